"""Property tests: random allocate / grow / free sequences against brute-force reference models,
with ``check_invariants()`` after every operation.

Each property runs twice over the same body (``*_case``): a hypothesis test with
``KVSIM_PROPERTY_EXAMPLES_HYPOTHESIS`` examples (default 1,000; edge-case-biased, shrinking) and a seeded
uniform fuzz test with ``KVSIM_PROPERTY_EXAMPLES`` cases (default 10,000, as the reliability issue asks;
set lower for a quick local run) drawn from the same space (tests/seeded_fuzz.py, docs/testing.md).
"""

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from seeded_fuzz import HYPOTHESIS_EXAMPLES, int_list, run_fuzz

from kvsim.kv.base import KVRequest, cdiv
from kvsim.kv.buddy import BuddyAllocator
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.reservation import reservation_tokens

SETTINGS = settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MAX_LEN = 96

# An operation: (verb, request slot 0..5, size a 1..60, size b 1..36), drawn as ONE integer of the
# product space and decoded by decode_ops(): every operation is reachable as before, but hypothesis
# makes one draw per operation instead of four (a 4-tuple of draws cost ~30 % more hypothesis time per
# example, and hypothesis itself is ~90 % of these tests' time; docs/testing.md).
VERBS = ("alloc", "grow", "free")
NUM_OPS = len(VERBS) * 6 * 60 * 36


def decode_op(n: int) -> tuple[str, int, int, int]:
    n, verb = divmod(n, len(VERBS))
    n, slot = divmod(n, 6)
    b, a = divmod(n, 60)
    return VERBS[verb], slot, a + 1, b + 1


def decode_ops(ops: list[int]) -> list[tuple[str, int, int, int]]:
    """Decode drawn integers inside a hypothesis test (the decoded operations are noted for a failure)."""
    out = [decode_op(n) for n in ops]
    note(f"decoded ops: {out}")
    return out


MAX_OPS = 30
ops_strategy = st.lists(st.integers(0, NUM_OPS - 1), min_size=1, max_size=MAX_OPS)


def draw_ops(rng) -> list[tuple[str, int, int, int]]:
    """The fuzz half's counterpart of ``ops_strategy`` + ``decode_ops``: same lengths, each operation
    uniform over the same integer space, decoded by the same ``decode_op``."""
    return [decode_op(n) for n in int_list(rng, NUM_OPS, 1, MAX_OPS)]


def check_capacity_sums(alloc, head=None):
    u = alloc.usage(head)
    parts = [u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens, u.external_frag_tokens,
             u.free_tokens]
    assert all(p >= 0 for p in parts), parts
    assert sum(parts) == u.capacity_tokens == alloc.capacity_tokens


def drive(alloc, ops, on_alloc=None, on_free=None, keys_for=None):
    """Apply ops ((verb, slot, a, b) tuples: decode_ops(drawn integers) or draw_ops(rng)); track
    written tokens so grows are legal; verify the ledger against the model."""
    written: dict[int, int] = {}
    reqs: dict[int, KVRequest] = {}
    next_id = 0
    slot_to_id: dict[int, int] = {}
    for verb, slot, a, b in ops:
        rid = slot_to_id.get(slot)
        if verb == "alloc" and rid is None:
            r = KVRequest(next_id, a, b, MAX_LEN, block_keys=keys_for(slot, a) if keys_for else None)
            next_id += 1
            got = alloc.allocate(r, a)
            ok = got is not None
            if on_alloc:
                on_alloc(r, ok)
            if ok:
                slot_to_id[slot] = r.request_id
                reqs[r.request_id] = r
                assert 0 <= got.cached_tokens < a, "a hit must leave at least the last token to compute"
                assert alloc.ensure_slots(r.request_id, a)
                written[r.request_id] = a
        elif verb == "grow" and rid is not None:
            r = reqs[rid]
            target = min(written[rid] + b, r.final_kv_tokens)
            before = alloc.held_tokens(rid)
            if alloc.ensure_slots(rid, target):
                written[rid] = target
                assert alloc.held_tokens(rid) >= target
            else:
                assert alloc.held_tokens(rid) == before, "a failed grow changed the allocation"
        elif verb == "free" and rid is not None:
            alloc.free(rid)
            if on_free:
                on_free(reqs[rid])
            del slot_to_id[slot]
            del written[rid]
        alloc.check_invariants()
        check_capacity_sums(alloc)
        check_capacity_sums(alloc, KVRequest(10**6, a, b, MAX_LEN))
        u = alloc.usage()
        # shared prefix blocks are physical once (check_invariants verified the shared-owner count)
        shared = alloc.usage_parts().shared_tokens
        assert u.token_states_tokens == sum(written.values()) - shared
        assert u.num_requests == len(written)


