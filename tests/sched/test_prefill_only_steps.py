"""Prompt-only steps. scheduler.prefill_only_steps: vLLM v0's default scheduler (no chunked prefill)
runs a step that admits prompts with those prompts only ("don't schedule decodes if prefills are
scheduled", vllm/core/scheduler.py ``_schedule_default``); the running requests decode from the next
step. scheduler.mixed_chunk: false: SGLang's default with chunked prefill (v0.5.7
``Scheduler.get_next_batch_to_run``: a prefill batch, the cut chunk first, runs before any decode
batch); scheduler.max_prefill_tokens: SGLang's ``PrefillAdder.add_one_req`` limit."""

import pytest

from helpers import make_scenario, make_trace
from kvsim.kv.base import KVRequest
from kvsim.kv.paged import PagedAllocator
from kvsim.metrics.request_log import RequestLog
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.scheduler import Scheduler
from kvsim.config.resolved import resolved_dict
from kvsim.simulate import run


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


_SG = {"engine_profile": "sglang", "model": "Llama-2-7B", "kv_budget": {"tokens": 20000},
       "allocator": {"kind": "radix"}, "timing": {"kind": "analytical"}}


def _chunked(**cfg):
    return _sched(chunked_prefill=True, max_num_batched_tokens=64, prompt_blocks="per_chunk", **cfg)


@pytest.mark.parametrize("mixed", [True, False])
def test_chunked_prompt_steps_hold_no_decodes_and_a_cut_prompt_goes_on_first(mixed):
    s = _chunked(mixed_chunk=mixed)
    s.add_arrival(KVRequest(0, 40, 10, 2048), 0.0)
    assert _step(s, 0.0).admitted == (0,)
    s.add_arrival(KVRequest(1, 100, 10, 2048), 0.01)  # longer than the 64-token budget: cut
    plan = _step(s, 0.02)
    assert plan.admitted == (1,)
    if mixed:  # vLLM v1: request 0 decodes in the same step, request 1 takes the rest of the budget
        assert dict(plan.scheduled) == {0: 1, 1: 63} and plan.shape.num_decode_seqs == 1
        return
    assert dict(plan.scheduled) == {1: 64} and plan.shape.num_decode_seqs == 0
    s.add_arrival(KVRequest(2, 20, 10, 2048), 0.03)
    plan = _step(s, 0.04)  # request 1's last 36 tokens first, then request 2 in the rest; no decode
    assert [rid for rid, _ in plan.scheduled] == [1, 2] and dict(plan.scheduled) == {1: 36, 2: 20}
    assert plan.admitted == (2,) and plan.shape.num_decode_seqs == 0
    nxt = _step(s, 0.06)
    assert nxt.shape.num_decode_seqs == 3 and nxt.shape.num_prefill_seqs == 0


def test_mixed_chunk_has_no_effect_without_chunked_prefill():
    s = _sched(mixed_chunk=False)
    s.add_arrival(KVRequest(0, 40, 10, 2048), 0.0)
    _step(s, 0.0)
    s.add_arrival(KVRequest(1, 30, 10, 2048), 0.01)
    assert _step(s, 0.02).shape.num_decode_seqs == 1  # mixed, as prefill_only_steps: false says


@pytest.mark.parametrize("limit,admitted", [(None, (0, 1)), (50, (0,)), (61, (0, 1))])
def test_max_prefill_tokens_holds_back_a_second_prompt_only(limit, admitted):
    s = _chunked(mixed_chunk=False, max_prefill_tokens=limit)
    s.add_arrival(KVRequest(0, 30, 10, 2048), 0.0)
    s.add_arrival(KVRequest(1, 30, 10, 2048), 0.0)
    # SGLang: request 1 joins only if its 30 tokens are fewer than the limit minus the 30 taken
    assert _step(s, 0.0).admitted == admitted
    s = _chunked(mixed_chunk=False, max_prefill_tokens=20)
    s.add_arrival(KVRequest(0, 60, 10, 2048), 0.0)
    assert _step(s, 0.0).admitted == (0,)  # the first prompt of a step is never held back


def test_sglang_profile_runs_prefill_batches_without_decodes():
    scn = make_scenario(**{**_SG, "scheduler": {"max_num_batched_tokens": 512}})
    assert (scn.scheduler.mixed_chunk, scn.scheduler.chunked_prefill, scn.scheduler.max_prefill_tokens) == \
        (False, True, 16384)
    res = run(scn, trace=make_trace(_rows(120, seed=5, rate=60.0)), check_invariants=True)
    st = res.steps
    assert ((st["prefill_tokens"] > 0) & (st["decode_tokens"] > 0)).sum() == 0
    assert (st["prefill_tokens"] > 0).sum() > 20 and st["decode_tokens"].sum() > 1000  # rows: steps or windows
    mixed = run(make_scenario(**{**_SG, "scheduler": {"max_num_batched_tokens": 512, "mixed_chunk": True}}),
                trace=make_trace(_rows(120, seed=5, rate=60.0)), check_invariants=True)
    assert ((mixed.steps["prefill_tokens"] > 0) & (mixed.steps["decode_tokens"] > 0)).sum() > 10
    assert "mixed_chunk" not in resolved_dict(mixed.scenario)["scheduler"]
    assert resolved_dict(res.scenario)["scheduler"]["mixed_chunk"] is False
