"""fp8 KV under vLLM v1's default backend (``auto-flashattention``): the kernel vLLM's selector runs.

vLLM's FlashAttention backend reads fp8 KV only with FlashAttention-3 (compute capability 9.x); on 8.x
the selector takes the next backend that reads it, FlashInfer (docs/kernel_model.md, "Selecting a
backend"). Before, kvsim ran the FlashAttention-2 profile with a separate dequantisation pass, a pair
vLLM never runs, and fp8 KV came out slower than fp16."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from kvsim.hw import GPUS, MODELS
from kvsim.kernel_cli import predict
from kvsim.models.geometry import KVGeometry
from kvsim.timing.kernel import KernelModel, load_backend, resolve_backend


@pytest.mark.parametrize("gpu, expected", [("H100-SXM-80GB", "flashattention3-paged"),
                                           ("H200-141GB", "flashattention3-paged"),
                                           ("A100-80GB", "flashinfer-paged"), ("L40S", "flashinfer-paged")])
def test_auto_flashattention_fp8_follows_the_gpu(gpu, expected):
    cc = GPUS[gpu].compute_capability
    assert resolve_backend("auto-flashattention", 16, "gqa", "fp8", cc) == expected
    # 16-bit KV, int8 (no vLLM CUDA dtype), an unknown GPU, and MLA models keep today's choice
    assert resolve_backend("auto-flashattention", 16, "gqa", "fp16", cc) == "flashattention-paged"
    assert resolve_backend("auto-flashattention", 16, "gqa", "int8", cc) == "flashattention-paged"
    assert resolve_backend("auto-flashattention", 16, "gqa", "fp8", None) == "flashattention-paged"
    assert resolve_backend("auto-flashattention", 64, "mla", "fp8", cc) == "flashmla"
    # a named backend is never switched
    assert resolve_backend("flashattention-paged", 16, "gqa", "fp8", cc) == "flashattention-paged"


def test_every_preset_knows_its_compute_capability():
    assert {g: s.compute_capability for g, s in GPUS.items()} == {
        "A100-40GB": 8.0, "A100-80GB": 8.0, "A100-PCIe-80GB": 8.0, "H100-SXM-80GB": 9.0, "H100-PCIe-80GB": 9.0,
        "H200-141GB": 9.0, "L40S": 8.9}


def test_fa3_profile_is_the_fa_fit_reading_fp8_fused():
    fa, fa3 = load_backend("flashattention-paged"), load_backend("flashattention3-paged")
    differ = {f.name for f in fields(fa) if getattr(fa, f.name) != getattr(fa3, f.name)}
    assert differ == {"name", "description", "fused_dequant_kv_dtypes", "source"}
    assert fa3.fused_dequant_kv_dtypes == ("fp8",) and fa.fused_dequant_kv_dtypes == ()


def test_fp8_reads_kv_faster_than_fp16_under_the_default_on_hopper():
    m, g = MODELS["Llama-2-13B"], GPUS["H100-SXM-80GB"]

    def time(dtype, name=None):
        name = name or resolve_backend("auto-flashattention", 16, "gqa", dtype, g.compute_capability)
        km = KernelModel.for_gpu(load_backend(name), KVGeometry.from_model(m, dtype, 16), g)
        return km.time_s(64, 64 * 2048, 64 * 128)

    # half the KV bytes; the fixed per-launch and per-unit costs stay
    assert time("fp8") < 0.85 * time("fp16")
    # what the default ran before: FlashAttention-2 with a dequantisation pass, slower than fp16
    assert time("fp8", "flashattention-paged") > time("fp16")


def test_kernel_cli_reports_the_backend_vllm_runs():
    a100 = predict("A100-80GB", "Llama-2-13B", 32, 1024, 16, "auto-flashattention", "fp8")
    h100 = predict("H100-SXM-80GB", "Llama-2-13B", 32, 1024, 16, "auto-flashattention", "fp8")
    assert (a100["backend"], h100["backend"]) == ("flashinfer-paged", "flashattention3-paged")


def test_default_profile_run_records_the_fp8_backend(tmp_path):
    from kvsim.cli import main

    scn = tmp_path / "s.yaml"
    scn.write_text("name: s\nmodel: Llama-2-13B\ngpu: A100-80GB\nkv_dtype: fp8\n"
                   "trace: {synthetic: {preset: sharegpt, num_requests: 20, arrival: {process: poisson, "
                   "rate_per_s: 5}}}\n")
    assert main(["run", str(scn), "--out", str(tmp_path / "a"), "--no-plots", "--quiet"]) == 0
    assert main(["run", str(scn), "--out", str(tmp_path / "h"), "--no-plots", "--quiet",
                 "--set", "gpu=H100-SXM-80GB"]) == 0
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    h = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert a["kv_access"]["attention_backend"] == "flashinfer-paged"
    assert h["kv_access"]["attention_backend"] == "flashattention3-paged"


def test_vllm_v0_selector_takes_pagedattention_for_fp8():
    """QA (twenty-ninth session): under engine_profile vllm-v0.6 an fp8-KV run read KV with FlashAttention-2
    plus a dequantisation pass (TPOT 139.5 -> 255.5 ms on an A100), a pair vLLM 0.4-0.6 never ran: its
    selector takes XFORMERS (PagedAttention v1/v2 decode, fp8 read in the kernel since vLLM 0.3)."""
    from kvsim.config import Scenario

    for gpu in ("A100-80GB", "H100-SXM-80GB"):
        cc = GPUS[gpu].compute_capability
        assert resolve_backend("auto-vllm-v0", 16, "gqa", "fp8", cc) == "vllm-paged-v2"
        assert resolve_backend("auto-vllm-v0", 16, "gqa", "bf16", cc) == "flashattention-paged"
    assert resolve_backend("auto-vllm-v0", 16, "gqa", "fp16", 7.5) == "vllm-paged-v2"  # Volta/Turing: XFORMERS
    assert resolve_backend("auto-vllm-v0", 64, "mla", "fp8", 9.0) == "flashmla"
    assert load_backend("vllm-paged-v2").fused_dequant_kv_dtypes == ("fp8",)
    scn = Scenario.model_validate({"engine_profile": "vllm-v0.6", "model": "Llama-3-8B", "gpu": "A100-80GB",
                                   "trace": {"file": "t.csv"}})
    assert scn.timing.attention_backend == "auto-vllm-v0"
    m, g = MODELS["Llama-3-8B"], GPUS["A100-80GB"]

    def time(dtype, name=None):
        km = KernelModel.for_gpu(load_backend(name or resolve_backend("auto-vllm-v0", 16, "gqa", dtype, 8.0)),
                                 KVGeometry.from_model(m, dtype, 16), g)
        return km.time_s(64, 64 * 2048, 64 * 128)

    # the PagedAttention kernel reads the fp8 bytes in one pass: faster than itself at fp16 and than the
    # FlashAttention-2 + dequantisation pass the profile ran before (not necessarily than FA2 at fp16:
    # it re-reads a GQA group's KV per query head)
    assert time("fp8") < time("fp16", "vllm-paged-v2") and time("fp8") < time("fp8", "flashattention-paged")