def paged_case(ops, block_size, blocks, watermark):
    """``ops``: decoded operations."""
    alloc = PagedAllocator(blocks, block_size, watermark)

    def on_alloc(r, ok):
        # Paged admission fails exactly when too few free blocks remain above the watermark.
        need = cdiv(r.prompt_tokens, block_size)
        free_before = alloc.num_free_blocks + (need if ok else 0)
        assert ok == (free_before - need >= alloc.watermark_blocks)

    drive(alloc, ops, on_alloc=on_alloc)


PAGED_BLOCK_SIZES, PAGED_WATERMARKS = [1, 3, 4, 16], [0.0, 0.1]


@SETTINGS
@given(ops=ops_strategy, block_size=st.sampled_from(PAGED_BLOCK_SIZES), blocks=st.integers(1, 40),
       watermark=st.sampled_from(PAGED_WATERMARKS))
def test_paged_random_sequences(ops, block_size, blocks, watermark):
    paged_case(decode_ops(ops), block_size, blocks, watermark)


@pytest.mark.slow  # KVSIM_PROPERTY_EXAMPLES cases: start early under xdist (tests/conftest.py)
def test_paged_random_sequences_seeded_fuzz():
    run_fuzz("paged", lambda rng: dict(ops=draw_ops(rng), block_size=rng.choice(PAGED_BLOCK_SIZES),
                                       blocks=rng.randint(1, 40), watermark=rng.choice(PAGED_WATERMARKS)),
             paged_case)


class SlotModel:
    """Brute-force model of a contiguous address space: one owner per slot."""

    def __init__(self, capacity):
        self.owner = [None] * capacity

    def first_fit(self, size):
        run = 0
        for i, o in enumerate(self.owner):
            run = run + 1 if o is None else 0
            if run == size:
                return i - size + 1
        return None

    def holes(self):
        out, start = [], None
        for i, o in enumerate(self.owner + ["end"]):
            if o is None and start is None:
                start = i
            elif o is not None and start is not None:
                out.append((start, i - start))
                start = None
        return out

    def best_fit(self, size):
        fits = [(z, s) for s, z in self.holes() if z >= size]
        return min(fits)[1] if fits else None


def contiguous_case(ops, capacity, policy, placement):
    """``ops``: decoded operations."""
    alloc = ContiguousAllocator(capacity, policy, placement)
    model = SlotModel(capacity)

    def on_alloc(r, ok):
        size = reservation_tokens(policy, r)
        expect = model.first_fit(size) if placement == "first-fit" else model.best_fit(size)
        assert ok == (expect is not None)
        if ok:
            assert alloc.extent(r.request_id) == (expect, size)
            model.owner[expect:expect + size] = [r.request_id] * size

    def on_free(r):
        model.owner = [None if o == r.request_id else o for o in model.owner]

    drive(alloc, ops, on_alloc=on_alloc, on_free=on_free)
    assert list(zip(alloc.hole_starts, alloc.hole_sizes)) == model.holes()


RESERVE_POLICIES, PLACEMENTS = ["max", "pow2", "oracle"], ["first-fit", "best-fit"]


