"""Roofline step-time model.

Per step::

    memory_s  = (weight_bytes + kv_bytes_read + kv_bytes_written) / (hbm_bandwidth * bandwidth_efficiency)
    compute_s = (2 * num_params * num_tokens + 4 * layers * heads * head_dim * attention_pairs)
                / (peak_flops * compute_efficiency)
    swap_s    = (swap_in_bytes + swap_out_bytes) / host_link_bandwidth + tier_load_s
    duration  = max(memory_s, compute_s) + step_overhead_s + swap_s

``kv_bytes_read = kv_tokens_read * kv_bytes_per_token``; ``kv_bytes_written = num_tokens *
kv_bytes_per_token``. The weights are read once per step whatever the batch: that is what makes
batching pay, and what makes KV capacity (concurrency) decide throughput. Swaps are serialised
with compute (vLLM v0 swaps between steps on the critical path).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from kvsim.config_base import StrictModel
from kvsim.registry import TIMING_MODELS
from kvsim.timing.base import BatchShape, StepTiming
from kvsim.timing.context import TimingContext


class AnalyticalTimingConfig(StrictModel):
    kind: Literal["analytical"] = "analytical"
    compute_efficiency: float = Field(0.7, gt=0, le=1, description="achieved / peak FLOP/s")
    bandwidth_efficiency: float = Field(0.85, gt=0, le=1, description="achieved / peak HBM bandwidth")
    step_overhead_s: float = Field(0.002, ge=0, description="fixed CPU/launch cost per step")
    host_link_bandwidth_bytes_per_s: float = Field(
        64e9, gt=0, description="GPU<->host link for swaps (PCIe Gen5 x16 ~ 64 GB/s)"
    )


class AnalyticalTiming:
    def __init__(self, cfg: AnalyticalTimingConfig, ctx: TimingContext):
        m = ctx.model
        self.cfg = cfg
        self.kv_bytes_per_token = ctx.kv_bytes_per_token
        self.weight_bytes = ctx.weight_bytes
        self.bandwidth_bytes_per_s = ctx.gpu.hbm_bandwidth_bytes_per_s * cfg.bandwidth_efficiency
        self.flops_per_s = ctx.gpu.bf16_flops_per_s * cfg.compute_efficiency
        self.linear_flops_per_token = 2.0 * m.num_params
        self.attention_flops_per_pair = 4.0 * m.num_layers * m.num_attention_heads * m.head_dim

    def step_time(self, shape: BatchShape) -> StepTiming:
        kv_read = shape.kv_tokens_read * self.kv_bytes_per_token
        kv_write = shape.num_tokens * self.kv_bytes_per_token
        weights_s = self.weight_bytes / self.bandwidth_bytes_per_s
        kv_s = (kv_read + kv_write) / self.bandwidth_bytes_per_s
        linear_s = self.linear_flops_per_token * shape.num_tokens / self.flops_per_s
        attn_s = self.attention_flops_per_pair * shape.attention_pairs / self.flops_per_s
        swap_s = (shape.swap_in_bytes + shape.swap_out_bytes) / self.cfg.host_link_bandwidth_bytes_per_s \
            + shape.tier_load_s
        duration = max(weights_s + kv_s, linear_s + attn_s) + self.cfg.step_overhead_s + swap_s
        return StepTiming(
            duration_s=duration,
            breakdown_s={
                "weights_read_s": weights_s,
                "kv_read_s": kv_s,
                "linear_compute_s": linear_s,
                "attention_compute_s": attn_s,
                "overhead_s": self.cfg.step_overhead_s,
                "swap_s": swap_s,
            },
            kv_bytes_read=kv_read,
        )


    def decode_durations(self, num_seqs: np.ndarray, kv_tokens_read: np.ndarray, kv_pages_read: np.ndarray):
        """Vectorised ``step_time`` for decode-only steps (one new token per sequence, no swaps).

        Element j equals ``step_time(shape_j).duration_s`` bit for bit: the same IEEE operations in
        the same order (the fast engine relies on it). Returns (durations, breakdown parts per step
        -- an array, or a float that is the same every step --, KV bytes read per step); see
        :func:`kvsim.timing.base.decode_totals`.
        """
        kv_read = kv_tokens_read * self.kv_bytes_per_token
        kv_write = num_seqs * self.kv_bytes_per_token
        weights_s = self.weight_bytes / self.bandwidth_bytes_per_s
        kv_s = (kv_read + kv_write) / self.bandwidth_bytes_per_s
        linear_s = self.linear_flops_per_token * num_seqs / self.flops_per_s
        attn_s = self.attention_flops_per_pair * kv_tokens_read / self.flops_per_s
        swap_s = 0 / self.cfg.host_link_bandwidth_bytes_per_s + 0.0
        duration = np.maximum(weights_s + kv_s, linear_s + attn_s) + self.cfg.step_overhead_s + swap_s
        parts = {
            "weights_read_s": weights_s,
            "kv_read_s": kv_s,
            "linear_compute_s": linear_s,
            "attention_compute_s": attn_s,
            "overhead_s": self.cfg.step_overhead_s,
            "swap_s": 0.0,
        }
        return duration, parts, kv_read


TIMING_MODELS.register("analytical", AnalyticalTimingConfig, AnalyticalTiming)
