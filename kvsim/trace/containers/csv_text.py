"""CSV container: a header line, then one request per line (blank lines are skipped)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator

import numpy as np
import pandas as pd

from kvsim.errors import TraceError
from kvsim.trace.containers.base import Chunk, Container, refuse_duplicate_columns
from kvsim.trace.fileio import TEXT_FORMATS, LineReader, OpenTrace

_PANDAS_FIELDS_RE = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


class CsvContainer(Container):
    """Comma-separated text with a header line; parsed ``chunk_rows`` lines at a time by pandas.
    ``text_columns`` stay strings (dates, space-separated key lists)."""

    name = "csv"

    def __init__(self, opened: OpenTrace, where: str, chunk_rows: int, text_columns: tuple[str, ...]):
        super().__init__(where, chunk_rows)
        self._lines = LineReader(opened.stream, opened.path)
        header = self._lines.readline()
        if not header.strip():
            raise TraceError(f"{where}: line 1: the file is empty (expected a CSV header line)")
        try:
            row = next(csv.reader([header.decode("utf-8-sig")]))
        except UnicodeDecodeError as exc:
            raise TraceError(f"{where}: line 1: not UTF-8 text (byte {exc.start}: {exc.reason}), so not a "
                             f"text trace ({TEXT_FORMATS})") from None
        except csv.Error as exc:
            raise TraceError(f"{where}: line 1: cannot read the CSV header: {exc}") from None
        self.columns = [c.strip() for c in row]
        refuse_duplicate_columns(self.columns, where, "line 1")
        self.metadata = {}
        self._text_columns = [c for c in text_columns if c in self.columns]

    def chunks(self) -> Iterator[Chunk]:
        buf: list[bytes] = []
        first_line = 2
        for line in self._lines:
            buf.append(line)
            if len(buf) >= self.chunk_rows:
                yield self._parse(buf, first_line)
                first_line += len(buf)
                buf = []
        if buf:
            yield self._parse(buf, first_line)

    def _field_count_error(self, line: int, found: int) -> TraceError:
        return TraceError(
            f"{self._where}: line {line}: expected {len(self.columns)} comma-separated "
            f"fields (as in the header), found {found}"
        )

    def _check_first_row(self, buf: list[bytes], first_line: int) -> None:
        """pandas checks every row's field count against the chunk's first row, but an over-long
        first row itself it truncates (with a warning, or silently for a trailing comma): check it
        here, with the same message."""
        offset, line = next(((i, b) for i, b in enumerate(buf) if b.strip()), (0, b""))
        fields = next(csv.reader([line.decode("utf-8", "replace")], skipinitialspace=True), [])
        if len(fields) > len(self.columns):
            raise self._field_count_error(first_line + offset, len(fields))

    def _parse(self, buf: list[bytes], first_line: int) -> Chunk:
        self._check_first_row(buf, first_line)
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
                raise self._field_count_error(first_line + int(m.group(2)) - 1, int(m.group(3))) from None
            raise TraceError(f"{self._where}: lines {first_line}-{first_line + len(buf) - 1}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise TraceError(f"{self._where}: near line {first_line}: not UTF-8 text ({exc.reason})") from None
        lines = np.arange(first_line, first_line + len(frame), dtype=np.int64)
        blank = frame.isna().all(axis=1).to_numpy()
        if blank.any():  # blank lines are allowed and skipped
            frame = frame.loc[~blank].reset_index(drop=True)
            lines = lines[~blank]
        return Chunk(frame, lines)
