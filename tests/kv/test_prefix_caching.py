"""Prefix caching on the paged allocator: exact block ids and free-queue orders after
allocate / free / hit sequences, in the manner of vLLM's block-pool tests."""

import numpy as np
import pytest

from kvsim.kv.base import KVRequest
from kvsim.kv.eviction import FIFOEvictionConfig, LFUEvictionConfig, LRUKEvictionConfig, PriorityEvictionConfig
from kvsim.kv.paged import PagedAllocator


def req(rid, prompt, keys=None, output=8, priority=0):
    return KVRequest(rid, prompt, output, 10_000, block_keys=None if keys is None else np.array(keys),
                     priority=priority)


def admit(a, r, tokens=None):
    tokens = r.prompt_tokens if tokens is None else tokens
    got = a.allocate(r, tokens)
    assert got is not None
    assert a.ensure_slots(r.request_id, tokens)
    return got.cached_tokens


def make(num_blocks=11, eviction=None):
    return PagedAllocator(num_blocks, block_size=4, prefix_caching=True, eviction=eviction)


def test_hits_share_blocks_and_free_order_is_reverse_tail_first():
    a = make()
    # req0: 3 full blocks (keys 1, 2, 3) + 2 tokens in a partial block
    assert admit(a, req(0, 14, [1, 2, 3])) == 0
    assert a.block_table(0) == [0, 1, 2, 3]
    assert a.free_block_order() == [4, 5, 6, 7, 8, 9, 10]
    # req1: same first 3 blocks, different tail
    assert admit(a, req(1, 14, [1, 2, 3])) == 12
    assert a.block_table(1) == [0, 1, 2, 4]
    assert [a.ref_counts[b] for b in (0, 1, 2, 3, 4)] == [2, 2, 2, 1, 1]
    a.check_invariants()
    # block 3 becomes free; 0, 1, 2 are still owned by req1. Holding no cached content (a partial
    # block), it goes to the front: vLLM 0.32's free_blocks reuses uncached blocks first
    # (vllm-project/vllm#42656; docs/conformance.md, "Async scheduling", "The free queue")
    a.free(0)
    assert a.free_block_order() == [3, 5, 6, 7, 8, 9, 10]
    a.free(1)  # reverse order: 4 (partial, uncached: to the front), then the chain tail 2, 1, 0 (to the back)
    assert a.free_block_order() == [4, 3, 5, 6, 7, 8, 9, 10, 2, 1, 0]
    a.check_invariants()
    # req2 hits the cached chain: its blocks leave the free queue from the back; its new block is the front
    assert admit(a, req(2, 13, [1, 2, 3])) == 12
    assert a.block_table(2) == [0, 1, 2, 4]
    assert a.free_block_order() == [3, 5, 6, 7, 8, 9, 10]
    a.check_invariants()


def test_last_token_is_always_computed():
    a = make()
    admit(a, req(0, 12, [1, 2, 3]))
    a.free(0)
    # exact full-prompt repeat of 3 full blocks: at most (12 - 1) // 4 = 2 blocks may hit
    assert a.peek_cached_tokens(req(1, 12, [1, 2, 3]), 12) == 8
    assert admit(a, req(1, 12, [1, 2, 3])) == 8
    assert a.block_table(1)[:2] == [0, 1]


def test_eviction_takes_the_lru_front_and_forgets_its_key():
    a = make(num_blocks=4)
    admit(a, req(0, 8, [1, 2]))  # blocks 0, 1 cached
    a.free(0)  # queue: [2, 3, 1, 0]
    admit(a, req(1, 12, [7, 8, 9]))  # takes 2, 3, then evicts 1 (the chain tail)
    assert a.block_table(1) == [2, 3, 1]
    assert a.evictions == 1
    assert a.peek_cached_tokens(req(2, 9, [1, 2]), 9) == 4  # head (block 0) still cached
    a.check_invariants()


def test_no_sharing_without_prefix_keys_but_a_readmitted_request_hits_itself():
    a = make()
    admit(a, req(0, 10))
    assert admit(a, req(1, 10)) == 0  # different requests, no keys: nothing shared
    a.free(0)
    assert admit(a, req(0, 10)) == 8  # request 0 again (a recompute after preemption)


def test_usage_counts_shared_blocks_once():
    a = make()
    admit(a, req(0, 14, [1, 2, 3]))
    admit(a, req(1, 14, [1, 2, 3]))
    u = a.usage()
    # physical blocks in use: 0, 1, 2 shared + 3 + 4 = 5 blocks = 20 slots
    assert u.token_states_tokens + u.reservation_tokens + u.internal_frag_tokens == 20
    assert u.token_states_tokens == 12 + 2 + 2
    assert sum([u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens,
                u.external_frag_tokens, u.free_tokens]) == u.capacity_tokens
    a.free(0)
    a.free(1)
    u = a.usage()
    assert u.free_tokens == u.capacity_tokens and u.cached_free_tokens == 12


def test_policy_pools_use_empty_blocks_before_evicting():
    a = make(num_blocks=5, eviction=FIFOEvictionConfig())
    for rid, key in enumerate([10, 20, 30]):
        admit(a, req(rid, 4, [key]), tokens=4)  # one full block each: blocks 0, 1, 2
    for rid in range(3):
        a.free(rid)
    assert a.free_block_order() == [3, 4, 0, 1, 2]  # never-cached blocks first, then FIFO by content age
    admit(a, req(9, 8, [40, 41]), tokens=8)
    assert a.block_table(9) == [3, 4] and a.evictions == 0
    a.check_invariants()


