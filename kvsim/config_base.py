"""Base class for every YAML-facing pydantic model: unknown keys are rejected, values are frozen,
and non-finite floats (``.nan``, ``.inf``, ``-.inf``) are refused.

:func:`reject_non_finite` does the same for a whole parsed YAML document (scenario, variants,
sweep, generator spec, ``--set`` values) before any model sees it, so the message names the file
and the key wherever the number is, including keys that models keep as free-form mappings.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from kvsim.errors import ConfigError


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


def find_non_finite(obj: Any, path: str = "") -> tuple[str, float] | None:
    """The first (dotted key path, value) whose value is a float NaN or infinity, or None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            hit = find_non_finite(v, f"{path}.{k}" if path else str(k))
            if hit:
                return hit
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            hit = find_non_finite(v, f"{path}[{i}]")
            if hit:
                return hit
    return None


def reject_non_finite(obj: Any, where: str, prefix: str = "") -> None:
    """Raise a one-line :class:`ConfigError` naming ``where`` and the key of a NaN/infinite number."""
    hit = find_non_finite(obj, prefix)
    if hit is not None:
        key, value = hit
        shown = {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
        raise ConfigError(f"{where}: {key or '(value)'}: {shown} is not allowed; give a finite number")
