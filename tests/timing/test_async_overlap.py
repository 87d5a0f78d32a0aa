"""Async scheduling's timing (kvsim.timing.overhead, StepOverhead.step_s): the engine loop's CPU terms
(per step, per sequence, per prompt token) overlap the GPU's step, ``duration = max(gpu, loop)``,
and the per-request terms stay serial; ``overhead_s`` is what the GPU did not hide. Without async
scheduling, or with ``overhead.async_overlap: false``, every term is added as before, bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine.test_fast_engine import assert_same, random_rows

from helpers import make_scenario, make_trace
from kvsim.hw import GPUS, MODELS
from kvsim.models.geometry import KVGeometry
from kvsim.config.resolved import resolved_dict
from kvsim.simulate import run
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape, decode_shape
from kvsim.timing.context import TimingContext

OVERHEAD = {"per_seq_s": 2.3e-5, "per_prefill_seq_s": 3.7e-3}


def _timing(async_scheduling, gemm_model="fitted", async_overlap=True, **overhead):
    m = MODELS["Llama-3-8B"]
    ctx = TimingContext(m, GPUS["H100-SXM-80GB"], KVGeometry.from_model(m, "bf16", 16), m.weight_bytes(), Path("."),
                        async_scheduling=async_scheduling)
    cfg = AnalyticalTimingConfig(gemm_model=gemm_model, step_overhead_s=0.0025, overhead={**OVERHEAD, **overhead},
                                 async_overlap=async_overlap)
    return AnalyticalTiming(cfg, ctx)


def _mixed():
    return BatchShape(num_seqs=4, num_prefill_seqs=1, num_decode_seqs=3, num_prefill_tokens=512,
                      num_decode_tokens=3, kv_tokens_read=600 + 576, attention_pairs=600 + 512 * 64 + 512 * 513 // 2,
                      kv_pages_read=1 + 2 + 3 + 36)


@pytest.mark.parametrize("gemm_model", ["fitted", "roofline"])
def test_a_step_lasts_the_longer_of_gpu_and_engine_loop(gemm_model):
    sync, asy = _timing(False, gemm_model), _timing(True, gemm_model)
    for n, ctx in ((1, 100), (8, 500), (64, 1000), (256, 2000)):
        shape = decode_shape(n, n * ctx, n * -(-(ctx + 1) // 16))
        s, a = sync.step_time(shape), asy.step_time(shape)
        loop = 0.0025 + 2.3e-5 * n
        assert s.breakdown_s["overhead_s"] == loop
        gpu = s.duration_s - loop
        assert a.duration_s == pytest.approx(max(gpu, loop), rel=1e-12)
        assert a.breakdown_s["overhead_s"] == pytest.approx(max(0.0, loop - gpu), abs=1e-15)
        # the GPU's parts are the same doubles
        assert {k: v for k, v in s.breakdown_s.items() if k != "overhead_s"} == \
               {k: v for k, v in a.breakdown_s.items() if k != "overhead_s"}
    # at 0.1 ms a sequence a one-sequence step is GPU-bound (its loop hidden), a 256-sequence one CPU-bound
    heavy = _timing(True, gemm_model, per_seq_s=1e-4)
    small, big = decode_shape(1, 100, 7), decode_shape(256, 256 * 200, 256 * 13)
    assert heavy.step_time(small).breakdown_s["overhead_s"] == 0.0
    assert heavy.step_time(big).duration_s == 0.0025 + 1e-4 * 256


def test_the_per_request_term_stays_serial():
    sync, asy = _timing(False), _timing(True)
    s, a = sync.step_time(_mixed()), asy.step_time(_mixed())
    loop = 0.0025 + 2.3e-5 * 4
    gpu = s.duration_s - loop - 3.7e-3
    assert a.duration_s == pytest.approx(max(gpu, loop) + 3.7e-3, rel=1e-12)
    assert a.breakdown_s["overhead_s"] == pytest.approx(max(0.0, loop - gpu) + 3.7e-3, rel=1e-9)


def test_async_overlap_false_prices_as_without_async_bit_for_bit():
    sync, off = _timing(False), _timing(True, async_overlap=False)
    assert not off.overhead.overlapped and _timing(True).overhead.overlapped
    for shape in (_mixed(), decode_shape(1, 10, 1), decode_shape(250, 250 * 3000, 250 * 188)):
        assert sync.step_time(shape).duration_s.hex() == off.step_time(shape).duration_s.hex()


def _vllm032(mode, **timing):
    return make_scenario(engine={"mode": mode}, engine_profile="vllm-0.32", model="Llama-3-8B",
                         gpu="H100-SXM-80GB", kv_budget={"tokens": 6000},
                         allocator={"kind": "paged", "block_size": 16},
                         timing={"kind": "analytical", **timing})


def test_vllm_0_32_runs_overlapped_and_fast_equals_step():
    rows = random_rows(200, seed=5, rate=30.0)
    step, fast = (run(_vllm032(m), trace=make_trace(rows), check_invariants=True) for m in ("step", "fast"))
    assert_same(step, fast, fast_has_windows=False)  # (the lazy decode group's steps: one by one)
    resolved = resolved_dict(_vllm032("fast"))["timing"]
    assert resolved["async_overlap"] is True and resolved["overhead"]["per_seq_s"] > 0  # the profile's terms kept
    serial = run(_vllm032("fast", async_overlap=False), trace=make_trace(rows))
    # decode steps no longer pay the loop on top of the GPU: shorter steps, a shorter TPOT
    d_overlap = fast.steps["duration_s"].sum() / fast.summary["engine_steps"]
    d_serial = serial.steps["duration_s"].sum() / serial.summary["engine_steps"]
    assert d_overlap < d_serial
    assert fast.requests["tpot_s"].mean() < serial.requests["tpot_s"].mean()
    # without async scheduling the key changes nothing and stays out of the resolved scenario
    sync = make_scenario(engine_profile="vllm-v1", model="Llama-3-8B", timing={"kind": "analytical"})
    assert "async_overlap" not in resolved_dict(sync)["timing"]


def test_parallel_samples_under_async_fast_equals_step():
    """Held finishes of parallel-sampling requests: a decode window keeps their written slots (less the
    prompt slots their samples share) and their sequences' lengths a step, as step by step."""
    rows = random_rows(120, seed=9, rate=25.0)
    out = {}
    for mode in ("step", "fast"):
        trace = make_trace(rows)
        object.__setattr__(trace, "num_samples", np.resize(np.array([1, 2, 3], np.int64), len(rows)))
        out[mode] = run(_vllm032(mode), trace=trace, check_invariants=True)
    assert_same(out["step"], out["fast"])
    assert out["step"].summary["kv"]["sharing_saving_frac"] > 0
