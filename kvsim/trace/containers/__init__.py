"""Trace *containers*: how requests are stored in a file (CSV, JSON lines, parquet).

A container reader turns bytes into :class:`~kvsim.trace.containers.base.Chunk` s -- a pandas
frame of up to ``chunk_rows`` requests plus each row's 1-based line (text) or row (parquet) number
-- without interpreting columns; the *format* (:mod:`kvsim.trace.formats`) says what the columns
mean and :mod:`kvsim.trace.coerce` validates them. The container is detected from the file's
bytes, never from its name, and gzip is handled below this layer (:mod:`kvsim.trace.fileio`).
"""

from __future__ import annotations

from kvsim.errors import TraceError
from kvsim.trace.containers.base import Chunk, Container
from kvsim.trace.fileio import PARQUET_MAGIC, OpenTrace
from kvsim.trace.formats import TEXT_COLUMNS

__all__ = ["Chunk", "Container", "open_container"]


def open_container(opened: OpenTrace, where: str, chunk_rows: int) -> Container:
    """The reader for an opened trace file, chosen by its first bytes."""
    head = opened.first_bytes
    if head[:4] == PARQUET_MAGIC:
        if opened.compressed:
            raise TraceError(f"{where}: a gzip-compressed parquet file is not supported; store it uncompressed")
        from kvsim.trace.containers.parquet import ParquetContainer

        return ParquetContainer(opened.path, where, chunk_rows)
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not stripped:
        raise TraceError(f"{where}: line 1: the file is empty")
    if stripped[:1] in (b"{", b"["):
        from kvsim.trace.containers.jsonl import JsonlContainer

        return JsonlContainer(opened, where, chunk_rows)
    from kvsim.trace.containers.csv_text import CsvContainer

    return CsvContainer(opened, where, chunk_rows, TEXT_COLUMNS)
