"""JSON-lines container: one JSON object per line (blank lines are skipped)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from kvsim.errors import TraceError
from kvsim.trace.coerce import SlowPath, arrow_key_lists
from kvsim.trace.containers.base import Chunk, Container
from kvsim.trace.fileio import LineReader, OpenTrace


class JsonlContainer(Container):
    """JSON lines. Each chunk is parsed by pyarrow's C++ JSON reader (fast, typed columns); if
    that fails or yields unusable types, the chunk is re-parsed line by line with :mod:`json` so
    the error names the exact line and problem."""

    name = "jsonl"

    def __init__(self, opened: OpenTrace, where: str, chunk_rows: int):
        super().__init__(where, chunk_rows)
        self._lines = LineReader(opened.stream, opened.path)
        self.metadata = {}
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

    def _late_columns(self, present) -> list[str]:
        """Columns the format reads that are in ``present`` but not on the first line."""
        return sorted((set(present) & self.known_columns) - set(self.columns))

    def _check_keys(self, obj: dict, line_no: int) -> dict:
        """``obj`` unless it has a column the format reads that the first line lacks: optional
        columns are optional for the whole file (on every line or on none), as the reverse case
        (on the first line, missing later) is a 'missing value' error."""
        late = self._late_columns(obj)
        if late:
            assert self._first is not None
            raise TraceError(
                f"{self._where}: line {line_no}: column '{late[0]}' is not on line {self._first[1]} (the first "
                f"object); an optional column must be on every line or on none"
            )
        return obj

    def chunks(self) -> Iterator[Chunk]:
        assert self._first is not None
        lines = [self._first[0]]
        line_nos = [self._first[1]]
        for line in self._lines:
            if not line.strip():  # blank lines are allowed and skipped
                continue
            lines.append(line)
            line_nos.append(self._lines.line_no)
            if len(lines) >= self.chunk_rows:
                yield self._chunk(lines, line_nos)
                lines, line_nos = [], []
        if lines:
            yield self._chunk(lines, line_nos)

    def _chunk(self, lines: list[bytes], line_nos: list[int]) -> Chunk:
        numbers = np.asarray(line_nos, dtype=np.int64)
        try:
            return self._fast(lines, numbers)
        except (SlowPath, pa.ArrowException):
            pass  # let the exact line-by-line parser find and explain the problem
        records = [self._check_keys(self._decode(line, n), n) for line, n in zip(lines, line_nos)]
        data = {c: [r.get(c) for r in records] for c in self.columns}
        frame = pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in data.items()})
        return Chunk(frame, numbers)

    def _fast(self, lines: list[bytes], numbers: np.ndarray) -> Chunk:
        import pyarrow.json as pj

        data = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
        table = pj.read_json(io.BytesIO(data), read_options=pj.ReadOptions(block_size=max(1 << 20, len(data) + 1)))
        if table.num_rows != len(lines) or self._late_columns(table.column_names):
            raise SlowPath
        keys = None
        if self.prefix_column is not None and self.prefix_column in table.column_names:
            col = table.column(self.prefix_column).combine_chunks()
            keys = arrow_key_lists(col, self._where, numbers, "line", strict=False)
            table = table.drop_columns([self.prefix_column])
        keep = [c for c in self.columns if c in table.column_names]
        frame = table.select(keep).to_pandas()
        for c in self.columns:  # columns absent from every line of this chunk
            if c not in frame.columns and c != self.prefix_column:
                frame[c] = pd.Series([None] * len(frame), dtype=object)
        return Chunk(frame, numbers, keys)
