"""The one internal request record every trace loader and generator produces.

A :class:`Trace` is columnar (numpy arrays, one element per request) so that a million-request
trace costs tens of megabytes, not a million Python objects. Invariants (checked by
:meth:`Trace.validate`, which loaders call before returning):

* ``arrival_s`` is float64 seconds from the trace start, finite, ``>= 0`` and non-decreasing;
* ``prompt_tokens >= 1`` and ``output_tokens >= 1`` (int64);
* every optional column has one entry per request;
* ``prefix_keys[i]`` (when present) is a 1-D int64 array of content keys, one per
  ``prefix_block_tokens``-token block of request *i*'s prompt, chained: equal keys at position *j*
  in two requests mean their prompts agree on the whole prefix ``[0, (j+1)*prefix_block_tokens)``.
  The last block may be partial (``len == ceil(prompt_tokens / prefix_block_tokens)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# The most tokens a trace may give one request's prompt or output: ~4.3 billion, a thousand times
# the longest context windows, so no real request is refused; and small enough that int64 never
# overflows downstream: prompt + output, a sum over 2**31 requests, or a count times a KV footprint
# of up to 2**31 bytes per token all stay below 2**63. Loaders (kvsim.trace.coerce) and the
# synthetic spec (kvsim.trace.spec) both enforce it.
MAX_TOKENS = 2**32
# The most requests a synthetic spec may ask for (num_requests, or duration_s x rate_per_s).
MAX_REQUESTS = 100_000_000


@dataclass(frozen=True, eq=False)
class Trace:
    arrival_s: np.ndarray  # float64, seconds from trace start
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    # Optional per-request columns (None when the source has no such information).
    prefix_keys: list[np.ndarray] | None = None
    prefix_block_tokens: int | None = None  # block size the prefix keys describe (Mooncake: 512)
    session_id: np.ndarray | None = None  # int64
    priority: np.ndarray | None = None  # int64, larger = more important
    num_samples: np.ndarray | None = None  # int64, parallel samples n (>= 1)
    # int64 0/1: 1 = the request's num_samples are beams of a beam search (kvsim.kv.beam); absent
    # or 0 = independent parallel samples.
    beam: np.ndarray | None = None
    # Provenance: where the requests came from (file path + sha256, or generator spec).
    source: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])

    @property
    def num_requests(self) -> int:
        return len(self)

    def validate(self, where: str = "trace") -> None:
        """Raise :class:`kvsim.errors.TraceError` naming ``where`` if an invariant is broken."""
        from kvsim.errors import TraceError

        n = len(self)
        for name in ("prompt_tokens", "output_tokens"):
            col = getattr(self, name)
            if col.shape != (n,):
                raise TraceError(f"{where}: column {name} has {col.shape[0]} rows, expected {n}")
        if n and not np.all(np.isfinite(self.arrival_s)):
            row = int(np.argmin(np.isfinite(self.arrival_s)))
            raise TraceError(f"{where}: request {row}: arrival time is not a finite number")
        if n and self.arrival_s.min() < 0:
            row = int(np.argmin(self.arrival_s))
            raise TraceError(f"{where}: request {row}: negative arrival time {self.arrival_s[row]}")
        if n > 1 and np.any(np.diff(self.arrival_s) < 0):
            row = int(np.argmax(np.diff(self.arrival_s) < 0)) + 1
            raise TraceError(f"{where}: request {row}: arrival times are not sorted")
        for name in ("prompt_tokens", "output_tokens"):
            col = getattr(self, name)
            if n and col.min() < 1:
                row = int(np.argmin(col))
                raise TraceError(f"{where}: request {row}: {name} must be >= 1, got {int(col[row])}")
        for name in ("session_id", "priority", "num_samples", "beam"):
            col = getattr(self, name)
            if col is not None and col.shape != (n,):
                raise TraceError(f"{where}: column {name} has {col.shape[0]} rows, expected {n}")
        if self.num_samples is not None and n and self.num_samples.min() < 1:
            row = int(np.argmin(self.num_samples))
            raise TraceError(f"{where}: request {row}: num_samples must be >= 1")
        if self.beam is not None and n and not np.isin(self.beam, (0, 1)).all():
            row = int(np.argmax(~np.isin(self.beam, (0, 1))))
            raise TraceError(f"{where}: request {row}: beam must be 0 or 1, got {int(self.beam[row])}")
        if self.prefix_keys is not None:
            if len(self.prefix_keys) != n:
                raise TraceError(f"{where}: prefix_keys has {len(self.prefix_keys)} rows, expected {n}")
            if not self.prefix_block_tokens or self.prefix_block_tokens < 1:
                raise TraceError(f"{where}: prefix_keys given without a positive prefix_block_tokens")

    def select(self, index: np.ndarray) -> "Trace":
        """A new trace holding the requests at ``index`` (a sorted integer or boolean array)."""
        idx = np.asarray(index)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)

        def pick(col):
            return None if col is None else col[idx]

        return Trace(
            arrival_s=self.arrival_s[idx],
            prompt_tokens=self.prompt_tokens[idx],
            output_tokens=self.output_tokens[idx],
            prefix_keys=None if self.prefix_keys is None else [self.prefix_keys[i] for i in idx],
            prefix_block_tokens=self.prefix_block_tokens,
            session_id=pick(self.session_id),
            priority=pick(self.priority),
            num_samples=pick(self.num_samples),
            beam=pick(self.beam),
            source=dict(self.source),
        )
