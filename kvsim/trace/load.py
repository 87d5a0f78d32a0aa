"""Trace loaders: Azure LLM inference 2023 CSV, Mooncake FAST'25 JSONL and kvsim's generic schema.

Every loader returns a validated :class:`~kvsim.trace.schema.Trace`. The *format* (which columns
mean what) is given or detected from the column names; the *container* (CSV, JSON lines or
parquet) and gzip compression are detected from the file's bytes, so any format may come in any
container (a Mooncake trace exported to CSV loads too).

==========  ============================  ======================  ==============================
format      arrival                        prompt / output tokens  prefix keys
==========  ============================  ======================  ==============================
azure       ``TIMESTAMP`` date string;     ``ContextTokens`` /     none
            seconds since the earliest     ``GeneratedTokens``
            timestamp in the file
mooncake    ``timestamp`` milliseconds     ``input_length`` /      ``hash_ids`` (512-token
            from the trace start (kept,    ``output_length``       blocks, chained), optional
            not rebased)
generic     ``arrival_s`` seconds (kept)   ``prompt_tokens`` /     ``prefix_keys`` +
                                           ``output_tokens``       ``prefix_block_tokens``
==========  ============================  ======================  ==============================

The generic schema also has optional integer columns ``session_id``, ``priority`` and
``num_samples`` (see ``docs/traces.md``). In CSV a key list is a space-separated string.

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

import csv
import io
import json
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from kvsim.errors import TraceError, format_choices
from kvsim.trace.arrays import split_flat
from kvsim.trace.fileio import PARQUET_MAGIC, LineReader, OpenTrace, check_path, sha256_of_file
from kvsim.trace.schema import Trace

CHUNK_LINES = 100_000
FORMATS = ("azure", "mooncake", "generic")
FORMAT_CHOICES = ("auto", *FORMATS)
MOONCAKE_BLOCK_TOKENS = 512
# Token counts and keys must fit comfortably in int64 after float parsing.
_MAX_EXACT_FLOAT_INT = 2**53

OnUnsorted = Literal["error", "sort"]
OnZeroOutput = Literal["error", "drop"]


class TraceWarning(UserWarning):
    """A trace was repaired while loading (sorted, requests dropped, ...)."""


@dataclass(frozen=True)
class TraceSchema:
    """Which column of a source format means what."""

    name: str
    arrival: str
    prompt: str
    output: str
    time_unit: Literal["datetime", "ms", "s"]
    prefix: str | None = None
    fixed_block_tokens: int | None = None  # block size implied by the format (Mooncake: 512)
    block_tokens_column: str | None = None  # column holding the block size (generic)
    optional_ints: tuple[str, ...] = ()  # Trace fields read from columns of the same name

    @property
    def required(self) -> tuple[str, str, str]:
        return (self.arrival, self.prompt, self.output)


SCHEMAS: dict[str, TraceSchema] = {
    "azure": TraceSchema("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime"),
    "mooncake": TraceSchema(
        "mooncake", "timestamp", "input_length", "output_length", "ms",
        prefix="hash_ids", fixed_block_tokens=MOONCAKE_BLOCK_TOKENS,
    ),
    "generic": TraceSchema(
        "generic", "arrival_s", "prompt_tokens", "output_tokens", "s",
        prefix="prefix_keys", block_tokens_column="prefix_block_tokens",
        optional_ints=("session_id", "priority", "num_samples"),
    ),
}


def detect_format(columns: list[str], where: str) -> str:
    """The format whose required columns are all in ``columns`` (generic wins ties)."""
    present = set(columns)
    for name in ("generic", "mooncake", "azure"):
        if set(SCHEMAS[name].required) <= present:
            return name
    expected = "; ".join(f"{n}: {', '.join(SCHEMAS[n].required)}" for n in FORMATS)
    shown = ", ".join(columns[:12]) + (", ..." if len(columns) > 12 else "")
    raise TraceError(
        f"{where}: line 1: cannot detect the trace format from the columns [{shown}]; "
        f"expected the columns of one of ({expected}), or set format to one of {format_choices(FORMATS)}"
    )


# --------------------------------------------------------------------------------------------
# Chunk sources: each yields (DataFrame, 1-based line/row numbers, optional arrow key lists).


@dataclass
class _Chunk:
    frame: pd.DataFrame
    lines: np.ndarray  # int64, 1-based line (text) or row (parquet) number of each frame row
    keys: list[np.ndarray] | None = None  # prefix key lists already decoded (parquet)


class _Source:
    """A container reader: ``columns`` (in file order) and ``chunks()``."""

    unit = "line"
    columns: list[str]
    metadata: dict[str, str]

    def chunks(self) -> Iterator[_Chunk]:  # pragma: no cover - interface
        raise NotImplementedError


_PANDAS_FIELDS_RE = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


class _CsvSource(_Source):
    def __init__(self, opened: OpenTrace, where: str, text_columns: tuple[str, ...]):
        self._where = where
        self._lines = LineReader(opened.stream, opened.path)
        header = self._lines.readline()
        if not header.strip():
            raise TraceError(f"{where}: line 1: the file is empty (expected a CSV header line)")
        try:
            row = next(csv.reader([header.decode("utf-8-sig")]))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise TraceError(f"{where}: line 1: cannot read the CSV header: {exc}") from None
        self.columns = [c.strip() for c in row]
        dupes = sorted({c for c in self.columns if self.columns.count(c) > 1})
        if dupes:
            raise TraceError(f"{where}: line 1: duplicate column name(s) {', '.join(repr(c) for c in dupes)}")
        self.metadata = {}
        self._text_columns = [c for c in text_columns if c in self.columns]

    def chunks(self) -> Iterator[_Chunk]:
        buf: list[bytes] = []
        first_line = 2
        for line in self._lines:
            buf.append(line)
            if len(buf) >= CHUNK_LINES:
                yield self._parse(buf, first_line)
                first_line += len(buf)
                buf = []
        if buf:
            yield self._parse(buf, first_line)

    def _parse(self, buf: list[bytes], first_line: int) -> _Chunk:
        try:
            frame = pd.read_csv(
                io.BytesIO(b"".join(buf)),
                header=None,
                names=self.columns,
                index_col=False,
                skip_blank_lines=False,  # keep one frame row per line so line numbers stay exact
                skipinitialspace=True,
                dtype={c: object for c in self._text_columns},
                keep_default_na=False,
                na_values=[""],
                encoding="utf-8",
                low_memory=False,  # parse each chunk whole: no mixed-dtype warnings
            )
        except pd.errors.ParserError as exc:
            m = _PANDAS_FIELDS_RE.search(str(exc))
            if m:
                line = first_line + int(m.group(2)) - 1
                raise TraceError(
                    f"{self._where}: line {line}: expected {len(self.columns)} comma-separated "
                    f"fields (as in the header), found {m.group(3)}"
                ) from None
            raise TraceError(f"{self._where}: lines {first_line}-{first_line + len(buf) - 1}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise TraceError(f"{self._where}: near line {first_line}: not UTF-8 text ({exc.reason})") from None
        lines = np.arange(first_line, first_line + len(frame), dtype=np.int64)
        blank = frame.isna().all(axis=1).to_numpy()
        if blank.any():  # blank lines are allowed and skipped
            frame = frame.loc[~blank].reset_index(drop=True)
            lines = lines[~blank]
        return _Chunk(frame, lines)


class _JsonlSource(_Source):
    """JSON lines. Each chunk is parsed by pyarrow's C++ JSON reader (fast, typed columns); if
    that fails or yields unusable types, the chunk is re-parsed line by line with :mod:`json` so
    the error names the exact line and problem."""

    def __init__(self, opened: OpenTrace, where: str):
        self._where = where
        self._lines = LineReader(opened.stream, opened.path)
        self.metadata = {}
        self.prefix_column: str | None = None  # set once the format is known
        self._first: tuple[bytes, int] | None = None
        for line in self._lines:
            if line.strip():
                self._first = (line, self._lines.line_no)
                break
        if self._first is None:
            raise TraceError(f"{where}: line 1: the file is empty (no JSON objects)")
        self.columns = list(self._decode(*self._first).keys())

    def _decode(self, line: bytes, line_no: int) -> dict:
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else f"not UTF-8 text ({exc.reason})"
            raise TraceError(
                f"{self._where}: line {line_no}: not a valid JSON object: {reason} "
                f"(JSON-lines traces hold one complete object per line)"
            ) from None
        if not isinstance(obj, dict):
            raise TraceError(
                f"{self._where}: line {line_no}: expected a JSON object {{...}}, got {type(obj).__name__}"
            )
        return obj

    def chunks(self) -> Iterator[_Chunk]:
        assert self._first is not None
        lines = [self._first[0]]
        line_nos = [self._first[1]]
        for line in self._lines:
            if not line.strip():  # blank lines are allowed and skipped
                continue
            lines.append(line)
            line_nos.append(self._lines.line_no)
            if len(lines) >= CHUNK_LINES:
                yield self._chunk(lines, line_nos)
                lines, line_nos = [], []
        if lines:
            yield self._chunk(lines, line_nos)

    def _chunk(self, lines: list[bytes], line_nos: list[int]) -> _Chunk:
        numbers = np.asarray(line_nos, dtype=np.int64)
        try:
            return self._fast(lines, numbers)
        except (_SlowPath, pa.ArrowException):
            pass  # let the exact line-by-line parser find and explain the problem
        records = [self._decode(line, n) for line, n in zip(lines, line_nos)]
        data = {c: [r.get(c) for r in records] for c in self.columns}
        frame = pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in data.items()})
        return _Chunk(frame, numbers)

    def _fast(self, lines: list[bytes], numbers: np.ndarray) -> _Chunk:
        import pyarrow.json as pj

        data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(block_size=max(1 << 20, len(data) + 1)))
        if table.num_rows != len(lines):
            raise _SlowPath
        keys = None
        if self.prefix_column is not None and self.prefix_column in table.column_names:
            col = table.column(self.prefix_column).combine_chunks()
            keys = _arrow_key_lists(col, self._where, numbers, "line", strict=False)
            table = table.drop_columns([self.prefix_column])
        keep = [c for c in self.columns if c in table.column_names]
        frame = table.select(keep).to_pandas()
        for c in self.columns:  # columns absent from every line of this chunk
            if c not in frame.columns and c != self.prefix_column:
                frame[c] = pd.Series([None] * len(frame), dtype=object)
        return _Chunk(frame, numbers, keys)


class _SlowPath(Exception):
    """The fast (arrow) parse of a chunk is unusable; re-parse it line by line."""


class _ParquetSource(_Source):
    unit = "row"

    def __init__(self, path: Path, where: str):
        import pyarrow.parquet as pq

        try:
            self._file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise TraceError(f"{where}: cannot read the parquet file: {exc}") from None
        self._where = where
        schema = self._file.schema_arrow
        self.columns = list(schema.names)
        meta = schema.metadata or {}
        self.metadata = {k.decode(): v.decode() for k, v in meta.items()}
        self.prefix_column: str | None = None  # set once the format is known
        if self._file.metadata.num_rows == 0:
            raise TraceError(f"{where}: row 1: the file is empty (no rows)")

    def chunks(self) -> Iterator[_Chunk]:
        first_row = 1
        try:
            for batch in self._file.iter_batches(batch_size=CHUNK_LINES):
                keys = None
                if self.prefix_column in batch.schema.names:
                    col = batch.column(self.prefix_column)
                    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                        rows = np.arange(first_row, first_row + len(col), dtype=np.int64)
                        keys = _arrow_key_lists(col, self._where, rows, "row", strict=True)
                        batch = batch.drop_columns([self.prefix_column])
                frame = batch.to_pandas()
                lines = np.arange(first_row, first_row + len(frame), dtype=np.int64)
                first_row += len(frame)
                yield _Chunk(frame, lines, keys)
        except pa.ArrowException as exc:
            raise TraceError(f"{self._where}: near row {first_row}: cannot read the parquet file: {exc}") from None


def _arrow_key_lists(col, where: str, lines: np.ndarray, unit: str, strict: bool) -> list[np.ndarray]:
    """An arrow list column -> int64 arrays. With ``strict=False`` any problem raises _SlowPath
    (the caller re-parses exactly); with ``strict=True`` it raises a TraceError."""

    def fail(i: int, message: str):
        if not strict:
            raise _SlowPath
        raise TraceError(f"{where}: {unit} {int(lines[i])}: {message}")

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
    if not pa.types.is_integer(values.type) or values.null_count:
        fail(int(np.argmax(lengths > 0)), f"prefix keys must be a list of integers, got a list of {values.type}")
    flat = values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return split_flat(flat, lengths)


def _open_source(opened: OpenTrace, where: str) -> _Source:
    head = opened.first_bytes
    if head[:4] == PARQUET_MAGIC:
        if opened.compressed:
            raise TraceError(f"{where}: a gzip-compressed parquet file is not supported; store it uncompressed")
        return _ParquetSource(opened.path, where)
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped:
        raise TraceError(f"{where}: line 1: the file is empty")
    if stripped[:1] in (b"{", b"["):
        return _JsonlSource(opened, where)
    text_cols = ("TIMESTAMP", "hash_ids", "prefix_keys")
    return _CsvSource(opened, where, text_cols)


# --------------------------------------------------------------------------------------------
# Column conversion with row-accurate error messages.


class _Ctx:
    def __init__(self, where: str, unit: str):
        self.where = where
        self.unit = unit

    def fail(self, line: int, message: str) -> TraceError:
        return TraceError(f"{self.where}: {self.unit} {line}: {message}")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _numeric(col: pd.Series, name: str, lines: np.ndarray, ctx: _Ctx) -> np.ndarray:
    """Column -> float64 or int64 array; error on a missing, boolean or non-numeric value."""
    kind = col.dtype.kind
    if kind in "iu":
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
        raise ctx.fail(lines[i], f"column '{name}' must be a number, got {_show(raw)}")
    return num.astype(np.float64) if num.dtype.kind == "f" else num.astype(np.int64)


def _integers(col: pd.Series, name: str, lines: np.ndarray, ctx: _Ctx) -> np.ndarray:
    arr = _numeric(col, name, lines, ctx)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr)) | (np.abs(arr) > _MAX_EXACT_FLOAT_INT)
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.fail(lines[i], f"column '{name}' must be a whole number, got {float(arr[i])!r}")
        arr = arr.astype(np.int64)
    return arr


def _lengths(col: pd.Series, name: str, lines: np.ndarray, ctx: _Ctx) -> np.ndarray:
    arr = _integers(col, name, lines, ctx)
    neg = arr < 0
    if neg.any():
        i = int(np.argmax(neg))
        raise ctx.fail(lines[i], f"column '{name}' is negative ({int(arr[i])}); token counts must be >= 0")
    return arr


def _times(col: pd.Series, name: str, unit: str, lines: np.ndarray, ctx: _Ctx) -> np.ndarray:
    """Arrival column -> int64 ns since the epoch (datetime) or float64 seconds."""
    if unit == "datetime":
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
            raise ctx.fail(lines[i], f"column '{name}' is not a date-time like 2023-11-16 18:15:46.68, got {_show(values[i])}")
        parsed = parsed.dt.tz_localize(None)
        return parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    arr = _numeric(col, name, lines, ctx).astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.argmax(bad))
        raise ctx.fail(lines[i], f"column '{name}' must be a finite number, got {float(arr[i])!r}")
    neg = arr < 0
    if neg.any():
        i = int(np.argmax(neg))
        raise ctx.fail(lines[i], f"column '{name}' is negative ({float(arr[i])!r}); arrival times must be >= 0")
    return arr / 1000.0 if unit == "ms" else arr


_KEY_TYPES = {int, str, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.uint32}


def _key_lists(col: pd.Series, name: str, lines: np.ndarray, ctx: _Ctx) -> list[np.ndarray]:
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
            raise ctx.fail(lines[i], f"column '{name}' must be a list of integers, got {_show(v)}")
        lengths[i] = len(parts)
        flat_parts.append(parts)
    flat_list = [x for parts in flat_parts for x in parts]
    # np.array(..., dtype=int64) parses decimal strings but silently truncates floats and accepts
    # booleans, so check the element types first (one C-level pass).
    types = set(map(type, flat_list))
    try:
        if not types <= _KEY_TYPES:
            raise ValueError
        flat = np.array(flat_list, dtype=np.int64) if flat_list else np.zeros(0, np.int64)
    except (ValueError, OverflowError, TypeError):
        for i, parts in enumerate(flat_parts):  # locate the offending row
            for x in parts:
                try:
                    if type(x) not in _KEY_TYPES:
                        raise ValueError
                    np.int64(int(x))
                except (ValueError, OverflowError, TypeError):
                    raise ctx.fail(lines[i], f"column '{name}' must hold 64-bit integers, got {_show(x)}") from None
        raise  # pragma: no cover - the loop above finds the culprit
    del flat_list
    return split_flat(flat, lengths)


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
        source = _open_source(opened, where)
        fmt = detect_format(source.columns, where) if format == "auto" else format
        schema = SCHEMAS[fmt]
        missing = [c for c in schema.required if c not in source.columns]
        if missing:
            shown = ", ".join(source.columns[:12])
            raise TraceError(
                f"{where}: {source.unit} 1: missing column(s) {', '.join(repr(c) for c in missing)} "
                f"required by the {fmt} format (found: {shown})"
            )
        if isinstance(source, (_ParquetSource, _JsonlSource)):
            source.prefix_column = schema.prefix
        ctx = _Ctx(where, source.unit)
        trace, repairs, n_in_file = _read_all(source, schema, ctx, on_unsorted, on_zero_output)
        container = "parquet" if isinstance(source, _ParquetSource) else (
            "jsonl" if isinstance(source, _JsonlSource) else "csv")
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
        "requests_in_file": n_in_file,
        "repairs": repairs,
    }
    trace = _with_source(trace, info)
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
        source=source,
    )


def _block_tokens(source: _Source, schema: TraceSchema, chunk: _Chunk, ctx: _Ctx, current: int | None) -> int | None:
    if schema.fixed_block_tokens:
        return schema.fixed_block_tokens
    col = schema.block_tokens_column
    if col and col in chunk.frame.columns:
        vals = _integers(chunk.frame[col], col, chunk.lines, ctx)
        expect = current if current is not None else int(vals[0])
        bad = vals != expect
        if bad.any():
            i = int(np.argmax(bad))
            raise ctx.fail(chunk.lines[i], f"column '{col}' must be the same on every {ctx.unit} "
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


def _read_all(source: _Source, schema: TraceSchema, ctx: _Ctx, on_unsorted: str, on_zero_output: str):
    acc = _Columns()
    has_keys = schema.prefix is not None and schema.prefix in source.columns
    if has_keys:
        acc.keys = []
    optional = [c for c in schema.optional_ints if c in source.columns]
    acc.optional = {c: [] for c in optional}
    block_tokens: int | None = None
    last_time = None
    unsorted_count = 0
    first_unsorted_line = None
    zero_dropped = 0
    first_zero_line = None
    n_in_file = 0

    for chunk in source.chunks():
        frame, lines = chunk.frame, chunk.lines
        n = len(frame)
        if n == 0:
            continue
        n_in_file += n
        times = _times(frame[schema.arrival], schema.arrival, schema.time_unit, lines, ctx)
        prompt = _lengths(frame[schema.prompt], schema.prompt, lines, ctx)
        output = _lengths(frame[schema.output], schema.output, lines, ctx)
        zero_prompt = prompt == 0
        if zero_prompt.any():
            i = int(np.argmax(zero_prompt))
            raise ctx.fail(lines[i], f"column '{schema.prompt}' is 0; every request needs at least one prompt token")

        # Order check before any row is dropped, across the chunk boundary too.
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
                    f"(set on_unsorted: sort to sort it)",
                )
            unsorted_count += int(back.sum())
            first_unsorted_line = first_unsorted_line or int(lines[i])
        last_time = times[-1] if on_unsorted == "error" else max(times.max(), last_time if last_time is not None else times.max())

        keys = chunk.keys
        if has_keys and keys is None:
            keys = _key_lists(frame[schema.prefix], schema.prefix, lines, ctx)
        if has_keys:
            block_tokens = _block_tokens(source, schema, chunk, ctx, block_tokens)
            if block_tokens is None or block_tokens < 1:
                raise TraceError(
                    f"{ctx.where}: {ctx.unit} 1: column '{schema.prefix}' needs a positive block size: add a "
                    f"'{schema.block_tokens_column}' column"
                )
            counts = np.fromiter((k.shape[0] for k in keys), np.int64, n)
            expect = -(-prompt // block_tokens)
            bad = counts != expect
            if bad.any():
                i = int(np.argmax(bad))
                raise ctx.fail(
                    lines[i],
                    f"column '{schema.prefix}' has {int(counts[i])} keys but {int(prompt[i])} prompt tokens "
                    f"in {block_tokens}-token blocks need {int(expect[i])} (one per block, the last may be partial)",
                )
        opt = {c: _integers(frame[c], c, lines, ctx) for c in optional}
        if "num_samples" in opt and (opt["num_samples"] < 1).any():
            i = int(np.argmax(opt["num_samples"] < 1))
            raise ctx.fail(lines[i], f"column 'num_samples' must be >= 1, got {int(opt['num_samples'][i])}")

        zero = output == 0
        if zero.any():
            i = int(np.argmax(zero))
            if on_zero_output == "error":
                raise ctx.fail(
                    lines[i],
                    f"column '{schema.output}' is 0; a request must generate at least one token "
                    f"(set on_zero_output: drop to drop such requests)",
                )
            zero_dropped += int(zero.sum())
            first_zero_line = first_zero_line or int(lines[i])
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
        raise TraceError(f"{ctx.where}: {ctx.unit} 2: the file has a header but no requests")

    def cat(parts: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    times = cat(acc.times, np.int64 if schema.time_unit == "datetime" else np.float64)
    prompt = cat(acc.prompt, np.int64)
    output = cat(acc.output, np.int64)
    optional_arrays = {c: cat(v, np.int64) for c, v in acc.optional.items()}
    keys_list = acc.keys

    repairs: list[str] = []
    if zero_dropped:
        msg = (f"{ctx.where}: dropped {zero_dropped} request(s) with 0 output tokens "
               f"(first at {ctx.unit} {first_zero_line}; on_zero_output: drop)")
        repairs.append(msg)
        warnings.warn(msg, TraceWarning, stacklevel=3)
    if unsorted_count:
        order = np.argsort(times, kind="stable")
        times, prompt, output = times[order], prompt[order], output[order]
        optional_arrays = {c: v[order] for c, v in optional_arrays.items()}
        if keys_list is not None:
            keys_list = [keys_list[i] for i in order]
        msg = (f"{ctx.where}: sorted the requests by arrival time: {unsorted_count} arrival(s) were earlier "
               f"than the one before (first at {ctx.unit} {first_unsorted_line}; on_unsorted: sort)")
        repairs.append(msg)
        warnings.warn(msg, TraceWarning, stacklevel=3)
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
    )
    return trace, repairs, n_in_file


def _fmt_time(value, schema: TraceSchema) -> str:
    if schema.time_unit == "datetime":
        return str(pd.Timestamp(int(value)))
    return f"{float(value):.6g} s"
