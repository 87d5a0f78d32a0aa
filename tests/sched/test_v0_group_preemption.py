"""vLLM V0's per-group preemption rule (``scheduler.preemption_mode: auto-vllm-v0``, filled by the
vllm-v0.6 and vllm-2023 profiles): a request with one sequence is recomputed, one with parallel
samples swapped (vllm/core/scheduler.py Scheduler._preempt; docs/conformance.md 'vllm-v0.6'), and
a group's swap moves the blocks the allocator holds for it."""

from __future__ import annotations

import pandas as pd
import pytest

from kvsim.config import Scenario
from kvsim.errors import ConfigError
from kvsim.kv.base import KVRequest, cdiv
from kvsim.metrics.request_log import RequestLog
from kvsim.sched.shape import StepDraft
from kvsim.build import build_allocator, build_scheduler
from kvsim.simulate import run

# two single-sequence requests, a 4-sample group admitted after them (the latest-admitted victim
# once they grow), then one more single-sequence request, on a 4,000-token cache
TRACE = "arrival_s,prompt_tokens,output_tokens,num_samples\n0,500,1000,1\n0,500,1000,1\n0.01,1000,400,4\n" \
        "0.02,300,1000,1\n"


def _scenario(tmp_path, max_len=4096, mode="fast", profile="vllm-v0.6", **sched):
    (tmp_path / "t.csv").write_text(TRACE)
    return Scenario.model_validate({
        "engine_profile": profile, "model": {"preset": "Llama-3.1-8B", "max_model_len_tokens": max_len},
        "gpu": "H100-SXM-80GB", "trace": {"file": str(tmp_path / "t.csv")}, "kv_budget": {"tokens": 4000},
        "allocator": {"kind": "paged", "block_size": 16}, "engine": {"mode": mode}, "scheduler": sched})


def _rows(res):
    return res.requests.set_index("request_id")


def test_profile_fills_the_v0_rule_and_an_explicit_mode_wins(tmp_path):
    scn = _scenario(tmp_path)
    assert scn.scheduler.preemption_mode == "auto-vllm-v0"
    assert scn.profile_filled()["filled"]["scheduler.preemption_mode"] == "auto-vllm-v0"
    assert _scenario(tmp_path, preemption_mode="recompute").scheduler.preemption_mode == "recompute"
    for profile in ("vllm-v1", "vllm-0.32", "sglang"):
        assert _scenario(tmp_path, profile=profile).scheduler.preemption_mode == "recompute"
    assert _scenario(tmp_path, profile="vllm-2023").scheduler.preemption_mode == "auto-vllm-v0"
    # multi-step: vLLM 0.6 runs only one-sequence groups there, which the rule recomputes
    ms = _scenario(tmp_path, num_scheduler_steps=8).scheduler
    assert ms.preemption_mode == "auto-vllm-v0" and not ms.swaps(4) and not ms.may_swap
    with pytest.raises((ConfigError, ValueError), match="auto-vllm-v0"):
        _scenario(tmp_path, async_scheduling=True, prefill_only_steps=False)


def test_v0_profile_swaps_groups_and_recomputes_single_requests(tmp_path):
    res = {m: run(_scenario(tmp_path, mode=m), check_invariants=(m == "step")) for m in ("step", "fast")}
    pd.testing.assert_frame_equal(res["step"].requests, res["fast"].requests, check_exact=True)
    again = run(_scenario(tmp_path))
    pd.testing.assert_frame_equal(res["fast"].requests, again.requests, check_exact=True)
    r = _rows(res["fast"])
    assert (r["status"] == "finished").all()
    group, single = r[r["num_samples"] > 1], r[r["num_samples"] == 1]
    assert (group["swaps"] == group["preemptions"]).all() and group["swaps"].sum() >= 1
    assert group["recomputed_tokens"].sum() == 0
    assert single["swaps"].sum() == 0 and single["preemptions"].sum() >= 1 and single["recomputed_tokens"].sum() > 0
    assert res["fast"].summary["swapped_out_bytes"] == res["fast"].summary["swapped_in_bytes"] > 0


def test_an_explicit_recompute_recomputes_every_request(tmp_path):
    r = _rows(run(_scenario(tmp_path, preemption_mode="recompute")))
    assert r["swaps"].sum() == 0 and (r["status"] == "finished").all()
    assert r.loc[r["num_samples"] > 1, "recomputed_tokens"].sum() > 0


