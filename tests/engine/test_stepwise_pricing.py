"""Backlogged group windows priced step by step as they run (ScalarDecodeSteps, StepwiseTimes)
give the very tables of the same windows priced in one ``decode_durations`` call: request and step
tables and the summary identical, bit for bit, and the step-by-step path really taken."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from helpers import make_scenario, make_trace
from kvsim.fast.stepwise import StepwiseTimes
from kvsim.simulate import run
from kvsim.timing.analytical import AnalyticalTiming


def _rows(n, seed, rate):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    return list(zip(arrivals, rng.integers(1, 400, n), rng.integers(1, 200, n)))


CASES = {
    "paged-16": dict(allocator={"kind": "paged", "block_size": 16, "watermark": 0.0}),
    "paged-7": dict(allocator={"kind": "paged", "block_size": 7, "watermark": 0.0}),
    "contiguous-max": dict(allocator={"kind": "contiguous", "reservation": "max"}),
    "buddy-pow2": dict(allocator={"kind": "buddy", "block_size": 16, "reservation": "pow2"}),
    "swap": dict(allocator={"kind": "paged", "block_size": 16, "watermark": 0.0},
                 scheduler={"preemption_mode": "swap", "swap_space_bytes": 2 * 10**9}),
    "roofline-attention": dict(allocator={"kind": "paged", "block_size": 16, "watermark": 0.0},
                               timing={"kind": "analytical", "attention_backend": "roofline"}),
    "cpu-overhead": dict(allocator={"kind": "paged", "block_size": 16, "watermark": 0.0},
                         timing={"kind": "analytical", "step_overhead_s": 0.001,
                                 "overhead": {"per_seq_s": 2.5e-6, "per_prefill_token_s": 1e-8}}),
}


def _run(case: str, stepwise: bool, monkeypatch, counter: list):
    with monkeypatch.context() as m:
        if not stepwise:
            m.setattr(AnalyticalTiming, "decode_step_pricer", lambda self: None)
        settle = StepwiseTimes.settle

        def counting(self, k):
            counter.append(k)
            return settle(self, k)

        m.setattr(StepwiseTimes, "settle", counting)
        over = {"timing": {"kind": "analytical", "step_overhead_s": 0.001}, "kv_budget": {"tokens": 6000},
                "model": "Llama-2-7B", **CASES[case]}
        scn = make_scenario(**over)
        return run(scn, trace=make_trace(_rows(400, seed=len(case), rate=60.0)), check_invariants=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_stepwise_windows_equal_windows_priced_at_once(case, monkeypatch):
    taken: list = []
    stepwise = _run(case, True, monkeypatch, taken)
    unused: list = []
    at_once = _run(case, False, monkeypatch, unused)
    assert taken and not unused, "the step-by-step pricing was not (only) where expected"
    assert sum(taken) > 2 * len(taken)  # windows of several steps, not just step 0 and 1
    pd.testing.assert_frame_equal(stepwise.requests, at_once.requests, check_exact=True)
    pd.testing.assert_frame_equal(stepwise.steps, at_once.steps, check_exact=True)
    assert json.dumps(stepwise.summary, sort_keys=True, default=str) == \
        json.dumps(at_once.summary, sort_keys=True, default=str)
    if case == "swap":
        assert stepwise.summary["preemptions_by_mode"]["swap"] > 0


def test_no_step_pricer_without_the_fitted_gemm_model(monkeypatch):
    """The roofline's linear layers have no step pricer: every window is priced at once."""
    scn = make_scenario(timing={"kind": "analytical", "gemm_model": "roofline"}, kv_budget={"tokens": 6000},
                        model="Llama-2-7B", allocator={"kind": "paged", "block_size": 16, "watermark": 0.0})
    taken: list = []
    settle = StepwiseTimes.settle
    monkeypatch.setattr(StepwiseTimes, "settle", lambda self, k: taken.append(k) or settle(self, k))
    res = run(scn, trace=make_trace(_rows(200, seed=1, rate=60.0)))
    assert not taken and (res.steps["num_steps"] > 1).any()  # windows ran, priced at once
