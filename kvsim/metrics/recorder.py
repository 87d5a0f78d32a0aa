"""Append-only step rows, kept as typed column buffers and flushed to parquet in chunks.

Rows are engine steps (``idle = false``; ``num_steps`` > 1 for a run of decode steps the fast engine
advanced at once) or idle gaps (``idle = true``, the engine waiting for an arrival), so that
time-weighted summaries cover the whole simulated span. Memory components are the state each step
runs in (right after scheduling); on a multi-step row they, ``running_mean`` and
``batch_size_mean`` are time-weighted means over the row's steps, and ``running`` / ``batch_size``
are maxima.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvsim.kv.base import KVUsage

STEP_COLUMNS: dict[str, str] = {
    # name -> numpy dtype; order is the file's column order
    "step": "int64",
    "replica": "int64",
    "idle": "bool",
    "start_s": "float64",
    "duration_s": "float64",
    "num_steps": "int64",
    "batch_size": "int64",
    "prefill_tokens": "int64",
    "decode_tokens": "int64",
    "running": "int64",
    "running_mean": "float64",
    "batch_size_mean": "float64",
    "waiting": "int64",
    "admitted": "int64",
    "preempted": "int64",
    "finished": "int64",
    "token_states_bytes": "float64",
    "reservation_bytes": "float64",
    "internal_frag_bytes": "float64",
    "external_frag_bytes": "float64",
    "free_bytes": "float64",
    "cached_free_bytes": "float64",
    "peak_used_bytes": "int64",
    "unshared_bytes": "float64",
    "evictions": "int64",
    "swap_in_bytes": "int64",
    "swap_out_bytes": "int64",
    "kv_bytes_read": "int64",
    "weights_read_s": "float64",
    "kv_read_s": "float64",
    "linear_compute_s": "float64",
    "attention_compute_s": "float64",
    "attention_s": "float64",
    "overhead_s": "float64",
    "swap_s": "float64",
    "compute_s": "float64",
    "decode_attention_s": "float64",
    "prefill_attention_s": "float64",
    "gemm_s": "float64",
    "lm_head_s": "float64",
    "elementwise_s": "float64",
}
BREAKDOWN_COLUMNS = [
    "weights_read_s", "kv_read_s", "linear_compute_s", "attention_compute_s", "attention_s",
    "overhead_s", "swap_s", "compute_s", "decode_attention_s", "prefill_attention_s", "gemm_s", "lm_head_s",
    "elementwise_s",
]


class StepRecorder:
    """Buffers rows column-wise; ``flush_every`` rows go to a parquet row group (bounded memory)."""

    def __init__(self, bytes_per_token: int, path: Path | None = None, flush_every: int = 65536):
        self.bytes_per_token = bytes_per_token
        self.path = path
        self.flush_every = flush_every
        self._cols: dict[str, list] = {name: [] for name in STEP_COLUMNS}
        self._writer: pq.ParquetWriter | None = None
        self._chunks: list[pa.Table] = []  # only used when path is None (in-memory runs)
        self.num_rows = 0
        self.schema = pa.schema([(n, pa.from_numpy_dtype(np.dtype(t))) for n, t in STEP_COLUMNS.items()])

    def row(self, *, idle: bool, start_s: float, duration_s: float, batch_size: int, prefill_tokens: int,
            decode_tokens: int, running: int, waiting: int, admitted: int, preempted: int, finished: int,
            usage: KVUsage, kv_bytes_read: int, breakdown: dict[str, float], num_steps: int = 1,
            evictions: int = 0, swap_in_bytes: int = 0, swap_out_bytes: int = 0, replica: int = 0) -> None:
        c = self._cols
        bpt = self.bytes_per_token
        c["step"].append(self.num_rows)
        c["replica"].append(replica)
        c["idle"].append(idle)
        c["start_s"].append(start_s)
        c["duration_s"].append(duration_s)
        c["num_steps"].append(0 if idle else num_steps)
        c["batch_size"].append(batch_size)
        c["prefill_tokens"].append(prefill_tokens)
        c["decode_tokens"].append(decode_tokens)
        c["running"].append(running)
        c["running_mean"].append(float(running))
        c["batch_size_mean"].append(float(batch_size))
        c["waiting"].append(waiting)
        c["admitted"].append(admitted)
        c["preempted"].append(preempted)
        c["finished"].append(finished)
        c["token_states_bytes"].append(usage.token_states_tokens * bpt)
        c["reservation_bytes"].append(usage.reservation_tokens * bpt)
        c["internal_frag_bytes"].append(usage.internal_frag_tokens * bpt)
        c["external_frag_bytes"].append(usage.external_frag_tokens * bpt)
        c["free_bytes"].append(usage.free_tokens * bpt)
        c["cached_free_bytes"].append(usage.cached_free_tokens * bpt)
        c["peak_used_bytes"].append(usage.used_tokens * bpt)
        c["unshared_bytes"].append(usage.unshared_tokens * bpt)
        c["evictions"].append(evictions)
        c["swap_in_bytes"].append(swap_in_bytes)
        c["swap_out_bytes"].append(swap_out_bytes)
        c["kv_bytes_read"].append(kv_bytes_read)
        for k in BREAKDOWN_COLUMNS:
            c[k].append(breakdown.get(k, 0.0))
        self.num_rows += 1
        if len(c["step"]) >= self.flush_every:
            self._flush()

    def macro_row(self, *, start_s: float, duration_s: float, num_steps: int, max_batch: int,
                  batch_mean: float, decode_tokens: int, waiting: int, finished: int,
                  parts_mean_tokens: dict[str, float], kv_bytes_read: int, breakdown: dict[str, float],
                  evictions: int, replica: int = 0) -> None:
        """One row standing for ``num_steps`` decode-only steps (means are time-weighted)."""
        c = self._cols
        bpt = self.bytes_per_token
        c["step"].append(self.num_rows)
        c["replica"].append(replica)
        c["idle"].append(False)
        c["start_s"].append(start_s)
        c["duration_s"].append(duration_s)
        c["num_steps"].append(num_steps)
        c["batch_size"].append(max_batch)
        c["prefill_tokens"].append(0)
        c["decode_tokens"].append(decode_tokens)
        c["running"].append(max_batch)
        c["running_mean"].append(batch_mean)
        c["batch_size_mean"].append(batch_mean)
        c["waiting"].append(waiting)
        c["admitted"].append(0)
        c["preempted"].append(0)
        c["finished"].append(finished)
        for part in ("token_states", "reservation", "internal_frag", "external_frag", "free", "cached_free"):
            c[f"{part}_bytes"].append(parts_mean_tokens[part] * bpt)
        c["peak_used_bytes"].append(int(parts_mean_tokens["peak_used"]) * bpt)
        c["unshared_bytes"].append(parts_mean_tokens["unshared"] * bpt)
        c["evictions"].append(evictions)
        c["swap_in_bytes"].append(0)
        c["swap_out_bytes"].append(0)
        c["kv_bytes_read"].append(kv_bytes_read)
        for k in BREAKDOWN_COLUMNS:
            c[k].append(breakdown.get(k, 0.0))
        self.num_rows += 1
        if len(c["step"]) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        if not self._cols["step"]:
            return
        table = pa.table(
            {n: pa.array(np.asarray(v, dtype=STEP_COLUMNS[n])) for n, v in self._cols.items()},
            schema=self.schema,
        )
        for v in self._cols.values():
            v.clear()
        if self.path is None:
            self._chunks.append(table)
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(str(self.path), self.schema)
        self._writer.write_table(table)

    def close(self) -> pa.Table | None:
        """Flush and close; returns the whole table for in-memory runs, else None."""
        self._flush()
        if self.path is None:
            return pa.concat_tables(self._chunks) if self._chunks else self.schema.empty_table()
        if self._writer is None:
            self._writer = pq.ParquetWriter(str(self.path), self.schema)
        self._writer.close()
        return None
