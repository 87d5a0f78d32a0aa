"""Decode steps of the fitted analytical model (:class:`~kvsim.timing.analytical.AnalyticalTiming`
with the GEMM model) priced one at a time: the timing model's :class:`~kvsim.timing.base.DecodeStepPricer`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.timing.base import SMALL_SUM_STEPS, DecodeParts, SummedParts

if TYPE_CHECKING:
    from kvsim.timing.analytical import AnalyticalTiming


class FittedDecodeSteps:
    """Decode steps of the fitted analytical model priced one at a time, in Python floats.

    :meth:`column` returns a decode step's duration and its column of the per-step parts matrix:
    the same doubles :meth:`AnalyticalTiming.decode_durations` computes for that step, by the same
    IEEE operations in the same order (tests/timing/test_timing_fast_paths.py checks it bit for bit).
    :meth:`parts` turns the columns of the steps that ran into decode_durations' breakdown of them.
    A decode window that usually stops after a few of its planned steps prices only those: one
    numpy call costs as much as dozens of steps priced here."""

    __slots__ = ("timing", "kernel", "rows", "size", "kv_bytes_per_token", "bandwidth_bytes_per_s",
                 "attention_flops_per_pair", "flops_per_s", "overhead_s", "overhead_row", "no_comm")

    def __init__(self, timing: AnalyticalTiming):
        self.timing = timing
        self.kernel = timing.kernel
        self.kv_bytes_per_token = timing.kv_bytes_per_token
        self.bandwidth_bytes_per_s = timing.bandwidth_bytes_per_s
        self.attention_flops_per_pair = timing.attention_flops_per_pair
        self.flops_per_s = timing.flops_per_s
        self.overhead_s = timing.cfg.step_overhead_s
        self.overhead_row = timing._overhead_row  # None: the constant overhead_s
        self.no_comm = timing._no_comm
        self._load()

    def _load(self) -> None:
        table = self.timing._decode_table
        self.rows = table.tolist()  # Python floats: the same doubles, cheaper to index
        self.size = table.shape[1]

    def column(self, num_seqs: int, kv_tokens_read: int, kv_pages_read: int) -> tuple[float, tuple]:
        """``(duration, parts)`` of one decode step: ``num_seqs`` sequences reading
        ``kv_tokens_read`` KV tokens in ``kv_pages_read`` pages (0: not known, estimated as
        decode_durations and step_time do). ``parts`` is the step's column of the matrix rows of
        :data:`_FITTED_ROWS` plus the KV-write row (then the comm and the overhead rows, where the
        decode table has them)."""
        n = num_seqs
        if n >= self.size:
            self.timing._grow_decode_table(n)
            self._load()
        r = self.rows
        if self.kernel is None:
            attn = kv_tokens_read * self.kv_bytes_per_token / self.bandwidth_bytes_per_s
        else:
            attn = self.kernel.time_scalar(n, kv_tokens_read, kv_pages_read if kv_pages_read > 0 else None)
        flops = self.attention_flops_per_pair * kv_tokens_read / self.flops_per_s
        dec = attn if attn >= flops else flops  # np.maximum(attn, flops)
        kv_write = r[6][n]
        linear = r[1][n]
        duration = linear + dec
        duration += kv_write
        col = (attn + kv_write, linear, r[2][n], r[3][n], flops, dec, kv_write)
        if self.overhead_row is None:
            duration += self.overhead_s
        else:
            ov = r[self.overhead_row][n]
            duration += ov
        if not self.no_comm:
            comm = r[7][n]
            duration += comm
            col = col + (comm,)
        if self.overhead_row is not None:
            col = col + (ov,)
        return duration, col

    def parts(self, columns: list) -> DecodeParts:
        """decode_durations' breakdown of the steps whose :meth:`column` parts are ``columns``."""
        if columns:
            matrix = np.array(list(zip(*columns)), dtype=np.float64)
        else:
            matrix = np.zeros((len(self.rows), 0))
        return self.timing._fitted_parts(matrix)

    def totals(self, columns: list) -> DecodeParts | SummedParts:
        """:meth:`parts` for ``decode_totals(..., len(columns))`` alone: up to ``SMALL_SUM_STEPS``
        steps the rows are summed here, in step order (the doubles decode_totals would compute from
        the matrix), without building it."""
        if not columns or len(columns) > SMALL_SUM_STEPS:
            return self.parts(columns)
        sums = [sum(row) for row in zip(*columns)]
        return SummedParts(self.timing._fitted_map(sums.__getitem__), sums, self.timing._fitted_rows, len(columns))
