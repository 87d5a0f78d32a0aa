"""The fitted GEMM model inside analytical timing (timing.gemm_model: fitted | roofline)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvsim.models.geometry import KVGeometry
from kvsim.hw import GPUS, MODELS
from kvsim.timing import gemm
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape
from kvsim.timing.context import TimingContext
from kvsim.timing.moe import WeightReads, moe_fixed_s, routed_expert_params

GPU = GPUS["A100-80GB"]
MODEL = MODELS["Llama-2-7B"]


def _ctx(model=MODEL, gpu=GPU, tensor=1, block=16):
    return TimingContext(model, gpu, KVGeometry.for_gpu(model, "fp16", tensor, block_size=block),
                         model.weight_bytes() // tensor, Path("."), tensor_parallel=tensor)


def _decode(n, ctx_tokens):
    return BatchShape(num_seqs=n, num_prefill_seqs=0, num_decode_seqs=n, num_prefill_tokens=0, num_decode_tokens=n,
                      kv_tokens_read=n * ctx_tokens, attention_pairs=n * ctx_tokens)


def test_fitted_is_the_default_and_roofline_keeps_the_old_formula():
    assert AnalyticalTimingConfig().gemm_model == "fitted"
    cfg = AnalyticalTimingConfig(gemm_model="roofline", attention_backend="roofline")
    t = AnalyticalTiming(cfg, _ctx())
    s = _decode(8, 1000)
    bw = GPU.hbm_bandwidth_bytes_per_s * cfg.bandwidth_efficiency
    kv = MODEL.kv_bytes_per_token("fp16")
    mem = MODEL.weight_bytes() / bw + (s.kv_tokens_read * kv / bw + s.num_tokens * kv / bw)
    flops = (2 * MODEL.num_params * 8 + 4 * MODEL.num_layers * MODEL.num_attention_heads * MODEL.head_dim * 8000) \
        / (GPU.bf16_flops_per_s * cfg.compute_efficiency)
    assert t.step_time(s).duration_s == pytest.approx(max(mem, flops) + cfg.step_overhead_s, rel=1e-12)


def test_fitted_linear_time_is_the_gemm_model_and_weights_are_counted_once():
    t = AnalyticalTiming(AnalyticalTimingConfig(), _ctx())
    b = t.step_time(_decode(1, 100)).breakdown_s
    want = gemm.step_linear_time_s(1, 1, MODEL, GPU)
    assert b["linear_compute_s"] == pytest.approx(want, rel=1e-12)
    assert b["weights_read_s"] == 0.0  # inside the GEMMs' memory terms
    # one token: the GEMMs are weight-read bound -- at least the weight bytes at peak bandwidth, and
    # not twice that (a double count would add a second full weight read)
    floor = MODEL.weight_bytes() / GPU.hbm_bandwidth_bytes_per_s
    assert floor < b["linear_compute_s"] < 1.6 * floor
    d = t.step_time(_decode(1, 100)).duration_s
    assert d < b["linear_compute_s"] + b["attention_s"] + b["kv_read_s"] + b["overhead_s"] + 1e-12


def test_fitted_efficiency_rises_with_token_count():
    t = AnalyticalTiming(AnalyticalTimingConfig(), _ctx())
    per_token = [t.step_time(BatchShape(num_seqs=1, num_prefill_seqs=1, num_decode_seqs=0, num_prefill_tokens=n,
                                        num_decode_tokens=0, kv_tokens_read=n, attention_pairs=n * (n + 1) // 2)
                             ).breakdown_s["linear_compute_s"] / n for n in (1, 64, 512, 4096)]
    assert per_token == sorted(per_token, reverse=True)
    # long prefill: compute bound at the fitted efficiency, between it and the peak
    n = 4096
    peak = 2 * MODEL.num_params * n / GPU.bf16_flops_per_s
    assert peak < per_token[-1] * n < peak / 0.5


def test_tensor_parallel_shards_are_priced_per_rank():
    one = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(MODELS["Llama-2-13B"]))
    two = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(MODELS["Llama-2-13B"], tensor=2))
    a = one.step_time(_decode(32, 500)).breakdown_s["linear_compute_s"]
    b = two.step_time(_decode(32, 500)).breakdown_s["linear_compute_s"]
    assert 0.5 * a < b < 0.75 * a  # half the weights each, plus a launch floor per GEMM


@pytest.mark.parametrize("tensor", [1, 8])
def test_mla_attention_gemms_are_its_own_shapes(tensor):
    m = MODELS["DeepSeek-V3"]
    t = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(m, GPUS["H200-141GB"], tensor=tensor))
    assert t.gemm is not None and t.gemm_model == "fitted"
    H, h = 128 // tensor, m.hidden_size
    # vLLM's MLA decode: fused q/kv down-projections (replicated), q up, the absorbed kv_b halves, output
    assert gemm.attention_shapes(t.gemm.model) == [(1536 + 512 + 64, h), (H * 192, 1536), (H * 512, 128),
                                                   (H * 128, 512), (h, H * 128)]
    # their weights are DeepSeek-V3's attention weights per layer (config.json shapes)
    assert sum(n * k for n, k in gemm.attention_shapes(m)) == (h * (1536 + 576) + 1536 * 128 * 192
                                                               + 512 * 128 * 256 + 128 * 128 * h)
    # the shared expert and the 3 dense layers spread over 61: one gated MLP of the rest, 7168 wide
    # (2,048 shared + 3 x 18,432 / 61 dense, less the dense layers' missing MoE part, to within 10 %)
    width = gemm.shared_params_per_layer(m) / (3 * h)
    assert 2048 < width < 2048 + 3 * 18432 / 61 * 1.1
    shapes = t.gemm._shapes
    assert shapes[5] == (256, h) and shapes[:5] == gemm.attention_shapes(t.gemm.model)


@pytest.mark.parametrize("moe_kernel", ["auto", "none"])
@pytest.mark.parametrize("name,tensor", [("Mixtral-8x7B", 2), ("Qwen3-30B-A3B", 1), ("Qwen3-235B-A22B", 4)])
def test_moe_dense_gemms_are_fitted_and_the_routed_experts_priced_beside_them(name, tensor, moe_kernel):
    m, gpu = MODELS[name], GPUS["H100-SXM-80GB"]
    cfg = AnalyticalTimingConfig(moe_kernel=moe_kernel, moe_layer_s=2e-6, moe_align_kernel="vllm")
    t = AnalyticalTiming(cfg, _ctx(m, gpu, tensor=tensor))
    assert t.gemm is not None and t.gemm_model == "fitted"
    # the dense GEMMs: this GPU's QKV and output heads and the replicated router, no MLP (no shared experts)
    q, kv = t.gemm.model.num_attention_heads * m.head_dim, t.gemm.model.num_kv_heads * m.head_dim
    assert gemm.shared_params_per_layer(m) == 0.0
    assert t.gemm._shapes == [(q + 2 * kv, m.hidden_size), (m.hidden_size, q), (m.num_experts, m.hidden_size)]
    n = 24
    b = t.step_time(_decode(n, 700)).breakdown_s
    dense = m.num_layers * sum(gemm.linear_time_s(n, a, k, gpu) for a, k in t.gemm._shapes)
    assert b["gemm_s"] == pytest.approx(dense, rel=1e-12)
    if moe_kernel == "auto":  # the fused MoE kernel
        assert b["moe_experts_s"] == t.experts.scalar_s(n)
    else:  # the routed experts' weight reads under uniform routing, plus the MoE layers' fixed time
        routed = WeightReads(m, t.weights.weight_bytes, t.bandwidth_bytes_per_s)
        fixed = moe_fixed_s(m, "vllm", 2e-6)
        reads = routed.bytes_read(n) - routed.bytes_read(0)
        assert b["moe_experts_s"] == pytest.approx(reads / t.bandwidth_bytes_per_s + fixed, rel=1e-12)
        # a long prefill is compute bound: the k routed experts' FLOPs per token at the roofline's rate
        big = 8192
        flops = 2 * m.experts_per_token * routed_expert_params(m) * big / t.flops_per_s
        assert flops > (routed.bytes_read(big) - routed.bytes_read(0)) / t.bandwidth_bytes_per_s
        assert t.routed.scalar_s(big) == pytest.approx(flops + fixed, rel=1e-12)
    # linear_compute_s is the dense GEMMs and the LM head; the routed experts are moe_experts_s beside it
    assert b["linear_compute_s"] == b["gemm_s"] + b["lm_head_s"]
    assert b["moe_experts_s"] > 0
    # step_time, decode_durations and the scalar decode pricer: the same doubles, parts included
    sizes = np.array([1, 7, 24, 300, 1500], np.int64)  # past the first table: it grows
    d, parts, _ = t.decode_durations(sizes, sizes * 700, None)
    pricer = t.decode_step_pricer()
    for j, k in enumerate(sizes):
        st = t.step_time(_decode(int(k), 700))
        dur, col = pricer.column(int(k), int(k) * 700, 0)
        assert d[j].hex() == st.duration_s.hex() == dur.hex()
        for key in ("linear_compute_s", "gemm_s", "moe_experts_s", "kv_write_s"):
            assert float(parts[key][j]).hex() == float(st.breakdown_s[key]).hex()
        assert col[t._experts_row] == st.breakdown_s["moe_experts_s"]
        assert col[t._experts_row + 1] == st.breakdown_s["linear_compute_s"]


def test_an_moe_model_with_shared_experts_prices_them_as_a_dense_mlp():
    m = MODELS["Qwen3-30B-A3B"]
    h = m.hidden_size
    shared = replace(m, active_params=m.active_params + m.num_layers * 3 * h * 5632,
                     num_params=m.num_params + m.num_layers * 3 * h * 5632)  # a 5,632-wide gated shared expert
    assert gemm.shared_params_per_layer(shared) == pytest.approx(3 * h * 5632, rel=0.05)
    one = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(shared, GPU, tensor=1)).gemm._shapes
    two = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(shared, GPU, tensor=2)).gemm._shapes
    width = one[4][1]  # the published totals are rounded: the width comes back to within 1 %
    assert width == pytest.approx(5632, rel=0.01) and one[3:] == [(2 * width, h), (h, width)]
    assert two[3:] == [(2 * (width // 2), h), (h, width // 2)]  # split over the two ranks


def test_one_prefill_chunk_uses_the_fitted_prefill_attention():
    t = AnalyticalTiming(AnalyticalTimingConfig(), _ctx())
    c, p = 1024, 3000
    shape = BatchShape(num_seqs=1, num_prefill_seqs=1, num_decode_seqs=0, num_prefill_tokens=c, num_decode_tokens=0,
                       kv_tokens_read=c + p, attention_pairs=c * p + c * (c + 1) // 2)
    b = t.step_time(shape).breakdown_s
    fitted = MODEL.num_layers * gemm.prefill_attention_time_s(c, p, MODEL, GPU)
    kv_share = t._attention_s(1, c + p, None)  # the kernel model's KV-read time for this chunk
    assert fitted > kv_share  # a 1k-token chunk is compute bound: the fitted FLOP time decides
    assert b["prefill_attention_s"] == pytest.approx(fitted, rel=1e-9)
    assert b["attention_s"] == pytest.approx(b["decode_attention_s"] + b["prefill_attention_s"])


def test_gpu_without_a_fitted_profile_uses_the_config_efficiencies():
    cfg = AnalyticalTimingConfig(compute_efficiency=0.5, bandwidth_efficiency=0.5)
    t = AnalyticalTiming(cfg, _ctx(gpu=GPUS["L40S"]))
    assert t.gemm.profile.compute_efficiency == 0.5 and t.gemm.profile.bandwidth_efficiency == 0.5
    sh = gemm.gemm_shapes(MODEL)
    gemm_weights = 2 * (MODEL.num_layers * sum(n * k for op, (n, k) in sh.items() if op != "lm_head")
                        + sh["lm_head"][0] * sh["lm_head"][1])  # the embedding table is gathered, not read
    floor = gemm_weights / (GPUS["L40S"].hbm_bandwidth_bytes_per_s * 0.5)
    assert t.step_time(_decode(1, 10)).breakdown_s["linear_compute_s"] >= floor


def test_an_moe_config_without_active_params_reads_every_expert_through_the_gemms():
    """num_experts without active_params: every token goes through every expert (what the roofline's
    weight reads assume too), so no routed part: the experts are one dense MLP of the remaining weights."""
    m = replace(MODELS["Mixtral-8x7B"], active_params=0.0)
    t = AnalyticalTiming(AnalyticalTimingConfig(moe_kernel="auto"), _ctx(m, GPUS["H100-SXM-80GB"], tensor=2))
    assert t.routed is None and t.experts is None
    width = t.gemm._shapes[4][1]  # the shared MLP's width on one of the two GPUs: all 8 experts, split
    assert width == pytest.approx(8 * 14336 / 2, rel=0.03)
    sizes = np.array([1, 24, 300], np.int64)
    d, _, _ = t.decode_durations(sizes, sizes * 700, None)
    assert [x.hex() for x in d] == [t.step_time(_decode(int(k), 700)).duration_s.hex() for k in sizes]
