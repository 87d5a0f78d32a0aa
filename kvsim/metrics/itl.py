"""Inter-token latency (ITL) of decode tokens, accumulated while the engine runs, in bounded memory.

A decode token (a token sampled by a request that already had its first token, computed in a step
as one new position) arrives one engine step after the request's previous token, so its gap is the
duration of the step that produced it. The recorder feeds every step's duration with its number of
decode tokens (the ``decode_tokens`` of a step row; a decode window passes its per-step durations
and counts, so windows and step-by-step runs see the same steps). Gaps are pooled over tokens, as
vLLM's serving benchmark pools the ITLs of all requests.

Memory is bounded: exact count, sum, sum of squares, minimum and maximum, plus a histogram of
``BINS_PER_DECADE`` geometric bins per decade from ``LOW_S`` to ``HIGH_S``, each with its token
count and the sum of its values. A percentile takes the value at a rank as the mean of the bin
holding it (exact when the bin holds one distinct step duration; otherwise within one bin width,
10**(1/BINS_PER_DECADE) - 1 = 0.58 % relative) and interpolates between ranks as numpy does.
Values are buffered (single steps as Python numbers, windows as the engine's arrays) and binned in
bulk, so a step or window costs two list appends; see docs/metrics.md, "ITL", for what the
distribution leaves out (gaps that span a preemption) and the exact stall totals reported instead.
"""

from __future__ import annotations

import math

import numpy as np

LOW_S = 1e-7  # 0.1 us: below any step duration
HIGH_S = 1e5  # ~28 h: above any gap
BINS_PER_DECADE = 400
NUM_BINS = int(round(math.log10(HIGH_S / LOW_S) * BINS_PER_DECADE))
FLUSH_VALUES = 1 << 18  # buffered (duration, count) pairs binned at once


class ITLAccumulator:
    """Token-weighted step durations: ``add`` one step, ``add_many`` a window's steps."""

    def __init__(self) -> None:
        # bins 0 / NUM_BINS + 1 are under / overflow; bin i covers [LOW * r**(i-1), LOW * r**i)
        self.counts = np.zeros(NUM_BINS + 2, dtype=np.int64)
        self.sums = np.zeros(NUM_BINS + 2, dtype=np.float64)  # sum of the values in each bin
        self.count = 0
        self.sum_s = 0.0
        self.sum_sq_s2 = 0.0
        self.min_s = math.inf
        self.max_s = -math.inf
        self._step_d: list[float] = []  # single steps, as Python numbers (cheapest to append)
        self._step_w: list[int] = []
        self._many_d: list[np.ndarray] = []  # decode windows, as the engine's arrays
        self._many_w: list[np.ndarray] = []
        self._buffered = 0

    def add(self, duration_s: float, tokens: int) -> None:
        if tokens > 0:
            self._step_d.append(duration_s)
            self._step_w.append(tokens)
            self._buffered += 1
            if self._buffered >= FLUSH_VALUES:
                self.flush()

    def add_many(self, durations_s: np.ndarray, tokens: np.ndarray) -> None:
        """Steps of a window: numpy arrays of float durations and integer token counts, kept by
        reference until the next flush (the caller must not change them)."""
        self._many_d.append(durations_s)
        self._many_w.append(tokens)
        self._buffered += len(durations_s)
        if self._buffered >= FLUSH_VALUES:
            self.flush()

    def flush(self) -> None:
        if not (self._step_d or self._many_d):
            return
        d = np.concatenate([np.array(self._step_d, dtype=np.float64), *self._many_d]).astype(np.float64, copy=False)
        w = np.concatenate([np.array(self._step_w, dtype=np.int64), *self._many_w]).astype(np.int64, copy=False)
        self._step_d, self._step_w, self._many_d, self._many_w, self._buffered = [], [], [], [], 0
        keep = w > 0
        d, w = d[keep], w[keep]
        if d.size == 0:
            return
        self.count += int(w.sum())
        wf = w.astype(np.float64)
        dw = d * wf
        self.sum_s += float(dw.sum())
        self.sum_sq_s2 += float(np.dot(dw, d))
        self.min_s = min(self.min_s, float(d.min()))
        self.max_s = max(self.max_s, float(d.max()))
        idx = bin_index(d)
        self.counts += np.bincount(idx, weights=w, minlength=NUM_BINS + 2).astype(np.int64)
        self.sums += np.bincount(idx, weights=dw, minlength=NUM_BINS + 2)

    def summary(self, percentiles: tuple[float, ...] = (50, 90, 99)) -> dict[str, float | None]:
        """``{mean, std, p<q>..., max}`` in seconds (None for no decode tokens); std is the
        population standard deviation, as ``np.std``."""
        self.flush()
        out: dict[str, float | None] = {"mean": None, "std": None}
        out.update({pkey(q): None for q in percentiles})
        out["max"] = None
        if self.count == 0:
            return out
        mean = self.sum_s / self.count
        var = max(self.sum_sq_s2 / self.count - mean * mean, 0.0)
        out["mean"], out["std"], out["max"] = mean, math.sqrt(var), self.max_s
        for q in percentiles:
            out[pkey(q)] = self.quantile(q / 100.0)
        return out

    def quantile(self, q: float) -> float:
        """The pooled ``q`` quantile by numpy's linear rule: the values at the two ranks around
        ``q * (n - 1)``, each taken as the mean of its bin (exact when the bin holds one distinct
        value, as all tokens of one step do), interpolated linearly."""
        rank = q * (self.count - 1)
        lo_rank = math.floor(rank)
        cum = np.cumsum(self.counts)
        a = self._value_at(cum, lo_rank)
        if rank == lo_rank:
            return a
        b = self._value_at(cum, min(lo_rank + 1, self.count - 1))
        return a + (rank - lo_rank) * (b - a)

    def _value_at(self, cum: np.ndarray, rank: int) -> float:
        i = int(np.searchsorted(cum, rank, side="right"))  # the bin holding the 0-based ``rank``
        return float(min(max(self.sums[i] / self.counts[i], self.min_s), self.max_s))


def bin_index(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        idx = np.floor(np.log10(np.maximum(d, 1e-300) / LOW_S) * BINS_PER_DECADE).astype(np.int64) + 1
    return np.clip(idx, 0, NUM_BINS + 1)


def bin_edges(i: int) -> tuple[float, float]:
    if i <= 0:
        return 0.0, LOW_S
    if i > NUM_BINS:
        return HIGH_S, math.inf
    return LOW_S * 10 ** ((i - 1) / BINS_PER_DECADE), LOW_S * 10 ** (i / BINS_PER_DECADE)


def pkey(q: float) -> str:
    """Summary key of percentile ``q``: 99 -> ``p99``, 99.9 -> ``p99.9``."""
    return f"p{q:g}"
