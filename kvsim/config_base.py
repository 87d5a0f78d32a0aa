"""Base class for every YAML-facing pydantic model: unknown keys are rejected, values are frozen,
and non-finite floats (``.nan``, ``.inf``, ``-.inf``) are refused; and the field types of byte
counts, token counts and rates (``Bytes``, ``Tokens``, ``ByteRate``, ``Number``: units and
scientific notation, kvsim.units).

:func:`reject_non_finite` does the same for a whole parsed YAML document (scenario, variants,
sweep, generator spec, ``--set`` values) before any model sees it, so the message names the file
and the key wherever the number is, including keys that models keep as free-form mappings.
"""

from __future__ import annotations

import math
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from kvsim.errors import ConfigError
from kvsim.units import parse_byte_rate, parse_bytes, parse_number, parse_tokens

# The field types of every byte count, token count and rate a user writes (kvsim.units has the one
# rule for each; docs/scenario.md, "Numbers and units"). Optional fields write ``Bytes | None``.
Bytes = Annotated[int, BeforeValidator(parse_bytes)]
Tokens = Annotated[int, BeforeValidator(parse_tokens)]
Count = Tokens  # request counts follow the token-count rule (100k requests)
ByteRate = Annotated[float, BeforeValidator(parse_byte_rate)]
Number = Annotated[float, BeforeValidator(parse_number)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """``tensor: true`` is not 1: pydantic's lax mode reads a boolean as a number, YAML writes
        ``yes``/``true`` for booleans, so a boolean in a number field is refused (as config.json's is)."""
        if isinstance(data, dict):
            for name in _numeric_fields(cls):
                value = data.get(name)
                if isinstance(value, bool):
                    raise ValueError(f"{name}: expected a number, got the boolean {str(value).lower()}")
        return data


def _numeric_fields(cls: type[BaseModel]) -> frozenset[str]:
    """Fields of ``cls`` that hold an int or a float (or None), never a boolean; computed once per class."""
    cached = cls.__dict__.get("_kvsim_numeric_fields")
    if cached is None:
        def numeric(annotation: Any) -> bool:
            args = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
            kinds = [a for a in args if a is not type(None)]
            return bool(kinds) and all(a in (int, float) for a in kinds)

        cached = frozenset(n for n, f in cls.model_fields.items() if numeric(f.annotation))
        type.__setattr__(cls, "_kvsim_numeric_fields", cached)
    return cached


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
