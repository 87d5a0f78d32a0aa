"""Constant step time, for tests and exact timelines: ``step_s + per_token_s * num_tokens``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvsim.config_base import StrictModel
from kvsim.registry import TIMING_MODELS
from kvsim.timing.base import BatchShape, StepTiming
from kvsim.timing.context import TimingContext


class ConstantTimingConfig(StrictModel):
    kind: Literal["constant"] = "constant"
    step_s: float = Field(0.01, gt=0)
    per_token_s: float = Field(0.0, ge=0)


class ConstantTiming:
    def __init__(self, cfg: ConstantTimingConfig, ctx: TimingContext | None = None):
        self.cfg = cfg
        self.kv_bytes_per_token = ctx.kv_bytes_per_token if ctx else 0

    def step_time(self, shape: BatchShape) -> StepTiming:
        compute = self.cfg.per_token_s * shape.num_tokens
        return StepTiming(
            duration_s=self.cfg.step_s + compute + shape.tier_load_s,
            breakdown_s={"overhead_s": self.cfg.step_s, "compute_s": compute, "swap_s": shape.tier_load_s},
            kv_bytes_read=shape.kv_tokens_read * self.kv_bytes_per_token,
        )


    def decode_durations(self, num_seqs, kv_tokens_read, kv_pages_read):
        """Vectorised ``step_time`` for decode-only steps (see AnalyticalTiming.decode_durations)."""
        compute = self.cfg.per_token_s * num_seqs
        duration = self.cfg.step_s + compute + 0.0
        return duration, {"overhead_s": self.cfg.step_s, "compute_s": compute}, kv_tokens_read * self.kv_bytes_per_token


TIMING_MODELS.register("constant", ConstantTimingConfig, ConstantTiming)
