"""Property tests: random allocate / grow / free sequences against brute-force reference models,
with ``check_invariants()`` after every operation.

The number of random sequences per allocator configuration is ``KVSIM_PROPERTY_EXAMPLES``
(default 10,000, as the reliability issue asks; set lower for a quick local run).
"""

import os

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from kvsim.kv.base import KVRequest, cdiv
from kvsim.kv.buddy import BuddyAllocator
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.reservation import reservation_tokens

EXAMPLES = int(os.environ.get("KVSIM_PROPERTY_EXAMPLES", "10000"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
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
    out = [decode_op(n) for n in ops]
    note(f"decoded ops: {out}")
    return out


ops_strategy = st.lists(st.integers(0, NUM_OPS - 1), min_size=1, max_size=30)


def check_capacity_sums(alloc, head=None):
    u = alloc.usage(head)
    parts = [u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens, u.external_frag_tokens,
             u.free_tokens]
    assert all(p >= 0 for p in parts), parts
    assert sum(parts) == u.capacity_tokens == alloc.capacity_tokens


def drive(alloc, ops, on_alloc=None, on_free=None, keys_for=None):
    """Apply ops ((verb, slot, a, b) tuples; the hypothesis tests pass decode_ops(drawn integers)); track
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
        shared = getattr(alloc, "_shared_extra", 0) * (getattr(alloc, "block_size", 1) or 1)
        assert u.token_states_tokens == sum(written.values()) - shared
        assert u.num_requests == len(written)


@SETTINGS
@given(ops=ops_strategy, block_size=st.sampled_from([1, 3, 4, 16]), blocks=st.integers(1, 40),
       watermark=st.sampled_from([0.0, 0.1]))
def test_paged_random_sequences(ops, block_size, blocks, watermark):
    alloc = PagedAllocator(blocks, block_size, watermark)

    def on_alloc(r, ok):
        # Paged admission fails exactly when too few free blocks remain above the watermark.
        need = cdiv(r.prompt_tokens, block_size)
        free_before = alloc.num_free_blocks + (need if ok else 0)
        assert ok == (free_before - need >= alloc.watermark_blocks)

    drive(alloc, decode_ops(ops), on_alloc=on_alloc)


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


@SETTINGS
@given(ops=ops_strategy, capacity=st.integers(1, 200), policy=st.sampled_from(["max", "pow2", "oracle"]),
       placement=st.sampled_from(["first-fit", "best-fit"]))
def test_contiguous_random_sequences_match_brute_force(ops, capacity, policy, placement):
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

    drive(alloc, decode_ops(ops), on_alloc=on_alloc, on_free=on_free)
    assert list(zip(alloc.hole_starts, alloc.hole_sizes)) == model.holes()


@SETTINGS
@given(ops=ops_strategy, capacity=st.integers(4, 300), unit=st.sampled_from([1, 2, 4, 8]),
       policy=st.sampled_from(["max", "pow2", "oracle"]))
def test_buddy_random_sequences(ops, capacity, unit, policy):
    if capacity < unit:
        return
    alloc = BuddyAllocator(capacity, unit, policy)

    def on_alloc(r, ok):
        if ok:
            return
        # A refusal must be honest: no free block of a sufficient order exists.
        order = alloc.order_for(r)
        assert all(not alloc.free_lists[j] for j in range(order, alloc.max_order + 1)) or order > alloc.max_order

    drive(alloc, decode_ops(ops), on_alloc=on_alloc)


@SETTINGS
@given(ops=ops_strategy, block_size=st.sampled_from([1, 2, 4]), blocks=st.integers(1, 40),
       eviction=st.sampled_from(["lru", "fifo", "lfu", "lru-k", "priority"]))
def test_prefix_caching_random_sequences(ops, block_size, blocks, eviction):
    """Requests in the same slot family (slot % 2) share their whole prompt prefix, so hits, shared
    reference counts and evictions all happen; invariants: ref counts == owners, nothing both free
    and owned, the five memory parts sum to capacity with shared blocks counted once."""
    from kvsim.kv.eviction import EVICTION_POLICIES

    cfg = EVICTION_POLICIES.default_config(eviction)
    alloc = PagedAllocator(blocks, block_size, 0.0, prefix_caching=True, eviction=cfg)

    def keys_for(slot, prompt):
        return [(slot % 2) * 1000 + k for k in range(prompt // block_size)]

    drive(alloc, decode_ops(ops), keys_for=keys_for)
