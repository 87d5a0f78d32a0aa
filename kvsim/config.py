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
from kvsim.config_base import StrictModel
from kvsim.errors import ConfigError, did_you_mean, format_choices
from kvsim.hw import GPUS, KV_DTYPES, MODELS, WEIGHT_DTYPE_BYTES, GPUSpec, ModelSpec
from kvsim.kv.eviction import EVICTION_POLICIES
from kvsim.registry import ALLOCATORS, RESERVATIONS, ROUTERS, TIMING_MODELS, VICTIMS, plugin_union, policy_field
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.router import DEFAULT_ROUTER
from kvsim.trace.config import TraceConfig

KVDTypeName = Literal["fp16", "bf16", "fp8", "int8", "int4"]
WeightDTypeName = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
assert set(get_args(KVDTypeName)) == set(KV_DTYPES) and set(get_args(WeightDTypeName)) == set(WEIGHT_DTYPE_BYTES)


def _preset(kind: str, value: Any, presets: dict) -> Any:
    """Accept a preset name, or a mapping with ``preset: NAME`` plus field overrides."""
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
    if name not in presets:
        raise ValueError(f"unknown {kind} preset {name!r}{did_you_mean(name, presets)}; "
                         f"valid presets: {format_choices(presets)}")
    return {**presets[name].to_dict(), **value}


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
    num_params: float = Field(gt=0)
    max_model_len_tokens: int = Field(gt=0)
    gated_mlp: bool = True
    source: str = ""

    @model_validator(mode="after")
    def _gqa(self):
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        return self

    def spec(self) -> ModelSpec:
        return ModelSpec(**self.model_dump())


class GPUConfig(StrictModel):
    """A GPU. Write a preset name (``gpu: A100-80GB``) or every field."""

    name: str
    memory_bytes: int = Field(gt=0)
    hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    bf16_flops_per_s: float = Field(gt=0)
    source: str = ""

    def spec(self) -> GPUSpec:
        return GPUSpec(**self.model_dump())


class KVBudgetConfig(StrictModel):
    """KV memory. Derived by default: ``memory x gpu_memory_utilization - weights - activation
    reserve``; or given explicitly with exactly one of ``bytes`` / ``tokens``."""

    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_bytes: int = Field(1 << 30, ge=0)
    bytes: int | None = Field(None, gt=0)
    tokens: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one(self):
        if self.bytes is not None and self.tokens is not None:
            raise ValueError("give at most one of bytes and tokens")
        return self


class EngineConfig(StrictModel):
    mode: Literal["fast", "step"] = Field(
        "fast", description="fast: advance runs of pure decode steps at once (exact); step: one event per step")
    max_window_steps: int = Field(4096, ge=2, description="most steps one decode window may cover")


class SharedStoreConfig(StrictModel):
    """A prefix store shared by all replicas (the Mooncake idea): blocks evicted by any replica land
    there, and any replica can load them back at ``bandwidth_bytes_per_s``."""

    capacity_bytes: int = Field(gt=0)
    bandwidth_bytes_per_s: float = Field(25e9, gt=0, description="e.g. an RDMA NIC, ~25 GB/s")


class ReplicasConfig(StrictModel):
    count: int = Field(1, ge=1, le=1024, description="engine replicas, each with the whole KV budget")
    router: policy_field(ROUTERS, DEFAULT_ROUTER) = Field(  # type: ignore[valid-type]
        DEFAULT_ROUTER, description="which replica gets an arriving request; a kind name or {kind: NAME} "
                                    "(kvsim/sched/router.py)")
    shared_prefix_store: SharedStoreConfig | None = None


class LimitsConfig(StrictModel):
    max_sim_time_s: float | None = Field(None, gt=0, description="stop with an error past this simulated time")
    max_wall_time_s: float | None = Field(None, gt=0, description="stop with an error past this wall time")


AllocatorConfig = plugin_union(ALLOCATORS)
TimingConfig = plugin_union(TIMING_MODELS)
# Top-level plugin sections: registry and default kind.
PLUGIN_SECTIONS = {"allocator": (ALLOCATORS, "paged"), "timing": (TIMING_MODELS, "analytical")}
# Nested policy keys (scheduler.victim, replicas.router, allocator.reservation, allocator.eviction):
# registry and default kind (None where it depends on the enclosing allocator). Policies accept a
# bare kind name as shorthand for {kind: NAME}.
POLICY_KEYS = {"victim": (VICTIMS, "latest_admitted"), "router": (ROUTERS, DEFAULT_ROUTER),
               "reservation": (RESERVATIONS, None), "eviction": (EVICTION_POLICIES, "lru")}
_SHORTHAND_KEYS = ("victim", "router", "reservation")  # eviction is always a mapping
# Old scenario keys that still validate as aliases (see docs/scenario.md).
DEPRECATED_KEYS = {"min_block_tokens": "block_size", "page_size": "block_size"}
_KIND_REGISTRIES = {k: reg for k, (reg, _) in (PLUGIN_SECTIONS | POLICY_KEYS).items()}


class Scenario(StrictModel):
    name: str | None = Field(None, description="defaults to the file name without extension")
    description: str = ""
    seed: int = 0
    trace: TraceConfig
    model: ModelConfig
    gpu: GPUConfig = Field(default_factory=lambda: GPUConfig(**GPUS["A100-80GB"].to_dict()))
    kv_dtype: KVDTypeName = "fp16"
    weight_dtype: WeightDTypeName = "fp16"
    kv_budget: KVBudgetConfig = KVBudgetConfig()
    allocator: AllocatorConfig = Field(default_factory=lambda: ALLOCATORS.default_config("paged"))  # type: ignore[valid-type]
    scheduler: SchedulerConfig = SchedulerConfig()
    timing: TimingConfig = Field(default_factory=lambda: TIMING_MODELS.default_config("analytical"))  # type: ignore[valid-type]
    limits: LimitsConfig = LimitsConfig()
    engine: EngineConfig = EngineConfig()
    replicas: ReplicasConfig = ReplicasConfig()
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("model", mode="before")
    @classmethod
    def _model_preset(cls, v):
        return _preset("model", v, MODELS)

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_preset(cls, v):
        return _preset("gpu", v, GPUS)

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
    def _store_needs_prefix_cache(self):
        if self.replicas.shared_prefix_store is not None and not (
                self.allocator.kind == "paged" and getattr(self.allocator, "prefix_caching", False)):
            raise ValueError("replicas.shared_prefix_store needs allocator kind paged with prefix_caching: true")
        return self

    # -- derived quantities ----------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.spec().kv_bytes_per_token(self.kv_dtype)

    @property
    def weight_bytes(self) -> int:
        return self.model.spec().weight_bytes(self.weight_dtype)

    def kv_budget_bytes(self) -> int:
        b = self.kv_budget
        if b.tokens is not None:
            return b.tokens * self.kv_bytes_per_token
        if b.bytes is not None:
            return b.bytes
        return int(self.gpu.memory_bytes * b.gpu_memory_utilization) - self.weight_bytes - b.activation_reserve_bytes


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
        elif isinstance(nxt, str) and node is tree and k in ("model", "gpu"):
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
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
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
        elif depth == 0 and k in ("model", "gpu") and isinstance(v, dict) and isinstance(old, str):
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
            cls = _model_from_annotation(cls.model_fields[part].annotation)
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
        return (f"{path}: expected a {section} kind name or a mapping with 'kind' (got {e.get('input')!r}); "
                f"valid kinds: {format_choices(valid)}")
    if t == "missing":
        return f"{path}: required key is missing"
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    got = e.get("input")
    if t not in ("value_error", "assertion_error") and not isinstance(got, (dict, list)):
        msg += f" (got {got!r})"
    return f"{path}: {msg}"


def format_validation_error(err: ValidationError, file: str, prefix: str = "") -> str:
    errors = err.errors()
    msgs = []
    for e in errors:
        m = _one_error(e, prefix)
        if m not in msgs:
            msgs.append(m)
    return f"{file}: " + "; ".join(msgs)


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that rejects a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml_mapping(path: Path, what: str = "scenario") -> dict:
    if not path.exists():
        raise ConfigError(f"{path}: {what} file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, expected a {what} YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read {what} file: {e}") from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    if raw is None:
        raise ConfigError(f"{path}: the {what} file is empty")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(raw).__name__}")
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{path}: top-level key {bad[0]!r} is not a string")
    return raw


def validate_scenario(raw: dict, file: str, prefix: str = "") -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, file, prefix)) from None


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    path = Path(path)
    raw = read_yaml_mapping(path)
    for expr in overrides:
        key, value = parse_set(expr)
        _set_dotted(raw, key, value, f"--set {expr}")
    raw.setdefault("name", path.stem)
    base = validate_scenario(raw, str(path))
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
        variants[vname] = validate_scenario(merged, str(path), prefix=f"variants.{vname}.")
    return LoadedScenario(path=path, name=str(base.name), base=base, variants=variants)
