"""Lazy decode growth (``grow_all_by_one``) against the same steps made one request at a time.

The block-counting paged allocator and the extent allocators advance "every request writes one
more token" with a clock and a table of block boundaries, touching only requests that need a new
block. Random sequences of admissions, grows, frees and decode-all steps are run on them and on
the block-id paged allocator (or one ``ensure_slots`` per request), and every count must agree.

The two large properties run twice over the same body: a hypothesis test
(``KVSIM_PROPERTY_EXAMPLES_HYPOTHESIS`` examples, default 1,000) and a seeded uniform fuzz test
(``KVSIM_PROPERTY_EXAMPLES`` cases, default 10,000) drawn from the same space (tests/seeded_fuzz.py).
"""

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from seeded_fuzz import FUZZ_EXAMPLES, HYPOTHESIS_EXAMPLES, int_list, run_fuzz

from kvsim.kv.base import KVRequest
from kvsim.kv.ledger import SlotLedger
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.paged import CountingPagedAllocator, PagedAllocator

SETTINGS = settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MAX_LEN = 200

# An operation: (verb, request slot 0..5, size a 1..40, size b 1..60), drawn as ONE integer of the
# product space and decoded by decode_op() (one hypothesis draw per operation instead of four; see
# test_properties.py). "decode" is three of the six verbs, as before.
VERBS = ("alloc", "grow", "free", "decode", "decode", "decode")
NUM_OPS = len(VERBS) * 6 * 40 * 60


def decode_op(n: int) -> tuple[str, int, int, int]:
    n, verb = divmod(n, len(VERBS))
    n, slot = divmod(n, 6)
    b, a = divmod(n, 40)
    return VERBS[verb], slot, a + 1, b + 1


MAX_OPS = 60
ops_strategy = st.lists(st.integers(0, NUM_OPS - 1), min_size=1, max_size=MAX_OPS)


def decode_ops(ops: list[int]) -> list[tuple[str, int, int, int]]:
    """Decode drawn integers inside a hypothesis test (the decoded operations are noted for a failure)."""
    out = [decode_op(n) for n in ops]
    note(f"decoded ops: {out}")
    return out


def draw_ops(rng) -> list[tuple[str, int, int, int]]:
    """The fuzz half's counterpart of ``ops_strategy`` + ``decode_ops``: same lengths, each operation
    uniform over the same integer space, decoded by the same ``decode_op``."""
    return [decode_op(n) for n in int_list(rng, NUM_OPS, 1, MAX_OPS)]


def usage_tuple(alloc):
    u = alloc.usage()
    return (u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens, u.free_tokens, u.num_requests)


def drive_pair(lazy, ref, ops):
    """Apply ``ops`` to both allocators; ``decode`` is ``grow_all_by_one`` on ``lazy`` and, on ``ref``,
    one ``ensure_slots`` per request (all or nothing, as the scheduler's fast path needs). ``ops`` are
    decoded operations (decode_op)."""
    written: dict[int, int] = {}
    reqs: dict[int, KVRequest] = {}
    slot_to_id: dict[int, int] = {}
    next_id = 0
    decodes = 0
    for verb, slot, a, b in ops:
        rid = slot_to_id.get(slot)
        if verb == "alloc" and rid is None:
            r = KVRequest(next_id, a, b, MAX_LEN)
            next_id += 1
            got_lazy, got_ref = lazy.allocate(r, a), ref.allocate(r, a)
            assert (got_lazy is None) == (got_ref is None)
            if got_lazy is not None:
                assert lazy.ensure_slots(r.request_id, a) and ref.ensure_slots(r.request_id, a)
                slot_to_id[slot], reqs[r.request_id], written[r.request_id] = r.request_id, r, a
        elif verb == "grow" and rid is not None:
            target = min(written[rid] + b % 20, reqs[rid].final_kv_tokens)
            ok = lazy.ensure_slots(rid, target)
            assert ok == ref.ensure_slots(rid, target)
            if ok:
                written[rid] = target
        elif verb == "free" and rid is not None:
            lazy.free(rid)
            ref.free(rid)
            del slot_to_id[slot], written[rid]
        elif verb == "decode" and written and all(w < reqs[r].final_kv_tokens for r, w in written.items()):
            # Reference: does every request's next token fit? (new blocks all come from the free pool)
            bs = getattr(ref, "block_size", None)
            if bs is None:
                fits = True
            else:
                need = sum(1 for r, w in written.items() if w == ref.held_tokens(r))
                fits = need <= ref.num_free_blocks
            assert lazy.grow_all_by_one() == fits
            if fits:
                for r in written:
                    written[r] += 1
                    assert ref.ensure_slots(r, written[r])
                decodes += 1
        lazy.check_invariants()
        ref.check_invariants()
        for r, w in written.items():
            assert lazy.held_tokens(r) == ref.held_tokens(r), f"request {r}: held differs"
            assert lazy.ledger.written_of(r) == w
        assert usage_tuple(lazy) == usage_tuple(ref)
        if bs_of(ref):
            assert lazy.num_free_blocks == ref.num_free_blocks
    return decodes


