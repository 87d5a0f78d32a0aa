"""Radix-tree prefix cache (SGLang RadixAttention style): token-granular KV sharing.

KV memory is ``num_pages`` pages of ``block_size`` tokens (SGLang calls it ``page_size``, a deprecated
alias of the scenario key; default 1: one page per token, as in SGLang). A request's pages form its page table. Every *full* page a request has written is
inserted in a radix tree whose edges are runs of content keys (one key per page) with the page ids
holding them; a later request whose prompt starts with the same keys reuses those pages instead of
computing them again. The tree and the free pages are the only other places a page can be.

Content keys (see :mod:`kvsim.trace.prefix`): page *k* of a request is keyed by
``req.block_keys[k]`` (the engine computes them with ``block_keys(trace, block_size)``: equal key
at position k <=> equal prompt prefix up to ``(k+1)·block_size`` tokens) when ``k <
len(block_keys)``; any other page -- generated tokens, or every page of a request without prefix
information -- gets a key unique to ``(request_id, k)`` (an int above the int64 range, so it never
equals a trace key), which only the same request readmitted after a preemption can hit, as in
:mod:`kvsim.kv.paged`.

Semantics:

* **Match.** On admission the longest prefix of the request's keys present in the tree is hit, but
  at least the last token is always computed: at most ``(num_tokens - 1) // block_size`` pages can
  hit. If the match ends inside an edge the edge is split there (SGLang ``_split_node``), so a
  request's tree pages always end at a node boundary. Each hit node's lock count goes up by one.
* **Locks.** A node's lock count is the number of requests whose page table contains its pages;
  a request's tree pages are always a path from the root, so locks never increase downwards and
  every unlocked node's subtree is unlocked (all evictable).
* **Insert.** When ``ensure_slots`` makes pages full they are inserted under the request's path.
  A new run extends the request's own leaf (when only it holds the leaf) or becomes a new child.
  If the tree already holds the same content (another request computed the same prefix
  meanwhile) the request switches to the tree's pages and its own duplicates are freed (SGLang
  ``cache_unfinished_req``), so the same content is held once.
* **Free.** A request's path nodes are unlocked and stamped with the release time (SGLang's
  ``cache_finished_req`` inserts, refreshing ``last_access_time`` along the path); its pages
  beyond the tree (the partial last page, unwritten reservation) go to the free list, tail first.
* **Eviction (LRU by default).** A new page comes from the free pages first (never-used pages in
  id order, then freed pages in the order they were freed); when none is left, pages are evicted
  from the unlocked *leaf* with the lowest eviction score (ties: lower node id), from the tail of
  its edge. The score is the eviction policy's (``eviction:``, the same registry and seam as the
  paged allocator's, :mod:`kvsim.kv.eviction`; the ScoredEviction capability) over the node's
  :class:`~kvsim.kv.eviction.BlockStats`: LRU = oldest last access, and so on. A node's history
  counts the admissions that used it (the one that inserted it included) and its last access is
  refreshed when a request releases it (SGLang's ``cache_finished_req``).
  A leaf whose edge empties is removed and its parent becomes a candidate. SGLang frees a whole
  leaf node at once (over-evicting up to one edge); here eviction is page-granular, so exactly as
  many pages are evicted as are needed. "Time" is a logical counter advanced by every admission
  and every free (deterministic; identical in the step-by-step and the fast engine).

Accounting is that of :class:`kvsim.kv.paged.PagedAllocator`: ``held`` counts whole pages per
request, pages shared by several requests are counted once physically (``shared`` = sum over
tree pages of ``lock - 1``), unlocked tree pages are ``cached_free`` (part of free memory).
``num_free_blocks`` = free pages + unlocked cached pages: every unlocked tree page can be evicted,
so it is exactly the number of pages ``ensure_slots`` can take without failing.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from typing import Literal

from pydantic import AliasChoices, Field

from kvsim.config_base import StrictModel, Tokens
from kvsim.kv.base import MAX_BLOCK_TOKENS, NO_HIT, Allocation, KVRequest, KVUsage, UsageSums, cdiv
from kvsim.kv.ledger import SlotLedger
from kvsim.kv.eviction import EVICTION_POLICIES, BlockStats, EvictionConfig, LRUEvictionConfig
from kvsim.kv.protocol import eviction_capabilities
from kvsim.kv.radix_tree import (Node, ReqState, check_tree, common_prefix, copy_stats, evictable_leaf,
                                  eviction_order, tree_paths, unique_key)
from kvsim.registry import ALLOCATORS

class RadixAllocatorConfig(StrictModel):
    kind: Literal["radix"] = "radix"
    block_size: Tokens = Field(1, ge=1, le=MAX_BLOCK_TOKENS, validation_alias=AliasChoices("block_size", "page_size"),
                            description="tokens per page (SGLang: 1; page_size: deprecated alias)")
    watermark: float = Field(0.0, ge=0, lt=1, description="fraction of pages kept free at admission")
    eviction: EvictionConfig = Field(  # type: ignore[valid-type]
        default_factory=LRUEvictionConfig,
        description="which unlocked leaf is evicted first: lru | fifo | lfu | lru-k | priority, or any registered "
                    "kind with a score (kvsim/kv/eviction.py); {kind: NAME, ...} or NAME")


class RadixAllocator:
    prefix_caching = True

    def __init__(self, num_pages: int, block_size: int = 1, watermark: float = 0.0, eviction=None):
        if num_pages < 1:
            raise ValueError("a radix allocator needs at least one page")
        if not 1 <= block_size <= 512:
            raise ValueError(f"block_size must be in [1, 512], got {block_size}")
        eviction = eviction or LRUEvictionConfig()
        policy = EVICTION_POLICIES.build(eviction, 0)  # the tree keeps no free queue: only the score is used
        caps = eviction_capabilities(policy)  # checked once; TypeError if not a policy
        if not caps.scored:
            raise ValueError(f"eviction kind {eviction.kind!r} has no score(stats) (ScoredEviction), which the "
                             f"radix allocator orders its evictable leaves by")
        self._score = policy.score
        self._history_k = caps.history_depth
        self.num_pages = num_pages
        self.block_size = block_size  # tokens per page (SGLang's page_size)
        self.capacity_tokens = num_pages * block_size
        self.watermark = watermark
        self.watermark_pages = int(watermark * num_pages)
        self.eviction_kind = eviction.kind
        self._next_id = 1
        self._num_nodes = 0  # tree nodes, root excluded
        self.root = Node(0, None, [], array("q"), 0, BlockStats(0, self._history_k))
        self._fresh = 0  # pages >= _fresh were never used (free, in id order)
        self._recycled: deque[int] = deque()  # freed pages without content, in free order
        self._heap: list[tuple[tuple, int, Node]] = []  # (score, node id, node): leaf candidates
        self._state: dict[int, ReqState] = {}
        self._qcache: dict[int, tuple[object, list]] = {}  # request -> (block_keys object, key list)
        self._memo = None  # last match: (request id, max_hit, version, result)
        self._version = 0  # bumped by every change of tree structure or locks
        self.ledger = SlotLedger()
        self._shared_extra = 0  # pages: sum over tree nodes of len(pages) * (lock - 1), lock >= 1
        self._cached_free = 0  # pages in unlocked tree nodes
        self._tick = 0
        # counters (read by the metrics)
        self.hit_blocks = 0
        self.query_blocks = 0
        self.evictions = 0

    @classmethod
    def from_capacity(cls, cfg: RadixAllocatorConfig, capacity_tokens: int, bytes_per_token: int = 0):
        return cls(capacity_tokens // cfg.block_size, cfg.block_size, cfg.watermark, cfg.eviction)

    # -- queries -------------------------------------------------------------------------------
    @staticmethod
    def _one_sequence(req: KVRequest) -> None:
        if req.num_samples != 1:
            raise ValueError(f"request {req.request_id} has num_samples={req.num_samples}: the radix allocator "
                             f"does not model parallel samples (use allocator kind 'paged')")

    def max_footprint_fits(self, req: KVRequest) -> bool:
        self._one_sequence(req)
        return cdiv(req.final_kv_tokens, self.block_size) <= self.num_pages - self.watermark_pages

    def max_footprint_fits_without_watermark(self, req: KVRequest) -> bool:
        self._one_sequence(req)
        return cdiv(req.final_kv_tokens, self.block_size) <= self.num_pages

    def held_tokens(self, request_id: int) -> int:
        return self.ledger.held[request_id]

    def seq_capacity_tokens(self, request_id: int) -> int:
        """Tokens the request's sequence can hold in its current pages (one sequence per request)."""
        return self.ledger.held[request_id]

    def written_offset_tokens(self, request_id: int) -> int:
        return 0  # one sequence per request: slots written == its length

    def block_table(self, request_id: int) -> list[int]:
        """A copy of the request's page ids (for tests)."""
        return list(self._state[request_id].table)

    @property
    def num_empty_pages(self) -> int:
        """Free pages holding no cached content."""
        return self.num_pages - self._fresh + len(self._recycled)

    @property
    def num_evictable_pages(self) -> int:
        """Pages of unlocked tree nodes (cached, reusable, evictable)."""
        return self._cached_free

    @property
    def num_free_blocks(self) -> int:
        """Pages ``ensure_slots`` can take without failing: empty pages + evictable cached pages."""
        return self.num_pages - self._fresh + len(self._recycled) + self._cached_free

    def free_page_order(self) -> list[int]:
        """Empty free pages in the order they would be used (for tests)."""
        return list(range(self._fresh, self.num_pages)) + list(self._recycled)

    def eviction_order(self) -> list[int]:
        """Cached unlocked pages in the order they would be evicted, without evicting (for tests)."""
        return eviction_order(self.root, self._score)

    def tree_paths(self) -> list[tuple[list[int], int]]:
        """Every node as (pages along the path root -> node, lock count), depth first (for tests)."""
        return tree_paths(self.root)

    def _keys(self, req: KVRequest, upto: int) -> list:
        """The request's content keys for pages [0, upto) (cached per request, extended lazily)."""
        rid = req.request_id
        bk = req.block_keys
        hit = self._qcache.get(rid)
        if hit is not None and hit[0] is bk:
            q = hit[1]
        else:
            q = [] if bk is None else (bk.tolist() if hasattr(bk, "tolist") else [int(k) for k in bk])
            self._qcache[rid] = (bk, q)
        if len(q) < upto:
            q.extend(unique_key(rid, k) for k in range(len(q), upto))
        return q

    def _match(self, req: KVRequest, max_hit: int):
        """Longest cached prefix, at most ``max_hit`` pages: (matched pages, [(node, pages used)],
        unlocked matched pages). No side effects."""
        memo = self._memo
        if memo is not None and memo[0] == req.request_id and memo[1] == max_hit and memo[2] == self._version \
                and memo[3] is req.block_keys:
            return memo[4]
        path: list[tuple[Node, int]] = []
        i = unlocked = 0
        if max_hit > 0:
            q = self._keys(req, max_hit)
            node = self.root
            while i < max_hit:
                child = node.children.get(q[i])
                if child is None:
                    break
                ek = child.keys
                lim = min(len(ek), max_hit - i)
                j = common_prefix(ek, q, i, lim)
                path.append((child, j))
                if child.lock == 0:
                    unlocked += j
                i += j
                if j < len(ek):
                    break
                node = child
        result = (i, path, unlocked)
        self._memo = (req.request_id, max_hit, self._version, req.block_keys, result)
        return result

    def _max_hit(self, num_tokens: int) -> int:
        return (num_tokens - 1) // self.block_size  # the last token is always computed

    def peek_cached_tokens(self, req: KVRequest, num_tokens: int) -> int:
        """Tokens ``allocate(req, num_tokens)`` would find cached (no side effects)."""
        return self._match(req, self._max_hit(num_tokens))[0] * self.block_size

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        """Would ``allocate(req, hold_tokens)`` succeed now? (no side effects)"""
        m, _, unlocked = self._match(req, self._max_hit(hold_tokens))
        need = cdiv(hold_tokens, self.block_size) - m
        return self.num_free_blocks - unlocked - need >= self.watermark_pages

    # -- tree mutations --------------------------------------------------------------------------
    def _lock(self, node: Node) -> None:
        if node.lock == 0:
            self._cached_free -= len(node.pages)
        else:
            self._shared_extra += len(node.pages)
        node.lock += 1

    def _unlock(self, node: Node) -> None:
        node.lock -= 1
        if node.lock == 0:
            self._cached_free += len(node.pages)
        else:
            self._shared_extra -= len(node.pages)

    def _new_node(self, parent: Node, keys: list, pages: array, lock: int, priority: int) -> Node:
        stats = BlockStats(self._tick, self._history_k)
        stats.touch(self._tick, priority)  # the inserting request's use
        node = Node(self._next_id, parent, keys, pages, lock, stats)
        self._next_id += 1
        self._num_nodes += 1
        parent.children[keys[0]] = node
        return node

    def _split(self, node: Node, j: int) -> Node:
        """Split ``node``'s edge after ``j`` pages; returns the new upper node (``node`` keeps its
        identity, children and heap entries as the lower part). Totals do not change."""
        upper = Node(self._next_id, node.parent, node.keys[:j], node.pages[:j], node.lock, copy_stats(node.stats))
        self._next_id += 1
        self._num_nodes += 1
        node.parent.children[upper.keys[0]] = upper
        node.keys = node.keys[j:]
        node.pages = node.pages[j:]
        node.parent = upper
        upper.children[node.keys[0]] = node
        return upper

    def _push_if_leaf(self, node: Node) -> None:
        if evictable_leaf(node):
            heapq.heappush(self._heap, (self._score(node.stats), node.id, node))

    def _evict(self, n: int) -> list[int]:
        """Evict ``n`` cached pages (LRU leaves, tail first); the caller checked they exist."""
        out: list[int] = []
        heap = self._heap
        while len(out) < n:
            t, _, leaf = heap[0]
            if not evictable_leaf(leaf) or self._score(leaf.stats) != t:
                heapq.heappop(heap)
                continue
            size = len(leaf.pages)
            take = min(n - len(out), size)
            self._cached_free -= take
            self.evictions += take
            if take == size:  # the whole leaf goes; its parent may become a candidate
                heapq.heappop(heap)
                out.extend(reversed(leaf.pages))
                parent = leaf.parent
                del parent.children[leaf.keys[0]]
                leaf.alive = False
                leaf.parent = None
                self._num_nodes -= 1
                self._push_if_leaf(parent)
            else:  # trim the edge's tail
                out.extend(reversed(leaf.pages[size - take:]))
                del leaf.pages[size - take:]
                del leaf.keys[size - take:]
        return out

    def _compact_heap(self) -> None:
        score = self._score
        self._heap = [e for e in self._heap if evictable_leaf(e[2]) and score(e[2].stats) == e[0]]
        heapq.heapify(self._heap)

    def _take(self, n: int) -> list[int]:
        """``n`` pages: never-used pages first, then freed ones, then evictions."""
        out: list[int] = []
        fresh = min(n, self.num_pages - self._fresh)
        if fresh:
            out.extend(range(self._fresh, self._fresh + fresh))
            self._fresh += fresh
        rec = self._recycled
        while len(out) < n and rec:
            out.append(rec.popleft())
        if len(out) < n:
            out.extend(self._evict(n - len(out)))
        return out

    # -- allocator interface ---------------------------------------------------------------------
    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        rid = req.request_id
        self.ledger.require_new(rid, hold_tokens)
        self._one_sequence(req)
        total = cdiv(hold_tokens, self.block_size)
        m, path, unlocked = self._match(req, self._max_hit(hold_tokens))
        if self.num_free_blocks - unlocked - (total - m) < self.watermark_pages:
            return None
        self._tick += 1
        self._version += 1
        table: list[int] = []
        node = self.root
        if path:
            last, j = path[-1]
            if j < len(last.keys):
                path[-1] = (self._split(last, j), j)
            for node, _ in path:
                self._lock(node)
                node.stats.touch(self._tick, req.priority)
                table.extend(node.pages)
        table.extend(self._take(total - m))  # hits are locked first: eviction cannot take them
        self._state[rid] = ReqState(req, table, node, m)
        self.ledger.add(rid, req.final_kv_tokens, total * self.block_size)
        self.query_blocks += cdiv(req.prompt_tokens, self.block_size)
        self.hit_blocks += m
        if m:
            self.ledger.set_written(rid, m * self.block_size)
            return Allocation(m * self.block_size)
        return NO_HIT

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        self.ledger.require(request_id)
        st = self._state[request_id]
        if num_tokens < self.ledger.written_of(request_id):
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        table = st.table
        need = cdiv(num_tokens, self.block_size) - len(table)
        if need > 0:
            if need > self.num_free_blocks:
                return False
            self._version += 1
            table.extend(self._take(need))
            self.ledger.set_held(request_id, len(table) * self.block_size)
        self.ledger.set_written(request_id, num_tokens)
        full = num_tokens // self.block_size
        if full > st.plen:
            self._insert(st, full)
        return True

    def _insert(self, st: ReqState, full: int) -> None:
        """Insert the request's pages [plen, full) under its path (see the module docstring)."""
        self._version += 1
        q = self._keys(st.req, full)
        table = st.table
        k = st.plen
        while k < full:
            node = st.node
            child = node.children.get(q[k])
            if child is not None:  # the tree already holds this content: use its pages
                j = common_prefix(child.keys, q, k, min(len(child.keys), full - k))
                if j < len(child.keys):
                    child = self._split(child, j)
                for t in range(j):
                    self._recycled.append(table[k + t])
                    table[k + t] = child.pages[t]
                self._lock(child)
                child.stats.touch(self._tick, st.req.priority)
                st.node = child
                k += j
            else:
                if node.parent is not None and not node.children and node.lock == 1:
                    node.keys.extend(q[k:full])  # the request's own leaf grows
                    node.pages.extend(table[k:full])
                else:
                    st.node = self._new_node(node, q[k:full], array("q", table[k:full]), 1, st.req.priority)
                k = full
        st.plen = full

    def free(self, request_id: int) -> None:
        self.ledger.remove(request_id)
        st = self._state.pop(request_id)
        self._qcache.pop(request_id, None)
        self._tick += 1
        self._version += 1
        rec = self._recycled
        table = st.table
        for i in range(len(table) - 1, st.plen - 1, -1):  # tail first
            rec.append(table[i])
        node = st.node
        deepest = node
        while node.parent is not None:
            node.stats.last_access = self._tick  # released: a refresh, not a use
            self._unlock(node)
            node = node.parent
        self._push_if_leaf(deepest)
        if len(self._heap) > 2 * self._num_nodes + 64:
            self._compact_heap()

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        # Any free page can serve any request: no external fragmentation.
        return self.ledger.usage(self.capacity_tokens, 0, self._shared_extra * self.block_size,
                                 self._cached_free * self.block_size)

    def usage_parts(self, head: KVRequest | None = None) -> UsageSums:
        return UsageSums(self.ledger.sum_held, self.ledger.sum_useful, self._shared_extra * self.block_size,
                         self._cached_free * self.block_size, 0)

    # -- invariants ------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.ledger.check("radix")
        ps = self.block_size
        assert len(self._state) == len(self.ledger), "request states and ledger disagree"
        root = self.root
        assert root.parent is None and not root.keys and not root.pages and root.lock == 0, "bad root"
        where, nodes = check_tree(root, self._fresh)  # page -> (node, index); the nodes
        assert len(nodes) == self._num_nodes, f"node count {self._num_nodes} != {len(nodes)}"
        # requests: a root path of tree pages, then private pages
        locks: dict[int, int] = {}
        private: dict[int, int] = {}
        for rid, st in self._state.items():
            held = self.ledger.held[rid]
            assert len(st.table) * ps == held, f"request {rid}: {len(st.table)} pages but {held} held tokens"
            assert st.plen == self.ledger.written_of(rid) // ps, (
                f"request {rid}: {st.plen} pages in the tree but {self.ledger.written_of(rid)} tokens written")
            chain = []
            n = st.node
            while n is not root:
                assert n.alive, f"request {rid} holds evicted node {n.id}"
                chain.append(n)
                locks[n.id] = locks.get(n.id, 0) + 1
                n = n.parent
            path_pages = [p for n in reversed(chain) for p in n.pages]
            assert path_pages == st.table[:st.plen], f"request {rid}: table prefix is not its tree path"
            path_keys = [key for n in reversed(chain) for key in n.keys]
            assert path_keys == self._keys(st.req, st.plen)[:st.plen], f"request {rid}: path keys != its content"
            for p in st.table[st.plen:]:
                assert 0 <= p < self._fresh, f"request {rid} holds never-used page {p}"
                assert p not in where, f"request {rid}: private page {p} is also in the tree"
                assert p not in private, f"page {p} privately owned twice"
                private[p] = rid
        cached_free = shared = 0
        for n in nodes:
            assert n.lock == locks.get(n.id, 0), f"node {n.id}: lock {n.lock} != owning requests {locks.get(n.id, 0)}"
            if n.lock == 0:
                cached_free += len(n.pages)
            else:
                shared += len(n.pages) * (n.lock - 1)
        assert cached_free == self._cached_free, f"cached-free count {self._cached_free} != {cached_free}"
        assert shared == self._shared_extra, f"shared-owner count {self._shared_extra} != {shared}"
        rec = list(self._recycled)
        assert len(set(rec)) == len(rec), "a page is free twice"
        for p in rec:
            assert 0 <= p < self._fresh, f"free page {p} out of range"
            assert p not in where and p not in private, f"page {p} is both free and in use"
        assert len(where) + len(private) + self.num_empty_pages == self.num_pages, (
            f"pages leaked: {len(where)} cached + {len(private)} private + {self.num_empty_pages} free "
            f"!= {self.num_pages}")
        # every evictable leaf is reachable from the eviction heap
        live = {e[2].id for e in self._heap if evictable_leaf(e[2]) and self._score(e[2].stats) == e[0]}
        for n in nodes:
            if evictable_leaf(n):
                assert n.id in live, f"evictable leaf {n.id} missing from the eviction heap"


ALLOCATORS.register("radix", RadixAllocatorConfig, RadixAllocator.from_capacity)
