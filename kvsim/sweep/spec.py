"""The sweep file: a base scenario plus the points to run, validated up front.

A sweep YAML holds a base scenario (inline ``base:`` or ``base_file:``) and the points to run:

* ``grid:`` dotted key -> list of values; the points are the cartesian product, in file order
  (the last key varies fastest);
* ``points:`` a list of override sets, each a mapping of dotted keys (``name:`` optional);
* ``set:`` (optional) dotted key -> value, applied to the base scenario for every point (before
  its variants and the point's own overrides), e.g. a shorter ``trace.end_s``;
* both: every entry of ``points`` combined with every grid combination (a key may not be in both);
* neither: one point, the base scenario.

When the base scenario has ``variants:``, they are expanded: every variant is combined with every
point above (the point's overrides apply on top of the variant's, like ``--set``), and the index
gets a ``variant`` column.

Every point's resolved :class:`~kvsim.config.Scenario` is validated (its KV capacity, trace and
what ``kvsim run`` refuses before simulating checked: :func:`check_points_supported`) before anything
runs; errors name the sweep file, the point and the key.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsim.config import (
    LoadedScenario,
    Scenario,
    _undot,
    deep_merge,
    expand_model,
    format_validation_error,
    parse_set,
    read_yaml_mapping,
    reject_non_finite,
    validate_scenario,
)
from kvsim.errors import ConfigError, KvsimError, did_you_mean, format_choices

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NAME_RULE = "must start with a letter or digit, then letters, digits, '.', '_' or '-'"
# Keys a point may not override: they identify the run, not the simulation.
RESERVED_KEYS = ("name", "variants", "description")
# Index columns that an override column could shadow.
INDEX_RESERVED = ("point_id", "point_name", "variant", "status", "error", "run_dir")


class SweepFile(BaseModel):
    """Schema of a sweep YAML file (unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str | None = Field(None, description="defaults to the sweep file name without extension")
    description: str = ""
    base: dict[str, Any] | None = Field(None, description="the base scenario, inline")
    base_file: str | None = Field(None, description="the base scenario's YAML, relative to the sweep file")
    set: dict[str, Any] = Field(
        default_factory=dict, description="dotted key -> value applied to the base (and its variants) for every point")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="dotted key -> values (cartesian product)")
    points: list[dict[str, Any]] = Field(default_factory=list, description="override sets, each with an optional name")

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if v is not None and not NAME_RE.fullmatch(v):
            raise ValueError(f"name {v!r} {NAME_RULE}")
        return v

    @field_validator("set")
    @classmethod
    def _set(cls, v):
        for key in v:
            _check_key(key, "set: ")
        return v

    @field_validator("grid")
    @classmethod
    def _grid(cls, v):
        for key, values in v.items():
            _check_key(key)
            if not values:
                raise ValueError(f"grid key {key!r} has an empty list of values")
        return v

    @field_validator("points")
    @classmethod
    def _points(cls, v):
        seen: set[str] = set()
        for i, p in enumerate(v):
            name = p.get("name")
            if name is not None:
                if not isinstance(name, str) or not NAME_RE.fullmatch(name):
                    raise ValueError(f"points[{i}].name {name!r} {NAME_RULE}")
                if name in seen:
                    raise ValueError(f"points[{i}].name {name!r} is used twice")
                seen.add(name)
            for key in p:
                if key != "name":
                    if not isinstance(key, str):
                        raise ValueError(f"points[{i}]: key {key!r} is not a string")
                    _check_key(key, f"points[{i}]: ")
        return v

    @model_validator(mode="after")
    def _one_base(self):
        if (self.base is None) == (self.base_file is None):
            raise ValueError("give exactly one of 'base' (an inline scenario) or 'base_file' (a scenario YAML)")
        return self


def _check_key(key: str, where: str = "") -> None:
    parts = key.split(".")
    if not all(parts):
        raise ValueError(f"{where}bad key path {key!r}")
    if parts[0] in RESERVED_KEYS:
        raise ValueError(f"{where}key {key!r}: a point cannot override {parts[0]!r}")
    if key in INDEX_RESERVED:
        raise ValueError(f"{where}key {key!r} clashes with an index column")


@dataclass(frozen=True)
class SweepPoint:
    """One simulation of the sweep."""

    id: str                      # directory name under points/: "<slug>-<hash8>"
    name: str | None             # the point's name in ``points:``, if any
    variant: str | None          # the base scenario's variant, if the base has variants
    overrides: dict[str, Any]    # dotted key -> value, points' keys first then grid keys
    raw: dict = field(repr=False)  # the merged scenario mapping (what the worker validates)
    scenario: Scenario = field(repr=False)

    @property
    def label(self) -> str:
        """Human-readable description for messages and plots."""
        parts = [self.name] if self.name else []
        if self.variant:
            parts.append(f"variant={self.variant}")
        parts += [f"{k}={_short(v)}" for k, v in self.overrides.items()]
        return ", ".join(parts) or "base"