@SETTINGS
@given(ops=ops_strategy, capacity=st.integers(1, 200), policy=st.sampled_from(RESERVE_POLICIES),
       placement=st.sampled_from(PLACEMENTS))
def test_contiguous_random_sequences_match_brute_force(ops, capacity, policy, placement):
    contiguous_case(decode_ops(ops), capacity, policy, placement)


@pytest.mark.slow  # KVSIM_PROPERTY_EXAMPLES cases: start early under xdist (tests/conftest.py)
def test_contiguous_random_sequences_match_brute_force_seeded_fuzz():
    run_fuzz("contiguous", lambda rng: dict(ops=draw_ops(rng), capacity=rng.randint(1, 200),
                                            policy=rng.choice(RESERVE_POLICIES), placement=rng.choice(PLACEMENTS)),
             contiguous_case)


def buddy_case(ops, capacity, unit, policy):
    """``ops``: decoded operations."""
    if capacity < unit:
        return
    alloc = BuddyAllocator(capacity, unit, policy)

    def on_alloc(r, ok):
        if ok:
            return
        # A refusal must be honest: no free block of a sufficient order exists.
        order = alloc.order_for(r)
        assert all(not alloc.free_lists[j] for j in range(order, alloc.max_order + 1)) or order > alloc.max_order

    drive(alloc, ops, on_alloc=on_alloc)


BUDDY_UNITS = [1, 2, 4, 8]


@SETTINGS
@given(ops=ops_strategy, capacity=st.integers(4, 300), unit=st.sampled_from(BUDDY_UNITS),
       policy=st.sampled_from(RESERVE_POLICIES))
def test_buddy_random_sequences(ops, capacity, unit, policy):
    buddy_case(decode_ops(ops), capacity, unit, policy)


@pytest.mark.slow  # KVSIM_PROPERTY_EXAMPLES cases: start early under xdist (tests/conftest.py)
def test_buddy_random_sequences_seeded_fuzz():
    run_fuzz("buddy", lambda rng: dict(ops=draw_ops(rng), capacity=rng.randint(4, 300), unit=rng.choice(BUDDY_UNITS),
                                       policy=rng.choice(RESERVE_POLICIES)),
             buddy_case)


def prefix_caching_case(ops, block_size, blocks, eviction):
    """Requests in the same slot family (slot % 2) share their whole prompt prefix, so hits, shared
    reference counts and evictions all happen; invariants: ref counts == owners, nothing both free
    and owned, the five memory parts sum to capacity with shared blocks counted once."""
    from kvsim.kv.eviction import EVICTION_POLICIES

    cfg = EVICTION_POLICIES.default_config(eviction)
    alloc = PagedAllocator(blocks, block_size, 0.0, prefix_caching=True, eviction=cfg)

    def keys_for(slot, prompt):
        return [(slot % 2) * 1000 + k for k in range(prompt // block_size)]

    drive(alloc, ops, keys_for=keys_for)


PREFIX_BLOCK_SIZES, EVICTIONS = [1, 2, 4], ["lru", "fifo", "lfu", "lru-k", "priority"]


@SETTINGS
@given(ops=ops_strategy, block_size=st.sampled_from(PREFIX_BLOCK_SIZES), blocks=st.integers(1, 40),
       eviction=st.sampled_from(EVICTIONS))
def test_prefix_caching_random_sequences(ops, block_size, blocks, eviction):
    prefix_caching_case(decode_ops(ops), block_size, blocks, eviction)


@pytest.mark.slow  # KVSIM_PROPERTY_EXAMPLES cases: start early under xdist (tests/conftest.py)
def test_prefix_caching_random_sequences_seeded_fuzz():
    run_fuzz("prefix-caching", lambda rng: dict(ops=draw_ops(rng), block_size=rng.choice(PREFIX_BLOCK_SIZES),
                                                blocks=rng.randint(1, 40), eviction=rng.choice(EVICTIONS)),
             prefix_caching_case)
