"""Eviction policies for reusable (cached, unreferenced) KV blocks.

A *free pool* holds the blocks with reference count 0 and hands one out when a new block is
needed. Two implementations:

* :class:`LRUFreePool` (``eviction: {kind: lru}``, the default) is vLLM v1's free-block queue,
  exactly: one queue of all free blocks, cached or not; allocation pops the front, evicting its
  cached content if any; freed blocks are appended at the back, a request's blocks in reverse
  order. Eviction order: (1) least recently freed first, (2) among blocks freed together the tail
  of a prefix chain before its head. Never-used blocks start at the front in id order. With prefix
  caching on, freed blocks that hold no cached content go to the front instead, reused first
  (``add_front_many``, the FrontReuse capability; vLLM's ``free_blocks`` since
  vllm-project/vllm#42656, checked by the conformance suite against vLLM 0.32).
* :class:`PolicyFreePool` (every other kind) keeps never-used/uncached free blocks in a FIFO that is
  always used first, then evicts the cached free block with the lowest policy score:

  ========== ==========================================================================
  fifo        score = when the content was first cached (oldest content evicted first)
  lfu         score = (number of accesses, last access)
  lru-k       score = time of the K-th most recent access; blocks with fewer than K accesses
              score -inf and go first, ties by last access (O'Neil et al., 1993)
  priority    score = (highest request priority that used the block, number of distinct
              requests that hit it, last access): keeps blocks of high-priority requests and
              of prefixes shared by many requests
  ========== ==========================================================================

"Time" is a logical access counter owned by the allocator (deterministic, no wall clock).
Ties break by the order blocks were freed, earliest first (a request frees its blocks tail first,
so among blocks freed together the tail of a prefix chain goes before its head, as under LRU), so
runs are reproducible.

Writing a policy: the free pool object needs only the members of
:class:`kvsim.kv.protocol.EvictionPolicy` (``num_free``, ``in``, ``pop``, ``remove``, ``add``); a
``history_depth`` (K of the access times :class:`BlockStats` keeps), ``ignores_block_stats``
(True: the policy never reads ``stats``, so none are built), ``pop_many``/``add_many`` (a request's
blocks in one call), ``check_invariants()`` and ``order()`` are optional capabilities the allocator
checks once when it is built. Declare a factory
``factory(cfg, num_blocks) -> pool`` with ``@EVICTION_POLICIES.policy("name")`` (``params={...}``
for parameters; :func:`kvsim.registry.declare_policy` makes the config class) any time before the
scenario is loaded; ``eviction: {kind: name}`` (or ``eviction: name``) then
chooses it. docs/architecture.md ("Writing a plugin") has an example.
"""

from __future__ import annotations

import heapq
from collections import deque

from pydantic import Field

from kvsim.config_base import StrictModel
from kvsim.kv.block_pool import FreeBlockQueue
from kvsim.registry import Registry, policy_field

EVICTION_POLICIES = Registry("eviction")
# ``eviction:`` of an allocator: any kind registered in EVICTION_POLICIES when the scenario is
# validated; a bare kind is shorthand for {kind: NAME}.
EvictionConfig = policy_field(EVICTION_POLICIES, "lru")


class BlockStats:
    """Access history of one block's cached content (reset when the content is evicted); what an
    eviction policy's ``add`` receives. Times are the allocator's logical access counter.

    * ``first_cached``: when the content was cached;
    * ``accesses``: admissions that used it, the one that computed it included (``users`` counts
      the same and is always equal);
    * ``last_access``: the most recent of those uses;
    * ``history``: the last ``history_depth`` use times, oldest first;
    * ``max_priority``: the highest priority of a request that used it.
    """

    __slots__ = ("first_cached", "accesses", "last_access", "history", "max_priority", "users")

    def __init__(self, now: int, k: int):
        self.first_cached = now
        self.accesses = 0
        self.last_access = now
        self.history: deque[int] = deque(maxlen=k)
        self.max_priority = 0
        self.users = 0

    def touch(self, now: int, priority: int) -> None:
        self.accesses += 1
        self.last_access = now
        self.history.append(now)
        self.users += 1
        if priority > self.max_priority:
            self.max_priority = priority


class LRUFreePool:
    """vLLM's free-block queue (see module docstring)."""

    history_depth = 1
    ignores_block_stats = True  # StatsBlindEviction: the order is the order of frees

    def __init__(self, num_blocks: int):
        self.queue = FreeBlockQueue(num_blocks)

    @property
    def num_free(self) -> int:
        return self.queue.num_free

    def __contains__(self, block: int) -> bool:
        return block in self.queue

    def pop(self) -> int:
        return self.queue.popleft()

    def remove(self, block: int) -> None:
        self.queue.remove(block)

    def add(self, block: int, stats: BlockStats | None) -> None:
        self.queue.append(block)

    def pop_many(self, n: int) -> list[int]:
        return self.queue.popleft_many(n)

    def add_many(self, blocks: list[int], stats) -> None:
        self.queue.append_many(blocks)

    def add_front_many(self, blocks: list[int]) -> None:
        """FrontReuse: never-cached blocks go to the front, reused first (vLLM's free_blocks since
        vllm-project/vllm#42656: "LIFO reuse of non-cached blocks")."""
        self.queue.prepend_many(blocks)

    def order(self) -> list[int]:
        return self.queue.all_free_blocks()

    @staticmethod
    def score(stats: BlockStats) -> tuple:
        """LRU as a score (ScoredEviction), for a cache that orders by access history rather than by
        a free queue: the radix tree, which refreshes a node's ``last_access`` when it is released."""
        return (stats.last_access,)

    def check_invariants(self) -> None:
        self.queue.check_invariants()


