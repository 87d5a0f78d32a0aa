"""Pydantic models describing a synthetic trace (the ``synthetic:`` section / ``SPEC.yaml``).

All models forbid unknown keys, so a typo in a scenario file is an error, not a silent default.
The generator itself lives in :mod:`kvsim.trace.synthetic`; see ``docs/traces.md`` for examples.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvsim.config_base import Count, Number, Tokens
from kvsim.trace.schema import MAX_REQUESTS, MAX_TOKENS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---- token-length distributions (all produce integers >= 1) ---------------------------------

# Every length field is at most MAX_TOKENS (2**32), the bound a trace file may give (kvsim.trace.coerce),
# so a generated trace always loads back.


class FixedLength(_Strict):
    """Every request has ``value`` tokens."""

    kind: Literal["fixed"] = "fixed"
    value: Tokens = Field(ge=1, le=MAX_TOKENS)


class UniformLength(_Strict):
    """Uniform on the integers ``low..high`` (both inclusive)."""

    kind: Literal["uniform"] = "uniform"
    low: Tokens = Field(ge=1, le=MAX_TOKENS)
    high: Tokens = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self):
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class LognormalLength(_Strict):
    """Log-normal with the given ``mean`` (in tokens) and either ``sigma`` (of the underlying
    normal) or ``cv`` (std/mean of the log-normal itself: ``sigma = sqrt(ln(1 + cv^2))``).

    Samples are rounded to the nearest integer and clipped to ``[min_tokens, max_tokens]``
    (clipping shifts the mean slightly; the presets keep it within 1 %); ``max_tokens`` defaults
    to 2**32, the most a trace may give.
    """

    kind: Literal["lognormal"] = "lognormal"
    mean: Number = Field(gt=0, le=MAX_TOKENS)
    sigma: float | None = Field(default=None, ge=0)
    cv: float | None = Field(default=None, ge=0)
    min_tokens: Tokens = Field(default=1, ge=1, le=MAX_TOKENS)
    max_tokens: Tokens | None = Field(default=None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _one_spread(self):
        if (self.sigma is None) == (self.cv is None):
            raise ValueError("give exactly one of sigma or cv")
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})")
        return self


class ZipfLength(_Strict):
    """Bounded Zipf: ``P(k) ∝ k^-exponent`` for integers ``min_tokens <= k <= max_tokens``."""

    kind: Literal["zipf"] = "zipf"
    exponent: float = Field(gt=0)
    min_tokens: Tokens = Field(default=1, ge=1, le=MAX_TOKENS)
    max_tokens: Tokens = Field(ge=1, le=10_000_000)

    @model_validator(mode="after")
    def _ordered(self):
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= min_tokens ({self.min_tokens})")
        return self


class EmpiricalLength(_Strict):
    """Resample (with replacement) a column of a real trace file.

    ``column``: ``prompt`` or ``output`` tokens; default: the field this distribution is used
    for. A relative ``file`` resolves against the spec/scenario file's folder, then the current
    directory. Prompt and output are resampled independently.
    """

    kind: Literal["empirical"] = "empirical"
    file: str
    format: Literal["auto", "azure", "mooncake", "generic"] = "auto"
    column: Literal["prompt", "output"] | None = None


LengthDist = Annotated[
    Union[FixedLength, UniformLength, LognormalLength, ZipfLength, EmpiricalLength],
    Field(discriminator="kind"),
]


# ---- arrivals, shared prompts, conversations, sampling ---------------------------------------


MIN_RATE_PER_S = 1e-12  # an input bound (arrival times stay finite numbers of seconds), not a modelling constant


class ArrivalSpec(_Strict):
    """Arrival process: ``poisson`` (exponential gaps), ``gamma`` (gaps with coefficient of
    variation ``cv``; cv > 1 is burstier than Poisson, cv = 1 is Poisson) or ``constant``
    (evenly spaced). The first request arrives at t = 0.
    """

    process: Literal["poisson", "gamma", "constant"] = "poisson"
    rate_per_s: Number = Field(gt=0)
    cv: float = Field(default=1.0, gt=0)

    @field_validator("rate_per_s")
    @classmethod
    def _rate_keeps_times_finite(cls, v):
        if v < MIN_RATE_PER_S:
            raise ValueError(f"{v:g} requests/s is below {MIN_RATE_PER_S:g} (one request per ~30,000 years): the "
                             f"arrival times would not be finite numbers of seconds")
        return v

    @model_validator(mode="after")
    def _cv_only_for_gamma(self):
        if self.process != "gamma" and "cv" in self.model_fields_set and self.cv != 1.0:
            raise ValueError(f"cv applies only to process: gamma (process is {self.process})")
        return self


class SystemPromptSpec(_Strict):
    """A system prompt of ``tokens`` tokens prepended to a ``fraction`` of the requests (of the
    conversations, when multi-turn). Its full blocks get the same prefix keys in every such
    request; the prompt length of those requests is ``tokens`` + the sampled length.
    """

    tokens: Tokens = Field(ge=1, le=MAX_TOKENS)
    fraction: float = Field(default=1.0, ge=0, le=1)


class ThinkTimeSpec(_Strict):
    """Time between the arrivals of consecutive turns: ``fixed`` or ``exponential`` with ``mean_s``."""

    kind: Literal["fixed", "exponential"] = "exponential"
    mean_s: float = Field(ge=0)


class ConversationSpec(_Strict):
    """Multi-turn conversations. ``turns`` is the distribution of the number of turns. Turn k+1's
    prompt = turn k's prompt + turn k's output + a new user message (drawn from the
    ``prompt_tokens`` distribution), so its prefix keys extend turn k's full-block keys.
    """

    turns: LengthDist
    think_time_s: ThinkTimeSpec = ThinkTimeSpec(kind="exponential", mean_s=30.0)


class SamplingSpec(_Strict):
    """Parallel sampling (``n`` sequences per request) or beam search (``beam_width`` beams), for
    a ``fraction`` of the requests; both map to the trace's ``num_samples`` column, and
    ``trace.source["num_samples_kind"]`` records which.
    """

    n: int = Field(default=1, ge=1, le=1024)
    beam_width: int = Field(default=1, ge=1, le=1024)
    fraction: float = Field(default=1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _one_kind(self):
        if self.n > 1 and self.beam_width > 1:
            raise ValueError("give n (parallel sampling) or beam_width (beam search), not both")
        return self

    @property
    def kind(self) -> str:
        return "beam_search" if self.beam_width > 1 else "parallel_sampling"

    @property
    def samples(self) -> int:
        return max(self.n, self.beam_width)


class PrioritySpec(_Strict):
    """Each request's priority is drawn from ``values`` with probabilities ∝ ``weights``."""

    values: list[int] = Field(min_length=1)
    weights: list[float] | None = None

    @model_validator(mode="after")
    def _weights(self):
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError(f"weights has {len(self.weights)} entries, values has {len(self.values)}")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        return self