@pytest.mark.parametrize("mode", ["step", "fast"])
def test_a_group_the_rule_swaps_is_not_rejected_for_its_recompute_cost(tmp_path, mode):
    """Budget 2,048 without chunked prefill: the group's worst-case recompute (1,000 + 4 x 399)
    does not fit, which rejected it on arrival; it is swapped instead. With no swap space it falls
    back to recompute, cannot fit, and ends as swap_space_full (no hang); the rest finish."""
    r = _rows(run(_scenario(tmp_path, max_len=2048, mode=mode), check_invariants=(mode == "step")))
    assert (r["status"] == "finished").all() and r.loc[2, "swaps"] >= 1
    r = _rows(run(_scenario(tmp_path, max_len=2048, mode=mode, swap_space_bytes=0),
                  check_invariants=(mode == "step")))
    assert r.loc[2, "status"] == "rejected" and r.loc[2, "reject_reason"] == "swap_space_full"
    assert (r.drop(index=2)["status"] == "finished").all()
    rc = _rows(run(_scenario(tmp_path, max_len=2048, mode=mode, preemption_mode="recompute")))
    assert rc.loc[2, "reject_reason"] == "exceeds_batch_token_budget"


@pytest.mark.parametrize("preemption_mode", ["auto-vllm-v0", "swap"])
def test_a_groups_swap_moves_its_prompt_blocks_once_and_each_samples_own(tmp_path, preemption_mode):
    """A 3-sample group with a 100-token prompt (6 full blocks shared, the partial one copied per
    sample) preempted after some decode steps: its swap moves 6 + 3 x ceil((computed - 96) / 16)
    blocks, the blocks the allocator held, not ceil(computed / 16) (one sequence's)."""
    scn = _scenario(tmp_path, preemption_mode=preemption_mode)
    alloc, _ = build_allocator(scn)
    sched = build_scheduler(scn, alloc, scn.kv_geometry().with_block_size(alloc.block_size), "t",
                            request_log=RequestLog())
    assert sched.add_arrival(KVRequest(0, 100, 60, 4096, num_samples=3), 0.0)
    t = 0.0
    for _ in range(30):
        sched.schedule(t)
        t += 0.01
        sched.on_step_done(t)
    req = sched.requests[0]
    computed = req.num_computed_tokens
    assert computed > 112  # past the prompt's partial block and into a second generated block
    blocks = 100 // 16 + 3 * cdiv(computed - 96, 16)
    assert alloc.held_tokens(0) == blocks * 16
    step = StepDraft(sched.token_budget)
    sched._preempt(req, step)
    bpt = sched.host.bytes_per_token
    assert req.num_swaps == 1 and step.swap_out_bytes == blocks * 16 * bpt
    assert sched.host.used_tokens == blocks * 16
    sched.check_invariants()
    sched.schedule(t)  # it comes back: the same blocks over the link
    assert sched.host.swapped_in_bytes == blocks * 16 * bpt and sched.host.used_tokens == 0


@pytest.mark.parametrize("mode", ["step", "fast"])
def test_a_group_ended_as_swap_space_full_frees_its_client_slot(tmp_path, mode):
    """A closed-loop client of 3: the group (request 2) ends mid-run as swap_space_full; its slot
    frees then, so request 3 is sent at once, not when requests 0 and 1 finish (the slot was lost)."""
    (tmp_path / "t.csv").write_text(TRACE.rstrip("\n") + "\n0.03,300,100,1\n0.04,300,100,1\n")
    scn = Scenario.model_validate({
        "engine_profile": "vllm-v0.6", "model": {"preset": "Llama-3.1-8B", "max_model_len_tokens": 2048},
        "gpu": "H100-SXM-80GB", "trace": {"file": str(tmp_path / "t.csv")}, "kv_budget": {"tokens": 4000},
        "allocator": {"kind": "paged", "block_size": 16}, "engine": {"mode": mode},
        "scheduler": {"swap_space_bytes": 0}, "client": {"max_concurrency": 3}})
    r = _rows(run(scn, check_invariants=(mode == "step")))
    assert r.loc[2, "reject_reason"] == "swap_space_full" and (r.drop(index=2)["status"] == "finished").all()
    sent_3 = r.loc[3, "arrival_s"]  # the send (client_queue_s before it)
    assert r.loc[3, "client_queue_s"] > 0 and sent_3 < r.loc[0, "finish_s"] and sent_3 < r.loc[1, "finish_s"]
