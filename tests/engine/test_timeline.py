"""Exact engine timelines with the constant timing model (SimPy-style ``log == [...]`` tests)."""

import pytest

from helpers import make_scenario, make_trace
from kvsim.simulate import run


def timeline(scn, rows, **kw):
    log = []
    res = run(scn, trace=make_trace(rows), check_invariants=True, event_log=log, **kw)
    return [(rid, ev, round(t, 9)) for rid, ev, t in log], res


def test_three_requests_exact_timeline():
    log, res = timeline(make_scenario(), [(0.0, 10, 3), (0.0, 20, 2), (0.05, 5, 4)])
    assert log == [
        (0, "arrive", 0.0), (1, "arrive", 0.0),
        (0, "admit", 0.0), (1, "admit", 0.0),          # step 1 [0, 0.1): both prompts
        (2, "arrive", 0.05),                           # arrives mid-step, waits for the next plan
        (0, "first_token", 0.1), (1, "first_token", 0.1),
        (2, "admit", 0.1),                             # step 2 [0.1, 0.2)
        (2, "first_token", 0.2), (1, "finish", 0.2),   # request 1's 2nd token
        (0, "finish", 0.3),                            # step 3: request 0's 3rd token
        (2, "finish", 0.5),                            # steps 4, 5
    ]
    r = res.requests.set_index("request_id")
    assert list(r["ttft_s"].round(9)) == [0.1, 0.1, 0.15]
    assert list(r["e2e_s"].round(9)) == [0.3, 0.2, 0.45]
    assert list(r["tpot_s"].round(9)) == [0.1, 0.1, 0.1]
    assert res.summary["engine_steps"] == 5
    assert res.summary["duration_s"] == pytest.approx(0.5)


def test_idle_gap_is_recorded_and_time_weighted():
    log, res = timeline(make_scenario(), [(0.0, 4, 1), (1.0, 4, 1)])
    assert log == [(0, "arrive", 0.0), (0, "admit", 0.0), (0, "first_token", 0.1), (0, "finish", 0.1),
                   (1, "arrive", 1.0), (1, "admit", 1.0), (1, "first_token", 1.1), (1, "finish", 1.1)]
    steps = res.steps
    assert list(steps["idle"]) == [False, True, False]
    assert steps["duration_s"].sum() == pytest.approx(1.1)
    # one request running during 0.2 s of 1.1 s
    assert res.summary["concurrency"]["mean"] == pytest.approx(0.2 / 1.1)


def test_preemption_recompute_latest_admitted_goes_back_to_the_front():
    # 16 slots (4 blocks of 4). Two requests of prompt 4 each grow; the later one is preempted.
    scn = make_scenario(kv_budget={"tokens": 16})
    log, res = timeline(scn, [(0.0, 4, 10), (0.0, 4, 10)])
    events = [(r, e) for r, e, _ in log]
    assert (1, "preempt") in events
    pre = next(t for r, e, t in log if (r, e) == (1, "preempt"))
    readmit = [t for r, e, t in log if (r, e) == (1, "admit")]
    assert len(readmit) == 2 and readmit[1] > pre
    r = res.requests.set_index("request_id")
    assert r.loc[0, "preemptions"] == 0 and r.loc[1, "preemptions"] >= 1
    assert r.loc[1, "recomputed_tokens"] > 0
    assert res.summary["preemptions"] == int(r["preemptions"].sum())
    assert (r["status"] == "finished").all()
    # request 0 is never delayed by request 1: it decodes one token per step
    assert r.loc[0, "e2e_s"] == pytest.approx(1.0)


