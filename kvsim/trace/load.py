"""Trace loading: Azure LLM inference 2023, Mooncake FAST'25 and kvsim's generic schema.

Every loader returns a validated :class:`~kvsim.trace.schema.Trace`. The *format* (which columns
mean what) is given or detected from the column names; the *container* (CSV, JSON lines or
parquet) and gzip compression are detected from the file's bytes, so any format may come in any
container (a Mooncake trace exported to CSV loads too).

The formats are declared in :mod:`kvsim.trace.formats` (a table of columns per format), the
containers in :mod:`kvsim.trace.containers`, and column validation in :mod:`kvsim.trace.coerce`;
this module ties them together: open, detect, read chunk by chunk, check order and repairs, and
assemble the :class:`Trace`. In CSV a key list is a space-separated string.

Streaming: text files are read line by line and parsed in chunks of :data:`CHUNK_LINES` lines
(parquet in record batches), each chunk converted to numpy arrays at once, so a 10-million-request
trace never holds its text in memory.

Bad input raises :class:`~kvsim.errors.TraceError` whose message names the file, the 1-based line
(text) or row (parquet) and the problem. Two problems have a documented repair instead:

* arrival times that go backwards: error by default; ``on_unsorted="sort"`` sorts the requests
  (stable, so equal timestamps keep file order) and warns. Equal (duplicate) timestamps are legal:
  Mooncake quantises arrivals to ~3 s steps, so hundreds of requests share one.
* zero output tokens: error by default; ``on_zero_output="drop"`` removes those requests and warns.

Repairs are also recorded in ``trace.source["repairs"]``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from kvsim.errors import KvsimWarning, TraceError, format_choices
from kvsim.trace import coerce
from kvsim.trace.coerce import RowContext
from kvsim.trace.containers import Chunk, Container, open_container
from kvsim.trace.fileio import OpenTrace, check_path, sha256_of_file
# Re-exported: these names were defined here before the split and are public.
from kvsim.trace.formats import (FORMAT_CHOICES, FORMATS, MOONCAKE_BLOCK_TOKENS, SCHEMAS,  # noqa: F401
                                 TraceSchema, detect_format)
from kvsim.trace.schema import Trace

CHUNK_LINES = 100_000  # lines (rows) parsed at once; read at each call, so tests may lower it

OnUnsorted = Literal["error", "sort"]
OnZeroOutput = Literal["error", "drop"]


class TraceWarning(KvsimWarning):
    """A trace was repaired while loading (sorted, requests dropped, ...)."""


# --------------------------------------------------------------------------------------------
# The loader.


@dataclass
class _Columns:
    """Per-chunk numpy arrays accumulated until the end of the file."""

    times: list[np.ndarray] = field(default_factory=list)
    prompt: list[np.ndarray] = field(default_factory=list)
    output: list[np.ndarray] = field(default_factory=list)
    lines: list[np.ndarray] = field(default_factory=list)
    keys: list[np.ndarray] | None = None
    optional: dict[str, list[np.ndarray]] = field(default_factory=dict)


def load_trace(
    path: str | Path,
    format: str = "auto",
    on_unsorted: OnUnsorted = "error",
    on_zero_output: OnZeroOutput = "error",
) -> Trace:
    """Load a trace file (any format in any container, optionally gzip) into a validated Trace.

    ``trace.source`` records ``path``, ``sha256`` (of the file as stored), ``content_sha256`` (of
    the decompressed bytes; equal to ``sha256`` for an uncompressed file), ``format``,
    ``container``, ``compressed``, ``requests_in_file`` and ``repairs`` (strings describing any
    repair applied).
    """
    path = Path(path)
    where = str(path)
    if format not in FORMAT_CHOICES:
        raise TraceError(f"{where}: unknown trace format '{format}'; choose one of {format_choices(FORMAT_CHOICES)}")
    if on_unsorted not in ("error", "sort"):
        raise TraceError(f"{where}: on_unsorted must be 'error' or 'sort', got {on_unsorted!r}")
    if on_zero_output not in ("error", "drop"):
        raise TraceError(f"{where}: on_zero_output must be 'error' or 'drop', got {on_zero_output!r}")
    check_path(path)
    with OpenTrace(path) as opened:
        source = open_container(opened, where, CHUNK_LINES)
        fmt = detect_format(source.columns, where) if format == "auto" else format
        schema = SCHEMAS[fmt]
        missing = [c for c in schema.required if c not in source.columns]
        if missing:
            shown = ", ".join(source.columns[:12])
            raise TraceError(
                f"{where}: {source.row_label} 1: missing column(s) {', '.join(repr(c) for c in missing)} "
                f"required by the {fmt} format (found: {shown})"
            )
        source.prefix_column = schema.prefix
        source.known_columns = schema.columns
        ctx = RowContext(where, source.row_label)
        read = _read_all(source, schema, ctx, on_unsorted, on_zero_output)
        container = source.name
        if container == "parquet":
            sha = content_sha = sha256_of_file(path)
        else:
            sha, content_sha = opened.sha256()
    info = {
        "kind": "file",
        "path": str(path),
        "sha256": sha,
        "content_sha256": content_sha,
        "format": fmt,
        "container": container,
        "compressed": bool(opened.compressed),
        "requests_in_file": read.requests_in_file,
        "repairs": list(read.repairs),
    }
    trace = _with_source(read.trace, info)
    trace.validate(where)
    return trace


def _with_source(trace: Trace, source: dict) -> Trace:
    return Trace(
        arrival_s=trace.arrival_s,
        prompt_tokens=trace.prompt_tokens,
        output_tokens=trace.output_tokens,
        prefix_keys=trace.prefix_keys,
        prefix_block_tokens=trace.prefix_block_tokens,
        session_id=trace.session_id,
        priority=trace.priority,
        num_samples=trace.num_samples,
        beam=trace.beam,
        source=source,
    )


def _block_tokens(source: Container, schema: TraceSchema, chunk: Chunk, ctx: RowContext, current: int | None) -> int | None:
    if schema.fixed_block_tokens:
        return schema.fixed_block_tokens
    col = schema.block_tokens_column
    if col and col in chunk.frame.columns:
        vals = coerce.integers(chunk.frame[col], col, chunk.lines, ctx)
        expect = current if current is not None else int(vals[0])
        bad = vals != expect
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.fail(chunk.lines[i], f"column '{col}' must be the same on every {ctx.row_label} "
                                           f"({expect}), got {int(vals[i])}")
        return expect
    if current is not None:
        return current
    meta = source.metadata.get("kvsim.prefix_block_tokens")
    if meta is not None:
        try:
            return int(meta)
        except ValueError:
            raise TraceError(f"{ctx.where}: parquet metadata kvsim.prefix_block_tokens={meta!r} is not an integer") from None
    return None


@dataclass(frozen=True)
class _ReadResult:
    trace: Trace  # without ``source``
    repairs: tuple[str, ...]  # one line per repair applied
    requests_in_file: int  # before any request was dropped


@dataclass
class _Repairs:
    """What reading the file repaired so far (counted across chunks)."""

    unsorted: int = 0
    first_unsorted_line: int | None = None
    zero_dropped: int = 0
    first_zero_line: int | None = None
    last_time: object = None  # the latest arrival seen (the order check spans chunk boundaries)


def _read_all(source: Container, schema: TraceSchema, ctx: RowContext, on_unsorted: str,
              on_zero_output: str) -> _ReadResult:
    acc = _Columns()
    has_keys = schema.prefix is not None and schema.prefix in source.columns
    if has_keys:
        acc.keys = []
    optional = [c for c in schema.optional_ints if c in source.columns]
    acc.optional = {c: [] for c in optional}
    block_tokens: int | None = None
    rep = _Repairs()
    n_in_file = 0

    for chunk in source.chunks():
        frame, lines = chunk.frame, chunk.lines
        n = len(frame)
        if n == 0:
            continue
        n_in_file += n
        times = coerce.times(frame[schema.arrival], schema.arrival, schema.time_unit, lines, ctx)
        prompt = coerce.lengths(frame[schema.prompt], schema.prompt, lines, ctx)
        output = coerce.lengths(frame[schema.output], schema.output, lines, ctx)
        zero_prompt = prompt == 0
        if zero_prompt.any():
            i = int(np.argmax(zero_prompt))
            raise ctx.fail(lines[i], f"column '{schema.prompt}' is 0; every request needs at least one prompt token")
        _check_order(times, lines, schema, ctx, on_unsorted, rep)  # before any row is dropped

        keys = chunk.keys
        if has_keys and keys is None:
            keys = coerce.key_lists(frame[schema.prefix], schema.prefix, lines, ctx)
        if has_keys:
            block_tokens = _block_tokens(source, schema, chunk, ctx, block_tokens)
            _check_key_counts(keys, prompt, lines, block_tokens, schema, ctx)
        opt = {c: coerce.integers(frame[c], c, lines, ctx) for c in optional}
        _check_optional(opt, lines, ctx)

        zero = output == 0
        if zero.any():
            i = int(np.argmax(zero))
            if on_zero_output == "error":
                raise ctx.fail(
                    lines[i],
                    f"column '{schema.output}' is 0; a request must generate at least one token "
                    f"(drop such requests: trace.on_zero_output: drop in a scenario, --on-zero-output drop in kvsim trace)",
                )
            rep.zero_dropped += int(zero.sum())
            rep.first_zero_line = rep.first_zero_line or int(lines[i])
            keep = ~zero
            times, prompt, output, lines = times[keep], prompt[keep], output[keep], lines[keep]
            if has_keys:
                keys = [k for k, z in zip(keys, zero) if not z]
            opt = {c: v[keep] for c, v in opt.items()}

        acc.times.append(times)
        acc.prompt.append(prompt)
        acc.output.append(output)
        acc.lines.append(lines)
        if has_keys:
            acc.keys.extend(keys)
        for c, v in opt.items():
            acc.optional[c].append(v)

    if n_in_file == 0:
        raise TraceError(f"{ctx.where}: {ctx.row_label} 2: the file has a header but no requests")
    trace, repairs = _assemble(acc, schema, ctx, rep, block_tokens)
    return _ReadResult(trace, repairs, n_in_file)


def _check_order(times: np.ndarray, lines: np.ndarray, schema: TraceSchema, ctx: RowContext, on_unsorted: str,
                 rep: _Repairs) -> None:
    """Arrivals earlier than the one before (across the chunk boundary too): an error, or counted
    for sorting (``on_unsorted: sort``)."""
    last_time = rep.last_time
    prev = times[:1] if last_time is None else np.array([last_time], dtype=times.dtype)
    back = np.diff(np.concatenate([prev, times])) < 0
    if back.any():
        i = int(np.argmax(back))
        if on_unsorted == "error":
            before = times[i - 1] if i else last_time
            raise ctx.fail(
                lines[i],
                f"arrival time {_fmt_time(times[i], schema)} is earlier than the previous request's "
                f"{_fmt_time(before, schema)}; the file is not sorted by time "
                f"(sort it: trace.on_unsorted: sort in a scenario, --on-unsorted sort in kvsim trace)",
            )
        rep.unsorted += int(back.sum())
        rep.first_unsorted_line = rep.first_unsorted_line or int(lines[i])
    rep.last_time = times[-1] if on_unsorted == "error" else max(times.max(), last_time if last_time is not None else times.max())


def _check_key_counts(keys: list, prompt: np.ndarray, lines: np.ndarray, block_tokens: int | None,
                      schema: TraceSchema, ctx: RowContext) -> None:
    """One prefix key per ``block_tokens``-token block of each prompt (the last may be partial)."""
    if block_tokens is None or block_tokens < 1:
        raise TraceError(
            f"{ctx.where}: {ctx.row_label} 1: column '{schema.prefix}' needs a positive block size: add a "
            f"'{schema.block_tokens_column}' column"
        )
    counts = np.fromiter((k.shape[0] for k in keys), np.int64, len(keys))
    expect = -(-prompt // block_tokens)
    bad = counts != expect
    if bad.any():
        i = int(np.argmax(bad))
        raise ctx.fail(
            lines[i],
            f"column '{schema.prefix}' has {int(counts[i])} keys but {int(prompt[i])} prompt tokens "
            f"in {block_tokens}-token blocks need {int(expect[i])} (one per block, the last may be partial)",
        )


def _check_optional(opt: dict[str, np.ndarray], lines: np.ndarray, ctx: RowContext) -> None:
    """``num_samples`` >= 1 and ``beam`` in {0, 1} where the file has them."""
    if "num_samples" in opt and (opt["num_samples"] < 1).any():
        i = int(np.argmax(opt["num_samples"] < 1))
        raise ctx.fail(lines[i], f"column 'num_samples' must be >= 1, got {int(opt['num_samples'][i])}")
    if "beam" in opt and not np.isin(opt["beam"], (0, 1)).all():
        i = int(np.argmax(~np.isin(opt["beam"], (0, 1))))
        raise ctx.fail(lines[i], f"column 'beam' must be 0 (parallel samples) or 1 (beam search), "
                                 f"got {int(opt['beam'][i])}")


def _assemble(acc: _Columns, schema: TraceSchema, ctx: RowContext, rep: _Repairs,
              block_tokens: int | None) -> tuple[Trace, tuple[str, ...]]:
    """The trace from the accumulated chunks (sorted if ``on_unsorted: sort`` found disorder), and
    one line per repair (each also warned, attributed to load_trace's caller)."""
    def cat(parts: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    times = cat(acc.times, np.int64 if schema.time_unit == "datetime" else np.float64)
    prompt = cat(acc.prompt, np.int64)
    output = cat(acc.output, np.int64)
    optional_arrays = {c: cat(v, np.int64) for c, v in acc.optional.items()}
    keys_list = acc.keys

    repairs: list[str] = []
    if rep.zero_dropped:
        msg = (f"{ctx.where}: dropped {rep.zero_dropped} request(s) with 0 output tokens "
               f"(first at {ctx.row_label} {rep.first_zero_line}; on_zero_output: drop)")
        repairs.append(msg)
        warnings.warn(msg, TraceWarning, stacklevel=4)
    if rep.unsorted:
        order = np.argsort(times, kind="stable")
        times, prompt, output = times[order], prompt[order], output[order]
        optional_arrays = {c: v[order] for c, v in optional_arrays.items()}
        if keys_list is not None:
            keys_list = [keys_list[i] for i in order]
        msg = (f"{ctx.where}: sorted the requests by arrival time: {rep.unsorted} arrival(s) were earlier "
               f"than the one before (first at {ctx.row_label} {rep.first_unsorted_line}; on_unsorted: sort)")
        repairs.append(msg)
        warnings.warn(msg, TraceWarning, stacklevel=4)
    if len(times) == 0:
        raise TraceError(f"{ctx.where}: no requests left after dropping those with 0 output tokens")

    if schema.time_unit == "datetime":
        # Seconds since the earliest timestamp; int64 ns differences are exact.
        arrival_s = (times - times.min()).astype(np.float64) / 1e9
    else:
        arrival_s = times

    trace = Trace(
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        output_tokens=output,
        prefix_keys=keys_list,
        prefix_block_tokens=block_tokens if keys_list is not None else None,
        session_id=optional_arrays.get("session_id"),
        priority=optional_arrays.get("priority"),
        num_samples=optional_arrays.get("num_samples"),
        beam=optional_arrays.get("beam"),
    )
    return trace, tuple(repairs)


def _fmt_time(value, schema: TraceSchema) -> str:
    if schema.time_unit == "datetime":
        return str(pd.Timestamp(int(value)))
    return f"{float(value):.6g} s"
