"""Timing one op: warm-up, then ``repeats`` timed calls over rotating inputs; median and spread.

CUDA: each timed call is bracketed by CUDA events. Before each bracket a short device-side spin
(``torch.cuda._sleep``) keeps the GPU busy while the host enqueues the events and the kernel, so
the interval is the kernels' device time, not Python launch latency (what a CUDA-graph replay in a
serving engine would see). The spin is sized from the measured host enqueue time.

CPU: ``time.perf_counter`` around each call (CPU torch ops are synchronous).

Rotation: ``fn(i)`` receives the call index; ops use ``i % rotations`` to pick a buffer set, so
consecutive calls read memory that is not in cache (see :func:`rotations_for`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

_SPIN_CLOCK_HZ = 2.0e9  # upper bound of Hopper/Ampere SM clocks: a spin sized with it lasts at least as long
_MIN_SPIN_S, _MAX_SPIN_S = 20e-6, 20e-3


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    mean_s: float
    repeats: int

    @classmethod
    def of(cls, samples_s: np.ndarray) -> Timing:
        s = np.asarray(samples_s, dtype=float)
        return cls(float(np.median(s)), float(np.percentile(s, 10)), float(np.percentile(s, 90)),
                   float(s.mean()), len(s))


def rotations_for(bytes_per_set: int, free_sets: int, calls: int, cache_bytes: int) -> int:
    """How many input sets to cycle through.

    Enough that ``4 x cache_bytes`` are touched between two reads of one set, or one set per call
    (every call cold, as in a serving step where each layer's weights and KV are read once), but no
    more than fit (``free_sets``) and at least 1.
    """
    want = -(-4 * cache_bytes // max(1, bytes_per_set))
    return max(1, min(free_sets, calls, max(2, want)))


class Timer:
    def __init__(self, device: torch.device, warmup: int, repeats: int):
        self.device = device
        self.warmup = warmup
        self.repeats = repeats
        self.has_spin = device.type == "cuda" and hasattr(torch.cuda, "_sleep")

    @property
    def calls(self) -> int:
        return self.warmup + self.repeats

    def measure(self, fn: Callable[[int], object]) -> Timing:
        if self.device.type == "cuda":
            return Timing.of(self._measure_cuda(fn))
        return Timing.of(self._measure_cpu(fn))

    def _measure_cpu(self, fn) -> np.ndarray:
        for i in range(self.warmup):
            fn(i)
        out = np.empty(self.repeats)
        for j in range(self.repeats):
            t0 = time.perf_counter()
            fn(self.warmup + j)
            out[j] = time.perf_counter() - t0
        return out

    def _measure_cuda(self, fn) -> np.ndarray:
        torch.cuda.synchronize(self.device)
        enqueue_s = 0.0
        for i in range(max(1, self.warmup)):
            torch.cuda.synchronize(self.device)  # an idle queue makes the host time pure enqueue cost
            t0 = time.perf_counter()
            fn(i)
            enqueue_s = time.perf_counter() - t0  # last warm-up: compiled, cached, steady
        torch.cuda.synchronize(self.device)
        spin_cycles = int(min(max(3 * enqueue_s, _MIN_SPIN_S), _MAX_SPIN_S) * _SPIN_CLOCK_HZ)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeats)]
        for j in range(self.repeats):
            if self.has_spin:
                torch.cuda._sleep(spin_cycles)
            starts[j].record()
            fn(self.warmup + j)
            ends[j].record()
        torch.cuda.synchronize(self.device)
        return np.array([s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)])
