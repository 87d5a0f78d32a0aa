"""Decode steps of the fitted analytical model (:class:`~kvsim.timing.analytical.AnalyticalTiming`
with the GEMM model) priced one at a time: the timing model's :class:`~kvsim.timing.base.DecodeStepPricer`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.timing.base import SMALL_SUM_STEPS, DecodeParts, SummedParts

if TYPE_CHECKING:
    from kvsim.timing.analytical import AnalyticalTiming


class _Row(int):
    """A parts-matrix row index, as :meth:`AnalyticalTiming._fitted_map` hands it back (the marker
    that tells a summed row from a part that is the same every step)."""


class FittedDecodeSteps:
    """Decode steps of the fitted analytical model priced one at a time, in Python floats.

    :meth:`price` prices a run of steps: each step's duration and its column of the per-step parts
    matrix, the same doubles :meth:`AnalyticalTiming.decode_durations` computes for that step, by the
    same IEEE operations in the same order (tests/timing/test_timing_fast_paths.py checks it bit for
    bit); :meth:`column` is one step of it. :meth:`parts` turns the columns of the steps that ran
    into decode_durations' breakdown of them, :meth:`totals` into its sums. A decode window that
    usually stops after a few of its planned steps prices only those: one numpy call costs as much
    as dozens of steps priced here."""

    __slots__ = ("timing", "kernel", "rows", "size", "kv_bytes_per_token", "bandwidth_bytes_per_s",
                 "attention_flops_per_pair", "flops_per_s", "overhead_s", "overhead_row", "no_comm", "overlap", "_totals",
                 "_int_kv_bytes", "experts_row")

    def __init__(self, timing: AnalyticalTiming):
        self.timing = timing
        self.kernel = timing.kernel
        self.kv_bytes_per_token = timing.kv_bytes_per_token
        self._int_kv_bytes = type(self.kv_bytes_per_token) is int  # KV bytes of a run of steps: a sum of ints
        self.bandwidth_bytes_per_s = timing.bandwidth_bytes_per_s
        self.attention_flops_per_pair = timing.attention_flops_per_pair
        self.flops_per_s = timing.flops_per_s
        self.overhead_s = timing.cfg.step_overhead_s
        self.overhead_row = timing._overhead_row  # None: the constant overhead_s
        self.overlap = timing._overlap  # async scheduling: max(GPU, engine loop) (kvsim.timing.overhead)
        self.no_comm = timing._no_comm
        self.experts_row = timing._experts_row  # MoE: the routed experts' row (None: a dense model)
        # decode_totals' breakdown by name, from the model's one map: (name, row index or -1, the
        # per-step value of a part that is the same every step)
        self._totals = [(name, int(v), 0.0) if type(v) is _Row else (name, -1, v)
                        for name, v in timing._fitted_map(_Row).items()]
        self._load()

    def _load(self) -> None:
        table = self.timing._decode_table
        self.rows = table.tolist()  # Python floats: the same doubles, cheaper to index
        self.size = table.shape[1]

    def price(self, num_seqs: list, kv_tokens_read: list, kv_pages_read: list, lo: int, hi: int, t: float,
              durations: list, times: list, columns: list) -> float:
        """Price decode steps ``lo .. hi-1`` of the per-step lists ``num_seqs`` sequences reading
        ``kv_tokens_read`` KV tokens in ``kv_pages_read`` pages (0: not known, estimated as
        decode_durations and step_time do), the first starting at time ``t``: appends each step's
        duration to ``durations``, its end to ``times`` (``t`` plus the durations, added one by one)
        and its parts to ``columns``; returns the last end. A step's parts are its column of the
        matrix rows of :data:`_FITTED_ROWS` plus the KV-write row (then the comm, the overhead and an
        MoE model's routed-experts rows, where the decode table has them)."""
        kernel = self.kernel
        time_scalar = None if kernel is None else kernel.time_scalar
        kvb, bw = self.kv_bytes_per_token, self.bandwidth_bytes_per_s
        afpp, fps = self.attention_flops_per_pair, self.flops_per_s
        ov_row, no_comm, overhead_s, overlap = self.overhead_row, self.no_comm, self.overhead_s, self.overlap
        ex_row = self.experts_row
        size, r = self.size, self.rows
        linear_r, gemm_r, lm_r, write_r = r[1], r[2], r[3], r[6]
        for s in range(lo, hi):
            n = num_seqs[s]
            kv = kv_tokens_read[s]
            if n >= size:
                self.timing._grow_decode_table(n)
                self._load()
                size, r = self.size, self.rows
                linear_r, gemm_r, lm_r, write_r = r[1], r[2], r[3], r[6]
            if time_scalar is None:
                attn = kv * kvb / bw
            else:
                p = kv_pages_read[s]
                attn = time_scalar(n, kv, p if p > 0 else None)
            flops = afpp * kv / fps
            dec = attn if attn >= flops else flops  # np.maximum(attn, flops)
            kv_write = write_r[n]
            linear = linear_r[n]
            duration = linear + dec
            duration += kv_write
            col = (attn + kv_write, linear, gemm_r[n], lm_r[n], flops, dec, kv_write)
            if ov_row is None:
                duration += overhead_s
            elif not overlap:  # (overlapped: the GPU's parts first, then max(GPU, engine loop), below)
                ov = r[ov_row][n]
                duration += ov
            if not no_comm:
                comm = r[7][n]
                duration += comm
                col = col + (comm,)
            if overlap:  # the overhead part is what the GPU did not hide
                loop = r[ov_row][n]
                d = loop if loop > duration else duration  # np.maximum(gpu, loop)
                ov = d - duration
                duration = d
            if ov_row is not None:
                col = col + (ov,)
            if ex_row is not None:  # the routed experts, then the dense linear layers (linear_compute_s)
                col = col + (r[ex_row][n], r[ex_row + 1][n])
            durations.append(duration)
            columns.append(col)
            t += duration
            times.append(t)
        return t

    def column(self, num_seqs: int, kv_tokens_read: int, kv_pages_read: int) -> tuple[float, tuple]:
        """``(duration, parts)`` of one decode step (:meth:`price` of that step alone)."""
        durations: list = []
        columns: list = []
        self.price([num_seqs], [kv_tokens_read], [kv_pages_read], 0, 1, 0.0, durations, [], columns)
        return durations[0], columns[0]

    def parts(self, columns: list) -> DecodeParts:
        """decode_durations' breakdown of the steps whose :meth:`column` parts are ``columns``."""
        if columns:
            matrix = np.array(list(zip(*columns)), dtype=np.float64)
        else:
            matrix = np.zeros((len(self.rows), 0))
        return self.timing._fitted_parts(matrix)

    def totals(self, columns: list, kv_tokens_read: list | None = None) -> DecodeParts | SummedParts:
        """:meth:`parts` for ``decode_totals(..., len(columns))`` alone: up to ``SMALL_SUM_STEPS``
        steps the rows are summed here, in step order (the doubles decode_totals would compute from
        the matrix), without building it, into the breakdown decode_totals returns; with the steps'
        ``kv_tokens_read``, also their KV bytes (decode_totals' sum of ``kv_tokens_read x
        kv_bytes_per_token``, where that is a sum of ints)."""
        k = len(columns)
        if not columns or k > SMALL_SUM_STEPS:
            return self.parts(columns)
        sums = list(map(sum, zip(*columns)))
        kv_bytes = None
        if kv_tokens_read is not None and self._int_kv_bytes:
            kv_bytes = sum(kv_tokens_read) * self.kv_bytes_per_token
        return SummedParts({name: (sums[i] if i >= 0 else v * k) for name, i, v in self._totals}, k, kv_bytes)
