"""Scenario-level checks of prefix caching, eviction, tiers, prefetch and preemption modes."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import make_scenario, make_trace
from kvsim.config import Scenario
from kvsim.simulate import run
from kvsim.trace.load import load_trace

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE_SYN = ROOT / "traces" / "mooncake_synthetic.jsonl.gz"


def mooncake_scenario(capacity_tokens, block=512, n=600, **alloc):
    return Scenario.model_validate({
        "trace": {"file": str(MOONCAKE_SYN), "max_requests": n},
        "model": {"preset": "Llama-3-8B", "max_model_len_tokens": 262144},
        "kv_budget": {"tokens": capacity_tokens, "allow_beyond_gpu": True},  # capacity what-ifs
        "allocator": {"kind": "paged", "block_size": block, "prefix_caching": True, "watermark": 0.0, **alloc},
        "timing": {"kind": "constant", "step_s": 0.01},
        "scheduler": {"max_num_seqs": 100000},
    })


def test_unbounded_cache_reaches_the_ideal_hit_ratio_of_trace_stats():
    """kvsim trace stats --block-size 512 gives the ideal a paged cache can reach (full blocks,
    last token computed); an unbounded cache on the same requests reaches it exactly."""
    from kvsim.trace.stats import paged_ideal_hit_ratio

    res = run(mooncake_scenario(10**9), base_dir=ROOT)
    pc = res.summary["prefix_cache"]
    assert pc["evictions"] == 0
    ideal = paged_ideal_hit_ratio(load_trace(MOONCAKE_SYN).select(np.arange(600)), 512)
    assert pc["hit_ratio_blocks"] == pytest.approx(ideal["hit_ratio_blocks"], abs=1e-12)
    assert pc["hit_ratio_tokens"] == pytest.approx(ideal["hit_ratio_tokens"], abs=1e-12)


@pytest.mark.slow
def test_hit_ratio_falls_monotonically_as_lru_capacity_shrinks():
    ratios = []
    for cap in (10**9, 4_000_000, 1_000_000, 400_000, 200_000):
        ratios.append(run(mooncake_scenario(cap, block=64, n=400), base_dir=ROOT).summary["prefix_cache"]["hit_ratio_tokens"])
    assert all(a >= b for a, b in zip(ratios, ratios[1:])), ratios
    assert ratios[-1] < 0.5 * ratios[0], ratios


def test_recompute_and_swap_differ_and_swap_costs_show_in_the_steps():
    rows = list(zip(np.cumsum(np.full(300, 0.02)), np.full(300, 200), np.full(300, 300)))
    out = {}
    for mode in ("recompute", "swap"):
        scn = make_scenario(kv_budget={"tokens": 6000}, timing={"kind": "analytical"},
                            allocator={"kind": "paged", "block_size": 16, "watermark": 0.0},
                            scheduler={"preemption_mode": mode, "swap_space_bytes": 8 * 10**9})
        out[mode] = run(scn, trace=make_trace(rows), check_invariants=True)
    rc, sw = out["recompute"].summary, out["swap"].summary
    assert rc["preemptions_by_mode"]["recompute"] > 0 and rc["preemptions_by_mode"]["swap"] == 0
    assert sw["preemptions_by_mode"]["swap"] > 0 and sw["recomputed_tokens"] == 0
    assert rc["recomputed_tokens"] > 0
    assert sw["step_time_breakdown_s"]["swap_s"] > 0 and rc["step_time_breakdown_s"]["swap_s"] == 0
    assert sw["swapped_out_bytes"] > 0 and sw["transfer"]["swap_in_bytes"] > 0
    assert rc["e2e_s"]["mean"] != sw["e2e_s"]["mean"]
    assert rc["throughput_output_tokens_per_s"] != sw["throughput_output_tokens_per_s"]


def _tiered(mode, prefetch):
    rng = np.random.default_rng(11)
    n = 250
    arrivals = np.cumsum(rng.exponential(0.05, n))
    prompts = rng.integers(64, 600, n)
    rows = list(zip(arrivals, prompts, rng.integers(1, 60, n)))
    keys = [np.array([7000 * (i % 6) + k for k in range(int(p) // 16)], dtype=np.int64) for i, p in enumerate(prompts)]
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 2500}, timing={"kind": "analytical"},
                        allocator={"kind": "paged", "block_size": 16, "prefix_caching": True, "watermark": 0.0,
                                   "offload": {"cpu": {"capacity_bytes": 2 * 10**10, "bandwidth_bytes_per_s": 2e10}}},
                        scheduler={"prefetch": prefetch, "preemption_mode": "swap", "swap_space_bytes": 2 * 10**9})
    trace = make_trace(rows)
    object.__setattr__(trace, "prefix_keys", keys)
    object.__setattr__(trace, "prefix_block_tokens", 16)
    return run(scn, trace=trace, check_invariants=True)


def test_offloaded_blocks_hit_from_cpu_and_prefetch_hides_transfer():
    plain, pre = _tiered("fast", False), _tiered("fast", True)
    pc = plain.summary["prefix_cache"]
    assert pc["offloaded_blocks"] > 0 and pc["tier_hits"]["cpu"] > 0
    assert plain.summary["transfer"]["needed_s"] > 0
    assert plain.summary["transfer"]["hidden_by_prefetch_s"] == 0
    hidden = pre.summary["transfer"]["hidden_by_prefetch_s"]
    assert 0 < hidden <= pre.summary["transfer"]["needed_s"] + 1e-12


def test_fast_engine_is_exact_with_tiers_prefetch_and_swap():
    step, fast = _tiered("step", True), _tiered("fast", True)
    pd.testing.assert_frame_equal(step.requests, fast.requests, check_exact=True)
    for key in ("hidden_by_prefetch_s", "needed_s"):
        assert math.isclose(step.summary["transfer"][key], fast.summary["transfer"][key], rel_tol=1e-12)
    assert step.summary["prefix_cache"] == fast.summary["prefix_cache"] or all(
        math.isclose(step.summary["prefix_cache"][k], fast.summary["prefix_cache"][k], rel_tol=1e-9)
        for k in ("hit_ratio_tokens", "hit_ratio_blocks"))


def test_parallel_sampling_saves_kv_by_sharing_the_prompt():
    """Alpaca-like traffic with n = 2, 4, 6 samples: the shared prompt saves a growing fraction
    of the unshared footprint; the step and fast engines agree."""
    from kvsim.trace.synthetic import generate_trace
    from kvsim.trace.spec import SyntheticTraceSpec

    savings = []
    for n in (1, 2, 4, 6):
        spec = SyntheticTraceSpec.model_validate({"preset": "alpaca", "num_requests": 300, "seed": 1,
                                                  "arrival": {"process": "poisson", "rate_per_s": 20},
                                                  "sampling": {"n": n}})
        trace = generate_trace(spec)
        res = {}
        for mode in ("step", "fast"):
            scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 20000}, timing={"kind": "analytical"},
                                allocator={"kind": "paged", "block_size": 16, "watermark": 0.0})
            res[mode] = run(scn, trace=trace, check_invariants=(mode == "step"))
        pd.testing.assert_frame_equal(res["step"].requests, res["fast"].requests, check_exact=True)
        savings.append(res["fast"].summary["kv"]["sharing_saving_frac"])
    assert savings[0] == pytest.approx(0.0, abs=1e-12)
    assert savings[1] > 0.05 and savings[1] < savings[2] < savings[3], savings


def _replica_run(router, mode="fast", store=False, count=3, n=300, cap=400_000):
    raw = {
        "trace": {"file": str(MOONCAKE_SYN), "max_requests": n, "rate_scale": 0.5},
        "model": {"preset": "Llama-3-8B", "max_model_len_tokens": 262144},
        "kv_budget": {"tokens": cap},
        "allocator": {"kind": "paged", "block_size": 64, "prefix_caching": True, "watermark": 0.0},
        "timing": {"kind": "analytical"},
        "scheduler": {"chunked_prefill": True, "max_num_batched_tokens": 8192},
        "engine": {"mode": mode},
        "replicas": {"count": count, "router": router},
    }
    if store:
        raw["replicas"]["shared_prefix_store"] = {"capacity_bytes": 10**12, "bandwidth_bytes_per_s": 2.5e10}
    return run(Scenario.model_validate(raw), base_dir=ROOT)


def test_replicas_share_the_load_and_routers_differ():
    rr = _replica_run("round_robin")
    assert rr.summary["replicas"]["requests"] == [100, 100, 100]
    ll = _replica_run("least_loaded")
    pa = _replica_run("prefix_affinity")
    assert sum(ll.summary["replicas"]["requests"]) == 300
    # routing requests to the replica that holds their prefix raises the hit ratio
    assert pa.summary["prefix_cache"]["hit_ratio_tokens"] > rr.summary["prefix_cache"]["hit_ratio_tokens"]


def test_shared_prefix_store_serves_other_replicas():
    alone = _replica_run("round_robin", cap=150_000)
    shared = _replica_run("round_robin", cap=150_000, store=True)
    assert shared.summary["prefix_cache"]["tier_hits"]["remote"] > 0
    assert shared.summary["prefix_cache"]["hit_ratio_tokens"] > alone.summary["prefix_cache"]["hit_ratio_tokens"]


@pytest.mark.parametrize("router", ["round_robin", "least_loaded"])
def test_fast_engine_is_exact_with_replicas(router):
    step, fast = _replica_run(router, mode="step", n=150), _replica_run(router, mode="fast", n=150)
    pd.testing.assert_frame_equal(step.requests, fast.requests, check_exact=True)


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_recompute_of_many_generated_samples_is_chunked_to_the_budget(mode):
    # A request with 2 parallel samples, preempted by recompute after generating many tokens,
    # must re-prefill prompt + 2 x generated tokens: more than one step's budget. Chunks past the
    # prompt take budget // 2 positions (it used to wait forever: "nothing schedulable").
    rng = np.random.default_rng(21)
    n = 40
    rows = list(zip(np.cumsum(rng.exponential(0.02, n)), rng.integers(50, 200, n), rng.integers(150, 300, n)))
    trace = make_trace(rows)
    object.__setattr__(trace, "num_samples", np.full(n, 2, dtype=np.int64))
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": 2400}, timing={"kind": "analytical"},
                        allocator={"kind": "paged", "block_size": 16, "watermark": 0.0},
                        scheduler={"chunked_prefill": True, "max_num_batched_tokens": 256,
                                   "preemption_mode": "recompute"})
    res = run(scn, trace=trace, check_invariants=True)
    r = res.requests
    assert (r["status"] == "finished").all()
    # some recompute re-prefilled more than one step's budget
    assert (r["recomputed_tokens"] > 256).any()


def test_prefix_affinity_without_a_prefix_cache_is_noted_and_runs_as_least_loaded():
    from kvsim.api import scenario_notes

    def scn(router, caching):
        raw = {"trace": {"file": str(MOONCAKE_SYN), "max_requests": 60}, "model": "Llama-3-8B",
               "kv_budget": {"tokens": 200_000}, "allocator": {"kind": "paged", "block_size": 64,
                                                               "prefix_caching": caching},
               "timing": {"kind": "analytical"}, "replicas": {"count": 2, "router": router}}
        return Scenario.model_validate(raw)

    off = scn("prefix_affinity", False)
    notes = off.notes()
    assert len(notes) == 1 and "prefix_affinity" in notes[0] and "least-loaded" in notes[0]
    assert scn("prefix_affinity", True).notes() == [] and scn("least_loaded", False).notes() == []
    assert scenario_notes({"a": off, "b": scn("prefix_affinity", True)}) == [f"a: {notes[0]}"]
    # what the note says: the same routing as least_loaded
    pd.testing.assert_frame_equal(run(off, base_dir=ROOT).requests,
                                  run(scn("least_loaded", False), base_dir=ROOT).requests, check_exact=True)


def test_samples_beyond_max_num_seqs_have_their_own_reject_reason(tmp_path, capsys):
    """Were counted as exceeds_kv_capacity, whose fix (more KV) could not help."""
    from kvsim.cli import main

    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens,num_samples\n0,10,5,1\n0.1,10,5,8\n")
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-3-8b\ngpu: H100-SXM-80GB\ntrace: {file: t.csv}\nscheduler: {max_num_seqs: 4}\n")
    assert main(["validate", str(f)]) == 0
    out = capsys.readouterr()
    assert "1/2 requests admissible" in out.out and "exceeds_max_num_seqs" in out.out + out.err
    assert "scheduler.max_num_seqs" in out.err and "exceeds_kv_capacity" not in out.out + out.err
    assert main(["run", str(f), "-q", "--no-plots", "--out", str(tmp_path / "o")]) == 0
    got = pd.read_parquet(tmp_path / "o" / "requests.parquet")
    assert got.set_index("request_id")["reject_reason"].to_dict() == {0: "", 1: "exceeds_max_num_seqs"}


@pytest.mark.parametrize("kind", ["paged", "radix"])
def test_requests_only_the_watermark_keeps_out_name_the_watermark(tmp_path, capsys, kind):
    """QA (thirtieth session): 1,500 + 400 tokens on 2,048 with watermark 0.2 read exceeds_kv_capacity,
    "give the KV cache more room", though they fit with watermark 0."""
    from kvsim.cli import main

    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1500,400\n1,1500,700\n2,1000,100\n")
    f = tmp_path / "s.yaml"
    f.write_text("model: Llama-3-8B\ngpu: A100-40GB\ntrace: {file: t.csv}\nkv_budget: {tokens: 2048}\n"
                 f"allocator: {{kind: {kind}, block_size: 16, watermark: 0.2}}\n")
    assert main(["run", str(f), "-q", "--no-plots", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    got = pd.read_parquet(tmp_path / "o" / "requests.parquet").set_index("request_id")["reject_reason"].to_dict()
    # 1,899 tokens fit 2,048 but not 2,048 less 20 %; 2,199 fit neither; 1,099 fit both
    assert got == {0: "exceeds_kv_capacity_with_watermark", 1: "exceeds_kv_capacity", 2: ""}
    assert "exceeds_kv_capacity_with_watermark: lower allocator.watermark" in err
    assert main(["run", str(f), "-q", "--no-plots", "--set", "allocator.watermark=0",
                 "--out", str(tmp_path / "o0")]) == 0
    got = pd.read_parquet(tmp_path / "o0" / "requests.parquet").set_index("request_id")["reject_reason"].to_dict()
    assert got == {0: "", 1: "exceeds_kv_capacity", 2: ""}


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_recomputed_tokens_count_every_sample(tmp_path, mode):
    """QA (twenty-ninth session): a 4-sample request preempted after 184 generated tokens read
    recomputed_tokens 1,184 (positions) where its recompute prefilled 1,000 + 4 x 185 tokens."""
    (tmp_path / "rc.csv").write_text("arrival_s,prompt_tokens,output_tokens,num_samples\n0,1000,400,1\n"
                                     "0.01,1000,400,4\n")
    scn = Scenario.model_validate({
        "model": "Llama-3.1-8B", "gpu": "H100-SXM-80GB", "trace": {"file": str(tmp_path / "rc.csv")},
        "kv_budget": {"tokens": 3000}, "engine": {"mode": mode}, "timing": {"kind": "analytical"},
        "allocator": {"kind": "paged", "block_size": 16, "prefix_caching": False}})
    res = run(scn, check_invariants=(mode == "step"))
    req, steps = res.requests, res.steps
    assert (req["status"] == "finished").all() and req["recomputed_tokens"].sum() > 0
    work = int(steps["prefill_tokens"].sum() + steps["decode_tokens"].sum())
    assert work == int((req["prompt_tokens"] + req["num_samples"] * (req["output_tokens"] - 1)
                        + req["recomputed_tokens"]).sum())


@pytest.mark.parametrize("mode", ["step", "fast"])
def test_samples_beyond_the_token_budget_are_rejected_on_arrival(tmp_path, capsys, mode):
    """QA (thirtieth session): a 3-sample request under max_num_batched_tokens 2 (chunked prefill
    on) crashed the run with "nothing schedulable (scheduler bug)": each decode step of its group
    costs 3 tokens. It is rejected on arrival as exceeds_batch_token_budget, and validate says so."""
    from kvsim.cli import main

    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens,num_samples\n0,10,5,1\n0.1,10,5,3\n")
    f = tmp_path / "s.yaml"
    f.write_text("model: llama-3-8b\ngpu: H100-SXM-80GB\ntrace: {file: t.csv}\n"
                 f"engine: {{mode: {mode}}}\nscheduler: {{max_num_batched_tokens: 2, max_num_seqs: 4}}\n")
    assert main(["validate", str(f)]) == 0
    out = capsys.readouterr()
    assert "1/2 requests admissible" in out.out and "exceeds_batch_token_budget 1" in out.out
    assert main(["run", str(f), "-q", "--no-plots", "--out", str(tmp_path / "o")]) == 0
    got = pd.read_parquet(tmp_path / "o" / "requests.parquet").set_index("request_id")
    assert got["reject_reason"].to_dict() == {0: "", 1: "exceeds_batch_token_budget"}
    assert got.loc[0, "status"] == "finished"
