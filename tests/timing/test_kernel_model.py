"""The decode-attention kernel model: each term's direction, profile validation, bit-for-bit
vectorisation through AnalyticalTiming."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvsim.models.geometry import KVGeometry
from kvsim.errors import ConfigError
from kvsim.hw import GPUS, MODELS
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape
from kvsim.timing.context import TimingContext
from kvsim.timing.kernel import (KernelModel, KVLayout, builtin_backends, default_backend, load_backend,
                                 load_profile_file, resolve_backend)

MODEL = MODELS["Llama-2-13B"]
GPU = GPUS["A100-80GB"]


def kernel(backend: str, block: int | None, dtype: str = "fp16", model=MODEL, gpu=GPU, **override):
    prof = load_backend(backend)
    if override:
        prof = replace(prof, **override)
    return KernelModel(prof, KVLayout.from_model(model, dtype, block), gpu.hbm_bandwidth_bytes_per_s, gpu.num_sms)


def launch(km: KernelModel, batch: int, context: int):
    bs = km.layout.block_size
    pages = batch * -(-context // bs) if bs else batch
    return km.result(batch, batch * context, pages)


def test_builtin_backends_and_defaults():
    assert {"contiguous", "flashinfer-paged", "vllm-paged-v1"} <= set(builtin_backends())
    # auto: one kernel generation for every layout (issue 23); auto-2023: the old per-layout rule
    assert default_backend(16) == default_backend(1) == default_backend(None) == "flashinfer-paged"
    assert [resolve_backend("auto", b) for b in (1, 16, None)] == ["flashinfer-paged"] * 3
    assert [resolve_backend("auto-2023", b) for b in (1, 16, None)] == ["vllm-paged-v1"] * 2 + ["contiguous"]
    assert resolve_backend("contiguous", 16) == "contiguous"
    # a model with multi-head latent attention reads its latent with the MLA kernel under auto only
    assert [resolve_backend("auto", b, "mla") for b in (1, 64, None)] == ["flashmla"] * 3
    assert resolve_backend("auto-2023", 64, "mla") == "vllm-paged-v1"
    assert resolve_backend("flashinfer-paged", 64, "mla") == "flashinfer-paged"


def test_small_pages_slow_the_vllm_2023_kernel():
    times = [launch(kernel("vllm-paged-v1", b), 32, 1024).time_s for b in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(times, times[1:]))
    assert times[0] > 2.5 * times[-1]  # block 1 is several times slower than block 16


def test_vllm_paged_v1_stays_above_the_paper_band_floor_vs_contiguous():
    # vLLM paper (SOSP'23) section 7.1: 20-26 % higher attention-kernel latency than FasterTransformer
    # (Llama-13B on an A100-40GB). kvsim models no FasterTransformer kernel; the corpus-fitted v1
    # profile (docs/kernel_model.md, "Changed claim") is 1.35-1.83x the contiguous FlashAttention
    # profile at these settings (the corpus has no MHA vLLM row and no FasterTransformer row to pin
    # the band), so only the band's floor is checked: paging never makes the kernel cheaper here.
    a100 = GPUS["A100-40GB"]
    for batch in (8, 32):
        for context in (128, 256):
            ratio = (launch(kernel("vllm-paged-v1", 16, gpu=a100), batch, context).time_s
                     / launch(kernel("contiguous", None, gpu=a100), batch, context).time_s)
            assert ratio >= 1.17


def test_flashinfer_is_nearly_flat_in_page_size():
    times = [launch(kernel("flashinfer-paged", b), 32, 2048).time_s for b in (1, 4, 16, 64, 256)]
    assert max(times) / min(times) < 1.12  # "90 % of the bandwidth of dense kernels" at page size 1
    assert times[2] / times[-1] < 1.01


def test_contiguous_kernel_has_no_page_term():
    km = kernel("contiguous", None)
    a = km.time_s(32, 32 * 1000, 32)
    b = km.time_s(32, 32 * 1000, 10_000)  # pages are ignored on a contiguous layout
    assert a == b
    # a paged layout under the contiguous profile pays no per-page cost either
    kp = kernel("contiguous", 16)
    assert kp.time_s(32, 32000, 2000) == kp.time_s(32, 32000, 4000)


def test_whole_page_reads_only_where_the_backend_does_them():
    v = kernel("vllm-paged-v1", 64)
    f = kernel("flashinfer-paged", 64)
    # 32 sequences of 65 tokens: 2 pages each, the second holding 1 token
    assert v.result(32, 32 * 65, 64).bytes_read == pytest.approx(2 * v.result(32, 32 * 64, 32).bytes_read)
    assert f.result(32, 32 * 65, 64).bytes_read == pytest.approx(f.result(32, 32 * 64, 32).bytes_read * 65 / 64)


def test_saturation_below_peak_and_small_launches_far_below():
    km = kernel("flashinfer-paged", 16)
    big = launch(km, 256, 4096).bandwidth_utilisation
    small = launch(km, 1, 64).bandwidth_utilisation
    assert 0.8 < big < km.profile.max_bandwidth_utilisation <= 1.0
    assert small < 0.1
    utils = [launch(km, b, 1024).bandwidth_utilisation for b in (1, 4, 16, 64, 256)]
    assert all(a < b for a, b in zip(utils, utils[1:]))


def test_parallelism_caps_a_kernel_without_split_kv():
    # batch 1 at a long context: the unsplit vLLM-2023 kernel has 40 work units for 108 SMs; split
    # into partitions it has 280 (7 per head), and Little's law gives the bandwidth of
    # 40 / (40 + units_half) against 280 / (280 + units_half) of the cap (units_half ~ 330 on A100)
    no_split = launch(kernel("vllm-paged-v1", 16, page_overhead_s=0.0, dram_chunk_half_bytes=0.0,
                             whole_page_reads=False), 1, 16384)
    split = launch(kernel("vllm-paged-v1", 16, page_overhead_s=0.0, dram_chunk_half_bytes=0.0,
                          whole_page_reads=False, split_kv=True), 1, 16384)
    assert no_split.time_s > 3 * split.time_s


def test_fp8_fused_reads_fewer_bytes_and_unfused_pays_a_dequant_pass():
    fp16 = launch(kernel("flashinfer-paged", 16, "fp16"), 64, 2048)
    fused = launch(kernel("flashinfer-paged", 16, "fp8"), 64, 2048)
    unfused = launch(kernel("vllm-paged-v1", 16, "fp8", page_overhead_s=0.0, dram_chunk_half_bytes=0.0,
                            whole_page_reads=False, split_kv=True, gqa_grouped=True), 64, 2048)
    assert fused.time_s < 0.6 * fp16.time_s
    assert unfused.time_s > fp16.time_s  # dequantise (read fp8, write fp16) then read fp16
    assert unfused.bytes_read == pytest.approx(fp16.bytes_read * 2.5)


def test_empty_launch_costs_nothing_and_arrays_match_scalars():
    km = kernel("vllm-paged-v1", 16)
    assert km.time_s(0, 0, 0) == 0.0
    n = np.array([0, 1, 7, 300]); T = n * 513; P = n * 33
    arr = km.time_s(n, T, P)
    assert [km.time_s(int(a), int(b), int(c)) for a, b, c in zip(n, T, P)] == list(arr)


def _ctx(block, dtype="fp16", model=MODELS["Llama-3-8B"]):
    return TimingContext(model, GPU, KVGeometry.from_model(model, dtype, block), model.weight_bytes(), Path("."))


@pytest.mark.parametrize("gemm_model", ["fitted", "roofline"])
@pytest.mark.parametrize("block", [1, 16, None])
@pytest.mark.parametrize("backend", ["auto", "flashinfer-paged", "contiguous", "roofline"])
def test_decode_durations_equal_step_time_bit_for_bit(block, backend, gemm_model):
    t = AnalyticalTiming(AnalyticalTimingConfig(attention_backend=backend, gemm_model=gemm_model), _ctx(block))
    rng = np.random.default_rng(1)
    n = rng.integers(0, 400, 300)
    T = n * rng.integers(1, 5000, 300)
    P = np.where(rng.random(300) < 0.2, 0, T // (block or 1) + n)
    for pages in (None, P):
        d, parts, _ = t.decode_durations(n, T, pages)
        for j in range(len(n)):
            s = t.step_time(BatchShape(num_seqs=1, num_prefill_seqs=0, num_decode_seqs=int(n[j]),
                                       num_prefill_tokens=0, num_decode_tokens=int(n[j]), kv_tokens_read=int(T[j]),
                                       attention_pairs=int(T[j]),
                                       kv_pages_read=0 if pages is None else int(P[j])))
            assert s.duration_s == d[j]
            assert s.breakdown_s["attention_s"] == parts["attention_s"][j]
            assert s.breakdown_s["kv_read_s"] == parts["kv_read_s"][j]
            assert s.breakdown_s["linear_compute_s"] == parts["linear_compute_s"][j]


def test_block_size_now_matters_in_the_analytical_model():
    shape = BatchShape(num_seqs=64, num_prefill_seqs=0, num_decode_seqs=64, num_prefill_tokens=0,
                       num_decode_tokens=64, kv_tokens_read=64 * 1500, attention_pairs=64 * 1500,
                       kv_pages_read=64 * -(-1500 // 1))
    shape16 = replace(shape, kv_pages_read=64 * -(-1500 // 16))
    old = AnalyticalTimingConfig(attention_backend="auto-2023")  # the 2023 paged kernel
    d1 = AnalyticalTiming(old, _ctx(1)).step_time(shape).duration_s
    d16 = AnalyticalTiming(old, _ctx(16)).step_time(shape16).duration_s
    assert d1 > 1.2 * d16
    # auto's kernel (FlashInfer) loses about 10 % of its bandwidth at page 1 (its README), little of the step
    a1 = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(1)).step_time(shape).duration_s
    a16 = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(16)).step_time(shape16).duration_s
    assert a16 < a1 < 1.12 * a16


def test_prefill_split_of_attention_time():
    t = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(16))
    shape = BatchShape(num_seqs=9, num_prefill_seqs=1, num_decode_seqs=8, num_prefill_tokens=512,
                       num_decode_tokens=8, kv_tokens_read=512 + 8 * 1000, attention_pairs=512 * 513 // 2 + 8000,
                       kv_pages_read=32 + 8 * 63)
    b = t.step_time(shape).breakdown_s
    assert b["prefill_attention_s"] > 0 and b["decode_attention_s"] > 0
    assert b["prefill_attention_s"] + b["decode_attention_s"] == pytest.approx(b["attention_s"])


# -- profile validation ---------------------------------------------------------------------------
def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prof.yaml"
    p.write_text(text)
    return p


def _good_text() -> str:
    from importlib import resources

    return (resources.files("kvsim.timing.backends") / "flashinfer-paged.yaml").read_text()


def test_profile_file_round_trip(tmp_path):
    prof = load_profile_file(_write(tmp_path, _good_text()))
    assert prof == replace(load_backend("flashinfer-paged"), source=prof.source)


@pytest.mark.parametrize("edit, key", [
    (lambda s: s.replace("page_overhead_s: 0.0\n", ""), "page_overhead_s"),
    (lambda s: re.sub(r"unit_overhead_s: .*", "unit_overhead_s: -1.0", s), "unit_overhead_s"),
    (lambda s: re.sub(r"max_bandwidth_utilisation: .*", "max_bandwidth_utilisation: 1.5", s),
     "max_bandwidth_utilisation"),
    (lambda s: re.sub(r"bytes_in_flight_per_unit: .*", "bytes_in_flight_per_unit: -5", s), "bytes_in_flight_per_unit"),
    (lambda s: s + "ctas_per_sm: -1\n", "ctas_per_sm"),
    (lambda s: s.replace("split_kv: true", "split_kv: maybe"), "split_kv"),
    (lambda s: s + "page_overhead: 1\n", "page_overhead"),
    (lambda s: s.replace("[fp8]", "[fp7]"), "fused_dequant_kv_dtypes"),
])
def test_bad_profiles_name_file_and_key(tmp_path, edit, key):
    p = _write(tmp_path, edit(_good_text()))
    with pytest.raises(ConfigError) as e:
        load_profile_file(p)
    msg = str(e.value)
    assert str(p) in msg and f"'{key}'" in msg and "\n" not in msg


def test_unknown_backend_lists_choices():
    with pytest.raises(ConfigError) as e:
        load_backend("flashinfer-page")
    assert "did you mean 'flashinfer-paged'" in str(e.value) and "vllm-paged-v1" in str(e.value)


def test_profile_path_relative_to_scenario(tmp_path):
    _write(tmp_path, _good_text())
    t = AnalyticalTiming(AnalyticalTimingConfig(attention_backend="prof.yaml"),
                         replace(_ctx(16), base_dir=tmp_path))
    assert t.kernel.profile.name == "flashinfer-paged"


def test_scenario_rejects_an_unknown_backend_with_choices():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        AnalyticalTimingConfig(attention_backend="flashinfer")
    assert "did you mean 'flashinfer-paged'" in str(e.value) and "roofline" in str(e.value)
    AnalyticalTimingConfig(attention_backend="my/profile.yaml")  # paths are checked when the model is built


def test_missing_profile_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        AnalyticalTiming(AnalyticalTimingConfig(attention_backend="nope.yaml"), replace(_ctx(16), base_dir=tmp_path))
    assert "nope.yaml" in str(e.value) and "\n" not in str(e.value)


def test_constant_timing_takes_the_pages_array():
    from kvsim.timing.constant import ConstantTiming, ConstantTimingConfig

    t = ConstantTiming(ConstantTimingConfig(step_s=0.01, per_token_s=0.001))
    n = np.array([1, 5])
    d, _, _ = t.decode_durations(n, n * 10, n * 2)
    assert list(d) == [0.011, 0.015]


def test_old_backend_name_is_an_alias():
    assert load_backend("vllm-2023-paged") == load_backend("vllm-paged-v1")
    assert "vllm-2023-paged" in str(pytest.raises(ConfigError, load_backend, "vllm-2023-pagd").value)
    # a run records the backend's name, not the old one (summary.json, the report, kvsim kernel agree)
    assert resolve_backend("vllm-2023-paged", 16) == "vllm-paged-v1"
    m = MODELS["Llama-2-7B"]
    ctx = TimingContext(model=m, gpu=GPUS["A100-80GB"], kv=KVGeometry.for_gpu(m, "fp16", 1, block_size=16),
                        weight_bytes=m.weight_bytes(), base_dir=Path("."), tensor_parallel=1)
    assert AnalyticalTiming(AnalyticalTimingConfig(attention_backend="vllm-2023-paged"), ctx).attention_backend \
        == "vllm-paged-v1"


def test_vllm_v2_follows_vllms_dispatch_rule():
    # vLLM (PR #1348; later versions add the 8,192-token clause): use_v1 = max_seq_len <= 8192 and
    # (max_num_partitions == 1 or num_seqs * num_heads > 512), partitions of 512 tokens
    # v2's profile holds vLLM 0.2-0.6's kernels (their own fit): where the rule picks v1, it is that profile
    # without partitions, not the 2023 kernel's profile (vllm-paged-v1)
    v2 = kernel("vllm-paged-v2", 16)  # Llama-2-13B: 40 query heads
    v1 = KernelModel(replace(v2.profile, split_kv=False), v2.layout, v2.peak_bw, 108)
    assert v2.profile.split_rule == "vllm-v2" and v2.profile.min_split_tokens == 512
    pages = lambda n, c: n * -(-c // 16)  # noqa: E731
    for n, c in ((13, 4096), (64, 2048), (32, 512), (1, 300)):  # > 512 units, or one partition: v1
        assert v2.time_s(n, n * c, pages(n, c)) == v1.time_s(n, n * c, pages(n, c))
    assert v2.time_s(2, 2 * 4096, pages(2, 4096)) < v1.time_s(2, 2 * 4096, pages(2, 4096))  # 80 units, 8 parts
    assert v2.time_s(32, 32 * 9000, pages(32, 9000)) != v1.time_s(32, 32 * 9000, pages(32, 9000))  # > 8192
    forced = KernelModel(replace(v2.profile, split_rule="partition"), v2.layout, v2.peak_bw, 108)
    assert forced.time_s(64, 64 * 2048, pages(64, 2048)) != v1.time_s(64, 64 * 2048, pages(64, 2048))


def test_query_head_rereads_only_without_grouping():
    gqa = MODELS["Llama-3-8B"]  # 32 query heads, 8 KV heads
    prof = load_backend("vllm-paged-v1")
    km = KernelModel(prof, KVLayout.from_model(gqa, "fp16", 16), 2.039e12, 108)
    assert km.rereads == pytest.approx(1 + prof.query_head_reads * 3)
    grouped = KernelModel(load_backend("flashinfer-paged"), KVLayout.from_model(gqa, "fp16", 16), 2.039e12, 108)
    assert grouped.rereads == 1.0
    mha = KernelModel(prof, KVLayout.from_model(MODELS["Llama-2-13B"], "fp16", 16), 2.039e12, 108)
    assert mha.rereads == 1.0


def test_saturation_follows_littles_law_with_the_gpus_dram_latency():
    """Every built-in profile saturates as units / (units + units_half), units_half = peak x cap x
    DRAM latency / bytes in flight per unit; the latency is the GPU's (gpu_memory.csv, with sources)."""
    from kvsim.timing.gpu_memory import FALLBACK_GPU, dram_latency_s, gpu_latencies

    assert all(load_backend(b).bytes_in_flight_per_unit > 0 for b in builtin_backends())
    assert set(gpu_latencies()) >= {"A100-40GB", "A100-80GB", "H100-SXM-80GB", "H200-141GB"}
    assert dram_latency_s("A100-80GB") == pytest.approx(400 / 1410e6)  # 400 cycles at 1,410 MHz
    assert dram_latency_s("L40S") == dram_latency_s(FALLBACK_GPU)  # no public figure: said in the docs
    prof = load_backend("flashattention-paged")
    lay = KVLayout.from_model(MODEL, "fp16", 16)
    a100, h100 = (KernelModel.for_gpu(prof, lay, GPUS[g]) for g in ("A100-80GB", "H100-SXM-80GB"))
    for km, g in ((a100, GPUS["A100-80GB"]), (h100, GPUS["H100-SXM-80GB"])):
        half = g.hbm_bandwidth_bytes_per_s * prof.max_bandwidth_utilisation * dram_latency_s(g.name) \
            / prof.bytes_in_flight_per_unit
        assert km.units_half == pytest.approx(half, rel=1e-12)
        assert km._parallel_bw(half, min) == pytest.approx(km.bw / 2)  # half the cap at units_half units
    # more work units keep more bytes in flight: achieved bandwidth rises without a sharp knee
    bws = [a100._parallel_bw(float(u), min) for u in (64, 256, 1024, 4096)]
    assert all(x < y for x, y in zip(bws, bws[1:])) and bws[-1] < a100.bw


