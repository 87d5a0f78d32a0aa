"""Roofline step-time model with a decode-attention kernel model for the KV reads.

Per step::

    weights_s  = weight_bytes / (hbm_bandwidth * bandwidth_efficiency)
    attention_s = kernel.time_s(num_seqs, kv_tokens_read, kv_pages_read)     (kvsim.timing.kernel)
    kv_read_s  = attention_s + num_tokens * kv_bytes_per_token / (hbm_bandwidth * bandwidth_efficiency)
    compute_s  = (2 * num_params * num_tokens + 4 * layers * heads * head_dim * attention_pairs)
                 / (peak_flops * compute_efficiency)
    swap_s     = (swap_in_bytes + swap_out_bytes) / host_link_bandwidth + tier_load_s   (no host_link:)
               = transfer_time_s(in bytes, in copies, h2d) + transfer_time_s(out..., d2h) + tier_load_s
                 with host_link: (docs/transfer_model.md)
    duration   = max(weights_s + kv_read_s, compute_s) + step_overhead_s + swap_s + parallel_comm_s

The attention kernel (backend ``timing.attention_backend``; ``auto``: the allocator's default, see
:func:`kvsim.timing.kernel.default_backend`) prices every scheduled sequence's KV read in one launch
per layer, decode and prefill alike: a prefill chunk reads its cached context and its new tokens
through the same paged layout, and its FLOPs stay on the compute side of the roofline (a long prefill
is compute-bound there). ``decode_attention_s`` / ``prefill_attention_s`` split ``attention_s`` in
proportion to the KV tokens each group reads. The KV writes of new tokens and the weights stream at
``bandwidth_efficiency``. ``attention_backend: roofline`` restores the pre-kernel-model behaviour
(every KV byte at ``bandwidth_efficiency``, block size ignored).

The weights are read once per step whatever the batch: that is what makes batching pay, and what
makes KV capacity (concurrency) decide throughput. Swaps are serialised with compute (vLLM v0 swaps
between steps on the critical path).

Under tensor/pipeline parallelism the bytes are one tensor rank's, FLOP/s are the tensor ranks'
together, and ``parallel_comm_s`` (all-reduces + stage sends, TimingContext.comm_s) is added; 0 on
one GPU (docs/models.md).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from kvsim.config_base import StrictModel
from kvsim.registry import TIMING_MODELS
from kvsim.timing.base import BatchShape, StepTiming
from kvsim.timing.context import TimingContext
from kvsim.timing.transfer import step_transfers
from kvsim.errors import did_you_mean, format_choices
from kvsim.timing.kernel import (KernelModel, KVLayout, builtin_backends, default_backend, load_backend,
                                 pages_or_estimate)

ROOFLINE = "roofline"


class AnalyticalTimingConfig(StrictModel):
    kind: Literal["analytical"] = "analytical"
    compute_efficiency: float = Field(0.7, gt=0, le=1, description="achieved / peak FLOP/s")
    bandwidth_efficiency: float = Field(0.85, gt=0, le=1, description="achieved / peak HBM bandwidth for the "
                                        "weights and KV writes (KV reads: the attention kernel model)")
    step_overhead_s: float = Field(0.002, ge=0, description="fixed CPU/launch cost per step")
    host_link_bandwidth_bytes_per_s: float = Field(
        64e9, gt=0, description="GPU<->host link for swaps (PCIe Gen5 x16 ~ 64 GB/s)"
    )
    attention_backend: str = Field(
        "auto", description="decode-attention kernel profile: auto (paged allocators: vllm-2023-paged; "
                            "contiguous/buddy: contiguous), a built-in name (contiguous, flashinfer-paged, "
                            "vllm-2023-paged), a profile .yaml path (e.g. from `kvsim calibrate fit`), or "
                            "roofline (KV reads at bandwidth_efficiency, no kernel model)")

    @field_validator("attention_backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        names = ["auto", ROOFLINE, *builtin_backends()]
        if v in names or v.endswith((".yaml", ".yml")):
            return v
        raise ValueError(f"unknown attention backend {v!r}{did_you_mean(v, names)}; valid: "
                         f"{format_choices(names)}, or a profile .yaml path")


class AnalyticalTiming:
    def __init__(self, cfg: AnalyticalTimingConfig, ctx: TimingContext):
        m = ctx.model
        self.cfg = cfg
        self.kv_bytes_per_token = ctx.kv_bytes_per_token
        self.weight_bytes = ctx.weight_bytes
        self.bandwidth_bytes_per_s = ctx.gpu.hbm_bandwidth_bytes_per_s * cfg.bandwidth_efficiency
        self.flops_per_s = ctx.gpu.bf16_flops_per_s * cfg.compute_efficiency * ctx.tensor_parallel
        self.linear_flops_per_token = 2.0 * m.params_per_token  # MoE: the active experts only
        self.comm_s = ctx.comm_s  # tensor/pipeline parallel communication (0.0 on one GPU)
        self.transfers = step_transfers(ctx.host_transfers, cfg.host_link_bandwidth_bytes_per_s)
        self.attention_flops_per_pair = 4.0 * m.num_layers * m.num_attention_heads * m.head_dim
        self.block_size = ctx.block_size
        self.peak_hbm_bandwidth_bytes_per_s = ctx.gpu.hbm_bandwidth_bytes_per_s
        name = cfg.attention_backend
        if name == "auto":
            name = default_backend(ctx.block_size)
        self.backend_name = name
        self.kernel: KernelModel | None = None
        if name != ROOFLINE:
            profile = load_backend(name, ctx.base_dir)
            layout = KVLayout.from_model(m, ctx.kv_dtype, ctx.block_size)
            self.kernel = KernelModel(profile, layout, ctx.gpu.hbm_bandwidth_bytes_per_s, ctx.gpu.num_sms)

    def _attention_s(self, num_seqs, kv_tokens, kv_pages):
        if self.kernel is None:
            return kv_tokens * self.kv_bytes_per_token / self.bandwidth_bytes_per_s
        return self.kernel.time_s(num_seqs, kv_tokens, kv_pages)

    def step_time(self, shape: BatchShape) -> StepTiming:
        kv_read = shape.kv_tokens_read * self.kv_bytes_per_token
        kv_write = shape.num_tokens * self.kv_bytes_per_token
        weights_s = self.weight_bytes / self.bandwidth_bytes_per_s
        # sequences in the launch: every sample of a parallel-sampling request reads its own context
        seqs = shape.num_prefill_seqs + shape.num_decode_seqs
        attn_kv_s = self._attention_s(seqs, shape.kv_tokens_read, shape.kv_pages_read or None)
        kv_s = attn_kv_s + kv_write / self.bandwidth_bytes_per_s
        linear_s = self.linear_flops_per_token * shape.num_tokens / self.flops_per_s
        attn_s = self.attention_flops_per_pair * shape.attention_pairs / self.flops_per_s
        swap_s = self.transfers.swap_s(shape.swap_in_bytes, shape.swap_in_copies,
                                       shape.swap_out_bytes, shape.swap_out_copies) + shape.tier_load_s
        duration = max(weights_s + kv_s, linear_s + attn_s) + self.cfg.step_overhead_s + swap_s
        comm_s = self.comm_s(shape.num_tokens)  # parallelism (same expression in decode_durations)
        duration = duration + comm_s
        if shape.num_prefill_seqs and shape.kv_tokens_read:
            from kvsim.timing.calibrated import split_kv_tokens

            pre_kv, _ = split_kv_tokens(shape)
            pre_att = attn_kv_s * (pre_kv / shape.kv_tokens_read)
        else:
            pre_att = 0.0
        return StepTiming(
            duration_s=duration,
            breakdown_s={
                "weights_read_s": weights_s,
                "kv_read_s": kv_s,
                "linear_compute_s": linear_s,
                "attention_compute_s": attn_s,
                "attention_s": attn_kv_s,
                "decode_attention_s": attn_kv_s - pre_att,
                "prefill_attention_s": pre_att,
                "overhead_s": self.cfg.step_overhead_s,
                "swap_s": swap_s,
                "parallel_comm_s": comm_s,
            },
            kv_bytes_read=kv_read,
        )

    def decode_durations(self, num_seqs: np.ndarray, kv_tokens_read: np.ndarray,
                         kv_pages_read: np.ndarray | None = None):
        """Vectorised ``step_time`` for decode-only steps (one new token per sequence, no swaps).

        Element j equals ``step_time(shape_j).duration_s`` bit for bit: the same IEEE operations in
        the same order (the fast engine relies on it). ``kv_pages_read`` None (an engine that does
        not count pages) or a 0 element means "not known", as ``BatchShape.kv_pages_read == 0``
        does. Returns (durations, breakdown parts per step -- an array, or a float that is the same
        every step --, KV bytes read per step); see :func:`kvsim.timing.base.decode_totals`.
        """
        kv_read = kv_tokens_read * self.kv_bytes_per_token
        kv_write = num_seqs * self.kv_bytes_per_token
        weights_s = self.weight_bytes / self.bandwidth_bytes_per_s
        if kv_pages_read is not None and self.block_size is not None:
            est = pages_or_estimate(num_seqs, kv_tokens_read, None, self.block_size)
            kv_pages_read = np.where(kv_pages_read > 0, kv_pages_read, est)
        attn_kv_s = self._attention_s(num_seqs, kv_tokens_read, kv_pages_read)
        kv_s = attn_kv_s + kv_write / self.bandwidth_bytes_per_s
        linear_s = self.linear_flops_per_token * num_seqs / self.flops_per_s
        attn_s = self.attention_flops_per_pair * kv_tokens_read / self.flops_per_s
        swap_s = 0 / self.cfg.host_link_bandwidth_bytes_per_s + 0.0
        duration = np.maximum(weights_s + kv_s, linear_s + attn_s) + self.cfg.step_overhead_s + swap_s
        comm_s = self.comm_s(num_seqs)  # parallelism (same expression as in step_time)
        duration = duration + comm_s
        parts = {
            "weights_read_s": weights_s,
            "kv_read_s": kv_s,
            "linear_compute_s": linear_s,
            "attention_compute_s": attn_s,
            "attention_s": attn_kv_s,
            "decode_attention_s": attn_kv_s,
            "prefill_attention_s": 0.0,
            "overhead_s": self.cfg.step_overhead_s,
            "swap_s": 0.0,
            "parallel_comm_s": comm_s,
        }
        return duration, parts, kv_read


TIMING_MODELS.register("analytical", AnalyticalTimingConfig, AnalyticalTiming)
