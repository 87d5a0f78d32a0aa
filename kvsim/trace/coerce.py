"""Column coercion: pandas/arrow columns -> validated numpy arrays, with row-accurate errors.

Every function takes the column, its name, the 1-based line (text) or row (parquet) number of each
entry and a :class:`RowContext`, and raises a one-line :class:`~kvsim.errors.TraceError` naming the
file, the line/row and the problem at the first bad entry. Used by :mod:`kvsim.trace.load`
(numbers, times, key lists) and by the containers (arrow key-list columns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from kvsim.errors import TraceError
from kvsim.trace.arrays import split_flat
from kvsim.trace.schema import MAX_TOKENS

# Token counts and keys must fit comfortably in int64 after float parsing.
MAX_EXACT_FLOAT_INT = 2**53


class SlowPath(Exception):
    """The fast (arrow) parse of a chunk is unusable; re-parse it line by line."""


def arrow_key_lists(col, where: str, lines: np.ndarray, row_label: str, strict: bool) -> list[np.ndarray]:
    """An arrow list column -> int64 arrays. With ``strict=False`` any problem raises SlowPath
    (the caller re-parses exactly); with ``strict=True`` it raises a TraceError."""

    def fail(i: int, message: str):
        if not strict:
            raise SlowPath
        raise TraceError(f"{where}: {row_label} {int(lines[i])}: {message}")

    if pa.types.is_null(col.type):
        fail(0, "prefix key list is missing (null)")
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        fail(0, f"prefix keys must be a list of integers, got {col.type}")
    if col.null_count:
        fail(int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0]), "prefix key list is missing (null)")
    offsets = col.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(offsets)
    values = col.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if pa.types.is_null(values.type):  # every list of the chunk is empty
        return [np.zeros(0, np.int64) for _ in range(len(col))]
    if not pa.types.is_integer(values.type):
        fail(int(np.argmax(lengths > 0)), f"prefix keys must be a list of integers, got a list of {values.type}")
    ends = offsets[1:] - offsets[0]  # each row's end within ``values``

    def row_of(j: int) -> int:  # the row holding element j of ``values``
        return int(np.searchsorted(ends, j, side="right"))

    if values.null_count:
        j = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        r = row_of(j)
        fail(r, f"prefix key list holds a missing (null) key (key {j - int(ends[r] - lengths[r]) + 1} of {int(lengths[r])})")
    flat = values.to_numpy(zero_copy_only=False)
    if flat.dtype == np.uint64 and len(flat) and flat.max() > np.iinfo(np.int64).max:
        j = int(np.argmax(flat > np.iinfo(np.int64).max))
        fail(row_of(j), f"prefix keys must hold 64-bit integers (at most 2**63 - 1), got {int(flat[j])}")
    flat = flat.astype(np.int64, copy=False)
    return split_flat(flat, lengths)


@dataclass(frozen=True)
class RowContext:
    """Where an error points: the file, and what a position is called there."""

    where: str
    row_label: Literal["line", "row"]  # 1-based text line, or parquet row

    def fail(self, line: int, message: str) -> TraceError:
        return TraceError(f"{self.where}: {self.row_label} {line}: {message}")


def show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


ARRIVAL_HINT = ("; the generic format's arrival_s is seconds from the trace start, as numbers (absolute "
                "date-times: use the azure columns TIMESTAMP, ContextTokens, GeneratedTokens)")


def refuse_time_types(col: pd.Series, name: str, lines: np.ndarray, ctx: RowContext, hint: str = "") -> None:
    """A date-time or duration column (typed parquet) is not a number: its raw integer ticks
    (e.g. microseconds) must never be read as a count or as seconds."""
    if col.dtype.kind in "mM" and len(col):
        what = "date-times" if col.dtype.kind == "M" else "durations"
        raise ctx.fail(lines[0], f"column '{name}' holds {what} ({col.dtype}), not numbers{hint}")


def numeric(col: pd.Series, name: str, lines: np.ndarray, ctx: RowContext) -> np.ndarray:
    """Column -> float64 or int64 array; error on a missing, boolean or non-numeric value."""
    refuse_time_types(col, name, lines, ctx)
    kind = col.dtype.kind
    if kind == "u":
        return _unsigned(col, name, lines, ctx)
    if kind == "i":
        return col.to_numpy(np.int64)
    if kind == "f":
        arr = col.to_numpy(np.float64)
        bad = np.isnan(arr)
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.fail(lines[i], f"missing value for column '{name}'")
        return arr
    # object/str column: a mixture; find the first offending entry.
    values = col.to_numpy(dtype=object)
    num = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy()
    bad = pd.isna(num) | np.fromiter((isinstance(v, bool) for v in values), bool, len(values))
    if bad.any():
        i = int(np.argmax(bad))
        raw = values[i]
        if raw is None or (isinstance(raw, float) and np.isnan(raw)):
            raise ctx.fail(lines[i], f"missing value for column '{name}'")
        raise ctx.fail(lines[i], f"column '{name}' must be a number, got {show(raw)}")
    return num.astype(np.float64) if num.dtype.kind == "f" else num.astype(np.int64)


def _unsigned(col: pd.Series, name: str, lines: np.ndarray, ctx: RowContext) -> np.ndarray:
    """An unsigned column -> int64; a value above int64's range is an error (not wrapped negative)."""
    arr = col.to_numpy(np.uint64)
    big = arr > np.iinfo(np.int64).max
    if big.any():
        i = int(np.argmax(big))
        raise ctx.fail(lines[i], f"column '{name}' is too large ({int(arr[i])}); it must fit in a signed 64-bit integer")
    return arr.astype(np.int64)


