"""The radix-tree prefix cache (SGLang RadixAttention style): exact page ids and eviction orders
on tiny pools, token-granular sharing, the last-token rule, random operation sequences with
``check_invariants()`` after every step, and end-to-end runs against the paged allocator and
between the step-by-step and the fast engine."""

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from seeded_fuzz import HYPOTHESIS_EXAMPLES, int_list, run_fuzz

import kvsim.kv.radix  # noqa: F401  (registers the kind; kvsim.kv imports it too)
from kvsim.kv.base import KVRequest, UsageSums, cdiv
from kvsim.kv.radix import RadixAllocator, RadixAllocatorConfig, unique_key
from kvsim.registry import ALLOCATORS
from kvsim.trace.prefix import block_keys
from kvsim.trace.schema import Trace

REPO = Path(__file__).resolve().parents[2]


def req(rid, prompt, keys=None, output=8):
    return KVRequest(rid, prompt, output, 10_000, block_keys=None if keys is None else np.array(keys, dtype=np.int64))


def admit(a, r, tokens=None):
    tokens = r.prompt_tokens if tokens is None else tokens
    got = a.allocate(r, tokens)
    assert got is not None
    assert a.ensure_slots(r.request_id, tokens)
    a.check_invariants()
    return got.cached_tokens


# -- configuration -----------------------------------------------------------------------------------

def test_config_defaults_registration_and_validation():
    cfg = RadixAllocatorConfig()
    assert (cfg.kind, cfg.block_size, cfg.watermark, cfg.eviction.kind) == ("radix", 1, 0.0, "lru")
    assert "radix" in ALLOCATORS.kinds
    a = ALLOCATORS.build(RadixAllocatorConfig(page_size=16, watermark=0.1), 1000, bytes_per_token=2)
    assert isinstance(a, RadixAllocator)
    assert (a.num_pages, a.block_size, a.capacity_tokens, a.watermark_pages) == (62, 16, 992, 6)
    assert a.prefix_caching and a.num_free_blocks == 62
    for bad in ({"page_size": 0}, {"page_size": 513}, {"watermark": 1.0}, {"eviction": {"kind": "nope"}},
                {"block_size": 0}, {"block_size": 16, "page_size": 16}):  # page_size: deprecated alias
        with pytest.raises(ValidationError):
            RadixAllocatorConfig.model_validate({"kind": "radix", **bad})
    with pytest.raises(ValueError):
        RadixAllocator(0, 1)


def test_eviction_policies_order_the_leaves_through_the_same_seam():
    """``eviction:`` chooses the leaf order by the policy's score over each node's access history:
    LRU takes the least recently released leaf, LFU the least used one."""
    from kvsim.kv.eviction import LFUEvictionConfig

    orders, tables = {}, {}
    for name, cfg in (("lru", None), ("lfu", LFUEvictionConfig())):
        a = RadixAllocator(8, block_size=1, eviction=cfg)
        assert a.eviction_kind == name
        admit(a, req(0, 3, [1, 2, 3]))
        a.free(0)
        assert admit(a, req(1, 3, [1, 2, 3])) == 2  # [1, 2] hit; page 3 recomputed, the tree's copy reused
        a.free(1)  # [1, 2] and [3] each used by 2 admissions
        admit(a, req(2, 2, [10, 11]))
        a.free(2)  # [10, 11] used once, released last
        orders[name] = a.eviction_order()
        admit(a, req(3, 5, [20, 21, 22, 23, 24]))  # 3 empty pages (6, 7, recycled 3), then 2 evicted
        tables[name] = a.block_table(3)
    assert orders == {"lru": [2, 1, 0, 5, 4], "lfu": [5, 4, 2, 1, 0]}
    assert tables == {"lru": [6, 7, 3, 2, 1], "lfu": [6, 7, 3, 5, 4]}