PresetName = Literal["sharegpt", "alpaca"]


class SyntheticTraceSpec(_Strict):
    """A synthetic workload: arrivals + length distributions + optional structure.

    Exactly one of ``num_requests`` and ``duration_s`` bounds the trace. ``preset`` supplies
    ``prompt_tokens``/``output_tokens`` distributions (explicit ones override it); without a preset
    both are required. ``seed`` (optional) overrides the scenario's seed. Prefix keys describe
    ``prefix_block_tokens``-token blocks and exist only when a system prompt or conversations
    give requests something to share.
    """

    num_requests: Count | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    duration_s: float | None = Field(default=None, gt=0)
    seed: int | None = Field(default=None, ge=0)
    preset: PresetName | None = None
    arrival: ArrivalSpec
    prompt_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    prefix_block_tokens: Tokens = Field(default=16, ge=1, le=1 << 20)
    system_prompt: SystemPromptSpec | None = None
    conversation: ConversationSpec | None = None
    sampling: SamplingSpec | None = None
    priority: PrioritySpec | None = None

    @model_validator(mode="after")
    def _complete(self):
        if (self.num_requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of num_requests or duration_s")
        if self.duration_s is not None and self.duration_s * self.arrival.rate_per_s > MAX_REQUESTS:
            raise ValueError(f"duration_s ({self.duration_s:g}) x arrival.rate_per_s ({self.arrival.rate_per_s:g}) "
                             f"expects {self.duration_s * self.arrival.rate_per_s:.3g} requests; at most "
                             f"{MAX_REQUESTS:,} (the num_requests limit)")
        if self.preset is None and (self.prompt_tokens is None or self.output_tokens is None):
            raise ValueError("give prompt_tokens and output_tokens, or a preset (sharegpt, alpaca)")
        return self