def integers(col: pd.Series, name: str, lines: np.ndarray, ctx: RowContext) -> np.ndarray:
    arr = numeric(col, name, lines, ctx)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.fail(lines[i], f"column '{name}' must be a whole number, got {float(arr[i])!r}")
        big = np.abs(arr) > MAX_EXACT_FLOAT_INT
        if big.any():
            i = int(np.argmax(big))
            raise ctx.fail(lines[i], f"column '{name}' is too large ({float(arr[i])!r}) to be an exact integer "
                                     f"(at most 2**53 in magnitude when written as a float)")
        arr = arr.astype(np.int64)
    return arr


def lengths(col: pd.Series, name: str, lines: np.ndarray, ctx: RowContext) -> np.ndarray:
    arr = integers(col, name, lines, ctx)
    neg = arr < 0
    if neg.any():
        i = int(np.argmax(neg))
        raise ctx.fail(lines[i], f"column '{name}' is negative ({int(arr[i])}); token counts must be >= 0")
    big = arr > MAX_TOKENS
    if big.any():
        i = int(np.argmax(big))
        raise ctx.fail(lines[i], f"column '{name}' is too large ({int(arr[i])}); token counts must be "
                                 f"<= {MAX_TOKENS} (2**32) per request")
    return arr


def times(col: pd.Series, name: str, time_unit: str, lines: np.ndarray, ctx: RowContext) -> np.ndarray:
    """Arrival column -> int64 ns since the epoch (datetime) or float64 seconds."""
    if time_unit == "datetime":
        values = col.to_numpy(dtype=object)
        missing = pd.isna(values)
        if missing.any():
            i = int(np.argmax(missing))
            raise ctx.fail(lines[i], f"missing value for column '{name}'")
        # utc=True: zone-less stamps (Azure) are taken as they are; stamps with a zone are
        # converted to UTC first, so a file mixing zones still orders correctly.
        try:
            parsed = pd.to_datetime(pd.Series(values, dtype=object).astype(str), format="ISO8601",
                                    errors="coerce", utc=True)
        except (ValueError, TypeError) as exc:
            raise ctx.fail(int(lines[0]), f"column '{name}' cannot be read as date-times: {exc}") from None
        bad = parsed.isna().to_numpy()
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.fail(lines[i], f"column '{name}' is not a date-time like 2023-11-16 18:15:46.68, got {show(values[i])}")
        parsed = parsed.dt.tz_localize(None)
        return parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    refuse_time_types(col, name, lines, ctx, ARRIVAL_HINT if time_unit == "s" else "")
    arr = numeric(col, name, lines, ctx).astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.argmax(bad))
        raise ctx.fail(lines[i], f"column '{name}' must be a finite number, got {float(arr[i])!r}")
    neg = arr < 0
    if neg.any():
        i = int(np.argmax(neg))
        raise ctx.fail(lines[i], f"column '{name}' is negative ({float(arr[i])!r}); arrival times must be >= 0")
    return arr / 1000.0 if time_unit == "ms" else arr


KEY_TYPES = {int, str, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32}


def key_lists(col: pd.Series, name: str, lines: np.ndarray, ctx: RowContext) -> list[np.ndarray]:
    """A column of key lists (space-separated strings or JSON arrays) -> int64 arrays."""
    values = col.to_numpy(dtype=object)
    if len(values) and all(type(v) is str for v in values):
        try:  # fast path: arrow splits and parses all strings in C++
            import pyarrow.compute as pc

            text = pc.utf8_trim_whitespace(pa.array(values, pa.string()))
            if pc.any(pc.equal(text, "")).as_py():
                raise ValueError("empty key list")
            lists = pc.cast(pc.utf8_split_whitespace(text), pa.list_(pa.int64()))
            offsets = lists.offsets.to_numpy().astype(np.int64)
            return split_flat(lists.values.to_numpy().astype(np.int64, copy=False), np.diff(offsets))
        except (ValueError, pa.ArrowException):
            pass  # fall through to the exact per-row parser
    lengths = np.empty(len(values), dtype=np.int64)
    flat_parts: list = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            parts = v.split()
        elif isinstance(v, (list, tuple, np.ndarray)):
            parts = v
        else:
            if v is None or (isinstance(v, float) and np.isnan(v)):
                raise ctx.fail(lines[i], f"missing value for column '{name}'")
            raise ctx.fail(lines[i], f"column '{name}' must be a list of integers, got {show(v)}")
        lengths[i] = len(parts)
        flat_parts.append(parts)
    flat_list = [x for parts in flat_parts for x in parts]
    # np.array(..., dtype=int64) parses decimal strings but silently truncates floats and accepts
    # booleans, so check the element types first (one C-level pass).
    types = set(map(type, flat_list))
    try:
        if not types <= KEY_TYPES:
            raise ValueError
        flat = np.array(flat_list, dtype=np.int64) if flat_list else np.zeros(0, np.int64)
    except (ValueError, OverflowError, TypeError):
        for i, parts in enumerate(flat_parts):  # locate the offending row
            for x in parts:
                try:
                    if type(x) not in KEY_TYPES:
                        raise ValueError
                    np.int64(int(x))
                except (ValueError, OverflowError, TypeError):
                    raise ctx.fail(lines[i], f"column '{name}' must hold 64-bit integers, got {show(x)}") from None
        raise  # pragma: no cover - the loop above finds the culprit
    del flat_list
    return split_flat(flat, lengths)
