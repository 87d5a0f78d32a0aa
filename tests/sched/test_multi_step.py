"""Multi-step scheduling (scheduler.num_scheduler_steps; vLLM 0.6's --num-scheduler-steps,
vllm-project/vllm#7000): a decode step opens a round of N decode steps planned once; slots for the
round are reserved when it opens; nobody joins during it; requests complete at its end (running on
past their last token); the CPU overhead is paid once per round; the client sees one chunk a round."""

import math

import numpy as np
import pytest

from helpers import make_scenario, make_trace
from kvsim.errors import ConfigError
from kvsim.kv.base import KVRequest
from kvsim.kv.paged import PagedAllocator
from kvsim.metrics.request_log import RequestLog
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.scheduler import Scheduler
from kvsim.config.resolved import resolved_dict
from kvsim.simulate import run


def _sched(n, blocks=64, **cfg):
    return Scheduler(SchedulerConfig(prefill_only_steps=True, num_scheduler_steps=n, **cfg),
                     PagedAllocator(blocks, 16), 2048, request_log=RequestLog())


def _step(s, t, dt=0.01):
    plan = s.schedule(t)
    first, done = s.on_step_done(t + dt)
    s.check_invariants()
    return plan, [r.request_id for r in done]


def test_a_decode_step_opens_a_round_that_admits_nobody_and_finishes_at_its_end():
    s = _sched(4)
    s.add_arrival(KVRequest(0, 40, 3, 2048), 0.0)  # 3 output tokens: its last comes in the round's 2nd step
    s.add_arrival(KVRequest(1, 20, 9, 2048), 0.0)
    plan, done = _step(s, 0.0)
    assert plan.shape.num_prefill_tokens == 60 and not done  # the prompts: a round of one step
    # the round's first step reserves the round's slots (up to each request's last output token)
    plan, done = _step(s, 0.01)
    assert dict(plan.scheduled) == {0: 1, 1: 1} and not plan.shape.round_continuation
    assert s.allocator.ledger.written_of(0) == 40 + 2 and s.allocator.ledger.written_of(1) == 20 + 4
    s.add_arrival(KVRequest(2, 10, 5, 2048), 0.015)  # waits for the round's end
    plan, done = _step(s, 0.02)  # request 0 samples its last token: it runs on, unfinished
    assert plan.shape.round_continuation and not plan.admitted and not done
    plan, done = _step(s, 0.03)  # request 0 overruns: a decode of its 43-token context, not scheduled
    assert dict(plan.scheduled) == {1: 1} and plan.shape.num_decode_seqs == 2
    assert plan.shape.kv_tokens_read == 43 + (22 + 1)
    plan, done = _step(s, 0.04)
    assert plan.shape.kv_tokens_read == 44 + (23 + 1) and done == [0]  # the round's end
    assert s.round_itl(0.05) == (pytest.approx(0.04), 2)  # one chunk per sequence, the round's time
    plan, done = _step(s, 0.05)  # the waiting request's prompt, alone
    assert plan.admitted == (2,) and dict(plan.scheduled) == {2: 10}
    assert s.round_itl(0.06) is None


def test_hand_timed_rounds_with_a_constant_step():
    # constant 0.1 s steps, 4-step rounds: prompt step ends at 0.1 (first token); 5 tokens end with the
    # round at 0.5; 3 tokens complete at 0.3 and run on to the round's end, 0.5
    rows = [(0.0, 10, 5), (0.0, 12, 3)]
    res = run(make_scenario(kv_budget={"tokens": 256}, scheduler={"prefill_only_steps": True,
                                                                  "num_scheduler_steps": 4}),
              trace=make_trace(rows), check_invariants=True)
    r = res.requests.set_index("request_id")
    assert r["first_token_s"].tolist() == pytest.approx([0.1, 0.1])
    assert r["finish_s"].tolist() == pytest.approx([0.5, 0.5])
    assert r["tpot_s"].tolist() == pytest.approx([0.4 / 4, 0.4 / 2])
    itl = res.summary["itl_s"]
    assert itl["mean"] == pytest.approx(0.4)  # one 4-step round, two chunks
    # vLLM's mean ITL: (0.4 + 0.4) s over ceil(4/4) + ceil(2/4) = 2 chunks after the first token
    assert itl["mean_with_stalls_s"] == pytest.approx(0.4)


