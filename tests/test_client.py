"""The closed-loop benchmark client (kvsim/client.py): at most N requests in flight."""

import subprocess
import sys

import numpy as np
import pytest

from kvsim.client import ClosedLoopClient
from kvsim.config import load_scenario
from kvsim.simulate import run

SCENARIO = """\
trace:
  synthetic:
    num_requests: 40
    arrival: {process: poisson, rate_per_s: 100.0}
    prompt_tokens: {kind: uniform, low: 32, high: 600}
    output_tokens: {kind: uniform, low: 1, high: 40}
model: Llama-3-8B
gpu: H100-SXM-80GB
kv_budget: {bytes: 1073741824}   # 8K tokens: a small block pool keeps the invariant checks quick
"""


def _run(tmp_path, extra: str = "", check: bool = True):
    f = tmp_path / f"s{abs(hash(extra))}.yaml"
    f.write_text(SCENARIO + extra)
    return run(load_scenario(f).base, tmp_path, check_invariants=check)


def _max_in_flight(sent: np.ndarray, finish: np.ndarray) -> int:
    """The most requests sent and not finished at once (a finish at t frees its slot before a send at t)."""
    events = sorted([(t, 1) for t in sent] + [(t, -1) for t in finish])
    level = top = 0
    for _, d in events:
        level += d
        top = max(top, level)
    return top


def test_slots_send_in_order_at_the_later_of_arrival_and_free_slot():
    c = ClosedLoopClient(np.array([0.0, 0.0, 0.5, 2.0]), 2)
    assert c.sent_s[:2].tolist() == [0.0, 0.0] and np.isinf(c.engine_arrival_s[2:]).all() and c.pending
    c.ended(1, 1.0)  # request 2 arrived at 0.5 and waited for this slot
    assert c.sent_s[2] == 1.0 and np.isinf(c.engine_arrival_s[3])
    c.ended(1, 1.5)  # request 3 has not arrived yet: it is sent when it arrives
    assert c.sent_s[3] == 2.0 and not c.pending
    assert c.queue_s().tolist() == [0.0, 0.0, 0.5, 0.0]
    with pytest.raises(RuntimeError):
        c.ended(3, 3.0)  # only 2 in flight


def test_send_goes_through_the_front_end_when_given():
    c = ClosedLoopClient(np.zeros(3), 1, depart=lambda i, t: t + 0.25 * (i + 1))
    assert c.engine_arrival_s[0] == 0.25 and c.sent_s[0] == 0.0
    c.ended(1, 1.0)
    assert c.sent_s[1] == 1.0 and c.engine_arrival_s[1] == 1.5


@pytest.mark.parametrize("n", [1, 3])
def test_never_more_than_n_in_flight_and_each_send_waits_for_a_finish(tmp_path, n):
    r = _run(tmp_path, f"client: {{max_concurrency: {n}}}\n").requests
    assert (r["status"] == "finished").all() and len(r) == 40
    sent, fin = r["arrival_s"].to_numpy(), r["finish_s"].to_numpy()
    assert _max_in_flight(sent, fin) == n
    waited = r["client_queue_s"].to_numpy() > 0
    assert waited.any()
    # a request that waited was sent exactly when an earlier one finished
    assert all(np.isin(s, fin) for s in sent[waited])
    # latencies count from the send
    assert np.allclose(r["ttft_s"], r["first_token_s"] - r["arrival_s"])
    if n == 1:  # one at a time: nothing ever queues in the engine
        assert (r["queue_s"] == 0).all()
        assert (np.diff(sent) >= 0).all() and (sent[1:] >= fin[:-1]).all()


def test_bound_above_the_load_changes_no_figure(tmp_path):
    base, loose = _run(tmp_path), _run(tmp_path, "client: {max_concurrency: 1000}\n")
    assert (loose.requests["client_queue_s"] == 0).all()
    cols = list(base.requests.columns)
    assert base.requests[cols].equals(loose.requests[cols])
    assert "client" not in base.summary and loose.summary["client"]["queue_max_s"] == 0.0
    assert base.summary["serving"] == loose.summary["serving"]


def test_tight_bound_lowers_throughput_and_ttft_counts_from_the_send(tmp_path):
    base, one = _run(tmp_path), _run(tmp_path, "client: {max_concurrency: 1}\n")
    assert one.summary["serving"]["request_throughput"] < base.summary["serving"]["request_throughput"]
    assert one.summary["client"]["max_concurrency"] == 1 and one.summary["client"]["queue_max_s"] > 0
    # alone in the engine, a request's TTFT is its prefill: shorter than under the open loop's queueing
    assert one.requests["ttft_s"].mean() < base.requests["ttft_s"].mean()


def test_front_end_after_the_client(tmp_path):
    r = _run(tmp_path, "client: {max_concurrency: 2}\nfrontend: {per_request_s: 0.003}\n").requests
    assert (r["frontend_s"] >= 0.003 - 1e-12).all()
    assert (r["ttft_s"] >= r["frontend_s"]).all()
    assert _max_in_flight(r["arrival_s"].to_numpy(), r["finish_s"].to_numpy()) == 2


def test_rejected_requests_free_their_slots(tmp_path):
    # prompts up to 600 tokens with a 300-token model length: some are rejected on arrival
    f = tmp_path / "rej.yaml"
    f.write_text(SCENARIO.replace("model: Llama-3-8B", "model: {preset: Llama-3-8B, max_model_len_tokens: 300}")
                 + "client: {max_concurrency: 2}\n")
    r = run(load_scenario(f).base, tmp_path, check_invariants=True).requests
    assert len(r) == 40 and (r["status"] == "rejected").any() and (r["status"] == "finished").any()
    assert set(r["status"]) <= {"finished", "rejected"}


@pytest.mark.parametrize("extra", ["", "replicas: {count: 2}\n", "frontend: {per_request_s: 0.002}\n",
                                   "allocator: {kind: paged, block_size: 16, prefix_caching: true}\n"])
def test_fast_and_step_engines_agree_with_a_client(tmp_path, extra):
    c = "client: {max_concurrency: 4}\n" + extra
    fast, step = _run(tmp_path, c + "engine: {mode: fast}\n"), _run(tmp_path, c + "engine: {mode: step}\n")
    assert fast.requests.equals(step.requests)
    assert _max_in_flight(fast.requests["arrival_s"].to_numpy(), fast.requests["finish_s"].to_numpy()) <= 4


def test_bad_bound_is_one_line_exit_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(SCENARIO + "client: {max_concurrency: 0}\n")
    p = subprocess.run([sys.executable, "-m", "kvsim", "validate", str(f)], capture_output=True, text=True)
    assert p.returncode == 2
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "client.max_concurrency" in err[0] and str(f) in err[0]
