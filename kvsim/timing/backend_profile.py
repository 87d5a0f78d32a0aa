"""Backend profiles of the decode-attention kernel model: the YAML files under kvsim/timing/backends/,
their old names, and the one loader that checks them (every error names the file and the key).
The model that uses them is :mod:`kvsim.timing.kernel`; the sources of every value are in
docs/kernel_model.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import yaml

from kvsim.errors import ConfigError, did_you_mean, format_choices

BACKENDS_PACKAGE = "kvsim.timing.backends"
# old names of built-in backends that keep working in scenarios and on the command line
BACKEND_ALIASES = {"vllm-2023-paged": "vllm-paged-v1"}
SPLIT_RULES = ("fill", "partition", "vllm-v2")


@dataclass(frozen=True)
class BackendProfile:
    """One attention backend's kernel behaviour (a YAML file under kvsim/timing/backends/)."""

    name: str
    description: str
    reference_gpu: str  # the GPU the time constants were measured/derived on (documentation)
    split_kv: bool  # splits a sequence's KV into partitions (Flash-Decoding / FlashInfer)
    gqa_grouped: bool  # one work unit per KV head (query heads of a group share it) vs per query head
    whole_page_reads: bool  # reads every token slot of a sequence's last, partly filled page
    fused_dequant_kv_dtypes: tuple[str, ...]  # quantised KV dtypes dequantised inside the kernel
    launch_overhead_s: float  # fixed cost per launch (one launch per layer)
    unit_overhead_s: float  # GPU-aggregate cost per work unit (sequence x head x split)
    max_bandwidth_utilisation: float  # saturation: best achieved / peak HBM bandwidth, in (0, 1]
    units_per_sm_to_saturate: float  # work units per SM needed to reach full bandwidth
    min_split_tokens: int  # smallest split-KV partition (tokens); unused without split_kv
    page_overhead_s: float  # GPU-aggregate cost per (page, kv head) fetch: block-table indirection
    dram_chunk_half_bytes: float  # contiguous run length at which DRAM efficiency is 1/2
    overlap: float = 0.0  # share of the per-unit/per-page work hidden under streaming, in [0, 1]
    split_rule: str = "fill"  # how split_kv partitions: fill (SM-filling), partition or vllm-v2 (512-token)
    query_head_reads: float = 0.0  # non-grouped GQA: share of per-query-head KV re-reads reaching HBM, [0, 1]
    # bytes one work unit keeps in flight (Little's law saturation, docs/kernel_model.md); 0 = the
    # sharp cap min(1, units / (SMs x units_per_sm_to_saturate))
    bytes_in_flight_per_unit: float = 0.0
    # work units resident per SM at once (a launch runs in rounds of SMs x ctas_per_sm units; the last,
    # partly filled round streams at its own, lower concurrency, docs/kernel_model.md); 0 = no rounds
    ctas_per_sm: float = 0.0
    # the models' attention kinds the kernel reads (kvsim.models: gqa -- MHA, GQA, MQA --, mla); an MLA
    # kernel reads one latent per token and cannot run a model without one
    attention_kinds: tuple[str, ...] = ("gqa", "mla")
    source: str = ""  # where the file came from (path), filled by the loader

    NUMERIC = ("launch_overhead_s", "unit_overhead_s", "max_bandwidth_utilisation", "units_per_sm_to_saturate",
               "min_split_tokens", "page_overhead_s", "dram_chunk_half_bytes")
    FLAGS = ("split_kv", "gqa_grouped", "whole_page_reads")
    # keys older profile files may omit
    OPTIONAL = {"overlap": 0.0, "split_rule": "fill", "query_head_reads": 0.0, "bytes_in_flight_per_unit": 0.0,
                "ctas_per_sm": 0.0, "attention_kinds": ["gqa", "mla"]}

    def to_yaml_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        d["fused_dequant_kv_dtypes"] = list(self.fused_dequant_kv_dtypes)
        d["attention_kinds"] = list(self.attention_kinds)
        return d

    def reads_problem(self, attention: str, model: str) -> str:
        """Why this kernel cannot run a model of ``attention`` kind (named ``model``), or ""."""
        if attention in self.attention_kinds:
            return ""
        return (f"backend {self.name!r} reads {' or '.join(self.attention_kinds)} attention only; model {model} "
                f"has {attention} attention (use auto, or a backend that reads it)")

    def check_reads(self, attention: str, model: str, where: str) -> None:
        """Refuse (one ConfigError line naming ``where``) a model whose ``attention`` kind this kernel does not read."""
        why = self.reads_problem(attention, model)
        if why:
            raise ConfigError(f"{where}: {why}")


def builtin_backends() -> list[str]:
    root = resources.files(BACKENDS_PACKAGE)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def backend_choices() -> list[str]:
    """Every name ``load_backend`` accepts without a path: the built-ins and their old aliases."""
    return sorted(set(builtin_backends()) | set(BACKEND_ALIASES))