def test_an_eviction_policy_without_a_score_is_refused_when_built():
    from kvsim.config_base import StrictModel
    from kvsim.kv.eviction import EVICTION_POLICIES, LRUFreePool
    from typing import Literal

    class QueueOnly:  # a free queue without score(): fine for the paged allocator, not for a tree
        def __init__(self, n):
            self.q = LRUFreePool(n)
            self.num_free = n

        def __contains__(self, b):
            return b in self.q

        def pop(self):
            return self.q.pop()

        def remove(self, b):
            self.q.remove(b)

        def add(self, b, stats):
            self.q.add(b, stats)

    class QueueOnlyConfig(StrictModel):
        kind: Literal["queue-only-radix-test"] = "queue-only-radix-test"

    EVICTION_POLICIES.register("queue-only-radix-test", QueueOnlyConfig, lambda cfg, n: QueueOnly(n))
    try:
        with pytest.raises(ValueError, match=r"eviction kind 'queue-only-radix-test' has no score\(stats\)"):
            RadixAllocator(8, 1, eviction=QueueOnlyConfig())
    finally:
        EVICTION_POLICIES.unregister("queue-only-radix-test")


def test_scenario_schema_accepts_the_radix_kind():
    from kvsim.config import Scenario

    scn = Scenario.model_validate({"trace": {"file": "x.csv"}, "model": "OPT-13B",
                                   "allocator": {"kind": "radix", "page_size": 16}})
    assert isinstance(scn.allocator, RadixAllocatorConfig) and scn.allocator.block_size == 16


# -- exact page ids and eviction orders ---------------------------------------------------------------

def test_split_share_evict_leaves_then_parents_and_extend_own_leaf():
    a = RadixAllocator(12, block_size=1)
    assert admit(a, req(0, 6, [1, 2, 3, 4, 5, 6])) == 0
    assert a.block_table(0) == [0, 1, 2, 3, 4, 5]
    # shares 3 tokens: the edge [1..6] is split after 3 pages
    assert admit(a, req(1, 5, [1, 2, 3, 7, 8])) == 3
    assert a.block_table(1) == [0, 1, 2, 6, 7]
    assert a.tree_paths() == [([0, 1, 2], 2), ([0, 1, 2, 3, 4, 5], 1), ([0, 1, 2, 6, 7], 1)]
    assert a.usage().token_states_tokens == 6 + 5 - 3  # shared pages once
    a.free(0)  # only its unshared leaf becomes evictable
    assert a.eviction_order() == [5, 4, 3]
    a.free(1)
    # least recently released leaf first (tail first), the shared parent only after both children
    assert a.eviction_order() == [5, 4, 3, 7, 6, 2, 1, 0]
    assert a.free_page_order() == [8, 9, 10, 11] and a.num_free_blocks == 12
    # 8 pages: the 4 never-used ones, then 4 evicted in LRU order
    assert admit(a, req(2, 8, [20, 21, 22, 23, 24, 25, 26, 27])) == 0
    assert a.block_table(2) == [8, 9, 10, 11, 5, 4, 3, 7]
    assert a.evictions == 4
    assert a.tree_paths() == [([0, 1, 2], 0), ([0, 1, 2, 6], 0), ([8, 9, 10, 11, 5, 4, 3, 7], 1)]
    # [1, 2, 3, 7, 99]: only 4 pages could hit, and the 5th page needs an eviction that would have
    # to take a page it hits: refused, nothing changed
    assert a.peek_cached_tokens(req(3, 5, [1, 2, 3, 7, 99]), 5) == 4
    assert not a.can_allocate(req(3, 5, [1, 2, 3, 7, 99]), 5)
    assert a.allocate(req(3, 5, [1, 2, 3, 7, 99]), 5) is None
    a.check_invariants()
    # [1, 2, 3, 7]: the last token is computed, so 3 hit; its 4th page evicts the leaf [6] ...
    assert admit(a, req(3, 4, [1, 2, 3, 7])) == 3
    assert a.block_table(3) == [0, 1, 2, 6] and a.evictions == 5
    # ... and the page it then fills (same content 7, but the cached copy is gone) extends its leaf
    assert a.tree_paths() == [([0, 1, 2, 6], 1), ([8, 9, 10, 11, 5, 4, 3, 7], 1)]
    assert a.num_free_blocks == 0
    assert not a.ensure_slots(3, 5)  # locked pages are never evicted
    a.check_invariants()


def test_locked_paths_are_never_evicted():
    a = RadixAllocator(10, block_size=1)
    admit(a, req(0, 4, [1, 2, 3, 4]))
    admit(a, req(1, 6, [1, 2, 3, 4, 5, 6]))  # hits 4, owns [4, 5]
    a.free(1)
    assert a.eviction_order() == [5, 4]  # [0..3] are locked by request 0
    admit(a, req(2, 6, [9, 9, 9, 9, 9, 9]))  # 4 never-used pages + the 2 evictable ones
    assert a.block_table(2) == [6, 7, 8, 9, 5, 4]
    assert a.num_free_blocks == 0 and a.allocate(req(3, 1, [1]), 1) is None
    assert a.tree_paths() == [([0, 1, 2, 3], 1), ([6, 7, 8, 9, 5, 4], 1)]
    a.check_invariants()


