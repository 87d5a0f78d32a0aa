"""vLLM V1's async scheduling (scheduler.async_scheduling; vLLM's AsyncScheduler, its default since
0.14.0, vllm-project/vllm#27614): step k+1 is planned while step k runs, so that plan sees the
arrivals up to step k's start only, and a request that finishes in step k keeps its KV and its
max_num_seqs place, unscheduled, through the plan of step k+1. The conformance suite checks the
same against vLLM's own AsyncScheduler (tests/conformance, the *_async cases); these tests check
each rule by hand on kvsim alone."""

import dataclasses

import pytest

from kvsim.conformance.cases import Case, Req, random_requests
from kvsim.conformance.kvsim_side import run_kvsim
from kvsim.errors import ConfigError
from kvsim.kv.base import KVRequest
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.radix import RadixAllocator
from kvsim.metrics.request_log import RequestLog
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.scheduler import Scheduler


def _prompt(i: int, n: int) -> tuple[int, ...]:
    return tuple(range(1000 * (i + 1), 1000 * (i + 1) + n))


def _both(case: Case):
    """The case replayed synchronously and with async scheduling (step mode)."""
    return run_kvsim(case, "step"), run_kvsim(dataclasses.replace(case, async_scheduling=True), "step")


def test_an_arrival_during_a_step_waits_one_plan_more():
    # steps start at 0, 0.01, 0.02, ...; request 1 arrives during step 1
    reqs = (Req(_prompt(0, 20), 10), Req(_prompt(1, 20), 5, arrival_s=0.015))
    sync, asy = _both(Case("a", "", reqs, num_blocks=50))
    assert sync.requests[1]["first_scheduled_step"] == 2  # planned at 0.02, after its arrival
    assert asy.requests[1]["first_scheduled_step"] == 3  # the plan for step 2 was made at step 1's start
    assert asy.requests[0] == sync.requests[0]


def test_a_finished_request_holds_its_place_and_kv_through_the_next_plan():
    # max_num_seqs 2: request 0 (3 tokens) finishes in step 2; request 2 waits for its place
    reqs = (Req(_prompt(0, 20), 3), Req(_prompt(1, 20), 20), Req(_prompt(2, 20), 5))
    sync, asy = _both(Case("f", "", reqs, num_blocks=50, max_num_seqs=2))
    assert sync.requests[0]["finish_step"] == asy.requests[0]["finish_step"] == 2  # the client's finish
    assert sync.requests[2]["first_scheduled_step"] == 3
    assert asy.requests[2]["first_scheduled_step"] == 4
    # step 3: request 0's two blocks (20 + 2 tokens written) are still held, unscheduled
    assert asy.steps[3]["running"] == 2 and asy.steps[3]["scheduled_tokens"] == 1
    assert asy.steps[3]["kv_blocks_used"] == sync.steps[2]["kv_blocks_used"]
    assert asy.steps[4]["kv_blocks_used"] < asy.steps[3]["kv_blocks_used"] + 2


def test_an_empty_plan_is_made_again_with_the_finishes_taken_in():
    # max_num_seqs 1: once request 0 finishes nothing else could run, as in vLLM (an empty batch,
    # then its output, then a new plan at once): request 1 starts right after, as without async
    reqs = (Req(_prompt(0, 20), 3), Req(_prompt(1, 20), 4))
    sync, asy = _both(Case("e", "", reqs, num_blocks=50, max_num_seqs=1))
    assert sync.requests == asy.requests
    assert [s["scheduled_tokens"] for s in asy.steps] == [s["scheduled_tokens"] for s in sync.steps]


def test_step_and_fast_agree_under_pressure_with_decode_windows(monkeypatch):
    case = Case("p", "", random_requests(2, 40, (40, 200), (20, 120)), num_blocks=60, async_scheduling=True)
    step = run_kvsim(case, "step")
    # fast: the lazy decode group and its windows; without the group (as with parallel samples) the
    # request-by-request decode windows
    group = run_kvsim(case, "fast")
    monkeypatch.setattr(Scheduler, "install_decode_path", lambda self, path: False)
    fast = run_kvsim(case, "fast")
    for got in (group, fast):
        assert step.requests == got.requests and len(step.steps) == len(got.steps)
        assert sum(k for _, k in got.windows) > len(step.steps) // 2  # most steps ran inside decode windows
        for k, (a, b) in enumerate(zip(step.steps, got.steps)):
            assert b is None or a == b, k  # (None: inside a window, checked by its sums)
        for (first, k), sums in zip(got.windows, got.window_sums):
            span = step.steps[first:first + k]
            assert sums["scheduled_tokens"] == sum(s["scheduled_tokens"] for s in span)
            assert sums["preemptions"] == sum(s["preemptions"] for s in span) == 0
    assert sum(s["preemptions"] for s in step.steps) > 5
    sync = run_kvsim(dataclasses.replace(case, async_scheduling=False), "step")
    assert len(step.steps) > len(sync.steps)  # memory is freed a step later: more steps


def _sched(alloc, **cfg):
    return Scheduler(SchedulerConfig(async_scheduling=True, chunked_prefill=True, **cfg), alloc, 2048,
                     request_log=RequestLog())