@pytest.mark.parametrize("eviction,touch,expected_victim", [
    (FIFOEvictionConfig(), [10, 10], 0),       # oldest content goes first, however often used
    (LFUEvictionConfig(), [10, 10, 20], 2),   # 30 was used least
    (LRUKEvictionConfig(k=2), [10, 30], 1),  # 20 has < 2 accesses (and older last access than ...)
])
def test_eviction_policies_choose_their_victim(eviction, touch, expected_victim):
    a = PagedAllocator(4, block_size=4, prefix_caching=True, eviction=eviction)  # 3 cached + 1 spare
    for rid, key in enumerate([10, 20, 30]):
        admit(a, req(rid, 4, [key]), tokens=4)  # one full block each: blocks 0, 1, 2
    for rid in range(3):
        a.free(rid)
    rid = 100
    for key in touch:  # re-hit some contents (prompt 5 so the full block can hit; the tail uses the spare)
        assert admit(a, req(rid, 5, [key])) == 4
        a.free(rid)
        rid += 1
    before = dict(a.key_to_block)
    admit(a, req(999, 8, [77, 78]), tokens=8)  # needs two blocks: the spare, then one eviction
    evicted = [k for k in before if k not in a.key_to_block]
    assert len(evicted) == 1
    assert before[evicted[0]] == expected_victim
    a.check_invariants()


def test_priority_policy_keeps_high_priority_and_widely_shared_blocks():
    a = PagedAllocator(4, block_size=4, prefix_caching=True, eviction=PriorityEvictionConfig())
    admit(a, req(0, 4, [10], priority=5), tokens=4)
    admit(a, req(1, 4, [20], priority=0), tokens=4)
    admit(a, req(2, 4, [30], priority=0), tokens=4)
    for rid in range(3):
        a.free(rid)
    for rid in (3, 4):  # block with key 30 is shared by two more requests
        assert admit(a, req(rid, 5, [30])) == 4
        a.free(rid)
    admit(a, req(9, 8, [99, 98]), tokens=8)
    assert 20 not in a.key_to_block and 10 in a.key_to_block and 30 in a.key_to_block


def test_evicted_blocks_go_to_the_cpu_tier_and_load_back_with_a_cost():
    from kvsim.kv.tiers import OffloadConfig, TierConfig

    bpt = 1000  # bytes per token; a 4-token block is 4000 bytes
    off = OffloadConfig(cpu=TierConfig(capacity_bytes=2 * 4000, bandwidth_bytes_per_s=4e6))
    a = PagedAllocator(4, block_size=4, prefix_caching=True, offload=off, bytes_per_token=bpt)
    admit(a, req(0, 8, [1, 2]))
    a.free(0)  # queue: [2, 3, 1, 0], blocks 1 (key 2) and 0 (key 1) cached
    admit(a, req(1, 16, [7, 8, 9, 10]))  # takes 2, 3, then evicts 1 and 0 -> both offloaded
    assert a.offloaded_blocks == 2 and list(a.tiers[0].keys) == [2, 1]
    a.free(1)
    got = a.allocate(req(2, 9, [1, 2]), 9)  # keys 1, 2 are in the CPU tier: loaded back
    assert got.cached_tokens == 8 and got.cpu_tokens == 8
    assert got.load_s == pytest.approx(2 * 4000 / 4e6)
    assert list(a.tiers[0].keys) == [7, 8] or len(a.tiers[0].keys) <= 2
    assert all(k not in a.tiers[0] for k in (1, 2))  # exclusive tiers: loaded keys left the CPU tier
    a.check_invariants()


def test_cpu_tier_overflow_demotes_to_ssd():
    from kvsim.kv.tiers import OffloadConfig, TierConfig

    off = OffloadConfig(cpu=TierConfig(capacity_bytes=4, bandwidth_bytes_per_s=1e9),
                        ssd=TierConfig(capacity_bytes=40, bandwidth_bytes_per_s=1e8))
    a = PagedAllocator(2, block_size=1, prefix_caching=True, offload=off, bytes_per_token=4)  # cpu: 1 block
    for rid, key in enumerate([11, 12, 13]):
        admit(a, req(rid, 2, [key]), tokens=2)
        a.free(rid)
    # each request cached [key, (rid, 1)]; the CPU tier keeps the single most recent eviction
    assert len(a.tiers[0].keys) == 1 and 11 in a.tiers[1] and a.offloaded_blocks == 4
    got = a.allocate(req(9, 2, [11]), 2)
    assert got.ssd_tokens == 1 and got.load_s == pytest.approx(4 / 1e8)
    a.check_invariants()


@pytest.mark.parametrize("eviction", [FIFOEvictionConfig(), LFUEvictionConfig(), LRUKEvictionConfig(k=2),
                                      PriorityEvictionConfig()])
def test_policy_pools_evict_a_chain_tail_first_on_ties(eviction):
    """Blocks of one prefix chain freed together score alike; the tie went by block id, so the head
    was evicted first and the tail stayed cached but unreachable (a QA run: 0 cached tokens where
    LRU keeps 64). Ties now go by free order, tail first, as LRU's queue does."""
    a = PagedAllocator(4, block_size=4, prefix_caching=True, eviction=eviction)
    admit(a, req(0, 12, [10, 11, 12]), tokens=12)  # blocks 0, 1, 2: one chain
    a.free(0)  # freed tail first: 2, 1, 0
    admit(a, req(1, 8, [77, 78]), tokens=8)  # the spare, then one eviction: the chain's tail
    assert 12 not in a.key_to_block and 10 in a.key_to_block and 11 in a.key_to_block
    a.free(1)
    assert admit(a, req(2, 9, [10, 11])) == 8  # the head survives, so the prefix still hits
    a.check_invariants()