@dataclass(frozen=True)
class LoadedSweep:
    path: Path                   # the sweep file (absolute); virtual for an in-memory spec
    anchor: Path                 # relative paths in scenarios resolve against anchor.parent
    name: str
    spec: SweepFile
    base_raw: dict               # the base scenario mapping (with its variants)
    points: list[SweepPoint]
    override_keys: list[str]     # every dotted key any point overrides, in first-seen order
    has_variants: bool
    common: dict = field(default_factory=dict)  # ``set:`` plus --set overrides, applied to every point
    # point id -> what its run is made from (kvsim.api.run_inputs: resolved scenario, trace report);
    # None when loaded with check_capacity=False (run_sweep checks the points then)
    run_inputs: dict[str, dict] | None = None

    def loaded_scenario(self, point: SweepPoint) -> LoadedScenario:
        return LoadedScenario(path=self.anchor, name=point.id, base=point.scenario, variants={})

    def resolved(self) -> dict:
        """A JSON/YAML-able record of the sweep, written to ``sweep.resolved.yaml``."""
        return {
            "sweep_file": str(self.path),
            "name": self.name,
            "description": self.spec.description,
            "scenario_anchor": str(self.anchor),
            "override_keys": self.override_keys,
            "set": _jsonable(self.common),
            "points": [{"id": p.id, "name": p.name, "variant": p.variant, "overrides": _jsonable(p.overrides)}
                       for p in self.points],
            "base": _jsonable(self.base_raw),
        }


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def _short(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return str(v)


def _numeric_canonical(obj):
    """``obj`` with integral floats as ints (``5.0`` -> ``5``; bools kept): what makes two points' values
    equal when telling duplicates apart (ids keep hashing the values as written)."""
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _numeric_canonical(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_numeric_canonical(v) for v in obj]
    return obj


def point_hash(variant: str | None, overrides: dict[str, Any]) -> str:
    """Short deterministic hash of what a point changes (not its name)."""
    payload = json.dumps({"variant": variant, "overrides": overrides}, sort_keys=True, default=str,
                         separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:8]


def _slug_text(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return re.sub(r"-{2,}", "-", s)


def point_slug(name: str | None, variant: str | None, overrides: dict[str, Any], limit: int = 48) -> str:
    """Readable part of a point id: its name, else ``<last key part>-<value>`` joined by ``_``,
    prefixed by the variant. Longer than ``limit``: :func:`_short_slug` (no value is cut)."""
    parts = [variant] if variant else []
    if name:
        parts.append(name)
    else:
        for k, v in overrides.items():
            val = v if not isinstance(v, dict) else (v.get("kind") or v.get("preset") or "map")
            parts.append((k.split(".")[-1], _short(val)))
    text = [p if isinstance(p, str) else f"{p[0]}-{p[1]}" for p in parts]
    slug = _slug_text("_".join(text))
    if len(slug) > limit:
        slug = _short_slug(parts, limit)
    return slug or "base"


def _short_slug(parts: list, limit: int) -> str:
    """A slug of at most ``limit`` characters that never cuts a value: each key shortened to the
    initials of its words (``max_num_batched_tokens`` -> ``mnbt``), then only the leading parts that
    fit whole. Only a first part longer than ``limit`` alone (a long name or value) is cut."""
    def initials(key: str) -> str:
        words = key.split("_")
        return "".join(w[:1] for w in words) if len(words) > 1 else key

    texts = [_slug_text(p if isinstance(p, str) else f"{initials(p[0])}-{p[1]}") for p in parts]
    kept = ""
    for t in filter(None, texts):
        joined = f"{kept}_{t}" if kept else t
        if len(joined) > limit:
            break
        kept = joined
    return kept or texts[0][:limit].rstrip("-._")


def _format_sweep_error(err: ValidationError, file: str) -> str:
    msgs = []
    for e in err.errors():
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e["loc"]).replace(".[", "[")
        if e["type"] == "extra_forbidden":
            key = str(e["loc"][-1])
            valid = list(SweepFile.model_fields)
            m = f"{loc}: unknown key {key!r}{did_you_mean(key, valid)}; valid keys: {format_choices(valid)}"
        elif e["type"] == "missing":
            m = f"{loc}: required key is missing"
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            m = f"{loc}: {msg}" if loc else msg
        if m not in msgs:
            msgs.append(m)
    return f"{file}: " + "; ".join(msgs)


def parse_sweep(raw: dict, path: Path) -> SweepFile:
    try:
        return SweepFile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_sweep_error(e, str(path))) from None


