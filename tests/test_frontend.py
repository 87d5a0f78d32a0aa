"""The front end (kvsim/frontend.py): FIFO API-server processes before the engine."""

import numpy as np
import pytest

from kvsim.config import load_scenario
from kvsim.frontend import departures, service_s
from kvsim.simulate import run

SCENARIO = """\
trace:
  synthetic:
    num_requests: 60
    arrival: {process: poisson, rate_per_s: 200.0}
    prompt_tokens: {kind: fixed, value: 128}
    output_tokens: {kind: fixed, value: 4}
model: Llama-3-8B
gpu: H100-SXM-80GB
"""


def _run(tmp_path, extra: str = ""):
    f = tmp_path / f"s{abs(hash(extra))}.yaml"
    f.write_text(SCENARIO + extra)
    return run(load_scenario(f).base, tmp_path, check_invariants=True)


def test_one_server_is_the_fifo_recurrence():
    arr = np.array([0.0, 0.0, 0.05, 1.0])
    svc = np.array([0.1, 0.2, 0.1, 0.3])
    # done_i = max(arrival_i, done_{i-1}) + input_i
    assert departures(arr, svc, 1).tolist() == pytest.approx([0.1, 0.3, 0.4, 1.3])


def test_several_servers_share_the_load_and_hand_on_in_order():
    arr = np.zeros(4)
    svc = np.array([1.0, 0.1, 0.1, 0.1])
    # two servers: requests 1-3 go to the free one; request 1 is done at 0.1 but waits for request 0
    assert departures(arr, svc, 2).tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0])
    assert departures(np.zeros(3), np.full(3, 0.1), 2).tolist() == pytest.approx([0.1, 0.1, 0.2])


def test_service_is_per_request_plus_per_token():
    inp, out = service_s(np.array([100, 1000]), np.array([4, 64]), 1e-3, 2e-6, 1e-4)
    assert inp.tolist() == pytest.approx([1e-3 + 2e-4, 1e-3 + 2e-3]) and out.tolist() == pytest.approx([4e-4, 6.4e-3])


def test_zero_cost_front_end_changes_no_figure(tmp_path):
    base, zero = _run(tmp_path), _run(tmp_path, "frontend: {servers: 2}\n")
    cols = [c for c in base.requests.columns]
    assert base.requests[cols].equals(zero.requests[cols])
    assert (zero.requests["frontend_s"] == 0).all()
    assert "frontend" not in base.summary and zero.summary["frontend"]["max_s"] == 0.0
    assert base.summary["serving"] == zero.summary["serving"]


def test_a_saturated_front_end_caps_throughput_and_counts_in_ttft(tmp_path):
    base = _run(tmp_path)
    slow = _run(tmp_path, "frontend: {per_request_s: 0.02}\n")  # 50 requests/s at most, offered 200
    r, b = slow.requests, base.requests
    assert (r["arrival_s"] == b["arrival_s"]).all()  # the client's arrivals
    assert (r["frontend_s"] >= 0.02 - 1e-12).all()
    assert (r["ttft_s"] >= r["frontend_s"]).all() and (r["e2e_s"] >= r["frontend_s"]).all()
    # the i-th request leaves the single server no earlier than (i + 1) x 20 ms after the first arrival
    leave = r["arrival_s"] + r["frontend_s"]
    assert (leave.to_numpy() >= r["arrival_s"].iloc[0] + 0.02 * np.arange(1, len(r) + 1) - 1e-9).all()
    assert slow.summary["serving"]["request_throughput"] <= 50.0 + 1e-9
    assert slow.summary["serving"]["request_throughput"] < base.summary["serving"]["request_throughput"]
    assert slow.summary["frontend"]["per_request_s"] == 0.02
    # output work is not queued: it shows as the servers' utilisation
    outw = _run(tmp_path, "frontend: {per_request_s: 0.001, per_output_token_s: 0.01}\n")
    assert (outw.requests["frontend_s"] < 0.001 * len(outw.requests)).all()
    u = outw.summary["frontend"]["utilisation"]
    span = outw.requests["finish_s"].max() - outw.requests["arrival_s"].min()
    assert u == pytest.approx(len(outw.requests) * (0.001 + 4 * 0.01) / span)
    # two servers double the front end's capacity
    two = _run(tmp_path, "frontend: {per_request_s: 0.02, servers: 2}\n")
    assert two.summary["frontend"]["mean_s"] < slow.summary["frontend"]["mean_s"]


def test_fast_and_step_engines_agree_with_a_front_end(tmp_path):
    fe = "frontend: {per_request_s: 0.004, per_output_token_s: 0.001}\n"
    fast, step = _run(tmp_path, fe + "engine: {mode: fast}\n"), _run(tmp_path, fe + "engine: {mode: step}\n")
    assert fast.requests.equals(step.requests)
