"""scheduler.prefill_only_steps: vLLM v0's default scheduler (no chunked prefill) runs a step that
admits prompts with those prompts only ("don't schedule decodes if prefills are scheduled",
vllm/core/scheduler.py ``_schedule_default``); the running requests decode from the next step."""

import pytest

from helpers import make_scenario, make_trace
from kvsim.kv.base import KVRequest
from kvsim.kv.paged import PagedAllocator
from kvsim.metrics.request_log import RequestLog
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.scheduler import Scheduler
from kvsim.simulate import resolved_dict, run


def _sched(**cfg):
    return Scheduler(SchedulerConfig(**cfg), PagedAllocator(64, 16), 2048, request_log=RequestLog())


def _step(s, t):
    plan = s.schedule(t)
    s.on_step_done(t + 0.01)
    return plan


@pytest.mark.parametrize("prefill_only", [False, True])
def test_a_step_that_admits_runs_no_decodes_only_with_the_flag(prefill_only):
    s = _sched(prefill_only_steps=prefill_only)
    s.add_arrival(KVRequest(0, 40, 10, 2048), 0.0)
    assert _step(s, 0.0).admitted == (0,)
    s.add_arrival(KVRequest(1, 30, 10, 2048), 0.01)
    plan = _step(s, 0.02)
    assert plan.admitted == (1,)
    assert plan.shape.num_prefill_seqs == 1
    # request 0 (decoding) is in the admission step only without the flag
    assert plan.shape.num_decode_seqs == (0 if prefill_only else 1)
    assert [rid for rid, _ in plan.scheduled] == ([1] if prefill_only else [0, 1])
    nxt = _step(s, 0.04)
    assert nxt.shape.num_decode_seqs == 2 and not nxt.admitted


def test_a_blocked_head_leaves_the_step_to_the_decodes():
    s = Scheduler(SchedulerConfig(prefill_only_steps=True), PagedAllocator(6, 16), 2048, request_log=RequestLog())
    s.add_arrival(KVRequest(0, 60, 10, 2048), 0.0)  # 4 of the 6 blocks
    _step(s, 0.0)
    s.add_arrival(KVRequest(1, 60, 10, 2048), 0.01)  # does not fit
    plan = _step(s, 0.02)
    assert plan.admitted == () and plan.shape.num_decode_seqs == 1


def _run(mode, rows, **sched):
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 3000},
                        allocator={"kind": "paged", "block_size": 16, "watermark": 0.01},
                        timing={"kind": "analytical", "step_overhead_s": 0.001}, scheduler=sched)
    return run(scn, trace=make_trace(rows), check_invariants=True)


def _rows(n=300, seed=3, rate=40.0):
    import numpy as np
    rng = np.random.default_rng(seed)
    return list(zip(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 300, n), rng.integers(1, 120, n)))


def test_prompt_only_steps_in_a_run_and_they_lengthen_it():
    rows = _rows()
    mixed, v0 = _run("step", rows), _run("step", rows, prefill_only_steps=True)
    st = v0.steps
    assert ((st["prefill_tokens"] > 0) & (st["decode_tokens"] > 0)).sum() == 0
    assert ((mixed.steps["prefill_tokens"] > 0) & (mixed.steps["decode_tokens"] > 0)).sum() > 10
    # decodes wait out every prompt step: more steps, longer TPOT
    assert v0.summary["engine_steps"] > mixed.summary["engine_steps"]
    assert v0.summary["tpot_s"]["mean"] > mixed.summary["tpot_s"]["mean"]


def test_no_effect_with_chunked_prefill_and_absent_from_the_resolved_form_when_off():
    rows = _rows(150, seed=4)
    a = _run("step", rows, chunked_prefill=True)
    b = _run("step", rows, chunked_prefill=True, prefill_only_steps=True)
    assert a.requests.equals(b.requests)
    assert "prefill_only_steps" not in resolved_dict(a.scenario)["scheduler"]
    assert resolved_dict(b.scenario)["scheduler"]["prefill_only_steps"] is True