def test_mla_models_resolve_auto_to_flashmla_in_a_run():
    m = MODELS["DeepSeek-V3"]
    ctx = TimingContext(model=m, gpu=GPUS["H100-SXM-80GB"], kv=KVGeometry.for_gpu(m, "bf16", 8, block_size=64),
                        weight_bytes=m.weight_bytes() // 8, base_dir=Path("."), tensor_parallel=8)
    timing = AnalyticalTiming(AnalyticalTimingConfig(attention_backend="auto"), ctx)
    assert timing.attention_backend == "flashmla"
    # one latent per token and layer, read once by all 16 query heads of a GPU: 1,152 bytes in bf16
    assert timing.kernel.layout.kv_bytes_per_token_layer == 1152 and timing.kernel.heads_par == 1


def test_an_mla_kernel_refuses_a_model_without_mla(tmp_path, capsys):
    """flashmla reads one latent per token (``attention_kinds: [mla]``): a GQA model is refused in one line by
    `kvsim kernel`, by a scenario (validate and run) and by a run's timing model; other kernels read both."""
    from kvsim.cli import main
    from kvsim.config import load_scenario

    assert load_backend("flashmla").attention_kinds == ("mla",)
    assert all(load_backend(b).attention_kinds == ("gqa", "mla") for b in builtin_backends() if b != "flashmla")
    assert main(["kernel", "--gpu", "A100-80GB", "--model", "Llama-2-13B", "--batch", "4", "--context", "128",
                 "--backend", "flashmla"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backend" in err[0] and "Llama-2-13B has gqa attention" in err[0]
    scn = tmp_path / "s.yaml"
    scn.write_text("model: Llama-2-7B\ngpu: H100-SXM-80GB\ntiming: {kind: analytical, attention_backend: flashmla}\n"
                   "trace: {synthetic: {preset: sharegpt, num_requests: 2, arrival: {process: poisson, rate_per_s: 1}}}\n")
    with pytest.raises(ConfigError, match=r"s.yaml: timing.attention_backend: backend 'flashmla' reads mla"):
        load_scenario(scn)
    m = MODELS["Llama-2-7B"]
    ctx = TimingContext(model=m, gpu=GPUS["H100-SXM-80GB"], kv=KVGeometry.for_gpu(m, "fp16", 1, block_size=16),
                        weight_bytes=m.weight_bytes(), base_dir=Path("."), tensor_parallel=1)
    with pytest.raises(ConfigError, match="timing.attention_backend: backend 'flashmla'"):
        AnalyticalTiming(AnalyticalTimingConfig(attention_backend="flashmla"), ctx)
    prof = tmp_path / "mine.yaml"  # a profile file's attention_kinds is checked as every key is
    prof.write_text(yaml.safe_dump(load_backend("flashmla").to_yaml_dict() | {"attention_kinds": ["mha"]}))
    with pytest.raises(ConfigError, match="mine.yaml: key 'attention_kinds' must be a non-empty list of gqa, mla"):
        load_backend(str(prof))


def test_rounds_of_resident_units_give_the_wave_sawtooth():
    # Llama-2-7B (32 heads, no split): batch 6 is 192 units, one round of 2 x 108 = 216; batch 7 is
    # 224 units, a full round plus 8 that stream at the concurrency of 8 (the corpus' sawtooth)
    lay = KVLayout.from_model(MODELS["Llama-2-7B"], "fp16", 16)
    base = replace(load_backend("flashattention-paged"), split_kv=False)
    per_token = {}
    for rounds in (0.0, 2.0):
        for sharp in (False, True):
            prof = replace(base, ctas_per_sm=rounds, units_per_sm_to_saturate=1.0,
                           bytes_in_flight_per_unit=0.0 if sharp else base.bytes_in_flight_per_unit)
            km = KernelModel(prof, lay, 2.039e12, 108)
            per_token[rounds, sharp] = [km.time_s(n, n * 3648, n * 228) / n for n in (6, 7, 13)]
    for sharp in (False, True):
        six, seven, thirteen = per_token[2.0, sharp]
        assert seven > 1.15 * six and thirteen < seven  # the step at the round, and its fading
        assert per_token[0.0, sharp][1] <= per_token[0.0, sharp][0] * 1.0001  # no rounds: no step
    # one round (batch 6) is the saturation form itself
    assert per_token[2.0, False][0] == pytest.approx(per_token[0.0, False][0], rel=1e-12)



def test_the_fp8_study_profile_is_the_builtin_flashinfer_profile_unfused():
    # scenarios/studies/profiles/flashinfer-paged-unfused.yaml isolates fusion (docs/studies.md, study
    # d): every constant must be the built-in profile's, or a refit would make the study compare two fits
    root = Path(__file__).resolve().parents[2]
    copy = load_profile_file(root / "scenarios" / "studies" / "profiles" / "flashinfer-paged-unfused.yaml")
    builtin = load_backend("flashinfer-paged")
    assert copy.fused_dequant_kv_dtypes == () and builtin.fused_dequant_kv_dtypes == ("fp8",)
    same = replace(copy, name=builtin.name, description=builtin.description, source=builtin.source,
                   fused_dequant_kv_dtypes=builtin.fused_dequant_kv_dtypes)
    assert same == builtin
