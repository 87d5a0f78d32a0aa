"""Tiny-pool tests of the paged allocator with exact block ids and free-queue orders."""

import pytest

from kvsim.kv.base import KVRequest
from kvsim.kv.paged import PagedAllocator


def req(rid, prompt, output=10, max_len=1000):
    return KVRequest(rid, prompt, output, max_len)


def test_allocate_takes_blocks_from_the_front_in_order():
    a = PagedAllocator(num_blocks=10, block_size=4)
    assert a.allocate(req(0, 14), 14)  # 4 blocks
    assert a.block_table(0) == [0, 1, 2, 3]
    assert a.allocate(req(1, 5), 5)
    assert a.block_table(1) == [4, 5]
    assert a.free_queue.all_free_blocks() == [6, 7, 8, 9]
    a.check_invariants()


def test_free_returns_blocks_tail_first_to_the_back():
    a = PagedAllocator(10, 4)
    a.allocate(req(0, 14), 14)  # [0, 1, 2, 3]
    a.allocate(req(1, 5), 5)  # [4, 5]
    a.free(0)
    # [unallocated 6..9] then request 0's blocks in reverse order
    assert a.free_queue.all_free_blocks() == [6, 7, 8, 9, 3, 2, 1, 0]
    a.allocate(req(2, 20), 20)  # 5 blocks: 6, 7, 8, 9, 3
    assert a.block_table(2) == [6, 7, 8, 9, 3]
    assert a.free_queue.all_free_blocks() == [2, 1, 0]
    a.check_invariants()


def test_does_not_fit_is_a_normal_return_and_changes_nothing():
    a = PagedAllocator(4, 4)
    assert a.allocate(req(0, 12), 12)
    assert not a.allocate(req(1, 8), 8)
    assert a.free_queue.all_free_blocks() == [3]
    assert a.ensure_slots(0, 16)  # grows into block 3
    assert a.block_table(0) == [0, 1, 2, 3]
    assert not a.ensure_slots(0, 17)
    assert a.block_table(0) == [0, 1, 2, 3]
    a.check_invariants()


def test_on_demand_growth_allocates_only_when_a_block_fills():
    a = PagedAllocator(8, 4)
    a.allocate(req(0, 3, output=20), 3)
    assert a.block_table(0) == [0]
    a.ensure_slots(0, 4)
    assert a.block_table(0) == [0]
    a.ensure_slots(0, 5)
    assert a.block_table(0) == [0, 1]
    u = a.usage()
    assert (u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens) == (5, 3, 0)


def test_usage_splits_tail_of_last_block_as_internal_fragmentation():
    # prompt 5 + output 2 => final KV length 6; 2 blocks of 4 hold 8 slots, 2 never used
    a = PagedAllocator(8, 4)
    a.allocate(req(0, 5, output=2), 5)
    a.ensure_slots(0, 5)
    u = a.usage()
    assert u.token_states_tokens == 5
    assert u.reservation_tokens == 1
    assert u.internal_frag_tokens == 2
    assert u.external_frag_tokens == 0
    assert u.free_tokens == 24
    assert sum([u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens,
                u.external_frag_tokens, u.free_tokens]) == u.capacity_tokens


def test_watermark_blocks_admission_but_not_growth():
    a = PagedAllocator(10, 1, watermark=0.2)  # 2 blocks kept free at admission
    assert a.allocate(req(0, 8), 8)
    assert not a.allocate(req(1, 1), 1)  # would leave 1 < 2 free
    assert a.ensure_slots(0, 10)  # running requests may use the watermark


def test_misuse_raises():
    a = PagedAllocator(4, 4)
    a.allocate(req(0, 4), 4)
    with pytest.raises(ValueError):
        a.allocate(req(0, 4), 4)
    with pytest.raises(ValueError):
        a.ensure_slots(99, 1)
    with pytest.raises(ValueError):
        a.free(99)
    a.ensure_slots(0, 3)
    with pytest.raises(ValueError):
        a.ensure_slots(0, 2)  # written tokens cannot shrink


def test_check_invariants_catches_a_corrupted_ref_count():
    a = PagedAllocator(4, 4)
    a.allocate(req(0, 8), 8)
    a.ref_counts[1] += 1
    with pytest.raises(AssertionError, match="ref count"):
        a.check_invariants()


def test_check_invariants_catches_a_block_both_free_and_owned():
    a = PagedAllocator(4, 4)
    a.allocate(req(0, 8), 8)
    a.free_queue.append(1)
    with pytest.raises(AssertionError):
        a.check_invariants()


def test_parallel_samples_share_the_prompt_and_copy_the_partial_block_on_first_write():
    from kvsim.kv.base import KVRequest

    a = PagedAllocator(12, 4)
    r = KVRequest(0, 10, 5, 1000, num_samples=3)  # prompt: 2 full blocks + 2 tokens
    assert a.allocate(r, 10) is not None
    assert a.ensure_slots(0, 10)
    assert a.block_table(0) == [0, 1, 2]
    assert [a.ref_counts[b] for b in (0, 1, 2)] == [3, 3, 3]  # shared by reference count
    a.check_invariants()
    assert a.ensure_slots(0, 11)  # first generated token: copy-on-write of block 2 for samples 1, 2
    assert a.block_table(0) == [0, 1, 2, 3, 4]
    assert [a.ref_counts[b] for b in range(5)] == [3, 3, 1, 1, 1]
    u = a.usage()
    assert u.token_states_tokens == 10 + 2 * 2 + 3  # prompt + 2 copied tokens x 2 + one token per sample
    assert u.unshared_tokens == 3 * 11
    a.check_invariants()
    assert a.ensure_slots(0, 12)  # still inside the copied blocks (positions 8..11)
    assert len(a.block_table(0)) == 5
    assert a.ensure_slots(0, 13)  # crosses into a new block: one per sample
    assert a.block_table(0) == [0, 1, 2, 3, 4, 5, 6, 7]
    a.check_invariants()
    a.free(0)
    assert a.num_free_blocks == 12
    a.check_invariants()


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_parallel_samples_share_a_prompt_prefilled_in_chunks_and_free_every_block(prefix_caching):
    # chunked prefill: the prompt's blocks come with its chunks; every one of them is the samples' own
    # (a later chunk's blocks with one reference each would be dropped below zero and leaked at the free)
    a = PagedAllocator(16, 4, prefix_caching=prefix_caching)
    r = KVRequest(0, 10, 5, 1000, num_samples=3)  # prompt: 2 full blocks + 2 tokens
    assert a.allocate(r, 4) is not None  # the first chunk: one block
    assert a.block_table(0) == [0]
    a.check_invariants()
    assert a.ensure_slots(0, 8)  # the second chunk
    assert a.ensure_slots(0, 10)  # the last
    assert a.block_table(0) == [0, 1, 2]
    assert [a.ref_counts[b] for b in (0, 1, 2)] == [3, 3, 3]
    a.check_invariants()
    assert a.ensure_slots(0, 11)  # first generated token: copy-on-write of block 2 for samples 1, 2
    assert [a.ref_counts[b] for b in a.block_table(0)] == [3, 3, 1, 1, 1]
    a.check_invariants()
    a.free(0)
    assert a.num_free_blocks == 16
    a.check_invariants()
