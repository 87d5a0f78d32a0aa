"""Write a Trace in kvsim's generic schema (CSV, JSON lines or parquet; CSV/JSONL may be .gz).

Columns, in this order (optional ones only when the trace has them):

``arrival_s, prompt_tokens, output_tokens[, prefix_block_tokens, prefix_keys][, session_id]
[, priority][, num_samples]``

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
import io
import json
from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.trace.schema import Trace

CHUNK_ROWS = 100_000
CONTAINERS = ("csv", "jsonl", "parquet")


def container_of(path: Path) -> tuple[str, bool]:
    """(container, gzip?) from the file name: ``.csv``, ``.jsonl`` (``.json``), ``.parquet``, + ``.gz``."""
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
    cols += [c for c in ("session_id", "priority", "num_samples") if getattr(trace, c) is not None]
    return cols


def _open_text(path: Path, gz: bool):
    raw = open(path, "wb")
    if gz:
        return io.TextIOWrapper(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6),
                                encoding="utf-8", newline="\n"), raw
    return io.TextIOWrapper(raw, encoding="utf-8", newline="\n"), None


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` to ``path`` in the generic schema; the container follows the extension."""
    path = Path(path)
    container, gz = container_of(path)
    if not path.parent.exists():
        raise TraceError(f"{path}: the output folder {path.parent} does not exist")
    try:
        if container == "parquet":
            _write_parquet(trace, path)
        else:
            text, raw = _open_text(path, gz)
            try:
                (_write_csv if container == "csv" else _write_jsonl)(trace, text)
            finally:
                text.close()
                if raw is not None:
                    raw.close()
    except OSError as exc:
        raise TraceError(f"{path}: cannot write the trace: {exc.strerror or exc}") from None
    return path


def _float_text(values: np.ndarray) -> list[str]:
    return [repr(v) for v in values.tolist()]  # shortest round-trip representation


def _write_csv(trace: Trace, out) -> None:
    cols = _columns(trace)
    out.write(",".join(cols) + "\n")
    n = len(trace)
    for lo in range(0, n, CHUNK_ROWS):
        hi = min(n, lo + CHUNK_ROWS)
        fields = [_float_text(trace.arrival_s[lo:hi]),
                  trace.prompt_tokens[lo:hi].astype(str).tolist(),
                  trace.output_tokens[lo:hi].astype(str).tolist()]
        if trace.prefix_keys is not None:
            fields.append([str(trace.prefix_block_tokens)] * (hi - lo))
            fields.append([" ".join(map(str, k.tolist())) for k in trace.prefix_keys[lo:hi]])
        for c in ("session_id", "priority", "num_samples"):
            col = getattr(trace, c)
            if col is not None:
                fields.append(col[lo:hi].astype(str).tolist())
        out.write("".join(",".join(row) + "\n" for row in zip(*fields)))


def _write_jsonl(trace: Trace, out) -> None:
    cols = _columns(trace)
    n = len(trace)
    for lo in range(0, n, CHUNK_ROWS):
        hi = min(n, lo + CHUNK_ROWS)
        fields = [_float_text(trace.arrival_s[lo:hi]),
                  trace.prompt_tokens[lo:hi].astype(str).tolist(),
                  trace.output_tokens[lo:hi].astype(str).tolist()]
        if trace.prefix_keys is not None:
            fields.append([str(trace.prefix_block_tokens)] * (hi - lo))
            fields.append(["[" + ", ".join(map(str, k.tolist())) + "]" for k in trace.prefix_keys[lo:hi]])
        for c in ("session_id", "priority", "num_samples"):
            col = getattr(trace, c)
            if col is not None:
                fields.append(col[lo:hi].astype(str).tolist())
        names = [json.dumps(c) + ": " for c in cols]
        out.write("".join(
            "{" + ", ".join(name + value for name, value in zip(names, row)) + "}\n" for row in zip(*fields)
        ))


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
        lengths = np.fromiter((k.shape[0] for k in trace.prefix_keys), np.int64, len(trace))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.concatenate([np.asarray(k, np.int64) for k in trace.prefix_keys]) if len(trace) else np.zeros(0, np.int64)
        arrays["prefix_block_tokens"] = pa.array(np.full(len(trace), trace.prefix_block_tokens, np.int64))
        arrays["prefix_keys"] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int64()))
        metadata["kvsim.prefix_block_tokens"] = str(int(trace.prefix_block_tokens))
    for c in ("session_id", "priority", "num_samples"):
        col = getattr(trace, c)
        if col is not None:
            arrays[c] = pa.array(col, pa.int64())
    try:
        metadata["kvsim.source"] = json.dumps(trace.source, sort_keys=True, default=str)
    except (TypeError, ValueError):
        pass
    table = pa.table(arrays).replace_schema_metadata(metadata)
    pq.write_table(table, path, compression="zstd", row_group_size=1 << 20)
