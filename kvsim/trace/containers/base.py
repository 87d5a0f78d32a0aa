"""What every container reader provides: the column names and a stream of parsed chunks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import pandas as pd

from kvsim.errors import TraceError


@dataclass(frozen=True)
class Chunk:
    """Up to ``chunk_rows`` requests of a file, parsed but not yet validated."""

    frame: pd.DataFrame
    lines: np.ndarray  # int64, 1-based line (text) or row (parquet) number of each frame row
    keys: list[np.ndarray] | None = None  # prefix key lists already decoded (arrow-backed containers)


class Container:
    """A container reader: ``columns`` (in file order), ``metadata`` and ``chunks()``.

    ``prefix_column`` is set by the loader once the format is known: a container that can decode
    that column's key lists natively (arrow) returns them in :attr:`Chunk.keys` and drops the
    column from the frame; the others leave it in the frame for :func:`kvsim.trace.coerce.key_lists`.
    ``known_columns`` (also set by the loader) are the columns the format reads: a container whose
    rows may each have their own keys (JSON lines) refuses one that is not in ``columns``.
    """

    name: ClassVar[Literal["csv", "jsonl", "parquet"]]
    row_label: ClassVar[Literal["line", "row"]] = "line"
    columns: list[str]
    metadata: dict[str, str]
    prefix_column: str | None = None
    known_columns: frozenset[str] = frozenset()

    def __init__(self, where: str, chunk_rows: int):
        self._where = where
        self.chunk_rows = chunk_rows

    def chunks(self) -> Iterator[Chunk]:  # pragma: no cover - interface
        raise NotImplementedError


def refuse_duplicate_columns(columns: list[str], where: str, at: str) -> None:
    """One TraceError if a column name repeats (CSV header, parquet schema); ``at`` says where."""
    dupes = sorted({c for c in columns if columns.count(c) > 1})
    if dupes:
        raise TraceError(f"{where}: {at}: duplicate column name(s) {', '.join(repr(c) for c in dupes)}; "
                         f"each column may appear once")