def load_sweep(source: str | Path | dict, *, base_dir: str | Path | None = None,
               overrides: list[str] | tuple[str, ...] = (), check_capacity: bool = True) -> LoadedSweep:
    """Read and validate a sweep (a YAML path, or the same mapping in memory) and expand its points.

    For an in-memory mapping, relative paths resolve against ``base_dir`` (default: the current
    directory). ``overrides``: ``path.to.key=value`` strings (``kvsim sweep --set``), added to the
    sweep's ``set:`` (they win). Raises :class:`ConfigError` naming the file, the point and the key.
    """
    path, raw, root = _read_sweep_source(source, base_dir)
    where = str(source) if not isinstance(source, dict) else "sweep"
    spec = parse_sweep(raw, Path(where))
    name = spec.name or (path.stem if not isinstance(source, dict) else "sweep")
    anchor, base_raw, common, base = _sweep_base(spec, path, root, where, name, overrides)

    for key in common:  # the grid sets it for every point: the set:/--set value would apply to none
        if key in spec.grid:
            src = "--set" if key in {parse_set(e)[0] for e in overrides} else "set:"
            raise ConfigError(f"{where}: {src} {key!r} is also a grid key, which sets it at every point; "
                              f"set it in one place")
    for i, p in enumerate(spec.points):
        both = [k for k in p if k in spec.grid]
        if both:
            raise ConfigError(f"{where}: points[{i}]: key {both[0]!r} is also a grid key; set it in one place")
    points, override_keys = _expand_points(spec, base, base_raw, anchor, where, check_capacity)
    inputs = check_points_supported(points, anchor.parent, where) if check_capacity else None
    return LoadedSweep(path=path, anchor=anchor, name=name, spec=spec, base_raw=base_raw, points=points,
                       override_keys=override_keys, has_variants=bool(base.variants), common=common,
                       run_inputs=inputs)


def check_points_supported(points: list[SweepPoint], base_dir: Path, where: str) -> dict[str, dict]:
    """What ``kvsim run`` would refuse of each point before simulating (its trace cannot be built,
    :func:`kvsim.build.check_run_supported`, as kvsim.api.check_runs_supported), every
    point up front, each distinct trace built once. Returns point id -> :func:`kvsim.api.run_inputs`;
    raises one ConfigError naming the sweep and the point(s)."""
    from kvsim.api import TraceCache, run_inputs
    from kvsim.build import check_run_supported

    traces = TraceCache(base_dir, where)
    inputs: dict[str, dict] = {}
    errors: list[str] = []
    for p in points:
        at = f"{where}: point {p.id}"
        try:
            trace, report = traces.get(p.scenario, at)
        except KvsimError as e:  # every point of this trace would meet it: one line
            raise ConfigError(str(e)) from None
        try:
            check_run_supported(p.scenario, trace, at)
        except KvsimError as e:
            errors.append(str(e))
            continue
        inputs[p.id] = run_inputs(p.scenario, report)
    _raise_point_errors(errors)
    return inputs


def _raise_point_errors(errors: list[str]) -> None:
    """One ConfigError listing the invalid points (the first 20), if any."""
    if errors:
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        head = errors[0] if len(errors) == 1 else f"{len(errors)} invalid points:\n  " + "\n  ".join(errors[:20])
        raise ConfigError(head + more)


def _read_sweep_source(source: str | Path | dict, base_dir: str | Path | None) -> tuple[Path, dict, Path]:
    """(the sweep's path -- virtual for a mapping: messages and the path anchor only --, its raw
    mapping, the directory relative paths resolve against)."""
    if isinstance(source, dict):
        root = Path(base_dir if base_dir is not None else ".").resolve()
        name = source.get("name") if isinstance(source.get("name"), str) else "sweep"
        raw = copy.deepcopy(source)
        reject_non_finite(raw, "sweep")
        return root / f"{name}.sweep.yaml", raw, root
    path = Path(source).resolve()
    return path, read_yaml_mapping(path, "sweep"), path.parent