def _rows(n=200, seed=7, rate=30.0):
    rng = np.random.default_rng(seed)
    return list(zip(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 400, n), rng.integers(1, 150, n)))


def _run(mode, n, rows, tokens=4000, **sched):
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": tokens}, model="Llama-2-7B",
                        allocator={"kind": "paged", "block_size": 16, "watermark": 0.01},
                        timing={"kind": "analytical", "step_overhead_s": 0.002},
                        scheduler={"prefill_only_steps": True, "num_scheduler_steps": n, **sched})
    return run(scn, trace=make_trace(rows), check_invariants=True)


def test_fast_and_step_runs_are_the_same_run_under_memory_pressure():
    rows = _rows()
    fast, step = _run("fast", 8, rows), _run("step", 8, rows)
    assert fast.requests.equals(step.requests)
    assert fast.summary["preemptions"] == step.summary["preemptions"] > 0  # reservations preempt too
    assert (fast.requests["status"] == "finished").all()


def test_rounds_pay_the_overhead_once_and_stream_chunks():
    rows = _rows(120, seed=8, rate=20.0)
    one, ten = _run("step", 1, rows, tokens=40000), _run("step", 10, rows, tokens=40000)
    st = ten.steps
    decode = st[(st["decode_tokens"] > 0) & (st["prefill_tokens"] == 0)]
    paid = decode["overhead_s"] > 0
    # a round's first step pays the 2 ms, its nine others nothing
    assert set(decode.loc[paid, "overhead_s"].round(9)) == {0.002}
    assert 8 * paid.sum() < (~paid).sum() <= 9 * paid.sum()
    assert one.steps["overhead_s"].sum() > 2 * st["overhead_s"].sum()
    # the client sees a chunk per round: ITLs of about ten steps
    assert ten.summary["itl_s"]["p50"] > 7 * one.summary["itl_s"]["p50"]
    fin = ten.requests[ten.requests["status"] == "finished"]
    chunks = np.ceil((fin["output_tokens"] - 1) / 10)
    span = (fin["finish_s"] - fin["first_token_s"]).sum()
    assert ten.summary["itl_s"]["mean_with_stalls_s"] == pytest.approx(span / chunks.sum())


def test_one_step_is_the_run_without_the_key_and_keeps_the_resolved_form():
    rows = _rows(80, seed=9)
    base = make_scenario(kv_budget={"tokens": 4000}, scheduler={"prefill_only_steps": True})
    a = run(base, trace=make_trace(rows))
    b = run(make_scenario(kv_budget={"tokens": 4000}, scheduler={"prefill_only_steps": True,
                                                                 "num_scheduler_steps": 1}), trace=make_trace(rows))
    assert a.requests.equals(b.requests)
    assert "num_scheduler_steps" not in resolved_dict(b.scenario)["scheduler"]
    c = make_scenario(scheduler={"prefill_only_steps": True, "num_scheduler_steps": 10})
    assert resolved_dict(c)["scheduler"]["num_scheduler_steps"] == 10


@pytest.mark.parametrize("sched,word", [
    ({"num_scheduler_steps": 4, "chunked_prefill": True}, "chunked_prefill: false"),
    ({"num_scheduler_steps": 4}, "prefill_only_steps"),
    ({"num_scheduler_steps": 4, "prefill_only_steps": True, "preemption_mode": "swap"}, "preemption_mode"),
    ({"num_scheduler_steps": 0, "prefill_only_steps": True}, "num_scheduler_steps"),
])
def test_settings_multi_step_does_not_model_are_refused(sched, word):
    with pytest.raises(Exception) as e:
        make_scenario(scheduler=sched)
    assert word in str(e.value)