def test_invariants_and_release_by_hand():
    s = _sched(PagedAllocator(20, 16, prefix_caching=True), max_num_seqs=4)
    s.add_arrival(KVRequest(0, 30, 2, 2048, block_keys=None), 0.0)
    t = 0.0
    for _ in range(3):
        s.schedule(t)
        t += 0.01
        s.on_step_done(t)
        s.check_invariants()
    # alone: released at once (vLLM's next plan would be empty and it processes the output first)
    assert s.num_finished == 1 and s.num_finishing == 0 and s.log.num_finished == 1
    # memory pressure, arrivals during steps, prefix sharing: the invariants hold after every step
    s = _sched(PagedAllocator(12, 16, prefix_caching=True), max_num_seqs=6, max_num_batched_tokens=64)
    keys = [[7, 8, 9] + [100 * i + k for k in range(3)] for i in range(12)]  # a shared 3-block prefix
    arrivals = [(i, 0.004 * i) for i in range(12)]
    t, preempted, held_seen = 0.0, 0, 0
    for _ in range(2000):
        while arrivals and arrivals[0][1] <= t:
            i, a = arrivals.pop(0)
            s.add_arrival(KVRequest(i, 70 + 3 * i, 9 + i, 2048, block_keys=keys[i]), a)
        held_seen += bool(s._held)
        if not s.has_work:
            if not arrivals:
                break
            t = arrivals[0][1]
            continue
        plan = s.schedule(t)
        preempted += len(plan.preempted)
        t += 0.01
        s.on_step_done(t)
        s.check_invariants()
    assert s.num_finished == 12 and not s.running and not s._held and preempted and held_seen


def test_what_async_scheduling_is_not_modelled_with_is_one_line():
    for bad, why in ((dict(num_scheduler_steps=4, prefill_only_steps=True), "num_scheduler_steps > 1"),
                     (dict(prefill_only_steps=True), "prompt-only steps"),
                     (dict(chunked_prefill=True, mixed_chunk=False), "prompt-only steps"),
                     (dict(preemption_mode="swap"), "preemption_mode: swap")):
        with pytest.raises(ValueError) as e:
            SchedulerConfig(async_scheduling=True, **bad)
        assert why in str(e.value) and "async_scheduling: false" in str(e.value)


def test_a_prefix_cache_without_known_token_caching_is_refused():
    with pytest.raises(ConfigError, match="KnownTokenCaching"):
        _sched(RadixAllocator(20, 16))


def test_async_with_radix_is_one_line_naming_the_file_in_validate_and_run(tmp_path, capsys):
    from kvsim.cli import main

    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-3-8b\ngpu: H100-SXM-80GB\ntrace: {file: t.csv}\nallocator: {kind: radix}\n"
                 "scheduler: {async_scheduling: true}\n")
    for cmd in (["validate", str(f)], ["run", str(f), "-q", "--no-plots", "--out", str(tmp_path / "out")]):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"kvsim: error: {f}: scheduler.async_scheduling: true"), err
        assert "allocator kind paged" in err[0] and "async_scheduling: false" in err[0]


def test_uncached_freed_blocks_are_reused_first_with_prefix_caching():
    """vLLM's free_blocks since vllm-project/vllm#42656: blocks without cached content go to the
    front of the free queue, cached ones to the back (the eviction order)."""
    a = PagedAllocator(8, 4, watermark=0.0, prefix_caching=True)
    a.allocate(KVRequest(0, 10, 1, 64, block_keys=None), 10)
    assert a.ensure_slots(0, 10)  # 10 tokens written: blocks 0, 1 full (cached), 2 partial
    table = list(a.block_tables[0])
    a.free(0)
    order = a.free_block_order()
    assert order[0] == table[2]  # the partial block: reused first
    assert order[-2:] == [table[1], table[0]]  # the cached ones: last, tail of the prefix first
    b = PagedAllocator(8, 4, watermark=0.0)
    b.allocate(KVRequest(0, 10, 1, 64, block_keys=None), 10)
    assert b.ensure_slots(0, 10)
    table = list(b.block_tables[0])
    b.free(0)
    assert b.free_block_order()[-3:] == table[::-1]  # without prefix caching: appended, as before


def test_the_vllm_0_32_profile_runs_async_and_the_vllm_replay_refuses_it(tmp_path):
    from kvsim.config import Scenario
    from kvsim.realengine.replay import settings_for
    from kvsim.realengine.vllm_engine import EngineError

    base = {"trace": {"file": "x.csv"}, "model": "Llama-2-7B"}
    scn = Scenario.model_validate({**base, "engine_profile": "vllm-0.32"})
    assert scn.scheduler.async_scheduling is True
    assert scn.profile_filled()["filled"]["scheduler.async_scheduling"] is True
    with pytest.raises(EngineError, match="async_scheduling is true.*set it to false"):
        settings_for(scn, tmp_path / "config.json", 1, "cpu", True)
    with pytest.raises(EngineError, match=r"^s\.yaml: scheduler\.async_scheduling is true"):
        settings_for(scn, tmp_path / "config.json", 1, "cpu", True, "s.yaml")