def _sweep_base(spec, path: Path, root: Path, where: str, name: str, overrides) -> tuple[Path, dict, dict, Scenario]:
    """(anchor, the base scenario's raw mapping with ``set:`` and ``--set`` merged in, those
    common keys, the validated base). The base alone must be a valid scenario (its variants are
    validated as points)."""
    if spec.base_file is not None:
        anchor = (root / spec.base_file).resolve() if not Path(spec.base_file).is_absolute() \
            else Path(spec.base_file)
        try:
            base_raw = read_yaml_mapping(anchor, "base scenario")
        except ConfigError as e:
            raise ConfigError(f"{where}: base_file: {e}") from None
        base_where = f"{where}: base_file {spec.base_file}"
    else:
        anchor = path
        base_raw = copy.deepcopy(spec.base)
        base_where = f"{where}: base"
    base_raw.setdefault("name", name)
    common = dict(spec.set)
    for expr in overrides:
        key, value = parse_set(expr)
        try:
            _check_key(key, "--set ")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        common[key] = value
    if common:
        variants_raw = base_raw.pop("variants", None)
        base_raw = deep_merge(base_raw, _undot(common))
        if variants_raw is not None:
            base_raw["variants"] = variants_raw
    if spec.set:  # a bad value may be the sweep's set:, not the base's own
        base_where += f" (with set: {', '.join(spec.set)})"
    base_raw = expand_model(base_raw, anchor.parent, base_where)  # model: x.json -> its fields
    base = validate_scenario(base_raw, base_where, sets=tuple(overrides))  # a bad --set value names it
    return anchor, base_raw, common, base


def _expand_points(spec, base: Scenario, base_raw: dict, anchor: Path, where: str,
                   check_capacity: bool) -> tuple[list[SweepPoint], list[str]]:
    """Every point (variants x points x grid), validated; (points, override keys in first-seen
    order). All invalid points are reported together (the first 20)."""
    grid_keys = list(spec.grid)
    point_sets = [({k: v for k, v in p.items() if k != "name"}, p.get("name")) for p in spec.points] or [({}, None)]
    combos = list(itertools.product(*spec.grid.values())) if grid_keys else [()]
    variants = list(base.variants.items()) or [(None, None)]
    base_novar = {k: v for k, v in base_raw.items() if k != "variants"}

    points: list[SweepPoint] = []
    errors: list[str] = []
    seen: dict[tuple, str] = {}  # (name, numerically canonical hash) -> point id
    override_keys: list[str] = []
    for vname, vover in variants:
        start = base_novar if vname is None else deep_merge(base_novar, _undot(vover))
        for pover, pname in point_sets:
            for combo in combos:
                overrides = {**pover, **dict(zip(grid_keys, combo))}
                for k in overrides:
                    if k not in override_keys:
                        override_keys.append(k)
                h = point_hash(vname, overrides)
                pid = f"{point_slug(pname, vname, overrides)}-{h}"
                desc = ", ".join([f"variant={vname}"] * bool(vname)
                                 + [f"{k}={_short(v)}" for k, v in overrides.items()]) or "base"
                same = (pname, point_hash(vname, _numeric_canonical(overrides)))  # 5 and 5.0 alike
                if same in seen:
                    what = "" if seen[same] == pid else f" (numerically equal to point {seen[same]})"
                    errors.append(f"{where}: point {pid} ({desc}) is listed twice with identical overrides{what}")
                    continue
                seen[same] = pid
                merged = deep_merge(start, _undot(overrides)) if overrides else copy.deepcopy(start)
                merged["name"] = pid
                try:
                    merged = expand_model(merged, anchor.parent, f"{where}: point {pid}")
                    scn = _validate_point(merged, f"{where}: point {pid}", check_capacity, anchor.parent)
                except KvsimError as e:
                    errors.append(str(e))
                    continue
                points.append(SweepPoint(id=pid, name=pname, variant=vname, overrides=overrides, raw=merged,
                                         scenario=scn))
    _raise_point_errors(errors)
    return points, override_keys


def _validate_point(raw: dict, where: str, check_capacity: bool, base_dir: Path) -> Scenario:
    scn = validate_scenario(raw, where)
    if scn.trace.file is not None:
        from kvsim.trace.config import resolve_path

        try:
            resolve_path(scn.trace.file, base_dir)
        except KvsimError as e:
            raise ConfigError(f"{where}: trace.file: {e}") from None
    if check_capacity:
        from kvsim.build import build_allocator

        try:
            build_allocator(scn, where)
        except ValueError as e:  # allocator constructors reject impossible shapes
            raise ConfigError(f"{where}: allocator: {e}") from None
    return scn


def validate_point_raw(raw: dict, where: str) -> Scenario:
    """What a worker does with a point's mapping (same validation as up front, without I/O)."""
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, where)) from None


def dump_yaml(obj) -> str:
    return yaml.safe_dump(_jsonable(obj), sort_keys=False, allow_unicode=True)
