"""Loading a scenario file: YAML, ``--set`` overrides, ``variants:`` merged onto the base, validation."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from kvsim.config.messages import format_validation_error, format_variant_errors, run_error_line
from kvsim.config.scenario import _SHORTHAND_KEYS, PLUGIN_SECTIONS, POLICY_KEYS, Scenario
from kvsim.config_base import reject_non_finite
from kvsim.errors import ConfigError, KvsimError, did_you_mean, format_choices
from kvsim.models import hf
from kvsim.yamlio import YAMLSyntaxError, load_yaml


@dataclass(frozen=True)
class ModelSource:
    """A run's ``model:`` as written, before a config file was read into its fields: the config file it
    names (None: a preset or fields), the value as written and the key that set it (``model``,
    ``variants.NAME.model`` or ``--set model=...``), for tools that need the file itself (kvsim replay)."""

    file: Path | None
    value: Any
    key: str


def model_source(raw: dict, base_dir: Path | None, overrides: tuple[str, ...] = (), variant: str | None = None,
                 override: dict | None = None) -> ModelSource:
    """The :class:`ModelSource` of a scenario mapping whose ``model:`` is not expanded yet: ``overrides``
    (the ``--set`` expressions applied to it) and ``variant``/``override`` (the variant's own keys) say
    which key set it."""
    value = raw.get("model")
    name = value.get("preset") if isinstance(value, dict) else value
    file = None
    if isinstance(name, str) and hf.is_config_path(name, base_dir):
        file = Path(name).expanduser()
        if not file.is_absolute() and base_dir is not None:
            file = base_dir / file
    key = "model"
    if variant is not None and isinstance(override, dict) and "model" in override:
        key = f"variants.{variant}.model"
    for expr in overrides:
        k = expr.split("=", 1)[0].strip()
        if k == "model" or k.startswith("model."):
            key = f"--set {expr}"
    return ModelSource(file=file, value=value, key=key)


@dataclass(frozen=True)
class LoadedScenario:
    path: Path
    name: str
    base: Scenario
    variants: dict[str, Scenario]  # empty when the file has no variants
    # run name (as in runs) -> where its model: came from; empty for scenarios not loaded from a mapping
    model_sources: dict[str, ModelSource] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()  # the --set expressions applied to the base and every variant

    @property
    def runs(self) -> dict[str, Scenario]:
        """Name -> scenario for every run this file asks for (the base alone without variants)."""
        return self.variants or {self.name: self.base}

    def run_error(self, name: str, err: KvsimError) -> KvsimError:
        """``err``, raised while building the run ``name`` with ``where`` = this file's path (``FILE:
        key: why``), naming the ``--set`` argument that gave the key and the variant
        (:func:`~kvsim.config.messages.run_error_line`); another message is returned as it is."""
        head = f"{self.path}: "
        if not str(err).startswith(head):
            return err
        variant = name if name in self.variants else None
        return type(err)(run_error_line(str(err)[len(head):], str(self.path), variant, self.overrides))


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
    because the old kind's keys would be invalid for the new kind; so is a ``model``, ``gpu`` or
    ``host_link`` whose ``preset`` changes (the old preset's fields and overrides are not the new one's)."""
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
        elif depth == 0 and k in ("model", "gpu", "host_link") and isinstance(v, dict) and "preset" in v \
                and isinstance(old, dict) and old.get("preset") != v["preset"]:
            out[k] = copy.deepcopy(v)  # another preset (or file): the old one's fields are not its own
        elif isinstance(v, dict) and isinstance(old, dict):
            out[k] = deep_merge(old, v, depth + 1)
        else:
            out[k] = copy.deepcopy(v)
    return out


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
    return check_mapping(raw, str(path))


def check_mapping(raw: Any, where: str) -> dict:
    """``raw`` as a scenario's top level: a mapping with string keys and finite numbers (ConfigError line)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of keys at the top level, got {type(raw).__name__}")
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{where}: top-level key {bad[0]!r} is not a string")
    reject_non_finite(raw, where)
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


def apply_sets(raw: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply ``--set path.to.key=value`` expressions to a scenario mapping, in order (in place)."""
    for expr in overrides:
        key, value = parse_set(expr)
        _set_dotted(raw, key, value, f"--set {expr}")
    return raw


# What a mapping given in Python (kvsim.run, kvsim.run_to_dir) is called in messages; relative paths
# in it are read against the current directory (the parent of this name).
MAPPING_PATH = Path("scenario")


def load_scenario(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedScenario:
    """The scenario file at ``path`` with ``overrides`` (a list of ``"path.to.key=value"`` strings,
    applied in order to the base and every variant) and its variants, validated."""
    path = Path(path)
    overrides = check_overrides(overrides)
    return expand_scenario(apply_sets(read_yaml_mapping(path), overrides), path, overrides)


def load_mapping(raw: dict, base_dir: Path | None = None) -> LoadedScenario:
    """A scenario mapping validated as a file's would be (variants, ``baseline:``), named
    :data:`MAPPING_PATH` in messages; model files relative to ``base_dir`` (default: the current
    directory). ``raw`` itself is left unchanged."""
    raw = copy.deepcopy(check_mapping(raw, str(MAPPING_PATH)))
    return expand_scenario(raw, MAPPING_PATH, (), base_dir)


def check_overrides(overrides) -> tuple[str, ...]:
    """``overrides`` as a tuple; anything but a list or tuple of strings is a one-line TypeError."""
    if not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides):
        raise TypeError(f"load_scenario(): overrides are a list of \"path.to.key=value\" strings, "
                        f"got {overrides!r}")
    return tuple(overrides)


def expand_scenario(raw: dict, path: Path, overrides: tuple[str, ...], base_dir: Path | None = None) -> LoadedScenario:
    """The base and ``variants:`` of a scenario mapping (``overrides`` already applied to ``raw``,
    and applied again to each variant), validated; ``path`` names it, its directory (or ``base_dir``)
    anchors relative model files."""
    base_dir = path.parent if base_dir is None else Path(base_dir)
    raw.setdefault("name", path.stem)
    written_model = {"model": copy.deepcopy(raw.get("model"))}  # as written, --set applied, before expansion
    base_source = model_source(raw, base_dir, overrides)
    sources: dict[str, ModelSource] = {}
    raw = expand_model(raw, base_dir, str(path))
    sets = overrides
    base = validate_scenario(raw, str(path), sets=sets)
    if base.baseline is not None and base.baseline not in base.variants:
        raise ConfigError(f"{path}: baseline: {base.baseline!r} is not a variant"
                          f"{did_you_mean(base.baseline, list(base.variants))}; valid choices: "
                          f"{format_choices(list(base.variants)) if base.variants else '(the file has no variants)'}")
    variants: dict[str, Scenario] = {}
    base_raw = {k: v for k, v in raw.items() if k != "variants"}
    failures: list[tuple[str, ValidationError]] = []  # variants that do not validate: one line, all named
    for vname, override in base.variants.items():
        try:
            variants[vname], sources[vname] = _expand_variant(vname, override, base_raw, written_model, path,
                                                              base_dir, overrides)
        except ValidationError as e:
            failures.append((vname, e))
        except ConfigError:
            if not failures:  # else the first failure is the one reported
                raise
    if failures:
        raise ConfigError(format_variant_errors(failures, str(path), sets))
    if not variants:
        sources = {str(base.name): base_source}
    return LoadedScenario(path=path, name=str(base.name), base=base, variants=variants, model_sources=sources,
                          overrides=overrides)


def _expand_variant(vname: str, override: Any, base_raw: dict, written_model: dict, path: Path, base_dir: Path,
                    overrides: tuple[str, ...]) -> tuple[Scenario, ModelSource]:
    """The variant ``vname`` (its ``override`` merged onto the base, ``overrides`` applied) and where its
    model came from; a ValidationError when it does not validate (the caller words it)."""
    if not isinstance(override, dict):
        raise ConfigError(f"{path}: variants.{vname}: expected a mapping of overrides")
    if "variants" in override:
        raise ConfigError(f"{path}: variants.{vname}: variants cannot nest")
    undotted = _undot(override)
    merged = deep_merge(base_raw, undotted)
    # --set applies to every variant too: it is the user's last word.
    for expr in overrides:
        key, value = parse_set(expr)
        _set_dotted(merged, key, value, f"--set {expr}")
    # its model as written (the base's is expanded in merged): the base's, the variant's, then --set's
    own = deep_merge(written_model, {"model": undotted["model"]}) if "model" in undotted else written_model
    own = apply_sets(copy.deepcopy(own), [e for e in overrides if parse_set(e)[0].split(".")[0] == "model"])
    if "model" in undotted:  # merged onto the base's model as written, not onto its expanded file
        merged["model"] = copy.deepcopy(own["model"])
    source = model_source(own, base_dir, overrides, vname, undotted)
    merged = expand_model(merged, base_dir, str(path), prefix=f"variants.{vname}.")
    return Scenario.model_validate(merged), source