def test_lru_order_follows_the_last_release_and_hits_refresh():
    a = RadixAllocator(9, block_size=1)
    for rid, key in enumerate((10, 20, 30)):
        admit(a, req(rid, 3, [key, key + 1, key + 2]))
    for rid in (0, 1, 2):
        a.free(rid)
    assert a.eviction_order() == [2, 1, 0, 5, 4, 3, 8, 7, 6]
    # the same prompt again: 2 pages hit; its last page evicts the LRU leaf, which is the cached
    # copy of that very page (the hit stops short of it: the last token is always computed)
    assert admit(a, req(3, 3, [10, 11, 12])) == 2
    assert a.block_table(3) == [0, 1, 2] and a.evictions == 1
    a.free(3)  # released last: now the most recently used
    assert a.eviction_order() == [5, 4, 3, 8, 7, 6, 2, 1, 0]
    admit(a, req(4, 4, [40, 41, 42, 43]))
    assert a.block_table(4) == [5, 4, 3, 8] and a.evictions == 5
    assert a.eviction_order() == [7, 6, 2, 1, 0]
    a.check_invariants()


def test_duplicate_content_switches_to_the_cached_pages():
    a = RadixAllocator(16, block_size=4)
    r0, r1 = req(0, 14, [1, 2, 3]), req(1, 14, [1, 2, 3])
    assert a.allocate(r0, 14).cached_tokens == 0
    assert a.allocate(r1, 14).cached_tokens == 0  # nothing cached yet: both compute the prompt
    assert a.block_table(0) == [0, 1, 2, 3] and a.block_table(1) == [4, 5, 6, 7]
    assert a.ensure_slots(0, 14)
    assert a.ensure_slots(1, 14)  # its 3 full pages are already in the tree: duplicates freed
    assert a.block_table(1) == [0, 1, 2, 7]
    assert a.free_page_order()[-3:] == [4, 5, 6]
    assert a.tree_paths() == [([0, 1, 2], 2)]
    u = a.usage()
    assert u.token_states_tokens == 14 + 14 - 12 and u.token_states_tokens + u.reservation_tokens \
        + u.internal_frag_tokens == 5 * 4
    a.check_invariants()


