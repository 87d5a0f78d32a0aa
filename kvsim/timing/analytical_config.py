"""The analytical timing model's scenario section (``timing: {kind: analytical, ...}``); the model
itself is :class:`kvsim.timing.analytical.AnalyticalTiming`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvsim.config_base import ByteRate, StrictModel
from kvsim.errors import did_you_mean, format_choices
from kvsim.timing import moe_kernel
from kvsim.timing.allreduce import ALLREDUCE_KINDS
from kvsim.timing.kernel import AUTO_NAMES, backend_choices, unknown_backend
from kvsim.timing.moe import MOE_ALIGN_KINDS
from kvsim.timing.overhead import EngineOverheadConfig, async_overlap_field
from kvsim.timing.transfer import DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S, null_link_rate_is_unset

ROOFLINE = "roofline"


class AnalyticalTimingConfig(StrictModel):
    kind: Literal["analytical"] = "analytical"
    compute_efficiency: float = Field(0.7, gt=0, le=1, description="achieved / peak FLOP/s")
    bandwidth_efficiency: float = Field(0.85, gt=0, le=1, description="achieved / peak HBM bandwidth for the "
                                        "weights and KV writes (KV reads: the attention kernel model)")
    step_overhead_s: float = Field(0.002, ge=0, description="fixed CPU/launch cost per step")
    overhead: EngineOverheadConfig | None = Field(
        None, description="CPU overhead that scales with the batch: per_seq_s (per scheduled sequence per "
                          "step), per_prefill_token_s (per prompt token computed); absent: none "
                          "(docs/engine_overhead.md)")
    async_overlap: bool = async_overlap_field()
    allreduce: Literal[ALLREDUCE_KINDS] = Field("nccl", description="tensor-parallel all-reduces: nccl, or the "
                                                "engine's own (measured curves), docs/engine_overhead.md")
    moe_align_kernel: Literal[MOE_ALIGN_KINDS] = Field("none", description="MoE: the per-layer token-alignment "
                                                       "kernel priced (measured), docs/engine_overhead.md")
    moe_layer_s: float = Field(0.0, ge=0, description="MoE: further fixed time per MoE layer per step (fitted)")
    moe_kernel: str = Field("none", description="MoE: the routed experts as a fused MoE kernel fitted to public "
                                                "benchmark_moe.py readings (auto: by weight dtype and GPU, or a "
                                                "profile name; none: their weight bytes inside the step's "
                                                "roofline), docs/engine_overhead.md 'MoE layers'")
    host_link_bandwidth_bytes_per_s: ByteRate = Field(
        DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S, gt=0, description="given: the legacy size-independent GPU<->host "
        "rate for swaps instead of the GPU's link (default 64 GB/s, PCIe Gen5 x16); null: not given"
    )
    attention_backend: str = Field(
        "auto", description="decode-attention kernel profile: auto (flashinfer-paged for every layout: one "
                            "kernel generation, so layouts and page sizes compare on their own), auto-2023 "
                            "(the old auto: vllm-paged-v1 for paged allocators, contiguous for "
                            "contiguous/buddy), a built-in name (contiguous, flashattention-paged, "
                            "flashinfer-paged, vllm-paged-v1 (old name vllm-2023-paged), vllm-paged-v2), a profile "
                            ".yaml path (e.g. from `kvsim calibrate fit`), or "
                            "roofline (KV reads at bandwidth_efficiency, no kernel model)")
    gemm_model: Literal["fitted", "roofline"] = Field(
        "fitted", description="linear layers and prefill attention: fitted (per-GPU GEMM model fitted to "
                              "Vidur's profiles, docs/gemm_model.md; kernels in sequence) or roofline "
                              "(max(weights + KV bytes at bandwidth_efficiency, FLOPs at compute_efficiency))")

    _null_link_is_unset = model_validator(mode="before")(null_link_rate_is_unset)  # null: the key unset

    @field_validator("moe_kernel")
    @classmethod
    def _known_moe_kernel(cls, v: str) -> str:
        names = moe_kernel.kernel_choices()
        if v in names:
            return v
        raise ValueError(f"unknown MoE kernel {v!r}{did_you_mean(v, names)}; valid: {format_choices(names)}")

    @field_validator("attention_backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        names = [*AUTO_NAMES, ROOFLINE, *backend_choices()]
        if v in names or v.endswith((".yaml", ".yml")):
            return v
        raise ValueError(unknown_backend(v, names))