def test_requests_that_can_never_run_are_rejected_and_counted():
    scn = make_scenario(kv_budget={"tokens": 16})
    rows = [(0.0, 30, 5), (0.0, 2040, 20), (0.1, 4, 2)]  # too big for KV; too long for OPT (2048)
    log, res = timeline(scn, rows)
    assert (0, "reject", 0.0) in log and (1, "reject", 0.0) in log
    s = res.summary
    assert s["requests_rejected"] == 2 and s["requests_finished"] == 1
    assert s["rejected_by_reason"] == {"exceeds_kv_capacity": 1, "exceeds_max_model_len": 1}


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    scn = make_scenario(kv_budget={"tokens": 1024},
                        scheduler={"chunked_prefill": True, "max_num_batched_tokens": 16})
    log, res = timeline(scn, [(0.0, 40, 2)])
    # 40 prompt tokens at 16 per step: 3 steps to the first token, one more for the second
    assert log[-2:] == [(0, "first_token", 0.3), (0, "finish", 0.4)]
    assert list(res.steps["prefill_tokens"]) == [16, 16, 8, 0]


def test_max_num_seqs_limits_admission():
    scn = make_scenario(kv_budget={"tokens": 1024}, scheduler={"max_num_seqs": 1})
    log, res = timeline(scn, [(0.0, 4, 2), (0.0, 4, 2)])
    admits = [t for r, e, t in log if e == "admit"]
    assert admits == [0.0, 0.2]
    assert res.summary["concurrency"]["max"] == 1


@pytest.mark.parametrize("alloc", [
    {"kind": "paged", "block_size": 1}, {"kind": "paged", "block_size": 16},
    {"kind": "contiguous", "reservation": "max"}, {"kind": "contiguous", "reservation": "pow2"},
    {"kind": "contiguous", "reservation": "oracle", "placement": "best-fit"},
    {"kind": "buddy", "min_block_tokens": 8},
])
def test_every_allocator_runs_a_random_trace_with_invariants(alloc):
    import numpy as np

    rng = np.random.default_rng(1)
    n = 120
    rows = list(zip(np.sort(rng.uniform(0, 5, n)), rng.integers(1, 300, n), rng.integers(1, 100, n)))
    scn = make_scenario(kv_budget={"tokens": 1500}, allocator=alloc)
    _, res = timeline(scn, rows)
    s = res.summary
    assert s["requests_finished"] + s["requests_rejected"] == n
    fr = [s["kv"][f"{p}_frac"] for p in ("token_states", "reservation", "internal_frag", "external_frag", "free")]
    assert sum(fr) == pytest.approx(1.0)
    steps = res.steps
    five = ["token_states_bytes", "reservation_bytes", "internal_frag_bytes", "external_frag_bytes", "free_bytes"]
    parts = steps[five].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(s["kv"]["capacity_bytes"], rel=1e-12)


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_pulled_arrivals_equal_an_arrival_process(mode, monkeypatch):
    # One replica queues arrivals itself after each wait; several use a SimPy arrival process.
    # Forcing the process on one replica must change nothing: tables, step rows, event order.
    import numpy as np

    from kvsim.engine import Engine

    rng = np.random.default_rng(5)
    n = 120
    arrivals = np.cumsum(rng.exponential(0.05, n))
    arrivals[40:] += 3.0  # an idle gap
    rows = list(zip(arrivals, rng.integers(1, 300, n), rng.integers(1, 80, n)))
    rows[7] = (rows[7][0], 5000, 5)  # rejected: longer than the model
    rows[50] = (rows[49][0], 10, 3)  # two arrivals at the same time
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 3000},
                        timing={"kind": "analytical", "step_overhead_s": 0.001},
                        allocator={"kind": "paged", "block_size": 16, "watermark": 0.0})
    pulled, res_pulled = timeline(scn, rows)
    init = Engine.__init__

    def with_process(self, *a, **k):
        init(self, *a, **k)
        self._pull = False

    monkeypatch.setattr(Engine, "__init__", with_process)
    processed, res_processed = timeline(scn, rows)
    assert pulled == processed
    assert ("reject" in {e for _, e, _ in pulled}) and len(pulled) > 3 * n
    import pandas as pd

    pd.testing.assert_frame_equal(res_pulled.requests, res_processed.requests, check_exact=True)
    pd.testing.assert_frame_equal(res_pulled.steps, res_processed.steps, check_exact=True)