class PolicyFreePool:
    """Uncached free blocks first (FIFO), then the cached free block with the lowest score."""

    def __init__(self, num_blocks: int, score, history_depth: int = 1):
        self.score = score
        self.history_depth = history_depth
        self.empty: deque[int] = deque(range(num_blocks))
        self._empty_set = set(range(num_blocks))
        self.heap: list[tuple] = []
        self._entry_version: dict[int, int] = {}  # cached free block -> version of its live heap entry
        self._version = 0

    @property
    def num_free(self) -> int:
        return len(self._empty_set) + len(self._entry_version)

    def __contains__(self, block: int) -> bool:
        return block in self._empty_set or block in self._entry_version

    def pop(self) -> int:
        while self.empty:
            b = self.empty.popleft()
            if b in self._empty_set:
                self._empty_set.discard(b)
                return b
        while self.heap:
            *_, version, b = heapq.heappop(self.heap)
            if self._entry_version.get(b) == version:
                del self._entry_version[b]
                return b
        raise ValueError("no free blocks to pop")

    def remove(self, block: int) -> None:
        if block in self._empty_set:
            self._empty_set.discard(block)  # lazily skipped in the deque
        elif block in self._entry_version:
            del self._entry_version[block]  # lazily skipped in the heap
        else:
            raise RuntimeError(f"remove() called on block {block}, which is not free")

    def add(self, block: int, stats: BlockStats | None) -> None:
        if block in self:
            raise RuntimeError(f"add() called on block {block}, which is already free")
        if stats is None:
            self.empty.append(block)
            self._empty_set.add(block)
            return
        self._version += 1
        self._entry_version[block] = self._version
        # ties by when the block was freed, earliest first: a request's blocks are freed tail first
        # (reverse block-table order), so the tail of a prefix chain goes before its head, as under
        # LRU (by block id, the head could go first and leave the tail cached but unreachable)
        heapq.heappush(self.heap, (*self.score(stats), self._version, self._version, block))

    def order(self) -> list[int]:
        live = sorted(e for e in self.heap if self._entry_version.get(e[-1]) == e[-2])
        return [b for b in self.empty if b in self._empty_set] + [e[-1] for e in live]

    def check_invariants(self) -> None:
        empties = [b for b in self.empty if b in self._empty_set]
        assert len(empties) == len(set(empties)) == len(self._empty_set), "empty free list out of sync"
        assert not (self._empty_set & set(self._entry_version)), "a block is both empty-free and cached-free"
        live = [e for e in self.heap if self._entry_version.get(e[-1]) == e[-2]]
        assert len(live) == len(self._entry_version), "cached free heap out of sync"


NEG_INF = float("-inf")

# The built-in kinds, each declared with the factory of its own pool (the registry chose the kind;
# nothing dispatches on it again). Their configs derive from StrictModel, not PolicyConfig: they
# were always written back as mappings ({kind: lru}) and still are (config hashes unchanged).


@EVICTION_POLICIES.policy("lru", base=StrictModel, config_name="LRUEvictionConfig")
def lru_pool(cfg, num_blocks: int) -> LRUFreePool:
    return LRUFreePool(num_blocks)


@EVICTION_POLICIES.policy("fifo", base=StrictModel, config_name="FIFOEvictionConfig")
def fifo_pool(cfg, num_blocks: int) -> PolicyFreePool:
    return PolicyFreePool(num_blocks, lambda s: (s.first_cached,))


@EVICTION_POLICIES.policy("lfu", base=StrictModel, config_name="LFUEvictionConfig")
def lfu_pool(cfg, num_blocks: int) -> PolicyFreePool:
    return PolicyFreePool(num_blocks, lambda s: (s.accesses, s.last_access))


@EVICTION_POLICIES.policy("lru-k", base=StrictModel, config_name="LRUKEvictionConfig", params={
    "k": (int, Field(2, ge=1, le=16, description="history depth: evict by the K-th most recent access"))})
def lru_k_pool(cfg, num_blocks: int) -> PolicyFreePool:
    k = cfg.k

    def lru_k(s: BlockStats):
        kth = s.history[0] if len(s.history) >= k else NEG_INF
        return (kth, s.last_access)

    return PolicyFreePool(num_blocks, lru_k, history_depth=k)


@EVICTION_POLICIES.policy("priority", base=StrictModel, config_name="PriorityEvictionConfig")
def priority_pool(cfg, num_blocks: int) -> PolicyFreePool:
    return PolicyFreePool(num_blocks, lambda s: (s.max_priority, s.users, s.last_access))


# the config classes by name (allocator defaults, tests, plugins)
LRUEvictionConfig, FIFOEvictionConfig, LFUEvictionConfig, LRUKEvictionConfig, PriorityEvictionConfig = (
    lru_pool.Config, fifo_pool.Config, lfu_pool.Config, lru_k_pool.Config, priority_pool.Config)
