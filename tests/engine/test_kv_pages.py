"""``kv_pages_read``: the pages (blocks) attention reads, exact in step and fast engines."""

import math

import numpy as np
import pytest

from helpers import make_scenario, make_trace
from kvsim.fast.window import pages_per_step
from kvsim.simulate import run


def brute_pages(remaining, length0, weights, kcap, bs):
    out = []
    for j in range(kcap):
        out.append(sum(w * (1 if bs is None else math.ceil((a + j) / bs))
                       for r, a, w in zip(remaining, length0, weights) if r > j))
    return out


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_pages_per_step_matches_brute_force(seed, dense, monkeypatch):
    import kvsim.fast.window as window

    monkeypatch.setattr(window, "DENSE_PAGES_MAX", 1 << 30 if dense else 0)  # both evaluations
    rng = np.random.default_rng(seed)
    b = int(rng.integers(1, 30))
    bs = [None, 1, 2, 3, 16, 17, 5][seed % 7]
    remaining = np.sort(rng.integers(1, 50, b)).astype(np.int64)
    length0 = rng.integers(1, 300, b).astype(np.int64)
    weights = rng.integers(1, 4, b).astype(np.int64) if seed % 2 else None  # None: one sequence each
    kcap = int(rng.integers(1, 60))
    done_by = np.searchsorted(remaining, np.arange(kcap), side="right")
    got = pages_per_step(remaining, length0, weights, done_by, bs)
    assert got.dtype == np.int64
    w = np.ones(b, np.int64) if weights is None else weights
    assert got.tolist() == brute_pages(remaining, length0, w, kcap, bs)


@pytest.mark.parametrize("mode", ["step", "fast"])
@pytest.mark.parametrize("allocator,bs", [({"kind": "paged", "block_size": 16}, 16),
                                          ({"kind": "paged", "block_size": 16, "prefix_caching": True}, 16),
                                          ({"kind": "radix", "page_size": 4}, 4),
                                          ({"kind": "contiguous"}, None),
                                          ({"kind": "buddy"}, None)])
def test_one_request_reads_ceil_context_over_block_size(mode, allocator, bs):
    prompt, output = 37, 50
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 4096}, allocator=allocator)
    res = run(scn, trace=make_trace([(0.0, prompt, output)]), check_invariants=True)
    # step 0 computes the prompt (reads 37 tokens); decode step j reads prompt + j tokens
    contexts = [prompt] + [prompt + j for j in range(1, output)]
    want = sum(1 if bs is None else math.ceil(c / bs) for c in contexts)
    assert int(res.steps["kv_pages_read"].sum()) == want
    assert int(res.steps["kv_tokens_read" if "kv_tokens_read" in res.steps else "kv_bytes_read"].sum()) > 0
    if mode == "fast":
        assert len(res.steps) < output  # windows were taken


@pytest.mark.parametrize("allocator", [{"kind": "paged", "block_size": 8}, {"kind": "contiguous"}])
def test_parallel_samples_read_pages_per_sequence(allocator):
    # two requests with 3 samples each: every sample is a sequence reading its whole context
    rows = [(0.0, 20, 30), (0.0, 9, 12)]
    out = {}
    for mode in ("step", "fast"):
        # (contiguous reserves max_model_len per sample: room for both requests at once)
        scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 32768}, allocator=allocator)
        trace = make_trace(rows)
        object.__setattr__(trace, "num_samples", np.array([3, 3], np.int64))
        out[mode] = run(scn, trace=trace, check_invariants=True)
    bs = allocator.get("block_size")
    want = 0
    for prompt, output in ((20, 30), (9, 12)):
        want += 1 if bs is None else math.ceil(prompt / bs)  # the prompt step: one sequence
        want += sum(3 * (1 if bs is None else math.ceil((prompt + j) / bs)) for j in range(1, output))
    assert out["step"].summary["requests_finished"] == 2
    assert int(out["step"].steps["kv_pages_read"].sum()) == want
    assert int(out["fast"].steps["kv_pages_read"].sum()) == want


@pytest.mark.parametrize("stay_sums", [0, 1 << 30])
@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("allocator", [{"kind": "paged", "block_size": 16}, {"kind": "contiguous"},
                                       {"kind": "paged", "block_size": 16, "prefix_caching": True},
                                       {"kind": "paged", "block_size": 12}])
def test_window_arrays_both_evaluations_equal_step_mode(allocator, dense, stay_sums, monkeypatch):
    """Group windows take members as (step, member) pairs (dense) or per finish order (sparse), and
    the members outlasting the window either one by one or as the group's sums (always / never:
    ``MIN_STAY_SUMS``): every way gives the step-by-step engine's page, byte and token counts."""
    import pandas as pd

    import kvsim.fast.group_window as group_window
    import kvsim.fast.window as window

    monkeypatch.setattr(window, "DENSE_PAGES_MAX", 1 << 30 if dense else 0)
    monkeypatch.setattr(group_window, "MIN_STAY_SUMS", stay_sums)
    rng = np.random.default_rng(11)
    n = 60
    rows = list(zip(np.cumsum(rng.exponential(1 / 25.0, n)), rng.integers(1, 300, n), rng.integers(1, 150, n)))
    out = {}
    for mode in ("step", "fast"):
        scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 3000}, allocator=allocator,
                            timing={"kind": "analytical", "step_overhead_s": 0.001})
        out[mode] = run(scn, trace=make_trace(rows), check_invariants=True)
    pd.testing.assert_frame_equal(out["step"].requests, out["fast"].requests, check_exact=True)
    assert len(out["fast"].steps) < len(out["step"].steps)
    for col in ("kv_pages_read", "kv_bytes_read", "decode_tokens"):
        assert int(out["fast"].steps[col].sum()) == int(out["step"].steps[col].sum()), col
