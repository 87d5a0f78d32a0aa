"""The study scenarios of docs/studies.md, on a 60 s slice of their trace: the qualitative shape each
study is about (a U in block size, the seed table's direction of change, fp8 fusion). Each run takes
about a second."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvsim

STUDIES = Path(__file__).resolve().parents[2] / "scenarios" / "studies"
SLICE = ["trace.end_s=60"]

pytestmark = pytest.mark.skipif(not (STUDIES.parent.parent / "traces" / "azure_conv_2023.csv.gz").exists(),
                                reason="the shipped Azure trace is missing")


def _kernel_s_per_kv_token(s: dict) -> float:
    """Attention-kernel seconds per KV token read (bytes read / stored bytes per token)."""
    return s["kv_access"]["attention_kernel_s"] / (s["kv_access"]["kv_bytes_read"] / s["kv"]["bytes_per_token"])


def _kernel_ratio(block_a, block_b, backend_a="vllm-paged-v1", backend_b="vllm-paged-v1",
                  batch=20, context=1000):
    """The kernel model's own time ratio of two layouts for one representative launch (OPT-13B,
    A100-40GB, the workload's typical batch and context): what the simulated ratio should approach."""
    from kvsim.hw import GPUS, MODELS
    from kvsim.timing.kernel import KernelModel, KVLayout, load_backend

    gpu, model = GPUS["A100-40GB"], MODELS["OPT-13B"]

    def t(block, backend):
        km = KernelModel(load_backend(backend), KVLayout.from_model(model, "fp16", block),
                         gpu.hbm_bandwidth_bytes_per_s, gpu.num_sms)
        pages = batch * (-(-context // block) if block else 1)
        return km.time_s(batch, batch * context, pages)

    return t(block_a, backend_a) / t(block_b, backend_b)


def test_block_size_ablation_is_u_shaped():
    sweep = kvsim.sweep.load_sweep(STUDIES / "block_size_sweep.yaml", overrides=SLICE)
    runs = {p.overrides["allocator.block_size"]: kvsim.run(p.scenario, base_dir=STUDIES).summary
            for p in sweep.points if p.overrides["allocator.block_size"] in (1, 16, 64, 512)}
    nl = {b: s["normalized_latency_s_per_token"] for b, s in runs.items()}
    best_mid = min(nl[16], nl[64])
    assert nl[1] > best_mid and nl[512] > best_mid  # U: both ends worse than the middle
    # left arm: the kernel's per-page cost -- block 1 reads each KV token more slowly than block 16,
    # by at least half of what the kernel model predicts for one typical launch
    r = _kernel_ratio(1, 16)
    assert r > 2
    assert _kernel_s_per_kv_token(runs[1]) / _kernel_s_per_kv_token(runs[16]) > 1 + (r - 1) / 2
    # right arm: memory -- 512-token blocks waste more of the cache and fit fewer requests than 16
    assert runs[512]["kv"]["internal_frag_frac"] > runs[16]["kv"]["internal_frag_frac"]
    assert runs[512]["concurrency"]["max"] < runs[16]["concurrency"]["max"]
    # a fetch of a bigger page takes longer, but less than proportionally (fixed cost per fetch) ...
    lat = {b: s["kv_access"]["page_fetch_time_ns"] for b, s in runs.items()}
    assert lat[1] < lat[16] < lat[64] < lat[512] < 512 * lat[1]
    # ... while each token's KV loads more slowly in small pages: the headline latency says so
    load = {b: s["kv_access"]["kv_load_latency_ns"] for b, s in runs.items()}
    assert load[1] > load[16] > load[64]


def test_seed_table_rows_move_the_expected_way():
    loaded = kvsim.load_scenario(STUDIES / "seed_table.yaml", SLICE)
    assert loaded.base.baseline == "contiguous"
    res = {k: r.summary for k, r in kvsim.run(loaded).items()}
    cont, paged = res["contiguous"], res["paged-16"]
    # max reservation holds max_model_len slots per request: most of the allocated KV is waste
    assert cont["kv"]["fragmentation_frac"] > 10 * paged["kv"]["fragmentation_frac"]
    assert paged["concurrency"]["max"] > 2 * cont["concurrency"]["max"]
    # all four headline rows are there (the engine counts the pages each step reads)
    assert all(r["kv_access"]["kv_load_latency_ns"] and r["kv_access"]["pages_fetched"] for r in (cont, paged))
    # auto reads both layouts with one kernel (issue 23): the layouts differ by its page-size term only
    assert cont["kv_access"]["attention_backend"] == paged["kv_access"]["attention_backend"] == "flashinfer-paged"
    r = _kernel_ratio(16, None, "flashinfer-paged", "flashinfer-paged")
    assert 1 < r < 1.02  # FlashInfer's README: page 1 keeps 90 % of dense bandwidth; page 16 loses < 1 %
    per_token = _kernel_s_per_kv_token(paged) / _kernel_s_per_kv_token(cont)
    assert 0.9 < per_token < 1.1
    # ... while the 2023 comparison (auto-2023) is a kernel comparison: paging costs 20-26 % (vLLM paper 7.1)
    old = {k: r.summary for k, r in kvsim.run(kvsim.load_scenario(
        STUDIES / "seed_table.yaml", [*SLICE, "timing.attention_backend=auto-2023"])).items()}
    assert old["paged-16"]["kv_access"]["attention_backend"] == "vllm-paged-v1"
    assert old["contiguous"]["kv_access"]["attention_backend"] == "contiguous"
    r = _kernel_ratio(16, None, "vllm-paged-v1", "contiguous")
    assert r > 1.15
    assert (_kernel_s_per_kv_token(old["paged-16"]) / _kernel_s_per_kv_token(old["contiguous"])
            > 1 + (r - 1) / 2)
    assert old["paged-16"]["kv_access"]["kv_load_latency_ns"] > old["contiguous"]["kv_access"]["kv_load_latency_ns"]


def test_fp8_fused_reads_faster_and_unfused_pays_the_dequant_pass():
    res = {k: r.summary for k, r in kvsim.run(kvsim.load_scenario(STUDIES / "fp8_dequant.yaml", SLICE)).items()}
    fp16, fused, unfused = (_kernel_s_per_kv_token(res[k]) for k in ("fp16", "fp8-fused", "fp8-unfused"))
    assert fused < fp16 < unfused
    # both fp8 variants hold twice the tokens: the capacity side does not depend on fusion. The same
    # KV budget is cut into whole blocks, so fp8 holds 2x fp16's blocks or one more (one more when the
    # budget's fraction of an fp16 block is at least half: so under vllm-v1's memory profile, not kvsim's)
    kv = {k: res[k]["kv"] for k in ("fp16", "fp8-fused", "fp8-unfused")}
    assert kv["fp8-fused"]["budget_bytes"] == kv["fp8-unfused"]["budget_bytes"] == kv["fp16"]["budget_bytes"]
    assert kv["fp8-fused"]["capacity_tokens"] == kv["fp8-unfused"]["capacity_tokens"]
    block = kv["fp16"]["block_size"]
    assert 2 * kv["fp16"]["capacity_tokens"] <= kv["fp8-fused"]["capacity_tokens"] \
        <= 2 * kv["fp16"]["capacity_tokens"] + block
    assert res["fp8-fused"]["normalized_latency_s_per_token"] < res["fp8-unfused"]["normalized_latency_s_per_token"]


def test_preemption_overhead_swap_costly_at_small_blocks_recompute_flat():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(STUDIES / "preemption_overhead.py")], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    rows = [line.split() for line in out if line.strip() and line.split()[0].isdigit()]
    blocks = [int(r[0]) for r in rows]
    swap = [float(r[4]) for r in rows]
    recompute = [float(r[5]) for r in rows]
    assert blocks == sorted(blocks) and blocks[0] == 1
    assert all(a > b for a, b in zip(swap, swap[1:]))  # fewer, larger copies: cheaper per byte
    assert max(recompute) == min(recompute)  # the block size never reaches a recompute
    assert swap[0] > recompute[0] and swap[-1] < recompute[-1]  # swap loses at 1-token blocks, wins at 256
