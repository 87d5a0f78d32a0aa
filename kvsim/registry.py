"""Plugin registries: ``kind:`` in YAML -> (pydantic config class, factory).

Each plugin family has one :class:`Registry`:

* ``ALLOCATORS`` -- ``allocator:`` (kvsim/kv/paged.py, contiguous.py, buddy.py, radix.py);
* ``TIMING_MODELS`` -- ``timing:`` (kvsim/timing/*.py);
* ``EVICTION_POLICIES`` -- ``allocator.eviction:`` of the paged allocator (kvsim/kv/eviction.py,
  which owns it; the policy object's protocol is kvsim.kv.protocol.EvictionPolicy);
* ``VICTIMS`` -- ``scheduler.victim:`` (kvsim/sched/victim.py);
* ``ROUTERS`` -- ``replicas.router:`` (kvsim/sched/router.py);
* ``RESERVATIONS`` -- ``allocator.reservation:`` of contiguous and buddy (kvsim/kv/reservation.py).

A plugin's config class is a pydantic model with a ``kind: Literal["name"]`` field. A scenario
field of a family (:func:`plugin_union`, :func:`policy_field`) is validated against the family's
config classes *as registered when the scenario is validated* (a discriminated union, rebuilt after
each ``register``), so a plugin registered at any time before ``load_scenario`` -- also after
``kvsim.config`` was imported -- can be chosen by ``kind:``, and an unknown kind fails validation
with the list of valid kinds. ``build`` turns a validated config into the plugin object.

Policy families (victim, router, reservation, eviction) accept a bare kind as shorthand: ``victim:
largest_kv`` means ``victim: {kind: largest_kv}``; see :func:`policy_field`. A config class with no
field but ``kind`` derives from :class:`PolicyConfig` and is written back (resolved scenarios,
config hashes) as that bare string, so results of scenarios written before the registries existed
are unchanged. The built-in eviction configs do not derive from it: they were always written back
as mappings (``{kind: lru}``), and still are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BeforeValidator, Field, TypeAdapter, model_serializer
from pydantic_core import core_schema

from kvsim.config_base import StrictModel
from kvsim.errors import ConfigError, did_you_mean, format_choices


class Registry:
    def __init__(self, family: str):
        self.family = family
        self._entries: dict[str, tuple[type, Callable[..., Any]]] = {}
        self._adapter: TypeAdapter | None = None  # the union of the registered classes, built on use

    def register(self, kind: str, config_cls: type, factory: Callable[..., Any]) -> None:
        """Make ``kind`` selectable (``kind: NAME`` in a scenario) from the next validation on.
        ``config_cls`` is a pydantic model whose ``kind`` field is ``Literal[kind]``;
        ``factory(config, *args)`` builds the plugin (the family's docstring says which args)."""
        if kind in self._entries:
            raise ValueError(f"{self.family} kind {kind!r} registered twice")
        field = getattr(config_cls, "model_fields", {}).get("kind")
        if field is None or get_args(field.annotation) != (kind,):
            raise ValueError(f"{self.family} kind {kind!r}: {config_cls.__name__} needs a field "
                             f"kind: Literal[{kind!r}]")
        self._entries[kind] = (config_cls, factory)
        self._adapter = None

    def policy(self, kind: str, *, params: dict[str, Any] | None = None, base: type | None = None,
               config_name: str | None = None) -> Callable[[Any], Any]:
        """Declare a policy kind in one place (a decorator; see :func:`declare_policy`)."""
        def declare(target: Any) -> Any:
            declare_policy(self, kind, target, params=params, base=base, config_name=config_name)
            return target
        return declare

    def unregister(self, kind: str) -> None:
        """Remove a kind (tests, reloading a plugin); scenarios validated later no longer accept it."""
        del self._entries[kind]
        self._adapter = None

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

    def validate(self, value: Any) -> Any:
        """``value`` (a mapping with ``kind``, or a config instance) as the config class of its kind.
        Raises pydantic's ValidationError; inside a model's validation its errors keep their
        locations (the kind is the first element, as in any discriminated union)."""
        if self._adapter is None:
            classes = self.config_classes()
            if not classes:
                raise ValueError(f"no {self.family} kinds are registered")
            union = classes[0] if len(classes) == 1 else Union[classes]  # type: ignore[valid-type]
            self._adapter = TypeAdapter(Annotated[union, Field(discriminator="kind")])
        return self._adapter.validate_python(value)

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


def declare_policy(registry: Registry, kind: str, target: Any, *, params: dict[str, Any] | None = None,
                   base: type | None = None, config_name: str | None = None) -> type:
    """Declare a policy kind of ``registry``: make its config class and register it, so that a
    family module states each kind once (``@VICTIMS.policy("largest_kv")`` over the class).

    The config class derives from ``base`` (:class:`PolicyConfig` unless given: a kind without
    parameters is then written back as its bare name) with ``kind: Literal[kind] = kind`` and the
    fields in ``params`` (``name -> (type, default or Field(...))``, as ``pydantic.create_model``
    takes them). It is named ``config_name`` (default: the target's name + ``Config``) and kept as
    ``target.Config`` (qualified name ``<target>.Config``, so validated configs pickle). The factory:

    * ``target`` a class: ``target(*args, **parameters)`` -- the family's build arguments, then the
      config's parameters by name (a class of a kind without parameters takes no config);
    * ``target`` a function: the factory itself, ``target(cfg, *args)``.

    Returns the config class."""
    from pydantic import create_model

    fields = dict(params or {})
    config = create_model(config_name or f"{target.__name__}Config", __base__=base or PolicyConfig,
                          __module__=target.__module__, kind=(Literal[kind], kind), **fields)  # type: ignore[call-overload]
    config.__qualname__ = f"{target.__qualname__}.Config"
    target.Config = config
    if isinstance(target, type):
        def factory(cfg: Any, *args: Any) -> Any:
            return target(*args, **{n: v for n, v in cfg if n != "kind"})
    else:
        factory = target
    registry.register(kind, config, factory)
    return config


class PluginField:
    """Pydantic field metadata: validate with ``registry`` at validation time (see the module
    docstring). Serialisation uses the validated config instance's own serialiser."""

    def __init__(self, registry: Registry):
        self.registry = registry

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.registry.validate)

    def __repr__(self) -> str:
        return f"PluginField({self.registry.family!r})"