def test_last_token_is_always_computed():
    for page, expect in ((4, 8), (1, 11)):
        a = RadixAllocator(32, block_size=page)
        keys = list(range(1, 12 // page + 1))
        admit(a, req(0, 12, keys))
        a.free(0)
        assert a.peek_cached_tokens(req(1, 12, keys), 12) == expect
        assert admit(a, req(1, 12, keys)) == expect
        # one more token: the whole 12-token prompt can hit
        assert a.peek_cached_tokens(req(2, 13, keys + [99] * (page == 1)), 13) == 12


def test_generated_pages_are_unique_and_a_readmitted_request_hits_itself():
    a = RadixAllocator(64, block_size=4)
    r = req(0, 10, [1, 2], output=12)  # 2 full prompt pages; the rest is the request's own
    admit(a, r)
    assert a.ensure_slots(0, 18)  # 8 generated tokens: pages 2, 3 full (keys unique to request 0)
    other = req(1, 17, [1, 2])
    assert a.peek_cached_tokens(other, 17) == 8  # other requests only share the prompt pages
    a.free(0)  # preempted
    assert a.peek_cached_tokens(r, 19) == 16  # readmitted with 19 tokens: all 4 full pages hit
    assert admit(a, r, 19) == 16
    assert unique_key(0, 2) != unique_key(1, 2) and unique_key(0, 2) > np.iinfo(np.int64).max
    a2 = RadixAllocator(64, block_size=4)
    admit(a2, req(0, 10))  # no prefix keys: nothing shared with anyone else
    assert a2.peek_cached_tokens(req(1, 10), 10) == 0
    a2.free(0)
    assert admit(a2, req(0, 10)) == 8


def _trace_keys(prompts, shared, page):
    """Per-token source keys: every prompt starts with the same ``shared`` tokens."""
    keys = [np.array([1 + k if k < shared else 10_000 * (i + 1) + k for k in range(p)], dtype=np.int64)
            for i, p in enumerate(prompts)]
    n = len(prompts)
    t = Trace(arrival_s=np.zeros(n), prompt_tokens=np.array(prompts, dtype=np.int64),
              output_tokens=np.ones(n, dtype=np.int64), source={"kind": "test"}, prefix_keys=keys,
              prefix_block_tokens=1)
    return block_keys(t, page)


@pytest.mark.parametrize("page,shared_pages", [(1, 37), (16, 2), (4, 9), (37, 1)])
def test_token_granular_sharing(page, shared_pages):
    keys = _trace_keys([100, 90], shared=37, page=page)
    a = RadixAllocator(1000 // page, block_size=page)
    r0 = KVRequest(0, 100, 5, 10_000, block_keys=keys[0])
    r1 = KVRequest(1, 90, 5, 10_000, block_keys=keys[1])
    admit(a, r0)
    assert admit(a, r1) == shared_pages * page
    assert len(set(a.block_table(0)) & set(a.block_table(1))) == shared_pages
    assert a.usage().token_states_tokens == 100 + 90 - shared_pages * page


def test_num_free_blocks_is_what_ensure_slots_can_take():
    a = RadixAllocator(20, block_size=2)
    admit(a, req(0, 8, [1, 2, 3, 4]))
    admit(a, req(1, 6, [7, 8, 9], output=100))
    a.free(0)
    assert a.num_free_blocks == 20 - 3 == a.num_empty_pages + a.num_evictable_pages
    held = a.held_tokens(1)
    assert not a.ensure_slots(1, held + 2 * a.num_free_blocks + 1)
    assert a.held_tokens(1) == held
    assert a.ensure_slots(1, held + 2 * a.num_free_blocks)
    assert a.num_free_blocks == 0 and a.evictions == 4
    a.check_invariants()


# -- random sequences ----------------------------------------------------------------------------------

# The random-sequence property runs twice over radix_case(): a hypothesis test
# (KVSIM_PROPERTY_EXAMPLES_HYPOTHESIS examples, default 1,000) and a seeded uniform fuzz test
# (KVSIM_PROPERTY_EXAMPLES cases, default 10,000) drawn from the same space (tests/seeded_fuzz.py).
SETTINGS = settings(max_examples=HYPOTHESIS_EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
MAX_LEN = 96

# An operation (verb, request slot 0..3, prompt tokens 1..24, output / growth tokens 1..16), drawn
# as one integer (generating 4-tuples dominated the run time) and decoded in the test body, not by
# ``.map`` (hypothesis snapshots the global random state around every mapped draw: ~15 % of this
# test's time; the drawn integers, hence the examples, are the same); pools small enough to evict.
VERBS = ("alloc", "grow", "free")


def _decode(n):
    n, verb = divmod(n, 3)
    n, slot = divmod(n, 4)
    n, x = divmod(n, 24)
    return VERBS[verb], slot, x + 1, n % 16 + 1


NUM_OPS, MIN_OPS, MAX_OPS = 3 * 4 * 24 * 16, 10, 40
ops_strategy = st.lists(st.integers(0, NUM_OPS - 1), min_size=MIN_OPS, max_size=MAX_OPS)
PAGE_SIZES, WATERMARKS, FAMILIES = [1, 2, 3, 4], [0.0, 0.1], [1, 2, 3]


def _check_usage(a, written):
    u = a.usage()
    parts = [u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens, u.external_frag_tokens,
             u.free_tokens]
    assert all(p >= 0 for p in parts), parts
    assert sum(parts) == u.capacity_tokens == a.capacity_tokens
    assert u.token_states_tokens == sum(written.values()) - a._shared_extra * a.block_size
    assert u.num_requests == len(written)
    assert u.cached_free_tokens == a.num_evictable_pages * a.block_size <= u.free_tokens
    assert a.usage_parts() == UsageSums(held_tokens=a.ledger.sum_held, useful_tokens=a.ledger.sum_useful,
                                         shared_tokens=a._shared_extra * a.block_size,
                                         cached_free_tokens=u.cached_free_tokens, external_tokens=0)


@SETTINGS
@given(ops=ops_strategy, page=st.sampled_from(PAGE_SIZES), pages=st.integers(1, 16),
       watermark=st.sampled_from(WATERMARKS), families=st.sampled_from(FAMILIES))
def test_random_sequences(ops, page, pages, watermark, families):
    ops = [_decode(n) for n in ops]
    note(f"decoded ops: {ops}")
    radix_case(ops, page, pages, watermark, families)


@pytest.mark.slow  # KVSIM_PROPERTY_EXAMPLES cases: start early under xdist (tests/conftest.py)
def test_random_sequences_seeded_fuzz():
    run_fuzz("radix", lambda rng: dict(ops=[_decode(n) for n in int_list(rng, NUM_OPS, MIN_OPS, MAX_OPS)],
                                       page=rng.choice(PAGE_SIZES), pages=rng.randint(1, 16),
                                       watermark=rng.choice(WATERMARKS), families=rng.choice(FAMILIES)),
             radix_case)


def radix_case(ops, page, pages, watermark, families):
    """``ops``: decoded operations (_decode). Requests of the same family (slot % families) share their
    prompt's leading content, with a family-and-slot-specific tail so prompts diverge at token
    granularity. After every operation: check_invariants; the usage parts sum to capacity with shared
    pages counted once; peek and can_allocate agree with allocate; evictions take exactly the LRU-leaf
    order; while nothing has been evicted, a hit is the longest prefix of the request's keys among all
    content ever inserted."""
    a = RadixAllocator(pages, page, watermark)
    written: dict[int, int] = {}
    reqs: dict[int, KVRequest] = {}
    slot_to_id: dict[int, int] = {}
    inserted: set[tuple] = set()  # every prefix (tuple of keys) ever cached
    next_id = 0

    def keys_for(slot, prompt):
        fam = slot % families
        n = prompt // page
        cut = (slot * 7) % (n + 1)
        return [1000 * fam + k if k < n - cut else 100_000 + 1000 * slot + k for k in range(n)]

    def remember(rid):
        q = a._keys(reqs[rid], written[rid] // page)
        for m in range(1, written[rid] // page + 1):
            inserted.add(tuple(q[:m]))

    evicted: list[int] = []
    evict = a._evict

    def spy(n):
        out = evict(n)
        evicted.extend(out)
        return out

    a._evict = spy
    for verb, slot, x, y in ops:
        rid = slot_to_id.get(slot)
        order0 = a.eviction_order()
        ev0 = a.evictions
        evicted.clear()
        hit_pages: set[int] = set()
        if verb == "alloc" and rid is None:
            r = KVRequest(next_id, x, y, MAX_LEN, block_keys=np.array(keys_for(slot, x), dtype=np.int64))
            next_id += 1
            peek = a.peek_cached_tokens(r, x)
            can = a.can_allocate(r, x)
            got = a.allocate(r, x)
            assert can == (got is not None)
            assert 0 <= peek < x and peek % page == 0
            if a.evictions == 0:
                q = a._keys(r, (x - 1) // page)
                best = max((m for m in range((x - 1) // page + 1) if m == 0 or tuple(q[:m]) in inserted))
                assert peek == best * page, (peek, best)
            if got is None:
                need = cdiv(x, page) - peek // page
                assert a.num_free_blocks - need < a.watermark_pages + peek // page
            else:
                assert got.cached_tokens == peek
                hit_pages = set(a.block_table(r.request_id)[:peek // page])
                assert a.ensure_slots(r.request_id, x)
                slot_to_id[slot] = r.request_id
                reqs[r.request_id] = r
                written[r.request_id] = x
                remember(r.request_id)
        elif verb == "grow" and rid is not None:
            r = reqs[rid]
            target = min(written[rid] + y, r.final_kv_tokens)
            before = a.held_tokens(rid)
            free_before = a.num_free_blocks
            need = cdiv(target, page) - cdiv(before, page)
            if a.ensure_slots(rid, target):
                assert need <= free_before
                written[rid] = target
                remember(rid)
                assert a.held_tokens(rid) >= target
            else:
                assert need > free_before and a.held_tokens(rid) == before, "a failed grow changed the allocation"
        elif verb == "free" and rid is not None:
            a.free(rid)
            del slot_to_id[slot]
            del written[rid]
        a.check_invariants()
        _check_usage(a, written)
        assert len(evicted) == a.evictions - ev0
        assert evicted == [p for p in order0 if p not in hit_pages][:len(evicted)]


# -- end to end --------------------------------------------------------------------------------------

def _mooncake(alloc, n=300):
    from kvsim.config import Scenario

    return Scenario.model_validate({
        "trace": {"file": "traces/mooncake_synthetic.jsonl.gz", "max_requests": n},
        "model": {"preset": "Llama-3-8B", "max_model_len_tokens": 262144},
        "kv_budget": {"tokens": 200_000_000, "allow_beyond_gpu": True},  # an unbounded cache
        "timing": {"kind": "constant"},
        "allocator": alloc,
    })


@pytest.fixture(scope="module")
def mooncake_runs():
    from kvsim.simulate import run

    out = {}
    for name, alloc in (("paged16", {"kind": "paged", "block_size": 16, "prefix_caching": True}),
                        ("radix16", {"kind": "radix", "page_size": 16}),
                        ("radix1", {"kind": "radix", "page_size": 1})):
        t0 = time.perf_counter()
        out[name] = run(_mooncake(alloc), base_dir=REPO, check_invariants=False)
        out[name].wall_s = time.perf_counter() - t0
    return out


def test_unbounded_cache_radix_matches_paged_and_page_1_hits_at_least_as_much(mooncake_runs):
    hit = {k: r.summary["prefix_cache"]["hit_ratio_tokens"] for k, r in mooncake_runs.items()}
    tokens = {k: r.summary["prefix_cache"]["hit_tokens"] for k, r in mooncake_runs.items()}
    print("hit ratio (tokens):", hit, "hit tokens:", tokens,
          "wall s:", {k: round(r.wall_s, 2) for k, r in mooncake_runs.items()})
    assert all(r.summary["requests_finished"] == 300 for r in mooncake_runs.values())
    assert hit["radix16"] == hit["paged16"] > 0
    assert tokens["radix16"] == tokens["paged16"]
    # same hits, same (constant) step times: the very same request timeline
    pd.testing.assert_frame_equal(mooncake_runs["radix16"].requests, mooncake_runs["paged16"].requests,
                                  check_exact=True)
    assert hit["radix1"] >= hit["radix16"]
    assert mooncake_runs["radix16"].summary["prefix_cache"]["evictions"] == 0


def _bounded(mode, page, with_keys=True, seed=6):
    from helpers import make_scenario, make_trace
    from kvsim.simulate import run

    rng = np.random.default_rng(seed)
    n = 250
    arrivals = np.cumsum(rng.exponential(1 / 40.0, n))
    prompts = rng.integers(32, 400, n)
    outputs = rng.integers(1, 120, n)
    rows = list(zip(arrivals, prompts, outputs))
    # four families sharing 16-token source blocks; keys chained per family, with request-specific tails
    keys = [np.array([1000 * (i % 4) + k if k < (int(p) // 16) * 2 // 3 else 10**6 * (i + 1) + k
                      for k in range(cdiv(int(p), 16))], dtype=np.int64) for i, (_, p, _) in enumerate(rows)]
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 4000},
                        timing={"kind": "analytical", "step_overhead_s": 0.001},
                        allocator={"kind": "radix", "page_size": page})
    trace = make_trace(rows)
    if with_keys:
        object.__setattr__(trace, "prefix_keys", keys)
        object.__setattr__(trace, "prefix_block_tokens", 16)
    return run(scn, trace=trace, check_invariants=True)


@pytest.mark.parametrize("page,with_keys", [(1, True), (16, True), (4, False)])
def test_fast_engine_equals_step_engine_under_memory_pressure(page, with_keys):
    step, fast = _bounded("step", page, with_keys), _bounded("fast", page, with_keys)
    pd.testing.assert_frame_equal(step.requests, fast.requests, check_exact=True)
    assert fast.summary["engine_steps"] == step.summary["engine_steps"]
    assert len(fast.steps) < len(step.steps), "the fast engine advanced no window"
    for key in ("hit_ratio_tokens", "hit_tokens", "evictions"):
        assert step.summary["prefix_cache"][key] == fast.summary["prefix_cache"][key], key
    assert step.summary["preemptions"] > 0
    assert step.summary["prefix_cache"]["evictions"] > 0
    if with_keys:
        assert step.summary["prefix_cache"]["hit_ratio_tokens"] > 0.1
    else:  # without prefix keys nothing is shared: only readmissions hit their own pages
        assert step.summary["prefix_cache"]["hit_ratio_tokens"] == 0


def _repeats(alloc, prompt, eviction="lru"):
    """Twelve requests with the very same ``prompt``-token prompt, 50 ms apart, 200 output tokens
    each, on a KV cache that cannot hold them all (docs/radix.md, "Paged vs radix")."""
    rows = [(0.05 * i, prompt, 200) for i in range(12)]
    keys = [np.arange(1, prompt // 16 + 1, dtype=np.int64) for _ in rows]  # every full prompt block shared
    return _keyed_run(rows, keys, 1600, alloc, eviction)


def _keyed_run(rows, keys, tokens: int, alloc: dict, eviction: str):
    """``rows`` (arrival, prompt, output) with 16-token prefix ``keys``, on a ``tokens``-token cache."""
    from helpers import make_scenario, make_trace
    from kvsim.simulate import run

    trace = make_trace(rows)
    object.__setattr__(trace, "prefix_keys", keys)
    object.__setattr__(trace, "prefix_block_tokens", 16)
    scn = make_scenario(kv_budget={"tokens": tokens}, timing={"kind": "analytical", "step_overhead_s": 0.001},
                        allocator={**alloc, "block_size": 16, "watermark": 0.0, "eviction": eviction})
    return run(scn, trace=trace, check_invariants=True)


@pytest.mark.parametrize("prompt,same", [(255, True), (256, False)])
def test_paged_and_radix_lru_differ_under_pressure_only_by_the_recomputed_duplicate_block(prompt, same):
    # An exact repeat of a 256-token prompt cannot hit its last block (the last token is always
    # computed), so it computes block 15 again: the paged allocator keeps that duplicate until the
    # request ends (vLLM), the radix cache frees it at once (SGLang): one block less per repeat,
    # fewer preemptions. At 255 tokens the last block is partial, nothing is duplicated, and the two
    # LRU orders (free queue vs leaves) evict the same content: the same table bit for bit.
    paged = _repeats({"kind": "paged", "prefix_caching": True}, prompt)
    radix = _repeats({"kind": "radix"}, prompt)
    assert paged.summary["prefix_cache"]["evictions"] > 0 and paged.summary["preemptions"] > 0
    assert paged.summary["prefix_cache"]["hit_tokens"] == radix.summary["prefix_cache"]["hit_tokens"]
    if same:
        pd.testing.assert_frame_equal(paged.requests, radix.requests, check_exact=True)
    else:
        assert radix.summary["preemptions"] < paged.summary["preemptions"]


def _families(alloc, eviction):
    """150 requests of six prompt families (odd lengths: no full last block, so nothing is
    recomputed as a duplicate), at 20/s, on a 3,000-token cache."""
    rng = np.random.default_rng(1)
    n = 150
    rows = [(a, int(p) | 1, 60) for a, p in zip(np.cumsum(rng.exponential(1 / 20, n)), rng.integers(64, 600, n))]
    fam = rng.integers(0, 6, n)
    keys = [np.array([1000 * f + k if k < (p // 16) * 3 // 4 else 10**6 * (i + 1) + k for k in range(p // 16)],
                     dtype=np.int64) for i, ((_, p, _), f) in enumerate(zip(rows, fam))]
    return _keyed_run(rows, keys, 3000, alloc, eviction)


@pytest.mark.parametrize("eviction,same", [("lru", True), ("fifo", False)])
def test_paged_and_radix_other_eviction_kinds_differ_without_duplicates(eviction, same):
    # LRU: the free queue's order (last release, tail of a chain first) is the radix cache's leaf
    # order, so without duplicates the tables agree. Other kinds score every cached free block on the
    # paged side: FIFO evicts a chain's head (cached first) and orphans its tail; the radix cache
    # evicts leaves only, keeps the head and hits more.
    paged = _families({"kind": "paged", "prefix_caching": True}, eviction)
    radix = _families({"kind": "radix"}, eviction)
    assert paged.summary["prefix_cache"]["evictions"] > 0
    if same:
        pd.testing.assert_frame_equal(paged.requests, radix.requests, check_exact=True)
    else:
        assert paged.summary["prefix_cache"]["hit_tokens"] < radix.summary["prefix_cache"]["hit_tokens"]
