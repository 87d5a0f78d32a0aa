"""``@record``: a frozen, slotted dataclass whose constructor is cheap (hot boundary values).

A frozen dataclass's generated ``__init__`` writes each field with
``object.__setattr__(self, "name", value)``, which costs about five times a plain assignment. The
engine builds several such values per step (batch shapes, plans, usage snapshots, timings), which
made constructing them ~7 % of a run's event loop (py-spy, Azure benchmark case). ``@record``
builds the same class as ``@dataclass(frozen=True, slots=True)`` (equality, hash, repr, pickling,
``dataclasses.replace``, ``FrozenInstanceError`` on assignment: all unchanged) and replaces only
``__init__`` with one that stores each argument straight into its slot through the slot's
descriptor. Fields must be plain (a default value or none: no ``default_factory``, ``InitVar``,
``kw_only`` or ``__post_init__``); anything else is refused when the class is defined.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING


def record(cls: type) -> type:
    """Class decorator: ``@dataclass(frozen=True, slots=True)`` with a fast ``__init__``."""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"@record {cls.__name__}: __post_init__ is not supported")
    names: list[str] = []
    params: list[str] = []
    env: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not MISSING or f.kw_only or not f.init:
            raise TypeError(f"@record {cls.__name__}.{f.name}: only plain fields (a default value or none)")
        names.append(f.name)
        env[f"_set_{f.name}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
        if f.default is MISSING:
            params.append(f.name)
        else:
            env[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    body = "".join(f"    _set_{n}(self, {n})\n" for n in names) or "    pass\n"
    exec(f"def __init__(self, {', '.join(params)}):\n{body}", env)  # noqa: S102 -- built from field names only
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls
