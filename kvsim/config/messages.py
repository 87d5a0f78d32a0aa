"""Validation errors as one line each: ``FILE: key.path: why; valid choices: ...`` (the ``--set``
argument that gave a bad value is blamed by name)."""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from kvsim.config.scenario import _KIND_REGISTRIES, _SHORTHAND_KEYS, DEPRECATED_KEYS, PLUGIN_SECTIONS, Scenario
from kvsim.errors import did_you_mean, format_choices
from kvsim.registry import plugin_registry


def _model_fields_at(loc: tuple) -> list[str] | None:
    """Valid keys of the model that ``loc`` (minus its last element) points into."""
    cls = _class_at(loc[:-1])
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return list(cls.model_fields)
    return None


def _kinds_at(loc: tuple) -> list[str]:
    """The ``kind`` tags of the tagged union at ``loc`` (a section outside the plugin registries, such
    as a synthetic trace's length distributions); [] when ``loc`` is not one."""
    cls = _class_at(loc)
    if not isinstance(cls, tuple):
        return []
    return [str(c.model_fields["kind"].default) for c in cls if "kind" in c.model_fields]


def _class_at(loc: tuple) -> Any:
    """The model class (or tuple of a union's member classes) that ``loc`` points to; None if unknown."""
    cls: Any = Scenario
    for part in loc:
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
    return cls


def _model_from_annotation(ann: Any) -> Any:
    origin = get_origin(ann)
    if origin is Annotated:
        return _model_from_annotation(get_args(ann)[0])
    if origin is Union or origin is types.UnionType:  # Optional[Annotated[Union[...]]] included
        members = [m for a in get_args(ann) for m in _members(_model_from_annotation(a))]
        if len(members) == 1:
            return members[0]
        return tuple(members) or None
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    return None


def _members(cls: Any) -> tuple:
    return cls if isinstance(cls, tuple) else (cls,) if cls is not None else ()


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
        valid = registry.kinds if registry else _kinds_at(loc)
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
    return set_for_key(loc, sets)


def set_for_key(loc: str, sets: tuple[str, ...]) -> str | None:
    """The last ``--set`` argument of ``sets`` whose key is ``loc`` (a dotted key path), lies inside
    it or contains it; None if none does."""
    for expr in reversed(sets):
        key = expr.split("=", 1)[0].strip()
        if key == loc or loc.startswith(key + ".") or loc.startswith(key + "[") or key.startswith(loc + "."):
            return expr
    return None


def _applied_to(expr: str, file: str, variant: str | None) -> str:
    """Where a ``--set`` argument's error is: ``--set EXPR (applied to FILE[, variant NAME])``."""
    return f"--set {expr} (applied to {file}{f', variant {variant}' if variant else ''})"


def format_validation_error(err: ValidationError, file: str, prefix: str = "", sets: tuple[str, ...] = (),
                            variant: str | None = None) -> str:
    """One line for every problem: ``FILE: key: why`` (``--set KEY=VALUE (applied to FILE): key: why``
    where a ``--set`` argument gave the value; ``(applied to FILE, variant NAME)`` when ``variant``,
    whose keys ``prefix`` -- ``variants.NAME.`` -- names in the file)."""
    msgs: list[tuple[str, str]] = []
    for e in err.errors():
        expr = _set_blamed(e, sets)
        m = (_applied_to(expr, file, variant), _one_error(e, "")) if expr else (file, _one_error(e, prefix))
        if m not in msgs:
            msgs.append(m)
    msgs.sort(key=lambda m: m[0] == file)  # what --set gave first: the user's last word
    return "; ".join(f"{where}: {m}" if i == 0 or msgs[i - 1][0] != where else m
                     for i, (where, m) in enumerate(msgs))


_MARK = "\x00"  # a variant name no scenario has: where the names go in a message shared by several


def format_variant_errors(failures: list[tuple[str, ValidationError]], file: str, sets: tuple[str, ...]) -> str:
    """The first failing variant's one line (:func:`format_validation_error`); the other variants
    that fail with the same ``--set`` message are named beside it (``variants a, b``)."""
    def text(name: str, e: ValidationError) -> str:
        return format_validation_error(e, file, f"variants.{name}.", sets, variant=name)

    name, first = failures[0]
    template = text(_MARK, first)
    same = [n for n, e in failures if text(_MARK, e) == template]
    if len(same) > 1 and f"variants.{_MARK}." not in template:
        return template.replace(f"variant {_MARK}", f"variants {', '.join(same)}")
    return text(name, first)


def run_error_line(rest: str, file: str, variant: str | None, sets: tuple[str, ...]) -> str:
    """A problem found while building a run (``rest``: ``key: why`` or a sentence) as one line naming
    the ``--set`` argument that gave ``key`` (``--set EXPR (applied to FILE[, variant NAME]): ...``),
    else the file and the variant's key path (``FILE: variants.NAME.key: why``)."""
    m = re.match(r"([a-z_][a-z0-9_.]*): ", rest)
    expr = set_for_key(m.group(1), sets) if m else None
    if expr:
        return f"{_applied_to(expr, file, variant)}: {rest}"
    if variant is None:
        return f"{file}: {rest}"
    return f"{file}: variants.{variant}.{rest}" if m else f"{file}: variants.{variant}: {rest}"
