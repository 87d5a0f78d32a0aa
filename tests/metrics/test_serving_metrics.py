"""Serving metrics as vLLM's benchmark names them: TTFT / TPOT / ITL / E2EL distributions in ms,
token throughputs, goodput and SLO attainment, configurable percentiles, and the KV bytes read."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from helpers import make_scenario, make_trace
from kvsim.metrics.itl import ITLAccumulator
from kvsim.metrics.summarize import good_requests, serving_metrics, slo_metrics
from kvsim.sched.scheduler import Scheduler
from kvsim.simulate import run

TIMING = {"kind": "analytical", "step_overhead_s": 0.001}


def random_rows(n, seed, rate=30.0, prompt=(1, 200), output=(1, 100)):
    rng = np.random.default_rng(seed)
    return list(zip(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(*prompt, n), rng.integers(*output, n)))


def token_times(scn, rows):
    """Run in step mode, recording every request's token times from the scheduler (ground truth)."""
    times: dict[int, list[float]] = {}
    orig = Scheduler.on_step_done

    def spy(self, now_s):
        # the scheduled requests are all in ``requests`` before the step (finished ones leave it)
        before = {rid: (r, r.num_generated) for rid, r in self.requests.items()}
        out = orig(self, now_s)
        self.sync_progress()
        for rid, (r, generated) in before.items():
            if r.num_generated > generated:
                times.setdefault(rid, []).append(now_s)
        return out

    Scheduler.on_step_done = spy
    try:
        res = run(scn, trace=make_trace(rows))
    finally:
        Scheduler.on_step_done = orig
    return res, times


def test_itl_matches_per_token_ground_truth_without_preemption():
    rows = random_rows(40, 1)
    scn = make_scenario(engine={"mode": "step"}, kv_budget={"tokens": 100_000, "allow_beyond_gpu": True}, timing=TIMING)
    res, times = token_times(scn, rows)
    assert res.summary["preemptions"] == 0
    gaps = np.concatenate([np.diff(t) for t in times.values() if len(t) > 1])
    itl = res.summary["itl_s"]
    assert gaps.size == int((res.requests["output_tokens"] - 1).sum())
    assert math.isclose(itl["mean"], gaps.mean(), rel_tol=1e-9)
    assert math.isclose(itl["std"], gaps.std(), rel_tol=1e-6)
    assert itl["max"] == pytest.approx(gaps.max(), rel=1e-12)
    for q in (50, 90, 99):
        assert itl[f"p{q}"] == pytest.approx(np.percentile(gaps, q), rel=0.006)
    # prefill steps stall the decodes running with them: the longest gap is well above the median
    assert itl["max"] > 2 * itl["p50"]
    ms = res.summary["serving"]["itl_ms"]
    assert ms["mean"] == pytest.approx(itl["mean"] * 1000) and ms["median"] == pytest.approx(itl["p50"] * 1000)
    assert itl["stall_s_total"] == 0.0 and itl["mean_with_stalls_s"] == pytest.approx(itl["mean"], rel=1e-9)


def test_itl_stalls_of_preempted_requests_are_counted_exactly():
    rows = random_rows(60, 2)
    scn = make_scenario(engine={"mode": "step"}, kv_budget={"tokens": 600}, timing=TIMING)
    res, times = token_times(scn, rows)
    assert res.summary["preemptions"] > 0
    gaps = np.concatenate([np.diff(t) for t in times.values() if len(t) > 1])
    itl = res.summary["itl_s"]
    # the step-level distribution misses the gaps that span a preemption; the stall total and the
    # mean over every gap (vLLM's mean ITL) are exact
    assert itl["mean_with_stalls_s"] == pytest.approx(gaps.mean(), rel=1e-9)
    assert itl["stall_s_total"] > 0 and itl["max"] < gaps.max()
    assert itl["stall_s_total"] == pytest.approx(gaps.sum() - itl["mean"] * _count(res), rel=1e-6)


def _count(res):
    """Decode tokens in the run: the step rows' decode_tokens."""
    return int(res.steps.loc[~res.steps["idle"], "decode_tokens"].sum())


