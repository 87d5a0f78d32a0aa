"""The block pool of the block-id paged allocator (what vLLM v1's ``BlockPool`` owns): a reference
count per block, the free blocks (an eviction policy, :mod:`kvsim.kv.eviction`), and the prefix
cache's key map (``key_to_block`` / ``block_key``) with each cached block's access history.

Nothing else writes these. The allocator decides *which* blocks a request's table holds; the pool
hands blocks out (evicting cached content on the way), takes references and gives blocks back.

Counters kept here because every change goes through the pool:
* ``shared_extra``: over owned blocks, references beyond the first that come from *other*
  requests (a request's own samples and beams add references through :meth:`add_refs` /
  :meth:`set_refs`, which leave it alone);
* ``cached_free``: free blocks that still hold cached content;
* ``evictions``: cached contents dropped to make room.
"""

from __future__ import annotations

from itertools import repeat

from kvsim.kv.eviction import EVICTION_POLICIES, BlockStats, LRUEvictionConfig
from kvsim.kv.protocol import EvictionPolicy, eviction_capabilities


class BlockPool:
    def __init__(self, num_blocks: int, eviction=None, front_reuse: bool = False):
        eviction = eviction or LRUEvictionConfig()
        self.num_blocks = num_blocks
        self.eviction_kind = eviction.kind
        self.free: EvictionPolicy = EVICTION_POLICIES.build(eviction, num_blocks)
        self.caps = eviction_capabilities(self.free)  # checked once; TypeError if not a policy
        if self.free.num_free != num_blocks:
            raise ValueError(f"eviction kind {eviction.kind!r}: a new pool must hold all {num_blocks} blocks, "
                             f"it holds {self.free.num_free}")
        # freed blocks without cached content are reused first (vLLM since vllm-project/vllm#42656;
        # asked for with prefix caching on, where content decides hits), if the policy can (FrontReuse)
        self.front_reuse = front_reuse and self.caps.front_reuse
        self.history_k = self.caps.history_depth
        self.keeps_stats = not self.caps.ignores_stats  # else no BlockStats are built (StatsBlindEviction)
        self.ref_counts = [0] * num_blocks
        self.block_key: list[object] = [None] * num_blocks
        self.key_to_block: dict[object, int] = {}
        self.block_stats: dict[int, BlockStats] = {}
        self.shared_extra = 0
        self.cached_free = 0
        self.evictions = 0
        self.tick = 0  # logical access time (one per admission)

    @property
    def num_free(self) -> int:
        return self.free.num_free

    def take(self):
        """A free block with reference count 1, and the cached key it held (evicted), or None."""
        b = self.free.pop()
        key = self.block_key[b]
        if key is not None:
            self.cached_free -= 1
            del self.key_to_block[key]
            self.block_key[b] = None
            self.block_stats.pop(b, None)
            self.evictions += 1
        self.ref_counts[b] = 1
        return b, key

    def take_many(self, n: int, evicted: list) -> list[int]:
        """``take`` ``n`` times: the blocks in order; the keys evicted on the way are appended to
        ``evicted`` in eviction order."""
        block_key = self.block_key
        refs = self.ref_counts
        if self.caps.bulk:
            out = self.free.pop_many(n)
        else:
            pop = self.free.pop
            out = [pop() for _ in range(n)]
        key_to_block = self.key_to_block
        stats = self.block_stats if self.keeps_stats else None  # (without stats, none to drop)
        before = len(evicted)
        for b in out:
            key = block_key[b]
            if key is not None:
                del key_to_block[key]
                block_key[b] = None
                if stats is not None:
                    stats.pop(b, None)
                evicted.append(key)
            refs[b] = 1
        n_evicted = len(evicted) - before
        self.cached_free -= n_evicted
        self.evictions += n_evicted
        return out

    def hits_in_free(self, blocks: list[int]) -> int:
        """How many of ``blocks`` (cache hits) are free now (a hit takes them out of the pool)."""
        refs = self.ref_counts
        return sum(1 for b in blocks if refs[b] == 0)

    def hit(self, b: int, priority: int) -> None:
        """One more request references cached block ``b`` (an admission's cache hit)."""
        if self.ref_counts[b] == 0:
            self.free.remove(b)
            self.cached_free -= 1
        else:
            self.shared_extra += 1
        self.ref_counts[b] += 1
        stats = self.block_stats.get(b)
        if stats is not None:
            stats.touch(self.tick, priority)

    def cache(self, b: int, key, priority: int) -> None:
        """Key block ``b`` by ``key`` in the prefix cache, with a fresh access history."""
        self.key_to_block[key] = b
        self.block_key[b] = key
        if self.keeps_stats:
            stats = BlockStats(self.tick, self.history_k)
            stats.touch(self.tick, priority)
            self.block_stats[b] = stats

    def cache_one(self, b: int, key, priority: int) -> bool:
        """``cache_new([b], [key])`` for one block: whether ``key`` was cached now (not cached yet)."""
        if key in self.key_to_block:
            return False
        if self.keeps_stats:
            self.cache(b, key, priority)
        else:
            self.key_to_block[key] = b
            self.block_key[b] = key
        return True

    def cache_new(self, blocks: list[int], keys: list, priority: int) -> list:
        """``cache(blocks[i], keys[i])`` in order for each key not cached yet (a key already cached,
        in another block or earlier in this call, keeps that block); the keys cached, in order."""
        key_to_block = self.key_to_block
        block_key = self.block_key
        out = []
        if self.keeps_stats:
            for b, key in zip(blocks, keys):
                if key not in key_to_block:
                    self.cache(b, key, priority)
                    out.append(key)
            return out
        for b, key in zip(blocks, keys):
            if key not in key_to_block:
                key_to_block[key] = b
                block_key[b] = key
                out.append(key)
        return out

    def add_refs(self, blocks, n: int) -> None:
        """``n`` more references to each of ``blocks`` from the same request (samples); negative to drop."""
        refs = self.ref_counts
        for b in blocks:
            refs[b] += n

    def set_refs(self, refs: dict[int, int]) -> None:
        """Reference counts of a request's beam blocks, as its beams hold them."""
        counts = self.ref_counts
        for b, n in refs.items():
            counts[b] = n

    def release_many(self, blocks) -> None:
        """``release`` each of ``blocks`` in order (those without cached content to the front, in
        that order, with ``front_reuse``)."""
        refs = self.ref_counts
        stats = self.block_stats
        block_key = self.block_key
        freed = []
        front = [] if self.front_reuse else freed  # uncached blocks: to the front, or with the rest
        cached = shared = 0
        for b in blocks:
            n = refs[b] - 1
            refs[b] = n
            if n == 0:
                if block_key[b] is not None:
                    cached += 1
                    freed.append(b)
                else:
                    front.append(b)
            else:
                shared += 1
        self.cached_free += cached
        self.shared_extra -= shared
        if front and front is not freed:
            self.free.add_front_many(front)  # type: ignore[attr-defined]
        if self.caps.bulk:
            self.free.add_many(freed, [stats.get(b) for b in freed] if self.keeps_stats else repeat(None))
            return
        add = self.free.add
        for b in freed:
            add(b, stats.get(b))

    def release(self, b: int) -> None:
        """Drop one reference to ``b``; the last one returns it to the free pool (content kept)."""
        self.ref_counts[b] -= 1
        if self.ref_counts[b] == 0:
            if self.front_reuse and self.block_key[b] is None:
                self.free.add_front_many([b])  # type: ignore[attr-defined]
                return
            self.free.add(b, self.block_stats.get(b))
            if self.block_key[b] is not None:
                self.cached_free += 1
        else:
            self.shared_extra -= 1

    def give(self, b: int) -> None:
        """A block no beam holds any more goes back to the free pool (beam blocks are never cached)."""
        self.ref_counts[b] = 0
        self.free.add(b, self.block_stats.get(b))

    def check(self, owners: list[int], intra: int) -> None:
        """``owners[b]``: references the block tables hold to block ``b``; ``intra`` of them are
        a request's own samples or beams beyond the first."""
        if self.caps.self_check:
            self.free.check_invariants()  # type: ignore[attr-defined]
        extra = -intra
        for b in range(self.num_blocks):
            free = b in self.free
            assert self.ref_counts[b] == owners[b], (
                f"block {b}: ref count {self.ref_counts[b]} != owners {owners[b]}"
            )
            assert not (free and owners[b]), f"block {b} is both free and owned"
            assert free or owners[b], f"block {b} is neither free nor owned (leaked)"
            extra += max(owners[b] - 1, 0)
        assert extra == self.shared_extra, f"shared-owner count {self.shared_extra} != {extra}"
        assert self.free.num_free + sum(1 for o in owners if o) == self.num_blocks, "blocks leaked"
        for key, b in self.key_to_block.items():
            assert self.block_key[b] == key, f"cache map says key -> block {b}, block says {self.block_key[b]}"
        cached_free = sum(1 for b in range(self.num_blocks) if self.block_key[b] is not None and owners[b] == 0)
        assert cached_free == self.cached_free, f"cached-free count {self.cached_free} != {cached_free}"
        keyed = sum(1 for k in self.block_key if k is not None)
        assert keyed == len(self.key_to_block), "keyed blocks and cache map disagree"
