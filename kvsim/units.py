"""Numbers as people write them: byte counts, token counts and rates with units or scientific
notation. One rule for every YAML-facing field of each kind (docs/scenario.md, "Numbers and units"):

* **Bytes** (``*_bytes``, ``kv_budget.bytes``): an integer, a whole number in scientific notation
  (``16e9``, ``1.0e12``), or a number with a unit: ``B``; decimal ``KB MB GB TB PB`` = 10^3 ... 10^15;
  binary ``KiB MiB GiB TiB PiB`` = 2^10 ... 2^50. Units are case-insensitive, a space before the unit
  is allowed (``16 GiB``), but a capital prefix with a lower-case ``b`` (``Gb``, ``Mib``) or ``bit``
  is refused: that is how datasheets and NIC speeds write bits. The result must be a whole number of bytes (``1.5 GiB`` is fine,
  ``16.5 B`` is refused).
* **Token counts** (``*_tokens``, ``block_size``, ``kv_budget.tokens``, generator token lengths): an
  integer, a whole number in scientific notation (``1.28e5``), or vLLM's ``--max-model-len`` rule
  (vllm/engine/arg_utils.py ``human_readable_int``): lower-case ``k m g t`` are decimal (``128k`` =
  128,000, ``25.6k`` = 25,600), upper-case ``K M G T`` are binary and take whole numbers only
  (``128K`` = 131,072). The result must be a whole number (``1.5`` tokens is refused).
* **Rates** (``*_bytes_per_s``: bandwidths): a number (``64e9``) or a number with a byte unit per
  second (``25 GB/s``, ``2 TiB/s``, same units as bytes). Other rates and counts held as floats
  (``bf16_flops_per_s``, ``rate_per_s``, ``num_params``) take any finite number, scientific
  notation included, as a string too (``989e12``).

Each parser returns the value or raises ``ValueError`` with a one-line message that says what was
wrong and lists the valid forms; pydantic puts the file and key in front (kvsim.config_base). This
module imports nothing from kvsim (layer 0).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

BYTE_UNITS: dict[str, int] = {"b": 1}
for _i, _p in enumerate("kmgtp", start=1):
    BYTE_UNITS[f"{_p}b"] = 10 ** (3 * _i)
    BYTE_UNITS[f"{_p}ib"] = 2 ** (10 * _i)

TOKEN_SUFFIXES: dict[str, int] = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
                                  "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

BYTE_FORMS = "an integer, 16e9, 1.0e12, or a number with a unit: 16GB, 16 GiB, 512 MiB (KB/MB/GB/TB = 1e3/1e6/1e9/1e12, " \
             "KiB/MiB/GiB/TiB = 2^10/2^20/2^30/2^40)"
TOKEN_FORMS = "an integer, 1.28e5, or 128k (k/m/g = 1e3/1e6/1e9) or 128K (K/M/G = 2^10/2^20/2^30, whole numbers only)"
RATE_FORMS = "a number (64e9) or a number of bytes per second: 25 GB/s, 2 TiB/s (units as for bytes)"
NUMBER_FORMS = "a finite number: 12, 0.5, 989e12"
SET_HELP_UNITS = "sizes and counts take units: kv_budget.bytes=16GiB, model.max_model_len_tokens=128K (docs/scenario.md)"

_NUM = r"[+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_WITH_UNIT = re.compile(rf"\s*({_NUM})\s*([A-Za-z]*)\s*")
# a capital prefix with a lower-case b (Kb, Mb, Gb, Tb, Pb, Gib, ...) or "bit": a bit, not a byte
_BITS = re.compile(r"[KMGTP]i?b|[KkMmGgTtPp]?i?bits?")
_WITH_RATE_UNIT = re.compile(rf"\s*({_NUM})\s*(?:([A-Za-z]+)\s*/\s*s(?:ec)?)?\s*")


def _decimal(text: str) -> Decimal:
    try:
        d = Decimal(text.replace("_", ""))
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a number") from None
    if not d.is_finite():
        raise ValueError(f"{text!r} is not a finite number")
    return d


def _whole(d: Decimal, what: str, got: Any, forms: str) -> int:
    if d != d.to_integral_value():
        raise ValueError(f"{got!r} is not a whole number of {what}; give {forms}")
    return int(d)


def _plain(value: Any, what: str, forms: str) -> Decimal | None:
    """A YAML int/float as an exact Decimal; None for strings; ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"expected {what}, got {value!r}; give {forms}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number; give {forms}")
        return Decimal(repr(value))  # the shortest decimal that reads back as this float: 1e+12 -> 10^12
    if isinstance(value, str):
        return None
    raise ValueError(f"expected {what}, got {type(value).__name__} {value!r}; give {forms}")


def _byte_amount(value: Any, pattern: re.Pattern, what: str, forms: str) -> Decimal:
    """A number with an optional byte unit (``pattern``: group 1 the number, group 2 the unit)."""
    d = _plain(value, what, forms)
    if d is not None:
        return d
    m = pattern.fullmatch(value)
    unit = (m.group(2) or "").lower() if m else ""
    if m and _BITS.fullmatch(m.group(2) or ""):  # Gb, Mbit, Gib: bits in datasheets and NIC speeds
        raise ValueError(f"{value!r}: {m.group(2)!r} reads as bits (a NIC's 25 Gb/s is 3.125 GB/s); "
                         f"write bytes: {forms}")
    if not m or (unit and unit not in BYTE_UNITS):
        why = f"unknown unit {m.group(2)!r}" if m else f"not {what}"
        raise ValueError(f"{value!r}: {why}; give {forms}")
    return _decimal(m.group(1)) * BYTE_UNITS[unit or "b"]


def parse_bytes(value: Any) -> Any:
    """A byte count (see the module docstring) -> int. None passes through (optional fields)."""
    if value is None:
        return None
    return _whole(_byte_amount(value, _WITH_UNIT, "a byte count", BYTE_FORMS), "bytes", value, BYTE_FORMS)


def parse_tokens(value: Any) -> Any:
    """A token count (see the module docstring) -> int. None passes through."""
    if value is None:
        return None
    d = _plain(value, "a token count", TOKEN_FORMS)
    if d is None:
        m = _WITH_UNIT.fullmatch(value)
        suffix = m.group(2) if m else ""
        if not m or (suffix and suffix not in TOKEN_SUFFIXES):
            why = f"unknown suffix {suffix!r}" if m else "not a token count"
            raise ValueError(f"{value!r}: {why}; give {TOKEN_FORMS}")
        d = _decimal(m.group(1))
        if suffix.isupper() and d != d.to_integral_value():
            raise ValueError(f"{value!r}: a binary suffix ({suffix}) takes a whole number (did you mean "
                             f"{m.group(1)}{suffix.lower()}?); give {TOKEN_FORMS}")
        d *= TOKEN_SUFFIXES.get(suffix, 1)
    return _whole(d, "tokens", value, TOKEN_FORMS)


def parse_byte_rate(value: Any) -> Any:
    """Bytes per second (see the module docstring) -> float. None passes through."""
    if value is None:
        return None
    return float(_byte_amount(value, _WITH_RATE_UNIT, "a rate in bytes per second", RATE_FORMS))


def parse_number(value: Any) -> Any:
    """A finite number (scientific notation allowed, also as a string) -> float. None passes through."""
    if value is None:
        return None
    d = _plain(value, "a number", NUMBER_FORMS)
    if d is None:
        m = re.fullmatch(rf"\s*({_NUM})\s*", value)
        if not m:
            raise ValueError(f"{value!r} is not a number; give {NUMBER_FORMS}")
        d = _decimal(m.group(1))
    return float(d)