@pytest.mark.parametrize("budget", [100_000, 600])
def test_itl_identical_in_fast_and_step_engines(budget):
    rows = random_rows(60, 2)
    out = {}
    for mode in ("step", "fast"):
        scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": budget, "allow_beyond_gpu": True}, timing=TIMING)
        out[mode] = run(scn, trace=make_trace(rows))
    s, f = out["step"].summary, out["fast"].summary
    assert len(out["fast"].steps) < len(out["step"].steps)  # the fast engine did use windows
    for k, v in s["itl_s"].items():
        assert math.isclose(v, f["itl_s"][k], rel_tol=1e-9), k
    if budget == 600:
        assert s["preemptions"] > 0


def test_itl_accumulator_percentiles_within_a_bin():
    rng = np.random.default_rng(3)
    d = rng.lognormal(-4, 1.0, 5000)
    w = rng.integers(0, 50, 5000)
    acc = ITLAccumulator()
    for x, k in zip(d[:100], w[:100]):
        acc.add(float(x), int(k))
    acc.add_many(d[100:], w[100:])
    pooled = np.repeat(d, w)
    s = acc.summary((1, 50, 99.9))
    assert s["mean"] == pytest.approx(pooled.mean(), rel=1e-12)
    assert s["std"] == pytest.approx(pooled.std(), rel=1e-9)
    for q in (1, 50, 99.9):
        assert s[f"p{q:g}"] == pytest.approx(np.percentile(pooled, q), rel=0.006)
    assert ITLAccumulator().summary()["mean"] is None


def _requests(ttft, tpot, e2e, out, status=None):
    n = len(ttft)
    return pd.DataFrame({
        "status": pd.Series(status or ["finished"] * n, dtype="string"),
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "output_tokens": out,
        "prompt_tokens": [10] * n, "num_samples": [1] * n,
        "first_token_s": [0.0] * n, "finish_s": [e - t for e, t in zip(e2e, ttft)],
    })


def test_goodput_and_attainment_by_hand():
    req = _requests(ttft=[0.1, 0.3, 0.1, 0.1, math.nan], tpot=[0.01, 0.01, 0.05, math.nan, math.nan],
                    e2e=[1.0, 1.2, 3.0, 0.1, math.nan], out=[50, 50, 50, 1, 20],
                    status=["finished"] * 4 + ["rejected"])
    slo = {"ttft_ms": 200.0, "tpot_ms": 20.0}
    # good: #0 (both met), #3 (single token: TPOT counts as 0, as vLLM); #1 late first token, #2 slow
    assert good_requests(req, slo).tolist() == [True, False, False, True, False]
    m = slo_metrics(req, duration_s=2.0, slo=slo)
    assert m["good_requests"] == 2
    assert m["goodput_requests_per_s"] == pytest.approx(1.0)
    assert m["attainment"] == pytest.approx(2 / 5)  # the rejected request misses its SLO
    assert m["attainment_of_finished"] == pytest.approx(2 / 4)
    assert m["met_frac"] == {"ttft_ms": pytest.approx(3 / 5), "tpot_ms": pytest.approx(3 / 5)}
    assert good_requests(req, {"e2e_ms": 1000.0}).tolist() == [True, False, False, True, False]


def test_serving_distributions_match_numpy_and_throughputs():
    req = _requests(ttft=[0.1, 0.2, 0.4], tpot=[0.01, 0.02, math.nan], e2e=[1.0, 2.0, 0.4], out=[91, 91, 1])
    s = serving_metrics(req, duration_s=4.0, itl=None, percentiles=(25.0, 99.0))
    assert s["completed"] == 3 and s["total_input_tokens"] == 30 and s["total_output_tokens"] == 183
    assert s["input_throughput"] == pytest.approx(7.5)
    assert s["output_throughput"] == pytest.approx(183 / 4)
    assert s["total_token_throughput"] == pytest.approx(213 / 4)
    t = s["ttft_ms"]
    assert t["mean"] == pytest.approx(700 / 3) and t["median"] == pytest.approx(200)
    assert t["std"] == pytest.approx(np.std([100, 200, 400]))
    assert t["p25"] == pytest.approx(np.percentile([100, 200, 400], 25)) and "p50" not in t
    assert s["tpot_ms"]["mean"] == pytest.approx(15.0)  # the single-token request has no TPOT
    assert s["itl_ms"]["mean"] is None and s["itl_ms"]["stall_total"] is None
    # mean over every gap: (0.9 + 1.8) s over 90 + 90 gaps (the single-token request has none)
    assert s["itl_ms"]["mean_with_stalls"] == pytest.approx(2700 / 180)


def test_scenario_percentiles_and_slo_reach_summary():
    rows = random_rows(30, 4)
    scn = make_scenario(kv_budget={"tokens": 100_000, "allow_beyond_gpu": True}, timing=TIMING, metrics={"percentiles": [99.9, 75]},
                        slo={"ttft_ms": 50, "e2e_ms": 5000})
    s = run(scn, trace=make_trace(rows)).summary
    assert s["serving"]["percentiles"] == [75.0, 99.9]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert {"mean", "median", "std", "p75", "p99.9", "max"} <= set(s["serving"][name])
    assert s["slo"]["objectives_ms"] == {"ttft_ms": 50.0, "e2e_ms": 5000.0}
    fin = s["requests_finished"]
    assert 0 < s["slo"]["good_requests"] <= fin
    assert s["throughput_total_tokens_per_s"] == pytest.approx(
        s["throughput_input_tokens_per_s"] + s["throughput_output_tokens_per_s"])
    assert make_scenario().slo is None and run(make_scenario(kv_budget={"tokens": 100_000, "allow_beyond_gpu": True}),
                                               trace=make_trace(rows[:3])).summary["slo"] is None


@pytest.mark.parametrize("bad", [{"slo": {}}, {"slo": {"ttft_ms": -1}}, {"slo": {"tpot_ms": float("inf")}},
                                 {"metrics": {"percentiles": [0]}}, {"metrics": {"percentiles": []}}])
def test_bad_slo_and_percentiles_are_refused(bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        make_scenario(**bad)


def test_kv_bytes_read_total_counts_recompute_reads():
    """Without prefix caching or chunking a request reads its prompt once at prefill and
    ``prompt + g`` tokens for its g-th decode; a recompute preemption re-reads ``prompt + G``
    tokens in the step that resumes it (replacing that step's decode read). The total matches the
    formula only if recompute reads are counted."""
    rows = random_rows(60, 2)
    scn = make_scenario(kv_budget={"tokens": 600}, timing=TIMING, engine={"mode": "step"})
    res = run(scn, trace=make_trace(rows))
    assert res.summary["preemptions_by_mode"]["recompute"] > 0
    r = res.requests[res.requests["status"] == "finished"]
    p, o = r["prompt_tokens"].to_numpy(), r["output_tokens"].to_numpy()
    tokens = int((p + (o - 1) * p + (o - 1) * o // 2).sum())
    assert res.summary["kv_bytes_read_total"] == tokens * scn.kv_geometry().step_bytes_per_token
    fast = run(make_scenario(kv_budget={"tokens": 600}, timing=TIMING), trace=make_trace(rows))
    assert fast.summary["kv_bytes_read_total"] == res.summary["kv_bytes_read_total"]


def test_servebench_totals_leave_out_the_token_of_a_zero_token_output():
    """A result file's ``output_lens`` 0: kvsim generates one token for the request (its prefill makes
    one) and the benchmark's client counts none, so servebench's totals leave that token out; an
    unfinished request in the set is not subtracted (it is not in the totals)."""
    from kvsim.servebench.metrics import table_metrics

    req = _requests(ttft=[0.1, 0.2, 0.4, math.nan], tpot=[0.01, 0.02, math.nan, math.nan],
                    e2e=[1.0, 2.0, 0.4, math.nan], out=[91, 91, 1, 1],
                    status=["finished"] * 3 + ["rejected"])
    req["request_id"], req["arrival_s"] = [0, 1, 2, 3], 0.0
    plain = table_metrics(req)
    zero = table_metrics(req, zero_ttft=frozenset({2, 3}), zero_output=frozenset({2, 3}))
    assert plain["total_output_tokens"] == 183 and zero["total_output_tokens"] == 182
    assert zero["output_throughput"] == pytest.approx(plain["output_throughput"] * 182 / 183)
    assert zero["total_token_throughput"] == pytest.approx((30 + 182) / 30 * plain["input_throughput"])
    assert zero["request_throughput"] == plain["request_throughput"] and zero["ttft_ms"]["mean"] == pytest.approx(100)
