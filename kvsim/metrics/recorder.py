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
from typing import TYPE_CHECKING

import numpy as np

from kvsim.kv.base import MemoryParts
from kvsim.metrics.itl import ITLAccumulator
from kvsim.timing.base import RECORDED_BREAKDOWN, check_breakdown

if TYPE_CHECKING:  # pyarrow is imported where used (import cost: tests/test_import_cost.py)
    import pyarrow as pa
    import pyarrow.parquet as pq
    from kvsim.models.geometry import KVGeometry
    from collections.abc import Iterator

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
    "kv_pages_read": "int64",
    # the timing breakdown, one float64 column per name the timing boundary records
    **dict.fromkeys(RECORDED_BREAKDOWN, "float64"),
}
BREAKDOWN_COLUMNS = list(RECORDED_BREAKDOWN)  # last in STEP_COLUMNS: rows are built in this order
_ZEROS = [0] * len(BREAKDOWN_COLUMNS)  # the default of each breakdown column


class StepRecorder:
    """Buffers rows; every ``flush_every`` rows become a parquet row group (bounded memory).

    A row is kept as a tuple in ``STEP_COLUMNS`` order until the flush turns the buffer into typed
    columns: one tuple per row is the cheapest thing to build while the engine runs."""

    def __init__(self, kv: KVGeometry, path: Path | None = None, flush_every: int = 32768):
        import pyarrow as pa

        self.kv = kv  # the run's KV geometry: its bytes_per_token turns token counts into memory bytes
        self._bytes_per_token = kv.bytes_per_token  # bound for the row builder (hot)
        self.path = path
        self.flush_every = flush_every
        self._rows: list[tuple] = []
        self._writer: pq.ParquetWriter | None = None
        self._chunks: list[pa.Table] = []  # only used when path is None (in-memory runs)
        self.num_rows = 0
        self.schema = pa.schema([(n, pa.from_numpy_dtype(np.dtype(t))) for n, t in STEP_COLUMNS.items()])
        self.itl = ITLAccumulator()  # decode tokens' inter-token latencies (kvsim/metrics/itl.py)

    def _push(self, row: tuple) -> None:
        self._rows.append(row)
        self.num_rows += 1
        if len(self._rows) >= self.flush_every:
            self._flush()

    @staticmethod
    def _breakdown(breakdown: dict[str, float]) -> Iterator[float]:
        """The breakdown columns in order (0 for parts a timing model lacks); a name the timing
        boundary does not declare raises (kvsim.timing.base.check_breakdown)."""
        check_breakdown(breakdown)
        return map(breakdown.get, BREAKDOWN_COLUMNS, _ZEROS)  # breakdown.get(k, 0) per column, in order

    def row(self, *, replica: int, idle: bool, start_s: float, duration_s: float, memory: MemoryParts,
            num_steps: int = 1, batch_size: int = 0, batch_mean: float | None = None, running: int = 0,
            running_mean: float | None = None, prefill_tokens: int = 0, decode_tokens: int = 0, waiting: int = 0,
            admitted: int = 0, preempted: int = 0, finished: int = 0, evictions: int = 0, swap_in_bytes: int = 0,
            swap_out_bytes: int = 0, kv_bytes_read: int = 0, kv_pages_read: int = 0,
            breakdown: dict[str, float] | None = None, step_durations_s: np.ndarray | None = None,
            step_decode_tokens: np.ndarray | None = None) -> None:
        """THE row builder: one engine step, ``num_steps`` steps advanced at once (``memory``,
        ``batch_mean`` and ``running_mean`` then time-weighted means over them), or with ``idle`` a
        gap. Means default to the step's own values.

        ``step_durations_s`` / ``step_decode_tokens`` (each step's duration and decode tokens of a
        multi-step row) feed the inter-token latencies exactly; without them each step counts at
        the row's mean."""
        bpt = self._bytes_per_token
        if not idle:
            if step_durations_s is not None and step_decode_tokens is not None:
                self.itl.add_many(step_durations_s, step_decode_tokens)
            elif decode_tokens:
                self.itl.add(duration_s if num_steps == 1 else duration_s / num_steps, decode_tokens)
        m = memory
        self._push((
            self.num_rows, replica, idle, start_s, duration_s, 0 if idle else num_steps, batch_size,
            prefill_tokens, decode_tokens, running, float(running) if running_mean is None else running_mean,
            float(batch_size) if batch_mean is None else batch_mean, waiting, admitted, preempted, finished,
            m.token_states * bpt, m.reservation * bpt, m.internal_frag * bpt, m.external_frag * bpt, m.free * bpt,
            m.cached_free * bpt, int(m.peak_used) * bpt, m.unshared * bpt, evictions, swap_in_bytes,
            swap_out_bytes, kv_bytes_read, kv_pages_read, *self._breakdown(breakdown or {}),
        ))

    def _flush(self) -> None:
        if not self._rows:
            return
        import pyarrow as pa

        columns = zip(*self._rows)
        table = pa.table(
            {n: pa.array(np.asarray(v, dtype=t)) for (n, t), v in zip(STEP_COLUMNS.items(), columns)},
            schema=self.schema,
        )
        self._rows = []
        if self.path is None:
            self._chunks.append(table)
            return
        if self._writer is None:
            import pyarrow.parquet as pq  # only runs that stream rows to a file write parquet here

            self._writer = pq.ParquetWriter(str(self.path), self.schema)
        self._writer.write_table(table)

    def close(self) -> pa.Table | None:
        """Flush and close; returns the whole table for in-memory runs, else None."""
        import pyarrow as pa

        self._flush()
        if self.path is None:
            chunks, self._chunks = self._chunks, []  # the caller owns the rows now (no second copy here)
            return pa.concat_tables(chunks) if chunks else self.schema.empty_table()
        if self._writer is None:
            import pyarrow.parquet as pq

            self._writer = pq.ParquetWriter(str(self.path), self.schema)
        self._writer.close()
        return None
