"""The measurement code that a GPU run executes, exercised on the CPU with a tiny model: the Triton
decode timing path (single pass and split-K with a preallocated workspace) under the interpreter,
rotation of block tables, row contents, grid pruning and the time budget."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvsim.calibration import bench_ops as B  # noqa: E402
from kvsim.calibration_data import schema as S  # noqa: E402
from kvsim.calibration.grid import CPU_GRID, GPU_GRID, decode_points, prefill_points  # noqa: E402
from kvsim.calibration.timer import Timer, rotations_for  # noqa: E402
from kvsim.hw import MODELS, ModelSpec  # noqa: E402

TINY = ModelSpec("tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=256, num_params=1e5, max_model_len_tokens=1024)


def env(decode_impl=S.IMPL_TRITON) -> B.BenchEnv:
    dev = torch.device("cpu")
    return B.BenchEnv(device=dev, model=TINY, timer=Timer(dev, warmup=0, repeats=2), cache_bytes=1 << 16,
                      mem_budget_bytes=64 << 20, decode_impl=decode_impl, act_dtype=torch.bfloat16, log=lambda m: None)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_decode_timing_path_with_split_k():
    e = env()
    rows = B.measure_decode_paged(e, "fp16", (16, 1), [(1, 600), (2, 40)], lambda: False)
    impls = {(r["block_size"], r["batch"], r["impl"]) for r in rows}
    assert (16, 1, S.IMPL_TRITON_SPLITK) in impls  # 1 x 2 kv-head programs on 8 "SMs": split
    assert (16, 2, S.IMPL_TRITON_SPLITK) not in impls  # 40 tokens: too short to split
    for r in rows:
        assert r["median_s"] > 0 and r["rotations"] >= 1
        assert r["kv_bytes"] == r["batch"] * r["context_len"] * 2 * 2 * 16 * 2
        assert r["splits"] >= (2 if r["impl"] == S.IMPL_TRITON_SPLITK else 1)


def test_other_ops_produce_rows():
    e = env(S.IMPL_TORCH_REFERENCE)
    never = lambda: False  # noqa: E731
    rows = B.measure_gemms(e, (1, 8), (1,), never) + B.measure_elementwise(e, (1, 8), never)
    rows += B.measure_prefill(e, "fp8", (16,), [(8, 0), (8, 24)], never)
    rows += B.measure_contiguous(e, "fp16", [(2, 32)], never)
    rows.append(B.measure_copy(e, 1 << 20))
    ops = [r["op"] for r in rows]
    assert ops.count(S.GEMM_QKV) == 2 and ops.count(S.GEMM_LM_HEAD) == 1 and S.COPY in ops
    assert set(rows[0]) == set(S.COLUMNS)
    qkv = next(r for r in rows if r["op"] == S.GEMM_QKV and r["tokens"] == 8)
    assert (qkv["gemm_n"], qkv["gemm_k"]) == ((4 + 2 * 2) * 16, 64) and qkv["flops"] == 2 * 8 * 128 * 64


def test_out_of_time_skips_and_records():
    e = env(S.IMPL_TORCH_REFERENCE)
    rows = B.measure_decode_paged(e, "fp16", (16,), [(1, 32), (2, 32)], lambda: True)
    assert rows == [] and len(e.skipped) == 2


def test_rotations_rule():
    assert rotations_for(1 << 30, free_sets=10, calls=23, cache_bytes=60 << 20) == 2  # big: 2 suffice
    assert rotations_for(1 << 20, free_sets=1000, calls=23, cache_bytes=60 << 20) == 23  # small: one per call
    assert rotations_for(1 << 20, free_sets=3, calls=23, cache_bytes=60 << 20) == 3  # capped by what fits
    assert rotations_for(1 << 30, free_sets=1, calls=23, cache_bytes=60 << 20) == 1


def test_grid_pruning():
    llama2 = MODELS["Llama-2-7B"]  # 32 kv heads: 16 KiB of fp16 K+V per token per layer
    kept, dropped = decode_points(GPU_GRID, llama2, "fp16", mem_budget_bytes=20 << 30)
    # two copies of 256 x (4096 + 512) tokens x 16 KiB = 38.6 GB > 20 GB
    assert (256, 4096) not in kept and any(d[:2] == (256, 4096) and d[2] == "memory" for d in dropped)
    assert (1, 4096) in kept
    assert any(d[2] == "context > max_model_len" for d in dropped)  # 8192 > Llama-2's 4096
    kept_cpu, _ = decode_points(CPU_GRID, MODELS["Llama-3-8B"], "fp16", mem_budget_bytes=1 << 30)
    assert len(kept_cpu) == len(CPU_GRID.batch_sizes) * len(CPU_GRID.context_lens)
    assert all(n + c <= 4096 for n, c in prefill_points(GPU_GRID, llama2))
