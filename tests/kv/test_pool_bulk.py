"""The block pool's bulk calls and the StatsBlindEviction capability: the same blocks, order and
counters as the one-block calls (speed work on the block-id allocator must not change a result)."""

from __future__ import annotations

import random

import pytest

from kvsim.kv.block_pool import FreeBlockQueue
from kvsim.kv.eviction import FIFOEvictionConfig, LRUEvictionConfig, LRUFreePool
from kvsim.kv.paged_pool import BlockPool
from kvsim.kv.protocol import eviction_capabilities


def _shuffled_queue(seed: int, n: int = 40) -> tuple[FreeBlockQueue, FreeBlockQueue]:
    """Two equal queues after the same random pops and appends."""
    rng = random.Random(seed)
    a, b = FreeBlockQueue(n), FreeBlockQueue(n)
    held: list[int] = []
    for _ in range(200):
        if held and (rng.random() < 0.5 or not a.num_free):
            x = held.pop(rng.randrange(len(held)))
            a.append(x)
            b.append(x)
        else:
            x = a.popleft()
            assert b.popleft() == x
            held.append(x)
    return a, b


@pytest.mark.parametrize("seed", range(5))
def test_popleft_many_and_append_many_equal_one_at_a_time(seed):
    rng = random.Random(100 + seed)
    a, b = _shuffled_queue(seed)
    for _ in range(50):
        n = rng.randint(0, a.num_free)
        got = a.popleft_many(n)
        assert got == [b.popleft() for _ in range(n)]
        back = got[:]
        rng.shuffle(back)
        back = back[:rng.randint(0, len(back))]
        a.append_many(back)
        for x in back:
            b.append(x)
        assert a.all_free_blocks() == b.all_free_blocks()
        assert a.num_free == b.num_free
        a.check_invariants()


def test_popleft_many_refuses_more_than_free():
    q = FreeBlockQueue(3)
    with pytest.raises(ValueError, match="3 free"):
        q.popleft_many(4)
    assert q.all_free_blocks() == [0, 1, 2]


def test_append_many_of_a_free_block_raises_and_leaves_the_queue_consistent():
    q = FreeBlockQueue(5)
    taken = q.popleft_many(3)
    assert taken == [0, 1, 2]
    with pytest.raises(RuntimeError, match="block 4"):
        q.append_many([1, 4, 0])
    q.check_invariants()
    assert q.all_free_blocks() == [3, 4, 1]
    with pytest.raises(RuntimeError, match="block 2"):
        q.append_many([2, 2])
    q.check_invariants()
    assert q.all_free_blocks() == [3, 4, 1, 2]


def test_capabilities_lru_is_stats_blind_and_bulk_fifo_is_neither():
    lru = BlockPool(8, LRUEvictionConfig())
    fifo = BlockPool(8, FIFOEvictionConfig())
    assert lru.caps.ignores_stats and lru.caps.bulk
    assert not fifo.caps.ignores_stats and not fifo.caps.bulk


def test_stats_blind_pool_builds_no_block_stats_but_caches_and_evicts_the_same():
    lru = BlockPool(4, LRUEvictionConfig())
    blocks = lru.take_many(3, [])
    assert lru.cache_new(blocks, ["a", "b", "a"], 0) == ["a", "b"]
    assert lru.block_stats == {}
    assert lru.key_to_block == {"a": blocks[0], "b": blocks[1]}
    lru.release_many(reversed(blocks))
    assert lru.cached_free == 2 and lru.free.order() == [3, 2, 1, 0]
    evicted: list = []
    assert lru.take_many(3, evicted) == [3, 2, 1]
    assert evicted == ["b"] and lru.evictions == 1 and lru.cached_free == 1


def test_fifo_pool_still_builds_block_stats():
    fifo = BlockPool(4, FIFOEvictionConfig())
    blocks = fifo.take_many(2, [])
    fifo.cache_new(blocks, ["x", "y"], 3)
    assert set(fifo.block_stats) == set(blocks)
    assert fifo.block_stats[blocks[0]].max_priority == 3


class _BadBlind(LRUFreePool):
    ignores_block_stats = "yes"


def test_ignores_block_stats_must_be_a_bool():
    with pytest.raises(TypeError, match="ignores_block_stats must be True or False"):
        eviction_capabilities(_BadBlind(4))
