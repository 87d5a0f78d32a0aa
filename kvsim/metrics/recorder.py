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

    def _append(self, values: dict) -> None:
        """Append one row; columns not in ``values`` (breakdown parts a model lacks) get 0."""
        c = self._cols
        c["step"].append(self.num_rows)
        for name in STEP_COLUMNS:
            if name != "step":
                c[name].append(values.get(name, 0))
        self.num_rows += 1
        if len(c["step"]) >= self.flush_every:
            self._flush()

    def row(self, *, idle: bool, start_s: float, duration_s: float, batch_size: int, prefill_tokens: int,
            decode_tokens: int, running: int, waiting: int, admitted: int, preempted: int, finished: int,
            usage: KVUsage, kv_bytes_read: int, breakdown: dict[str, float], num_steps: int = 1,
            evictions: int = 0, swap_in_bytes: int = 0, swap_out_bytes: int = 0, replica: int = 0) -> None:
        """One engine step (or, with ``idle``, a gap) in the state ``usage`` describes."""
        bpt = self.bytes_per_token
        self._append({
            **{k: breakdown[k] for k in BREAKDOWN_COLUMNS if k in breakdown},
            "replica": replica, "idle": idle, "start_s": start_s, "duration_s": duration_s,
            "num_steps": 0 if idle else num_steps, "batch_size": batch_size, "prefill_tokens": prefill_tokens,
            "decode_tokens": decode_tokens, "running": running, "running_mean": float(running),
            "batch_size_mean": float(batch_size), "waiting": waiting, "admitted": admitted,
            "preempted": preempted, "finished": finished,
            "token_states_bytes": usage.token_states_tokens * bpt, "reservation_bytes": usage.reservation_tokens * bpt,
            "internal_frag_bytes": usage.internal_frag_tokens * bpt,
            "external_frag_bytes": usage.external_frag_tokens * bpt, "free_bytes": usage.free_tokens * bpt,
            "cached_free_bytes": usage.cached_free_tokens * bpt, "peak_used_bytes": usage.used_tokens * bpt,
            "unshared_bytes": usage.unshared_tokens * bpt, "evictions": evictions,
            "swap_in_bytes": swap_in_bytes, "swap_out_bytes": swap_out_bytes, "kv_bytes_read": kv_bytes_read,
        })

    def macro_row(self, *, start_s: float, duration_s: float, num_steps: int, max_batch: int,
                  batch_mean: float, decode_tokens: int, waiting: int, finished: int,
                  parts_mean_tokens: dict[str, float], kv_bytes_read: int, breakdown: dict[str, float],
                  evictions: int, replica: int = 0) -> None:
        """One row standing for ``num_steps`` decode-only steps (means are time-weighted)."""
        bpt = self.bytes_per_token
        self._append({
            **{k: breakdown[k] for k in BREAKDOWN_COLUMNS if k in breakdown},
            **{f"{p}_bytes": parts_mean_tokens[p] * bpt
               for p in ("token_states", "reservation", "internal_frag", "external_frag", "free", "cached_free")},
            "replica": replica, "idle": False, "start_s": start_s, "duration_s": duration_s,
            "num_steps": num_steps, "batch_size": max_batch, "decode_tokens": decode_tokens,
            "running": max_batch, "running_mean": batch_mean, "batch_size_mean": batch_mean, "waiting": waiting,
            "finished": finished, "peak_used_bytes": int(parts_mean_tokens["peak_used"]) * bpt,
            "unshared_bytes": parts_mean_tokens["unshared"] * bpt, "evictions": evictions,
            "kv_bytes_read": kv_bytes_read,
        })

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
