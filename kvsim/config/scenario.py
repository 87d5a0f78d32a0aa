"""The :class:`Scenario` model: every section of a scenario file, the plugin sections and policy keys
(their registries and default kinds), and the checks across sections."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

import kvsim.kv  # noqa: F401  (registers allocator kinds)
import kvsim.timing  # noqa: F401  (registers timing kinds)
from kvsim.config.batch_defaults import BatchContext
from kvsim.config.profiles import DEFAULT_PROFILE, PROFILE_NAMES, PROFILES, apply_batch_rule, apply_engine_profile
from kvsim.config.sections import (DEFAULT_GPU, BeamSearchConfig, ClientConfig, EngineConfig, FrontendConfig,
                                   GPUConfig, HostLinkConfig,
                                   KVBudgetConfig, KVDTypeName, LimitsConfig, MetricsConfig, ModelConfig,
                                   ParallelConfig, ReplicasConfig, SLOConfig, WeightDTypeName, _preset)
from kvsim.config_base import StrictModel
from kvsim.errors import did_you_mean, format_choices
from kvsim.hw import GPUS, MODELS, GPUSpec
from kvsim.kv.eviction import EVICTION_POLICIES
from kvsim.kv.paged import PagedAllocatorConfig
from kvsim.models.geometry import KVGeometry
from kvsim.models.memory import Reserve, cuda_total_bytes, vllm_reserve
from kvsim.models.parallel import ParallelPlan, layers_per_stage, plan
from kvsim.registry import ALLOCATORS, RESERVATIONS, ROUTERS, TIMING_MODELS, VICTIMS, plugin_union
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.router import DEFAULT_ROUTER
from kvsim.trace.config import TraceConfig

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


class Scenario(StrictModel):
    name: str | None = Field(None, description="defaults to the file name without extension")
    engine_profile: str = Field(
        DEFAULT_PROFILE, description="defaults for keys left out, from one engine and version: "
                                     f"{', '.join(PROFILE_NAMES)} (kvsim/config/profiles.py, docs/conformance.md)")
    description: str = ""
    seed: int = Field(0, ge=0, description="seeds every random draw of a run (synthetic traces, sampled policies)")
    trace: TraceConfig
    model: ModelConfig
    gpu: GPUConfig = Field(default_factory=lambda: GPUConfig(**GPUS[DEFAULT_GPU].to_dict()))
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
    frontend: FrontendConfig | None = Field(None, description="API-server processes in front of the engine "
                                                              "(absent: requests reach the engine on arrival)")
    client: ClientConfig | None = Field(None, description="the benchmark client's concurrency bound "
                                                          "(absent: every request is sent on arrival)")
    slo: SLOConfig | None = Field(None, description="service-level objectives for goodput / SLO attainment")
    metrics: MetricsConfig = MetricsConfig()
    baseline: str | None = Field(None, description="the variant the headline table compares the others with "
                                                   "(default: the first variant)")
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)

    # what the engine profile filled, {dotted key: value}, and each value's source (profile_filled(),
    # profile_sources(); not scenario keys)
    _profile_filled: dict = PrivateAttr(default_factory=dict)
    _profile_sources: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _engine_profile(cls, data, handler):
        if not isinstance(data, dict):  # e.g. a Scenario already validated: it keeps its own record
            return handler(data)
        data, filled, sources = apply_engine_profile(data)
        scn = handler(data)
        # the batch limits an engine derives from its GPU and model: read off the validated scenario,
        # then validated again with them (only where the profile has a rule and the scenario left them out)
        data, more, more_sources = apply_batch_rule(data, scn.batch_context())
        if more:
            scn = handler(data)
            filled, sources = {**filled, **more}, {**sources, **more_sources}
        scn._profile_filled, scn._profile_sources = filled, sources
        return scn

    @field_validator("engine_profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        if v not in PROFILES:
            raise ValueError(f"unknown engine profile {v!r}{did_you_mean(v, list(PROFILE_NAMES))}; "
                             f"valid choices: {format_choices(list(PROFILE_NAMES))}")
        return v

    def profile_filled(self) -> dict:
        """``{"name": profile, "filled": {dotted key: value}}``: the keys the engine profile set
        because the scenario left them out (summary.json and scenario.resolved.yaml record it)."""
        return {"name": self.engine_profile, "filled": dict(self._profile_filled)}

    def profile_sources(self) -> dict:
        """``{dotted key: source}`` for every key in ``profile_filled()["filled"]`` (scenario.resolved.yaml)."""
        return dict(self._profile_sources)

    def batch_context(self) -> BatchContext:
        """What an engine profile's batch rule reads (kvsim/config/batch_defaults.py): this scenario's
        GPU, the model's context limit, chunked prefill, and the two batch limits where given."""
        s = self.scheduler
        given = s.model_fields_set
        return BatchContext(gpu_name=self.gpu.name, gpu_memory_bytes=self.gpu.memory_bytes,
                            max_model_len=self.model.max_model_len_tokens, chunked_prefill=s.chunked_prefill,
                            max_num_seqs=s.max_num_seqs if "max_num_seqs" in given else None,
                            max_num_batched_tokens=s.max_num_batched_tokens if "max_num_batched_tokens" in given
                            else None, gpu_preset=self.gpu.preset, max_prefill_tokens=s.max_prefill_tokens)

    @field_validator("model", mode="before")
    @classmethod
    def _model_preset(cls, v):
        return _preset("model", v, MODELS)

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_preset(cls, v):
        """``gpu: NAME`` and ``{preset: NAME, ...}`` record the preset (``gpu.preset``, from the
        preset's own fields) whatever name overrides it. A mapping of every field named exactly
        like a preset is that preset, as it always was (old scenario.resolved.yaml files, which
        write no ``preset`` for a GPU named after its preset: kvsim.config.resolved.resolved_dict)."""
        v = _preset("gpu", v, GPUS)
        if isinstance(v, dict) and "preset" not in v and v.get("name") in GPUS:
            v = {**v, "preset": v["name"]}
        return v

    @field_validator("host_link", mode="before")
    @classmethod
    def _link_preset(cls, v, info):
        """A preset name, ``{preset: NAME, ...}`` or every field. A mapping that names neither a preset
        nor a link (``--set host_link.granularity=run`` on a scenario without ``host_link:``) overrides
        the link the run would use anyway, its GPU preset's (``gpu.host_link``), as ``--set gpu.FIELD``
        overrides the GPU."""
        from kvsim.timing.transfer import link_presets

        if v is None:
            return v
        gpu = info.data.get("gpu")
        if isinstance(v, dict) and "preset" not in v and "name" not in v and gpu is not None and gpu.host_link:
            v = {"preset": gpu.host_link, **v}
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
                raise ValueError(f"variant name {name!r} must start with a letter or digit, then letters, "
                                 f"digits, '.', '_' or '-'")
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

    # The allocator section is a plugin's config: the members other layers need are read here, in
    # the config layer, so nothing outside it probes a plugin config with getattr (issue 24 item 2).
    def allocator_block_size(self) -> int | None:
        """The allocator's block size in tokens (None: a kind without blocks, e.g. contiguous)."""
        return getattr(self.allocator, "block_size", None)

    def allocator_prefix_caching(self) -> bool:
        """Whether the allocator caches prefixes (False for a kind without the option)."""
        return bool(getattr(self.allocator, "prefix_caching", False))

    def block_ids_read(self) -> bool:
        """Does the run read *which* blocks a request holds, not only how many? Swap copies coalesced
        into runs of consecutive block ids do (``scheduler.preemption_mode: swap`` or ``auto-vllm-v0``
        with ``host_link.granularity: run``, read through the allocator's BlockRuns capability)."""
        return (self.scheduler.may_swap and self.host_link is not None
                and self.host_link.granularity == "run")

    def allocator_to_build(self):
        """The allocator config a run builds: ``allocator``, with a paged allocator's
        ``track_block_ids: auto`` resolved to ``always`` when the run reads block ids
        (:meth:`block_ids_read`), so ``auto`` and ``always`` give the same results."""
        cfg = self.allocator
        if isinstance(cfg, PagedAllocatorConfig) and cfg.track_block_ids == "auto" and self.block_ids_read():
            return cfg.model_copy(update={"track_block_ids": "always"})
        return cfg

    def allocator_offload(self):
        """The allocator's ``offload`` (lower KV tiers) section, or None."""
        return getattr(self.allocator, "offload", None)

    def default_link_name(self) -> str:
        """The link preset of a scenario without ``host_link:``: its GPU's (``gpu.host_link``), or ""
        (the legacy size-independent rate) when the GPU names none, ``timing.host_link_bandwidth_bytes_per_s``
        is given, or ``host_link:`` is."""
        if self.host_link is not None or "host_link_bandwidth_bytes_per_s" in self.timing.model_fields_set:
            return ""
        return self.gpu.host_link

    def link_profile(self):
        """The host link copies are priced on: ``host_link``, else the GPU preset's, else the legacy
        size-independent rate."""
        from kvsim.timing.transfer import get_link, legacy_link

        if self.host_link is not None:
            return self.host_link.link()
        if self.default_link_name():
            return get_link(self.default_link_name())
        return legacy_link(self.legacy_host_link_bandwidth())

    @model_validator(mode="after")
    def _kv_dtype_fits_model(self):
        why = self.model.spec().kv_dtype_problem(self.kv_dtype)
        if why:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _backend_reads_model(self):
        """A built-in attention backend must read the model's attention kind (a profile file named by path
        is checked when the run loads it)."""
        from kvsim.timing.kernel import builtin_backends, load_backend, resolve_backend

        name = resolve_backend(getattr(self.timing, "attention_backend", ""), self.allocator_block_size(),
                               self.model.spec().attention, self.kv_dtype, self.gpu.spec().compute_capability)
        if name in builtin_backends():
            why = load_backend(name).reads_problem(self.model.spec().attention, self.model.name)
            if why:
                raise ValueError(f"timing.attention_backend: {why}")
        return self

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
                f"({self.budget_terms()}); lower it, use more GPUs (parallel.tensor), or set "
                f"kv_budget.allow_beyond_gpu: true for an unbounded-cache what-if")
        return self

    def lower_tier_capacities(self) -> dict[str, int]:
        """{key: capacity in bytes} of the KV tiers below GPU memory this scenario sets (offload and
        the shared prefix store)."""
        out = {}
        off = self.allocator_offload()
        if off is not None:
            out["allocator.offload.cpu.capacity_bytes"] = off.cpu.capacity_bytes
            if off.ssd is not None:
                out["allocator.offload.ssd.capacity_bytes"] = off.ssd.capacity_bytes
        if self.replicas.shared_prefix_store is not None:
            out["replicas.shared_prefix_store.capacity_bytes"] = self.replicas.shared_prefix_store.capacity_bytes
        return out

    @model_validator(mode="after")
    def _tiers_hold_a_block(self):
        """A lower tier holds whole KV blocks: one smaller than a block would hold none."""
        tiers, block = self.lower_tier_capacities(), self.allocator_block_size()
        if not tiers or not block:
            return self
        bpt = self.kv_geometry().bytes_per_token
        for key, capacity in tiers.items():
            if capacity < block * bpt:
                raise ValueError(f"{key}: {capacity:,} bytes is less than one KV block, so the tier would hold "
                                 f"nothing: the minimum is {block * bpt:,} bytes (allocator.block_size {block} x "
                                 f"{bpt:,} bytes per token of {self.model.name})")
        return self

    # -- derived quantities ----------------------------------------------------------------------
    def gpu_spec(self) -> GPUSpec:
        """The GPU as this run sees it: the ``gpu`` section, whose interconnect becomes the
        host-memory path when ``parallel.gpu_p2p`` is false (docs/models.md#parallelism)."""
        gpu, par = self.gpu.spec(), self.parallel
        if par.gpu_p2p or par.tensor * par.pipeline == 1:
            return gpu
        link = self.link_profile()
        return gpu.through_host(min(link.h2d_bandwidth_bytes_per_s, link.d2h_bandwidth_bytes_per_s), *par.host_path())

    def parallel_plan(self) -> ParallelPlan:
        """Per-GPU view of one replica (one GPU without ``parallel``)."""
        return plan(self.model.spec(), self.gpu_spec(), self.kv_dtype, self.weight_dtype,
                    self.parallel.tensor, self.parallel.pipeline, self.parallel.nccl_ll)

    def notes(self) -> list[str]:
        """What a run of this scenario does that its keys do not say: one line each, printed by
        ``kvsim validate`` and warned by ``kvsim run`` (never a refusal: a sweep may vary the keys)."""
        out = []
        m = self.model
        if m.sliding_window_layers:
            out.append(f"note: {m.sliding_window_layers} of {m.num_layers} layers use a {m.sliding_window_tokens}-token "
                       f"sliding window; KV is charged for every token (an upper bound past the window, docs/models.md)")
        if (self.engine_profile == "vllm-v0.6" and self._profile_filled.get("scheduler.chunked_prefill") is False
                and m.max_model_len_tokens > 32768 and not m.sliding_window_layers):
            out.append(f"note: vLLM 0.5-0.6 turns chunked prefill on by default when max_model_len > 32K "
                       f"({m.max_model_len_tokens} here; vllm/engine/arg_utils.py create_engine_config, with no "
                       f"sliding window, LoRA or speculative decoding); vllm-v0.6 keeps it off: set "
                       f"scheduler.chunked_prefill: true to follow that rule (docs/conformance.md)")
        if self.parallel.tensor > 8:
            link = self.gpu_spec().interconnect or "its interconnect"
            out.append(f"note: parallel.tensor {self.parallel.tensor} spans more than one 8-GPU node; kvsim prices "
                       f"its all-reduces over {link} as if in one node, not over the inter-node network: an "
                       "optimistic bound (docs/models.md, 'Tensor parallel above 8')")
        caches = self.allocator_prefix_caching() or self.allocator.kind == "radix"
        if self.replicas.count > 1 and self.replicas.router.kind == "prefix_affinity" and not caches:
            out.append(f"note: replicas.router: prefix_affinity reads each replica's prefix cache, and allocator "
                       f"kind {self.allocator.kind} caches no prefixes here, so every request goes to the least-loaded "
                       f"replica (set allocator.prefix_caching: true, or router: least_loaded)")
        return out

    def kv_geometry(self) -> KVGeometry:
        """One GPU's KV geometry (kvsim/models/geometry.py), without the allocator's page size: a run
        builds it once and completes it with ``with_block_size(allocator.block_size)``. Its
        ``bytes_per_token`` (the fullest pipeline stage, this GPU's KV heads) sizes the KV pool."""
        return self.parallel_plan().kv

    @property
    def weight_bytes(self) -> int:
        """Weight bytes on one GPU (all of them without parallelism)."""
        return self.parallel_plan().weight_bytes_per_gpu

    def memory_reserve(self) -> Reserve | None:
        """With ``kv_budget.activation_reserve_bytes: vllm`` (or ``vllm-no-cudagraph``), vLLM's memory
        profile of the binding GPU by term (kvsim/models/memory.py); None for a fixed reserve."""
        kind = self.kv_budget.activation_reserve_bytes
        if not isinstance(kind, str):
            return None
        p, s, spec = self.parallel_plan(), self.scheduler, self.model.spec()
        return vllm_reserve(spec, p.tensor, p.pipeline, max(layers_per_stage(spec.num_layers, p.pipeline)), s.max_num_seqs,
                            s.token_budget(self.model.max_model_len_tokens), self.weight_dtype,
                            cudagraphs=kind == "vllm", gpu_p2p=self.parallel.gpu_p2p)

    def usable_memory_bytes(self) -> int:
        """One GPU's memory as the KV budget counts it: the CUDA-visible total under vLLM's memory
        profile (kvsim/models/memory.py ``CUDA_TOTAL``, where a log printed it for the preset and the scenario
        kept the preset's ``memory_bytes``, whatever its name), else ``gpu.memory_bytes`` (an override
        is the user's GPU)."""
        preset = GPUS.get(self.gpu.preset)
        if (isinstance(self.kv_budget.activation_reserve_bytes, str) and preset is not None
                and self.gpu.memory_bytes == preset.memory_bytes):
            return cuda_total_bytes(self.gpu.preset, self.gpu.memory_bytes)
        return self.gpu.memory_bytes

    def reserve_bytes(self) -> int:
        r = self.memory_reserve()
        return self.kv_budget.activation_reserve_bytes if r is None else r.total

    def reserve_summary(self) -> dict:
        """``summary.kv.reserve``: the memory model, the memory it counts from and what it kept off
        the GPU besides the weights (bytes; by term under vLLM's memory profile)."""
        kind, r = self.kv_budget.activation_reserve_bytes, self.memory_reserve()
        out = {"model": kind if isinstance(kind, str) else "fixed", "memory_bytes": self.usable_memory_bytes(),
               "reserve_bytes": self.reserve_bytes()}
        return {**out, **(r.to_dict() if r is not None else {})}

    def budget_terms(self) -> str:
        """``memory x utilisation - weights - reserve``, in GiB, as the error messages print it."""
        b, r = self.kv_budget, self.memory_reserve()
        reserve = (f"activation reserve {self.reserve_bytes() / 2**30:.1f} GiB" if r is None else
                   f"vLLM's non-torch {r.non_torch / 2**30:.2f} + activation peak {r.activation / 2**30:.2f} + "
                   f"CUDA graphs {r.cudagraph / 2**30:.2f} GiB")
        return (f"{self.usable_memory_bytes() / 2**30:.2f} GiB x gpu_memory_utilization {b.gpu_memory_utilization} - "
                f"weights {self.weight_bytes / 2**30:.1f} GiB ({self.model.name}, {self.weight_dtype}) - {reserve}")

    def derived_kv_budget_bytes(self) -> int:
        """What one GPU has for KV: memory x utilisation - weights - reserve."""
        return int(self.usable_memory_bytes() * self.kv_budget.gpu_memory_utilization) - self.weight_bytes \
            - self.reserve_bytes()

    def kv_budget_bytes(self) -> int:
        """The KV budget of one GPU (given, or derived)."""
        b = self.kv_budget
        if b.tokens is not None:
            return b.tokens * self.kv_geometry().bytes_per_token
        if b.bytes is not None:
            return b.bytes
        return self.derived_kv_budget_bytes()
