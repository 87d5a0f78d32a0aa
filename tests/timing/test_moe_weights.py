"""MoE weight reads: a step reads only the routed experts its tokens touch (kvsim.timing.moe)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvsim.hw import GPUS, MODELS
from kvsim.models.parallel import plan
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import decode_shape
from kvsim.timing.context import TimingContext
from kvsim.timing.moe import WeightReads, experts_touched, routed_expert_params


def _timing(model: str, tp: int = 1, weight_dtype: str = "bf16", gpu: str = "H200-141GB", gemm_model: str = "roofline"):
    """The roofline's MoE weight reads (``gemm_model: roofline``; under the fitted GEMM model the
    routed experts' reads are ``moe_experts_s``, tests/timing/test_gemm_wiring.py)."""
    m = MODELS[model]
    p = plan(m, GPUS[gpu], "bf16", weight_dtype, tensor=tp)
    ctx = TimingContext(m, GPUS[gpu], p.kv.with_block_size(16), p.weight_bytes_per_rank,
                        Path("."), tensor_parallel=tp, comm_s_per_step=p.comm_s_per_step,
                        comm_s_per_token=p.comm_s_per_token)
    return AnalyticalTiming(AnalyticalTimingConfig(gemm_model=gemm_model), ctx)


def test_touched_experts_match_a_uniform_routing_simulation():
    """E(1 - (1 - k/E)^n) is the mean number of distinct experts n tokens pick, k distinct each."""
    rng = np.random.default_rng(7)
    for E, k in ((8, 2), (256, 8), (60, 4)):
        for n in (1, 3, 16, 64, 300):
            draws = [len({int(e) for _ in range(n) for e in rng.choice(E, k, replace=False)})
                     for _ in range(400)]
            want = float(experts_touched(n, E, k))
            assert abs(np.mean(draws) - want) < 4 * np.std(draws) / np.sqrt(len(draws)) + 1e-6, (E, k, n)


def test_touched_experts_bounds():
    n = np.arange(0, 5000)
    t = experts_touched(n, 256, 8)
    assert t[0] == 0.0 and t[1] == pytest.approx(8.0)
    assert np.all(np.diff(t) >= 0) and np.all(t <= 256.0) and t[-1] == pytest.approx(256.0)


@pytest.mark.parametrize("model", ["Mixtral-8x7B", "DeepSeek-V3"])
def test_one_token_reads_the_active_params_and_many_read_all(model):
    m = MODELS[model]
    w = WeightReads(m, m.weight_bytes("fp8"), 1.0)
    assert w.moe and routed_expert_params(m) > 0
    assert float(w.bytes_read(1)) == pytest.approx(m.weight_bytes("fp8") * m.active_params / m.num_params)
    assert float(w.bytes_read(100_000)) == pytest.approx(m.weight_bytes("fp8"))
    assert float(w.bytes_read(0)) < float(w.bytes_read(1))  # attention, dense layers, shared experts


def test_dense_models_keep_the_constant_weights_term():
    m = MODELS["Llama-3-8B"]
    assert routed_expert_params(m) == 0.0
    w = WeightReads(m, m.weight_bytes(), 3.0e12)
    assert w.scalar_s(1) == w.scalar_s(5000) == w.array_s(np.array([1, 7])) == m.weight_bytes() / 3.0e12


def test_moe_roofline_step_reads_fewer_weights_and_scalar_equals_array_past_the_table():
    timing = _timing("DeepSeek-V3", tp=8, weight_dtype="fp8")
    full = timing.weights.constant_s
    n = np.array([1, 8, 64, 1024, 3000], np.int64)  # past the first 1024-entry table: it grows
    T = n * 1000
    durations, parts, _ = timing.decode_durations(n, T, None)
    for j, (a, b) in enumerate(zip(n, T)):
        st = timing.step_time(decode_shape(int(a), int(b), 0))
        assert durations[j].hex() == st.duration_s.hex()
        assert float(parts["weights_read_s"][j]).hex() == float(st.breakdown_s["weights_read_s"]).hex()
    w = parts["weights_read_s"]
    assert np.all(np.diff(w) > 0) and w[0] < 0.1 * full and w[-1] == pytest.approx(full)


def test_tensor_parallel_halves_each_ranks_expert_reads():
    one, two = _timing("Mixtral-8x7B", tp=1), _timing("Mixtral-8x7B", tp=2)
    for n in (1, 4, 40):
        shape = decode_shape(n, n * 100, 0)
        a = one.step_time(shape).breakdown_s["weights_read_s"]
        b = two.step_time(shape).breakdown_s["weights_read_s"]
        assert b == pytest.approx(a / 2, rel=1e-9)


def test_moe_layers_fixed_time_enters_every_step_once():
    """timing.moe_align_kernel / moe_layer_s: num_layers x (alignment kernel + per-layer constant)."""
    from kvsim.timing.moe import align_kernel_s, moe_fixed_s

    m = MODELS["DeepSeek-V3"]
    assert align_kernel_s("vllm", 256, 8) == pytest.approx(65.376e-6) and align_kernel_s("none", 256, 8) == 0.0
    assert align_kernel_s("sglang", 128, 8) == pytest.approx(19.936e-6)
    assert align_kernel_s("vllm", 8, 2) == align_kernel_s("vllm", 32, 2)  # the end value below 32 experts
    fixed = moe_fixed_s(m, "vllm", 1e-5)
    assert fixed == pytest.approx(61 * (65.376e-6 + 1e-5))
    assert moe_fixed_s(MODELS["Llama-3-8B"], "vllm", 1e-5) == 0.0  # dense: nothing
    p = plan(m, GPUS["H200-141GB"], "bf16", "fp8", tensor=8)
    ctx = TimingContext(m, GPUS["H200-141GB"], p.kv.with_block_size(16), p.weight_bytes_per_rank, Path("."),
                        tensor_parallel=8, comm_s_per_step=p.comm_s_per_step, comm_s_per_token=p.comm_s_per_token)
    base = AnalyticalTiming(AnalyticalTimingConfig(gemm_model="roofline"), ctx)
    more = AnalyticalTiming(AnalyticalTimingConfig(gemm_model="roofline", moe_align_kernel="vllm", moe_layer_s=1e-5), ctx)
    # the fitted GEMM model (the default): the same fixed time, in the routed experts' part
    fbase = AnalyticalTiming(AnalyticalTimingConfig(), ctx)
    fmore = AnalyticalTiming(AnalyticalTimingConfig(moe_align_kernel="vllm", moe_layer_s=1e-5), ctx)
    for n in (1, 8, 64):
        a, b = base.step_time(decode_shape(n, n * 1000, n * 63)), more.step_time(decode_shape(n, n * 1000, n * 63))
        assert b.breakdown_s["weights_read_s"] - a.breakdown_s["weights_read_s"] == pytest.approx(fixed, rel=1e-9)
        assert b.duration_s - a.duration_s == pytest.approx(fixed, rel=1e-9)
        a, b = fbase.step_time(decode_shape(n, n * 1000, n * 63)), fmore.step_time(decode_shape(n, n * 1000, n * 63))
        assert b.breakdown_s["moe_experts_s"] - a.breakdown_s["moe_experts_s"] == pytest.approx(fixed, rel=1e-9)
        assert b.duration_s - a.duration_s == pytest.approx(fixed, rel=1e-9)
    n = np.array([1, 8, 64, 3000], np.int64)
    d, _, _ = more.decode_durations(n, n * 1000, n * 63)
    assert [x.hex() for x in d] == [more.step_time(decode_shape(int(k), int(k) * 1000, int(k) * 63)).duration_s.hex()
                                    for k in n]
