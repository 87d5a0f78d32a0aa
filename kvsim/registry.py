"""Plugin registries: ``kind:`` in YAML -> (pydantic config class, factory).

Each plugin family (allocator, timing model, ...) has one :class:`Registry`. A plugin's config class
is a pydantic model with a ``kind: Literal["name"]`` field; the scenario schema is built from the
registered classes as a discriminated union, so an unknown kind fails validation with the list of
valid kinds. ``build`` turns a validated config into the plugin object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvsim.errors import ConfigError, did_you_mean, format_choices


class Registry:
    def __init__(self, family: str):
        self.family = family
        self._entries: dict[str, tuple[type, Callable[..., Any]]] = {}

    def register(self, kind: str, config_cls: type, factory: Callable[..., Any]) -> None:
        if kind in self._entries:
            raise ValueError(f"{self.family} kind {kind!r} registered twice")
        self._entries[kind] = (config_cls, factory)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._entries)

    def config_class(self, kind: str) -> type:
        return self._entries[kind][0]

    def default_config(self, kind: str):
        return self._entries[kind][0].model_validate({"kind": kind})

    def config_classes(self) -> tuple[type, ...]:
        return tuple(cls for _, (cls, _) in sorted(self._entries.items()))

    def build(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        kind = cfg.kind
        if kind not in self._entries:
            raise ConfigError(
                f"unknown {self.family} kind {kind!r}{did_you_mean(kind, self.kinds)}; "
                f"valid kinds: {format_choices(self.kinds)}"
            )
        return self._entries[kind][1](cfg, *args, **kwargs)


ALLOCATORS = Registry("allocator")
TIMING_MODELS = Registry("timing")