def test_the_cli_refuses_them_in_one_line(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "s.yaml"
    p.write_text("trace: {synthetic: {num_requests: 2, arrival: {process: poisson, rate_per_s: 1},"
                 " prompt_tokens: {kind: fixed, value: 10}, output_tokens: {kind: fixed, value: 10}}}\n"
                 "model: Llama-2-7B\ngpu: A100-80GB\nengine_profile: vllm-v1\nscheduler: {num_scheduler_steps: 8}\n")
    out = subprocess.run([sys.executable, "-m", "kvsim", "validate", str(p)], capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "scheduler" in lines[0] and "num_scheduler_steps" in lines[0] and str(p) in lines[0]


def test_beam_search_traces_are_refused():
    from kvsim.trace.schema import Trace

    rows = [(0.0, 20, 8), (0.0, 20, 8)]
    base = make_trace(rows)
    trace = Trace(arrival_s=base.arrival_s, prompt_tokens=base.prompt_tokens, output_tokens=base.output_tokens,
                  num_samples=np.array([2, 1]), beam=np.array([1, 0]), source={"kind": "test"})
    scn = make_scenario(kv_budget={"tokens": 256}, scheduler={"prefill_only_steps": True, "num_scheduler_steps": 4})
    with pytest.raises(ConfigError, match="beam"):
        run(scn, trace=trace)


def test_the_v06_profile_runs_lambda_like_traffic_faster_with_rounds():
    # vLLM 0.6.0's own benchmark (Lambda's report, benchmark_v0.md): --num-scheduler-steps 10 more than
    # doubled Llama-3.1-8B's output throughput on one H100; kvsim must at least move the same way
    rows = [(0.0, int(p), int(o)) for p, o in zip(np.random.default_rng(1).integers(10, 600, 200),
                                                  np.random.default_rng(2).integers(20, 400, 200))]
    def go(n):
        scn = make_scenario(engine_profile="vllm-v0.6", model="Llama-3-8B", gpu="H100-SXM-80GB",
                            kv_budget={"gpu_memory_utilization": 0.9}, allocator={"kind": "paged", "block_size": 16},
                            timing={"kind": "analytical"}, scheduler={"num_scheduler_steps": n, "max_num_seqs": 256})
        return run(scn, trace=make_trace(rows))
    one, ten = go(1), go(10)
    assert ten.summary["throughput_output_tokens_per_s"] > one.summary["throughput_output_tokens_per_s"]
    assert not math.isnan(ten.summary["tpot_s"]["p50"])


@pytest.mark.parametrize("alloc", [{"kind": "radix", "block_size": 1},
                                   {"kind": "paged", "block_size": 16, "prefix_caching": True}])
def test_a_readmission_found_in_the_prefix_cache_is_a_prompt_step_not_a_round(alloc):
    # a preempted request re-admitted with all but its last token cached computes one token: it is
    # admitted in a prompt step all the same (no lookahead reserved there), so no round may open on it
    rng = np.random.default_rng(5)
    rows = list(zip(np.cumsum(rng.exponential(1 / 25, 150)), rng.integers(1, 500, 150), rng.integers(1, 200, 150)))
    runs = {}
    for mode in ("fast", "step"):
        scn = make_scenario(engine={"mode": mode}, model="Llama-2-7B", kv_budget={"tokens": 6000}, allocator=alloc,
                            timing={"kind": "analytical", "step_overhead_s": 0.002,
                                    "overhead": {"per_arrival_s": 0.001}},
                            scheduler={"prefill_only_steps": True, "num_scheduler_steps": 6})
        runs[mode] = run(scn, trace=make_trace(rows), check_invariants=True)  # held >= computed after every step
    assert runs["fast"].requests.equals(runs["step"].requests)
    assert runs["step"].summary["preemptions"] > 0 and (runs["step"].requests["status"] == "finished").all()
