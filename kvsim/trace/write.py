"""Write a Trace in kvsim's generic schema (CSV, JSON lines or parquet; CSV/JSONL may be .gz).

Columns, in this order (optional ones only when the trace has them):

``arrival_s, prompt_tokens, output_tokens[, prefix_block_tokens, prefix_keys][, session_id]
[, priority][, num_samples][, beam]``

* floats are written with Python's shortest round-trip repr, so loading the file back gives
  bit-identical arrays;
* ``prefix_keys`` is a JSON array (JSONL), a space-separated string (CSV) or ``list<int64>``
  (parquet); ``prefix_block_tokens`` is a column in every container and, in parquet, also the
  schema metadata key ``kvsim.prefix_block_tokens``;
* gzip output uses mtime 0 and no file name, so equal traces give byte-identical files.

Writing streams in chunks of rows, so memory stays proportional to one chunk plus the trace.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.trace.arrays import flatten
from kvsim.trace.schema import Trace

TRACE_WRITER = "trace"  # who wrote a trace file, in an output directory's marker (kvsim.outdir.writer_of)

CHUNK_ROWS = 100_000
CONTAINERS = ("csv", "jsonl", "parquet")


def container_of(path: Path) -> tuple[str, bool]:
    """(container, gzip?) from the file name: ``.csv``, ``.jsonl`` (also ``.json``, ``.ndjson``: JSON lines,
    not a JSON array), ``.parquet`` (``.pq``), + ``.gz`` for text."""
    suffixes = [s.lower() for s in path.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    ext = suffixes[-2] if gz and len(suffixes) > 1 else (suffixes[-1] if suffixes and not gz else "")
    mapping = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
    if ext not in mapping:
        raise TraceError(
            f"{path}: cannot tell the output format from the file name; use .csv, .jsonl or .parquet "
            f"(.csv.gz and .jsonl.gz for compressed text)"
        )
    container = mapping[ext]
    if container == "parquet" and gz:
        raise TraceError(f"{path}: parquet is compressed internally; name the file .parquet, not .parquet.gz")
    return container, gz


def _columns(trace: Trace) -> list[str]:
    cols = ["arrival_s", "prompt_tokens", "output_tokens"]
    if trace.prefix_keys is not None:
        cols += ["prefix_block_tokens", "prefix_keys"]
    cols += [c for c in ("session_id", "priority", "num_samples", "beam") if getattr(trace, c) is not None]
    return cols


def _open_binary(path: Path, gz: bool):
    raw = open(path, "wb")
    if gz:
        return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6), raw
    return raw, None


def write_trace(trace: Trace, path: str | Path, *, force: bool = False) -> Path:
    """Write ``trace`` to ``path`` in the generic schema; the container follows the extension.

    An existing file is replaced only if a kvsim trace command wrote it (the marker of its folder says
    so: kvsim.outdir.writer_of) or with ``force``; the file is written under a temporary name and
    renamed into place (kvsim.outdir)."""
    from kvsim.outdir import check_out_file, write_file_atomic

    path = Path(path)
    container, gz = container_of(path)
    if not path.parent.exists():
        raise TraceError(f"{path}: the output folder {path.parent} does not exist")
    check_out_file(path, command=TRACE_WRITER, force=force, flag="OUT")
    try:
        write_file_atomic(path, lambda tmp: _write(trace, tmp, container, gz), command=TRACE_WRITER, force=force,
                          flag="OUT")
    except OSError as exc:
        raise TraceError(f"{path}: cannot write the trace: {exc.strerror or exc}") from None
    return path


def _write(trace: Trace, path: Path, container: str, gz: bool) -> None:
    if container == "parquet":
        _write_parquet(trace, path)
    else:
        out, raw = _open_binary(path, gz)
        try:
            if container == "csv":
                out.write((",".join(_columns(trace)) + "\n").encode())
            for lo in range(0, len(trace), CHUNK_ROWS):
                out.write(_text_rows(trace, lo, min(len(trace), lo + CHUNK_ROWS), container))
        finally:
            out.close()
            if raw is not None:
                raw.close()


def _key_list_array(keys: list[np.ndarray]):
    import pyarrow as pa

    flat, lengths = flatten(keys)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int64()))


def _text_rows(trace: Trace, lo: int, hi: int, container: str) -> bytes:
    """Rows ``[lo, hi)`` as CSV or JSON-lines bytes, formatted by arrow in C++.

    Arrow prints float64 with the shortest representation that parses back to the same value
    (checked by the round-trip tests), e.g. ``0.25``, ``3``, ``1e-07``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    def text(values: np.ndarray):
        return pc.cast(pa.array(values), pa.string())

    fields = [text(trace.arrival_s[lo:hi]), text(trace.prompt_tokens[lo:hi]), text(trace.output_tokens[lo:hi])]
    if trace.prefix_keys is not None:
        fields.append(pa.scalar(str(int(trace.prefix_block_tokens))))
        keys = pc.cast(_key_list_array(trace.prefix_keys[lo:hi]), pa.large_list(pa.string()))
        sep = " " if container == "csv" else ", "
        joined = pc.binary_join(keys, sep)
        fields.append(joined if container == "csv" else pc.binary_join_element_wise("[", joined, "]", ""))
    for c in ("session_id", "priority", "num_samples", "beam"):
        col = getattr(trace, c)
        if col is not None:
            fields.append(text(col[lo:hi]))
    if container == "csv":
        pieces = []
        for f in fields:
            pieces += [f, ","]
        pieces[-1] = "\n"
    else:
        pieces = []
        for name, f in zip(_columns(trace), fields):
            pieces += [(", " if pieces else "{") + json.dumps(name) + ": ", f]
        pieces.append("}\n")
    lines = pc.binary_join_element_wise(*pieces, "")
    lines = lines.cast(pa.large_string()) if not pa.types.is_large_string(lines.type) else lines
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset: lines.offset + len(lines) + 1]
    return bytes(memoryview(lines.buffers()[2])[offsets[0]:offsets[-1]])


def _write_parquet(trace: Trace, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = {
        "arrival_s": pa.array(trace.arrival_s, pa.float64()),
        "prompt_tokens": pa.array(trace.prompt_tokens, pa.int64()),
        "output_tokens": pa.array(trace.output_tokens, pa.int64()),
    }
    metadata = {}
    if trace.prefix_keys is not None:
        arrays["prefix_block_tokens"] = pa.array(np.full(len(trace), trace.prefix_block_tokens, np.int64))
        arrays["prefix_keys"] = _key_list_array(trace.prefix_keys)
        metadata["kvsim.prefix_block_tokens"] = str(int(trace.prefix_block_tokens))
    for c in ("session_id", "priority", "num_samples", "beam"):
        col = getattr(trace, c)
        if col is not None:
            arrays[c] = pa.array(col, pa.int64())
    try:
        metadata["kvsim.source"] = json.dumps(trace.source, sort_keys=True, default=str)
    except (TypeError, ValueError):
        pass
    table = pa.table(arrays).replace_schema_metadata(metadata)
    pq.write_table(table, path, compression="zstd", row_group_size=1 << 20)