def plugin_union(registry: Registry) -> Any:
    """A pydantic field type accepting any of ``registry``'s config classes, chosen by ``kind``
    among the kinds registered when the scenario is validated."""
    return Annotated[Any, PluginField(registry)]


def plugin_registry(annotation: Any) -> Registry | None:
    """The registry of a field type made by :func:`plugin_union` / :func:`policy_field`, else None."""
    if get_origin(annotation) is Annotated:
        for meta in get_args(annotation)[1:]:
            if isinstance(meta, PluginField):
                return meta.registry
    return None


def policy_field(registry: Registry, default_kind: str) -> Any:
    """A field type for a policy family: the discriminated union of its config classes, also
    accepting a bare kind string (``largest_kv`` -> ``{kind: largest_kv}``) and a mapping without
    ``kind`` (the default kind's parameters)."""

    def shorthand(value: Any) -> Any:
        if isinstance(value, str):
            return {"kind": value}
        if isinstance(value, dict) and "kind" not in value:
            if default_kind in registry.kinds:
                own = set(registry.config_class(default_kind).model_fields)
                stray = [k for k in value if k not in own]
                owners = [kind for kind in registry.kinds
                          if stray and set(stray) <= set(registry.config_class(kind).model_fields)]
                if owners:  # parameters of another kind, given without that kind (else: unknown keys)
                    hint = f"add kind: {owners[0]}" if len(owners) == 1 else f"kinds with {'it' if len(stray) == 1 else 'them'}: {format_choices(owners)}"
                    raise ValueError(f"no kind given, and the default kind {default_kind!r} has no "
                                     f"{'parameter' if len(stray) == 1 else 'parameters'} "
                                     f"{', '.join(repr(k) for k in stray)}; {hint}")
            return {"kind": default_kind, **value}
        return value

    return Annotated[plugin_union(registry), BeforeValidator(shorthand)]


ALLOCATORS = Registry("allocator")
TIMING_MODELS = Registry("timing")
VICTIMS = Registry("victim")
ROUTERS = Registry("router")
RESERVATIONS = Registry("reservation")