def bs_of(alloc):
    return getattr(alloc, "block_size", None)


def lazy_counting_paged_case(ops, block_size, blocks, watermark):
    drive_pair(CountingPagedAllocator(blocks, block_size, watermark), PagedAllocator(blocks, block_size, watermark),
               ops)


def lazy_contiguous_case(ops, capacity, policy):
    drive_pair(ContiguousAllocator(capacity, policy), ContiguousAllocator(capacity, policy), ops)


BLOCK_SIZES, WATERMARKS, POLICIES = [1, 2, 4, 16], [0.0, 0.1], ["max", "oracle"]


@SETTINGS
@given(ops=ops_strategy, block_size=st.sampled_from(BLOCK_SIZES), blocks=st.integers(1, 40),
       watermark=st.sampled_from(WATERMARKS))
def test_counting_paged_lazy_decode_matches_block_ids(ops, block_size, blocks, watermark):
    lazy_counting_paged_case(decode_ops(ops), block_size, blocks, watermark)


@pytest.mark.slow  # KVSIM_PROPERTY_EXAMPLES cases: start early under xdist (tests/conftest.py)
def test_counting_paged_lazy_decode_matches_block_ids_seeded_fuzz():
    run_fuzz("lazy-counting-paged", lambda rng: dict(ops=draw_ops(rng), block_size=rng.choice(BLOCK_SIZES),
                                                     blocks=rng.randint(1, 40), watermark=rng.choice(WATERMARKS)),
             lazy_counting_paged_case)


@SETTINGS
@given(ops=ops_strategy, capacity=st.integers(1, 400), policy=st.sampled_from(POLICIES))
def test_contiguous_lazy_decode_matches_ensure_slots(ops, capacity, policy):
    lazy_contiguous_case(decode_ops(ops), capacity, policy)


@pytest.mark.slow  # KVSIM_PROPERTY_EXAMPLES cases: start early under xdist (tests/conftest.py)
def test_contiguous_lazy_decode_matches_ensure_slots_seeded_fuzz():
    run_fuzz("lazy-contiguous", lambda rng: dict(ops=draw_ops(rng), capacity=rng.randint(1, 400),
                                                 policy=rng.choice(POLICIES)),
             lazy_contiguous_case)


def test_lazy_decode_touches_only_requests_at_a_block_boundary():
    alloc = CountingPagedAllocator(num_blocks=100, block_size=16)
    for rid, prompt in enumerate([16, 20, 31]):  # 0 and 2 fill their blocks after 0 and 1 steps
        r = KVRequest(rid, prompt, 100, MAX_LEN)
        assert alloc.allocate(r, prompt) is not None and alloc.ensure_slots(rid, prompt)
    free0 = alloc.num_free_blocks
    assert alloc.grow_all_by_one()  # request 0 (16 of 16 written) takes a block
    assert alloc.num_free_blocks == free0 - 1
    assert [alloc.held_tokens(r) for r in range(3)] == [32, 32, 32]
    assert alloc.grow_all_by_one()  # request 2 (32 of 32 written) takes a block
    assert alloc.num_free_blocks == free0 - 2
    assert [alloc.ledger.written_of(r) for r in range(3)] == [18, 22, 33]
    alloc.check_invariants()
    # Only as many blocks as are free: all or nothing.
    tight = CountingPagedAllocator(num_blocks=2, block_size=4)
    for rid in (0, 1):
        assert tight.allocate(KVRequest(rid, 4, 50, MAX_LEN), 4) is not None and tight.ensure_slots(rid, 4)
    assert not tight.grow_all_by_one()
    assert [tight.ledger.written_of(r) for r in (0, 1)] == [4, 4] and tight.num_free_blocks == 0
    tight.check_invariants()


