"""Contiguous and buddy allocators: exact placement, coalescing and fragmentation accounting."""

import pytest

from kvsim.kv.base import KVRequest
from kvsim.kv.buddy import BuddyAllocator
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.reservation import next_pow2, reservation_tokens


def req(rid, prompt, output, max_len=64):
    return KVRequest(rid, prompt, output, max_len)


def test_reservation_policies():
    r = req(0, 10, 7, max_len=64)
    assert reservation_tokens("max", r) == 64
    assert reservation_tokens("pow2", r) == 32
    assert reservation_tokens("oracle", r) == 17
    assert next_pow2(1) == 1 and next_pow2(17) == 32 and next_pow2(32) == 32


def test_first_fit_places_at_lowest_hole_and_coalesces():
    a = ContiguousAllocator(100, reservation="oracle")
    for rid, (p, o) in enumerate([(10, 10), (5, 5), (20, 10)]):
        assert a.allocate(req(rid, p, o), p)
    assert [a.extent(r) for r in range(3)] == [(0, 20), (20, 10), (30, 30)]
    a.free(1)
    assert list(zip(a.hole_starts, a.hole_sizes)) == [(20, 10), (60, 40)]
    assert a.allocate(req(3, 4, 4), 4)  # 8 slots: first fit is the hole at 20
    assert a.extent(3) == (20, 8)
    a.free(0)
    a.free(3)
    assert list(zip(a.hole_starts, a.hole_sizes)) == [(0, 30), (60, 40)]
    a.check_invariants()


def test_best_fit_picks_the_smallest_sufficient_hole():
    a = ContiguousAllocator(100, reservation="oracle", placement="best-fit")
    for rid, size in enumerate([30, 10, 20, 10]):
        a.allocate(req(rid, size - 1, 1), 1)
    a.free(0)  # hole (0, 30)
    a.free(2)  # hole (40, 20); tail hole (70, 30)
    assert a.allocate(req(9, 15, 5), 1)  # 20 slots: best fit is (40, 20), not (0, 30)
    assert a.extent(9) == (40, 20)
    a.check_invariants()


def test_external_fragmentation_relative_to_the_waiting_head():
    a = ContiguousAllocator(100, reservation="oracle")
    for rid in range(5):
        a.allocate(req(rid, 10, 10), 10)  # five extents of 20
    a.free(1)
    a.free(3)  # holes (20, 20) and (60, 20): 40 free, largest 20
    head = req(9, 20, 10)  # needs 30: fits in total free space but in no hole
    u = a.usage(head)
    assert u.external_frag_tokens == 40 and u.free_tokens == 0
    u = a.usage(None)
    assert u.external_frag_tokens == 20 and u.free_tokens == 20
    assert a.usage(req(8, 5, 5)).external_frag_tokens == 20  # fits: only space outside the largest hole
    assert not a.allocate(head, 20)


def test_max_reservation_counts_over_reservation_as_internal_fragmentation():
    a = ContiguousAllocator(200, reservation="max")
    a.allocate(req(0, 10, 5, max_len=64), 10)
    a.ensure_slots(0, 10)
    u = a.usage()
    assert (u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens) == (10, 4, 50)


def test_contiguous_cannot_grow_past_its_extent():
    a = ContiguousAllocator(100, reservation="oracle")
    a.allocate(req(0, 10, 5), 10)
    with pytest.raises(ValueError):
        a.ensure_slots(0, 16)


def test_buddy_splits_lowest_block_and_coalesces_back():
    b = BuddyAllocator(capacity_tokens=64, block_size=4, reservation="oracle")  # 16 units
    assert b.free_lists[4] == [0]
    assert b.allocate(req(0, 3, 2), 3)  # 5 tokens -> 2 units (order 1)
    assert b.extents[0] == (0, 1)
    assert b.free_lists[1] == [2] and b.free_lists[2] == [4] and b.free_lists[3] == [8]
    assert b.allocate(req(1, 10, 3), 10)  # 13 tokens -> 4 units (order 2)
    assert b.extents[1] == (4, 2)
    b.free(0)
    assert b.free_lists[2] == [0]  # merged units 0..3
    b.free(1)
    assert b.free_lists[4] == [0] and all(not fl for fl in b.free_lists[:4])
    b.check_invariants()


def test_buddy_non_power_of_two_capacity_uses_several_top_blocks():
    b = BuddyAllocator(capacity_tokens=96, block_size=8)  # 12 units = 8 + 4
    assert list(zip(b.top_bases, b.top_orders)) == [(0, 3), (8, 2)]
    assert b.allocate(req(0, 20, 5), 1)  # 25 tokens -> 4 units: smallest sufficient is the top block at 8
    assert b.extents[0] == (8, 2)
    b.free(0)
    assert b.free_lists[2] == [8] and b.free_lists[3] == [0]  # never merged across top blocks
    b.check_invariants()


def test_buddy_rounding_is_internal_fragmentation():
    b = BuddyAllocator(capacity_tokens=64, block_size=4)
    b.allocate(req(0, 3, 2), 3)
    b.ensure_slots(0, 3)
    u = b.usage()
    assert (u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens) == (3, 1, 4)


@pytest.mark.parametrize("make", [lambda: ContiguousAllocator(200, "oracle"), lambda: BuddyAllocator(256, 4, "oracle")])
def test_extent_allocators_keep_unshared_copies_of_parallel_samples(make):
    a = make()
    r = KVRequest(0, 10, 6, 64, num_samples=3)
    assert a.allocate(r, 10)
    assert a.held_tokens(0) >= 3 * 16  # three unshared copies of prompt + output
    for length in (10, 11, 12, 15):
        assert a.ensure_slots(0, length)
        u = a.usage()
        assert u.token_states_tokens == 3 * length and u.unshared_tokens == 3 * length
    assert a.seq_capacity_tokens(0) == a.held_tokens(0) // 3
    a.check_invariants()
    a.free(0)
    a.check_invariants()
