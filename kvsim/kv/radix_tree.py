"""The radix allocator's tree (kvsim/kv/radix.py): its nodes, the per-request path records, content
keys of pages without trace keys, and the read-only walks over a tree (the structural invariants
included). The allocator owns the tree and every change to it; nothing here mutates one."""

from __future__ import annotations

import heapq
from array import array

from kvsim.kv.base import KVRequest
from kvsim.kv.eviction import BlockStats

_UNIQUE_BASE = 1 << 64  # unique keys live above the int64 range of trace keys


def unique_key(request_id: int, k: int) -> int:
    """The content key of page ``k`` of a request whose content is its own: an injective int
    (for ``k < 2**32``) that never equals an int64 trace key."""
    return _UNIQUE_BASE + (request_id << 32) + k


class Node:
    __slots__ = ("id", "parent", "children", "keys", "pages", "lock", "stats", "alive")

    def __init__(self, nid: int, parent, keys: list, pages: array, lock: int, stats: BlockStats):
        self.id = nid
        self.parent = parent
        self.children: dict = {}
        self.keys = keys
        self.pages = pages
        self.lock = lock
        self.stats = stats  # access history of the node's content (what the eviction score reads)
        self.alive = True

    def __repr__(self) -> str:
        return f"Node(id={self.id}, pages={list(self.pages)}, lock={self.lock}, t={self.stats.last_access})"


def copy_stats(s: BlockStats) -> BlockStats:
    """The upper half of a split edge has the same content history as the whole edge had."""
    c = BlockStats(s.first_cached, s.history.maxlen)
    c.accesses, c.last_access, c.max_priority, c.users = s.accesses, s.last_access, s.max_priority, s.users
    c.history.extend(s.history)
    return c


class ReqState:
    __slots__ = ("req", "table", "node", "plen")

    def __init__(self, req: KVRequest, table: list[int], node: Node, plen: int):
        self.req = req
        self.table = table  # page ids; table[:plen] are the pages of the path root -> node
        self.node = node  # deepest tree node on the request's path (root if none)
        self.plen = plen  # pages of the table in the tree


def common_prefix(edge: list, q: list, start: int, lim: int) -> int:
    """Largest j <= lim with edge[:j] == q[start:start+j] (edge[0] == q[start] is known)."""
    if edge[:lim] == q[start:start + lim]:
        return lim
    lo, hi = 1, lim - 1  # edge[:lo] matches; edge[:hi+1] does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if edge[lo:mid] == q[start + lo:start + mid]:  # edge[:lo] is known to match
            lo = mid
        else:
            hi = mid - 1
    return lo


def iter_nodes(root: Node):
    """Every node below ``root`` (any order)."""
    stack = list(root.children.values())
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children.values())


def tree_paths(root: Node) -> list[tuple[list[int], int]]:
    """Every node as (pages along the path root -> node, lock count), depth first."""
    out = []

    def walk(node, prefix):
        for key in sorted(node.children, key=lambda c: node.children[c].id):
            c = node.children[key]
            path = prefix + list(c.pages)
            out.append((path, c.lock))
            walk(c, path)

    walk(root, [])
    return out


def check_tree(root: Node, num_used_pages: int) -> tuple[dict[int, tuple[Node, int]], list[Node]]:
    """Assert the tree's structure (live nodes, parent pointers, edges, child keys, locks never
    increasing downwards, every page at most once and below ``num_used_pages``); returns
    (page -> (node, index in its edge), the nodes)."""
    where: dict[int, tuple[Node, int]] = {}
    nodes = []
    stack = [root]
    while stack:
        n = stack.pop()
        for key, c in n.children.items():
            assert c.alive, f"dead node {c.id} in the tree"
            assert c.parent is n, f"node {c.id}: parent pointer does not point to its parent"
            assert c.keys and len(c.keys) == len(c.pages), f"node {c.id}: empty edge or keys/pages mismatch"
            assert key == c.keys[0], f"node {c.id}: child map key != first edge key"
            assert c.lock <= n.lock or n is root, f"node {c.id}: lock {c.lock} > parent's {n.lock}"
            for i, p in enumerate(c.pages):
                assert 0 <= p < num_used_pages, f"page {p} in the tree was never handed out"
                assert p not in where, f"page {p} is in the tree twice"
                where[p] = (c, i)
            nodes.append(c)
            stack.append(c)
    return where, nodes


def evictable_leaf(node: Node) -> bool:
    """A live, unlocked leaf below the root: its pages may be evicted."""
    return node.alive and not node.children and node.lock == 0 and node.parent is not None


def eviction_order(root: Node, score) -> list[int]:
    """Cached unlocked pages in the order the allocator would evict them (lowest ``score(stats)``
    leaf first, ties by node id, each edge tail first; a parent joins when its last child goes)."""
    order: list[int] = []
    heap = [(score(n.stats), n.id, n) for n in iter_nodes(root) if evictable_leaf(n)]
    heapq.heapify(heap)
    remaining_children = {}
    while heap:
        _, _, n = heapq.heappop(heap)
        order.extend(reversed(n.pages))
        p = n.parent
        if p is not root and p.lock == 0:
            left = remaining_children.get(p.id, len(p.children)) - 1
            remaining_children[p.id] = left
            if left == 0:
                heapq.heappush(heap, (score(p.stats), p.id, p))
    return order
