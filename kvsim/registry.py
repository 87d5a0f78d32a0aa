"""Plugin registries: ``kind:`` in YAML -> (pydantic config class, factory).

Each plugin family has one :class:`Registry`:

* ``ALLOCATORS`` -- ``allocator:`` (kvsim/kv/paged.py, contiguous.py, buddy.py, radix.py);
* ``TIMING_MODELS`` -- ``timing:`` (kvsim/timing/*.py);
* ``EVICTION_POLICIES`` -- ``allocator.eviction:`` (kvsim/kv/eviction.py, which owns it);
* ``VICTIMS`` -- ``scheduler.victim:`` (kvsim/sched/victim.py);
* ``ROUTERS`` -- ``replicas.router:`` (kvsim/sched/router.py);
* ``RESERVATIONS`` -- ``allocator.reservation:`` of contiguous and buddy (kvsim/kv/reservation.py).

A plugin's config class is a pydantic model with a ``kind: Literal["name"]`` field; the scenario
schema is built from the registered classes as a discriminated union, so an unknown kind fails
validation with the list of valid kinds. ``build`` turns a validated config into the plugin object.

Policy families (victim, router, reservation) accept a bare kind as shorthand: ``victim:
largest_kv`` means ``victim: {kind: largest_kv}``; see :func:`policy_field`. A config class with no
field but ``kind`` derives from :class:`PolicyConfig` and is written back (resolved scenarios,
config hashes) as that bare string, so results of scenarios written before the registries existed
are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Union

from pydantic import BeforeValidator, Field, model_serializer

from kvsim.config_base import StrictModel
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
        self._check(kind)
        return self._entries[kind][0].model_validate({"kind": kind})

    def config_classes(self) -> tuple[type, ...]:
        return tuple(cls for _, (cls, _) in sorted(self._entries.items()))

    def _check(self, kind: str) -> None:
        if kind not in self._entries:
            raise ConfigError(
                f"unknown {self.family} kind {kind!r}{did_you_mean(kind, self.kinds)}; "
                f"valid kinds: {format_choices(self.kinds)}"
            )

    def build(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        self._check(cfg.kind)
        return self._entries[cfg.kind][1](cfg, *args, **kwargs)


class PolicyConfig(StrictModel):
    """Base of a policy config class. Subclasses add ``kind: Literal["name"] = "name"`` and any
    parameters; one without parameters serialises as its bare kind string."""

    @model_serializer(mode="wrap")
    def _bare_kind(self, handler):
        if type(self).model_fields.keys() == {"kind"}:
            return self.kind  # type: ignore[attr-defined]
        return handler(self)


def plugin_union(registry: Registry) -> Any:
    """The discriminated union of ``registry``'s config classes (a pydantic field type)."""
    classes = registry.config_classes()
    return Annotated[Union[classes], Field(discriminator="kind")]  # type: ignore[valid-type]


def policy_field(registry: Registry, default_kind: str) -> Any:
    """A field type for a policy family: the discriminated union of its config classes, also
    accepting a bare kind string (``largest_kv`` -> ``{kind: largest_kv}``) and a mapping without
    ``kind`` (the default kind's parameters)."""

    def shorthand(value: Any) -> Any:
        if isinstance(value, str):
            return {"kind": value}
        if isinstance(value, dict) and "kind" not in value:
            return {"kind": default_kind, **value}
        return value

    return Annotated[plugin_union(registry), BeforeValidator(shorthand)]


ALLOCATORS = Registry("allocator")
TIMING_MODELS = Registry("timing")
VICTIMS = Registry("victim")
ROUTERS = Registry("router")
RESERVATIONS = Registry("reservation")