def _finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_profile(data, where: str) -> BackendProfile:
    """Validate a profile mapping; errors name ``where`` (the file) and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of backend parameters, got {type(data).__name__}")
    known = {f.name for f in fields(BackendProfile)} - {"source"}
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(str(key), known)}; "
                              f"valid keys: {format_choices(known)}")
    for key in ("name", *BackendProfile.FLAGS, *BackendProfile.NUMERIC):
        if key not in data:
            raise ConfigError(f"{where}: key '{key}' is missing (every backend parameter must be given)")
    for key in BackendProfile.FLAGS:
        if not isinstance(data[key], bool):
            raise ConfigError(f"{where}: key '{key}' must be true or false, got {data[key]!r}")
    vals = {}
    for key in BackendProfile.NUMERIC:
        v = data[key]
        if not _finite_number(v) or v < 0:
            raise ConfigError(f"{where}: key '{key}' must be a number >= 0, got {v!r}")
        vals[key] = v
    u = vals["max_bandwidth_utilisation"]
    if not 0 < u <= 1:
        raise ConfigError(f"{where}: key 'max_bandwidth_utilisation' must be in (0, 1], got {u!r}")
    for key in ("units_per_sm_to_saturate", "min_split_tokens"):
        if vals[key] <= 0:
            raise ConfigError(f"{where}: key '{key}' must be > 0, got {vals[key]!r}")
    if vals["min_split_tokens"] != int(vals["min_split_tokens"]):
        raise ConfigError(f"{where}: key 'min_split_tokens' must be a whole number of tokens")
    overlap = data.get("overlap", BackendProfile.OPTIONAL["overlap"])
    if not _finite_number(overlap) or not 0 <= overlap <= 1:
        raise ConfigError(f"{where}: key 'overlap' must be a number in [0, 1], got {overlap!r}")
    rereads = data.get("query_head_reads", BackendProfile.OPTIONAL["query_head_reads"])
    if not _finite_number(rereads) or not 0 <= rereads <= 1:
        raise ConfigError(f"{where}: key 'query_head_reads' must be a number in [0, 1], got {rereads!r}")
    inflight = data.get("bytes_in_flight_per_unit", BackendProfile.OPTIONAL["bytes_in_flight_per_unit"])
    if not _finite_number(inflight) or inflight < 0:
        raise ConfigError(f"{where}: key 'bytes_in_flight_per_unit' must be a number >= 0, got {inflight!r}")
    resident = data.get("ctas_per_sm", BackendProfile.OPTIONAL["ctas_per_sm"])
    if not _finite_number(resident) or resident < 0:
        raise ConfigError(f"{where}: key 'ctas_per_sm' must be a number >= 0, got {resident!r}")
    rule = data.get("split_rule", BackendProfile.OPTIONAL["split_rule"])
    if rule not in SPLIT_RULES:
        raise ConfigError(f"{where}: key 'split_rule' must be one of {format_choices(SPLIT_RULES)}, got {rule!r}")
    fused = data.get("fused_dequant_kv_dtypes", [])
    from kvsim.hw import ATTENTION_KINDS, KV_DTYPES

    if not isinstance(fused, list) or any(d not in KV_DTYPES for d in fused):
        raise ConfigError(f"{where}: key 'fused_dequant_kv_dtypes' must be a list of KV dtypes "
                          f"({format_choices(KV_DTYPES)}), got {fused!r}")
    kinds = data.get("attention_kinds", BackendProfile.OPTIONAL["attention_kinds"])
    if not isinstance(kinds, list) or not kinds or any(k not in ATTENTION_KINDS for k in kinds):
        raise ConfigError(f"{where}: key 'attention_kinds' must be a non-empty list of "
                          f"{format_choices(ATTENTION_KINDS)}, got {kinds!r}")
    return BackendProfile(
        name=str(data["name"]), description=str(data.get("description", "")),
        reference_gpu=str(data.get("reference_gpu", "")),
        split_kv=data["split_kv"], gqa_grouped=data["gqa_grouped"], whole_page_reads=data["whole_page_reads"],
        fused_dequant_kv_dtypes=tuple(fused),
        launch_overhead_s=float(vals["launch_overhead_s"]), unit_overhead_s=float(vals["unit_overhead_s"]),
        max_bandwidth_utilisation=float(u), units_per_sm_to_saturate=float(vals["units_per_sm_to_saturate"]),
        min_split_tokens=int(vals["min_split_tokens"]), page_overhead_s=float(vals["page_overhead_s"]),
        dram_chunk_half_bytes=float(vals["dram_chunk_half_bytes"]), overlap=float(overlap), split_rule=rule,
        query_head_reads=float(rereads), bytes_in_flight_per_unit=float(inflight), ctas_per_sm=float(resident),
        attention_kinds=tuple(kinds), source=where,
    )


def load_profile_file(path: str | Path) -> BackendProfile:
    from kvsim.timing.profile_file import read_yaml_file

    path, data = read_yaml_file(path, "backend profile")
    return parse_profile(data, str(path))


def load_backend(name: str, base_dir: Path | None = None, where: str = "timing.attention_backend") -> BackendProfile:
    """A built-in backend by name (or an old alias), or a profile YAML by path (relative to ``base_dir``,
    then cwd)."""
    name = BACKEND_ALIASES.get(name, name)
    if name in builtin_backends():
        res = resources.files(BACKENDS_PACKAGE) / f"{name}.yaml"
        return parse_profile(yaml.safe_load(res.read_text()), f"kvsim/timing/backends/{name}.yaml")
    if name.endswith((".yaml", ".yml")):
        p = Path(name).expanduser()
        if not p.is_absolute() and base_dir is not None and (Path(base_dir) / p).exists():
            p = Path(base_dir) / p
        if p.exists():
            return load_profile_file(p)
        raise ConfigError(f"{where}: backend profile file {name!r} not found")
    raise ConfigError(f"{where}: {unknown_backend(name, backend_choices())}")


def unknown_backend(name: str, names) -> str:
    """The message for an attention backend ``name`` that is none of ``names`` (nor a profile path)."""
    return (f"unknown attention backend {name!r}{did_you_mean(name, names)}; valid: {format_choices(names)}, "
            f"or a path to a profile .yaml")
