"""README: "Every key is in docs/scenario.md". Every field of the scenario schema -- the pydantic
models of kvsim/config, the sections they hold and every registered plugin kind's config class
(allocators, timing models, policies) -- is named in docs/scenario.md, so a new key cannot go
undocumented (model.vocab_size, gpu.interconnect, host_link's fields and others were)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from kvsim.config.messages import _members, _model_from_annotation
from kvsim.config.scenario import Scenario
from kvsim.registry import plugin_registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "scenario.md"


def _sections(field) -> tuple:
    """The model classes a field holds: a plugin family's registered config classes, else the
    models in its annotation (Optional, unions and Annotated unwrapped)."""
    registry = plugin_registry(Annotated[(field.annotation, *field.metadata)]) if field.metadata else None
    if registry is not None:
        return tuple(registry.config_classes())
    return _members(_model_from_annotation(field.annotation))


def schema_keys() -> list[tuple[str, str]]:
    """(dotted path, field name) of every key reachable from Scenario, each model class once."""
    out: list[tuple[str, str]] = []
    seen: set = set()

    def walk(cls, path: str) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for name, field in cls.model_fields.items():
            out.append((path + name, name))
            for sub in _sections(field):
                walk(sub, f"{path}{name}.")

    walk(Scenario, "")
    return out


def test_the_walk_reaches_plugin_kinds():
    paths = {p for p, _ in schema_keys()}
    assert {"allocator.track_block_ids", "timing.decode_impl", "allocator.reservation.kind",
            "host_link.per_transfer_latency_s", "model.vocab_size"} <= paths


def test_every_scenario_key_is_in_docs_scenario_md():
    doc = DOC.read_text(encoding="utf-8")
    missing = sorted({p for p, name in schema_keys()
                      if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", doc)})
    assert not missing, f"keys not named in docs/scenario.md: {', '.join(missing)}"
