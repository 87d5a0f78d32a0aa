"""Backlogged group windows priced one decode step at a time, as the replay reaches each step."""

from __future__ import annotations

import numpy as np

from kvsim.fast.window import DecodeWindow
from kvsim.timing.base import SummedParts


class StepwiseTimes:
    """A group window's step start times, priced one decode step at a time as the replay reads them
    (a :class:`~kvsim.timing.base.DecodeStepPricer`): ``self[j]`` is the start of step ``j``
    (``self[k]`` the end of a window of ``k`` steps), the same doubles as ``np.add.accumulate`` over
    ``[start, step 0's duration, decode_durations(steps 1..)]``. Step 0 was priced as a step.

    For windows with no arrival cut (a backlog): the replay stops at the step where the
    step-by-step scheduler would plan differently, usually a few steps into the planned horizon,
    and only the steps before it are priced."""

    __slots__ = ("_price", "_pricer", "_win", "_n", "_kv", "_pages", "_times", "_durations", "_columns")

    def __init__(self, pricer, win: DecodeWindow, start_s: float, step0_s: float):
        self._pricer = pricer
        self._price = pricer.price
        self._win = win
        self._n = win.num_seqs.tolist()
        self._kv = win.kv_tokens_read.tolist()
        self._pages = win.kv_pages_read.tolist()
        self._durations = [step0_s]
        self._times = [start_s, start_s + step0_s]
        self._columns: list = []  # steps 1.. priced so far: their parts

    def __getitem__(self, j: int) -> float:
        times = self._times
        s = len(times) - 1  # the next step to price
        if j > s:
            self._price(self._n, self._kv, self._pages, s, j, times[s], self._durations, times, self._columns)
        return times[j]

    def settle(self, k: int):
        """``(durations of steps 0..k-1, (None, breakdown parts of steps 1..k-1, their KV bytes
        read))``: what the engine takes from ``decode_durations`` in a window of ``k`` steps (the
        parts may come summed, with the KV bytes: :class:`~kvsim.timing.base.SummedParts`)."""
        self[k]
        durations = np.array(self._durations[:k], dtype=np.float64)
        parts = self._pricer.totals(self._columns[:k - 1], self._kv[1:k])
        if isinstance(parts, SummedParts) and parts.kv_bytes is not None:
            return durations, (None, parts, None)
        kv_bytes = self._win.kv_tokens_read[1:k] * self._pricer.kv_bytes_per_token
        return durations, (None, parts, kv_bytes)