def test_ledger_refuses_lazy_growth_without_boundaries():
    with pytest.raises(ValueError, match="tracks block boundaries"):
        SlotLedger().grow_all_by_one(16, 10)


runs_strategy = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "run", "run"]), st.integers(0, 5), st.integers(1, 40),
              st.integers(1, 30)),
    min_size=1, max_size=40,
)


def drive_runs(single, bulk, ops):
    """``run n`` is up to ``n`` ``grow_all_by_one`` calls on ``single`` (stopping at the first that
    fails) and one ``grow_steps(n, ...)`` on ``bulk``: steps done, recorded (step, held, useful)
    changes, usage and free blocks must agree after every op."""
    written: dict[int, int] = {}
    final: dict[int, int] = {}
    slot_to_id: dict[int, int] = {}
    next_id = 0
    for verb, slot, a, n in ops:
        rid = slot_to_id.get(slot)
        if verb == "alloc" and rid is None:
            r = KVRequest(next_id, a, MAX_LEN - a, MAX_LEN)
            next_id += 1
            got = single.allocate(r, a)
            assert (got is None) == (bulk.allocate(r, a) is None)
            if got is not None:
                assert single.ensure_slots(r.request_id, a) and bulk.ensure_slots(r.request_id, a)
                slot_to_id[slot], written[r.request_id], final[r.request_id] = r.request_id, a, r.final_kv_tokens
        elif verb == "free" and rid is not None:
            single.free(rid)
            bulk.free(rid)
            del slot_to_id[slot], written[rid]
        elif verb == "run" and written:
            n = min(n, min(final[r] - w for r, w in written.items()))  # nobody writes past its end
            expected, done = [], 0
            while done < n:
                held = single.ledger.sum_held
                if not single.grow_all_by_one():
                    break
                if single.ledger.sum_held != held:
                    expected.append((7 + done, single.ledger.sum_held, single.ledger.sum_useful))
                done += 1
            changes: list = []
            assert bulk.grow_steps(n, 7, changes) == done
            assert changes == expected
            for r in written:
                written[r] += done
        single.check_invariants()
        bulk.check_invariants()
        assert usage_tuple(single) == usage_tuple(bulk)
        assert single.num_free_blocks == bulk.num_free_blocks
        for r, w in written.items():
            assert bulk.ledger.written_of(r) == w and bulk.held_tokens(r) == single.held_tokens(r)


@settings(max_examples=min(FUZZ_EXAMPLES, 400), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=runs_strategy, block_size=st.sampled_from([1, 4, 16]), blocks=st.integers(1, 40))
def test_counting_paged_grow_steps_matches_single_steps(ops, block_size, blocks):
    drive_runs(CountingPagedAllocator(blocks, block_size), CountingPagedAllocator(blocks, block_size), ops)


@settings(max_examples=min(FUZZ_EXAMPLES, 200), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(ops=runs_strategy, capacity=st.integers(1, 400))
def test_contiguous_grow_steps_matches_single_steps(ops, capacity):
    drive_runs(ContiguousAllocator(capacity, "max"), ContiguousAllocator(capacity, "max"), ops)


def test_grow_steps_stops_before_a_step_without_free_blocks():
    alloc = CountingPagedAllocator(num_blocks=3, block_size=4)
    for rid in (0, 1):  # 4 and 2 tokens: block boundaries after 0 and 2 steps
        assert alloc.allocate(KVRequest(rid, 4 - 2 * rid, 50, MAX_LEN), 4 - 2 * rid) is not None
        assert alloc.ensure_slots(rid, 4 - 2 * rid)
    changes: list = []
    # step 0 takes the last free block (request 0); step 2 would need one for request 1: stop there
    assert alloc.grow_steps(10, 0, changes) == 2
    assert changes == [(0, 12, 12)] and alloc.num_free_blocks == 0
    assert [alloc.ledger.written_of(r) for r in (0, 1)] == [6, 4]
    alloc.check_invariants()
