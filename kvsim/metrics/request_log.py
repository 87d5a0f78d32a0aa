"""The append-only store of request results: one row per request, written when it ends.

The scheduler calls :meth:`RequestLog.append` from the one place a request finishes
(``Scheduler._finish``) and the one place it is rejected (``Scheduler.add_request``), then drops the
:class:`~kvsim.sched.request.Request`. A row costs about 160 bytes in typed numpy columns, where a
live Request (with its allocator view) costs about 500, so a million-request run no longer holds a
million Request objects until its end (bench/README.md, "Session 4: 1M requests").

Appended requests wait in a small buffer (they no longer change) and every :data:`FLUSH_ROWS`
rows move into typed column chunks, one C-level pass over the buffer per column. :func:`kvsim.metrics.requests.requests_table` turns the log
into the request table (sorted by ``request_id``; docs/metrics.md defines the columns).
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from kvsim.sched.request import RequestStatus

# column -> (Request attribute, dtype), in the table's column order (before the string columns)
NUMERIC_COLUMNS: dict[str, tuple[str, type]] = {
    "request_id": ("request_id", np.int64),
    "arrival_s": ("arrival_s", np.float64),
    "admitted_s": ("admitted_s", np.float64),
    "first_token_s": ("first_token_s", np.float64),
    "finish_s": ("finish_s", np.float64),
    "prompt_tokens": ("prompt_tokens", np.int64),
    "output_tokens": ("output_tokens", np.int64),
    "preemptions": ("num_preemptions", np.int64),
    "recomputed_tokens": ("recomputed_tokens", np.int64),
    "swaps": ("num_swaps", np.int64),
    "cached_tokens": ("cached_tokens", np.int64),
    "cpu_hit_tokens": ("cpu_hit_tokens", np.int64),
    "ssd_hit_tokens": ("ssd_hit_tokens", np.int64),
    "remote_hit_tokens": ("remote_hit_tokens", np.int64),
    "transfer_s": ("load_s", np.float64),
    "transfer_hidden_s": ("hidden_s", np.float64),
    "priority": ("priority", np.int64),
    "num_samples": ("num_samples", np.int64),
    "replica": ("replica", np.int64),
}

# The ``status`` column's value for each end state (a run stopped early leaves requests queued).
STATUS_NAMES = {RequestStatus.FINISHED: "finished", RequestStatus.REJECTED: "rejected",
                RequestStatus.WAITING: "unfinished", RequestStatus.RUNNING: "unfinished",
                RequestStatus.SWAPPED: "unfinished"}

FLUSH_ROWS = 4096  # requests buffered before their rows move into typed column chunks

_GETTERS = tuple((attrgetter(attr), dtype) for attr, dtype in NUMERIC_COLUMNS.values())
_STATUS = attrgetter("status")
_REASON = attrgetter("reject_reason")
_NUM = len(NUMERIC_COLUMNS)
_FINISHED, _REJECTED = int(RequestStatus.FINISHED), int(RequestStatus.REJECTED)


class RequestLog:
    """Append-only columnar store of request rows (owned by the metrics side; the scheduler only
    appends). Several schedulers (replicas) may share one log. Rows keep their append order;
    :meth:`columns` hands them over, and :func:`~kvsim.metrics.requests.requests_table` sorts them."""

    __slots__ = ("_buf", "_chunks", "_status_chunks", "_reason_chunks", "_reasons", "_rows",
                 "_finished", "_rejected")

    def __init__(self) -> None:
        self._buf: list = []  # requests whose rows are not in the chunks yet
        self._chunks: list[list[np.ndarray]] = [[] for _ in range(_NUM)]
        self._status_chunks: list[np.ndarray] = []
        self._reason_chunks: list[np.ndarray] = []
        self._reasons: dict[str, int] = {"": 0}  # reject_reason -> code
        self._rows = 0  # rows already in chunks
        self._finished = 0  # of which finished / rejected
        self._rejected = 0

    def __len__(self) -> int:
        return self._rows + len(self._buf)

    @property
    def num_finished(self) -> int:
        return self._finished + sum(r.status == _FINISHED for r in self._buf)

    @property
    def num_rejected(self) -> int:
        return self._rejected + sum(r.status == _REJECTED for r in self._buf)

    def append(self, req) -> None:
        """Record ``req``, which has ended (finished or rejected; or, at the end of a run, is left
        unfinished): its fields must not change any more. The caller drops it."""
        buf = self._buf
        buf.append(req)
        if len(buf) >= FLUSH_ROWS:
            self._flush()

    def extend(self, reqs) -> None:
        for r in reqs:
            self.append(r)

    def _flush(self) -> None:
        buf = self._buf
        if not buf:
            return
        self._buf = []
        n = len(buf)
        for chunks, (get, dtype) in zip(self._chunks, _GETTERS):
            chunks.append(np.fromiter(map(get, buf), dtype=dtype, count=n))
        status = np.fromiter(map(_STATUS, buf), dtype=np.int8, count=n)
        self._status_chunks.append(status)
        self._finished += int(np.count_nonzero(status == _FINISHED))
        self._rejected += int(np.count_nonzero(status == _REJECTED))
        codes = self._reasons
        self._reason_chunks.append(np.fromiter((codes.setdefault(s, len(codes)) for s in map(_REASON, buf)),
                                               dtype=np.int32, count=n))
        self._rows += n

    def column(self, name: str) -> np.ndarray:
        """A copy of one numeric column in append order (for checks; the log keeps its rows)."""
        self._flush()
        i = list(NUMERIC_COLUMNS).index(name)
        dtype = NUMERIC_COLUMNS[name][1]
        return np.concatenate(self._chunks[i]) if self._chunks[i] else np.empty(0, dtype=dtype)

    def columns(self):
        """Hand the rows over and empty the log: ``(name, array)`` for each numeric column, then
        ``("status", names)`` and ``("reject_reason", names)`` as object arrays of str, in append
        order. Each column's chunks are released as it is yielded."""
        self._flush()
        chunks, self._chunks = self._chunks, [[] for _ in range(_NUM)]
        for i, (name, (_, dtype)) in enumerate(NUMERIC_COLUMNS.items()):
            parts = chunks[i]
            chunks[i] = None
            yield name, np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
            del parts
        status_names = np.empty(max(int(s) for s in RequestStatus) + 1, dtype=object)
        for s in RequestStatus:
            status_names[int(s)] = STATUS_NAMES[s]
        status, self._status_chunks = self._status_chunks, []
        yield "status", _decode(status, status_names)
        reasons = np.empty(len(self._reasons), dtype=object)
        for s, code in self._reasons.items():
            reasons[code] = s
        parts, self._reason_chunks = self._reason_chunks, []
        yield "reject_reason", _decode(parts, reasons)
        self._rows = self._finished = self._rejected = 0


def _decode(chunks: list[np.ndarray], names: np.ndarray) -> np.ndarray:
    """Code chunks -> one object array of the names (the str objects are shared, not copied)."""
    if not chunks:
        return np.empty(0, dtype=object)
    return names[np.concatenate(chunks)]
