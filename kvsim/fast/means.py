"""A decode window's time-weighted means: the allocator sums it went through (:class:`Segments`),
and :func:`window_means` over its steps (memory parts in tokens, batch size)."""

from __future__ import annotations

from itertools import chain
from operator import mul, sub
from typing import TYPE_CHECKING

import numpy as np

from kvsim.kv.base import MemoryParts, UsageSums

if TYPE_CHECKING:
    from kvsim.fast.window import DecodeWindow

_add = np.add.reduce  # == ndarray.sum (the same reduction), without its Python-level wrapper

def int_sum(values: np.ndarray) -> int:
    """Sum of an integer array as a Python int (short arrays through a list: numpy's fixed cost per
    call is most of the work there)."""
    return sum(values.tolist()) if len(values) <= 64 else int(_add(values))


# windows of at most this many steps: time-weighted means in Python floats (numpy's per-call cost dominates)
SMALL_WINDOW_STEPS = 24


class Segments:
    """A window's piecewise-constant allocator sums: from step ``starts[i]`` on, the sums
    ``parts[i] = (held, useful, shared, cached free, external)`` tokens (a
    :class:`~kvsim.kv.base.UsageSums` as a plain tuple: one is kept per block event)."""

    __slots__ = ("starts", "parts")

    def __init__(self, first: UsageSums) -> None:
        self.starts: list[int] = [0]
        self.parts: list[tuple[int, int, int, int, int]] = []
        self.add_parts(first)

    def add(self, first_step: int, usage: UsageSums) -> None:
        self.starts.append(first_step)
        self.add_parts(usage)

    def add_parts(self, u: UsageSums) -> None:
        self.parts.append((u.held_tokens, u.useful_tokens, u.shared_tokens, u.cached_free_tokens, u.external_tokens))


def window_means(win: DecodeWindow, k: int, durations: np.ndarray, segments, capacity_tokens: int):
    """Time-weighted means over the window's steps: ``(memory parts in tokens, batch size)``.

    ``segments`` (:class:`Segments`, strictly increasing first steps, all < k) hold
    piecewise-constant allocator sums; the written / batch / KV-read series are per step."""
    parts = segments.parts
    if k <= SMALL_WINDOW_STEPS:
        return _window_means_small(win, k, durations, segments, capacity_tokens)
    d = durations[:k]
    total = float(_add(d))
    vals = np.fromiter(chain.from_iterable(parts), np.float64, 5 * len(parts)).reshape(-1, 5)  # (segments, 5)
    seg_time = np.add.reduceat(d, segments.starts)  # time spent in each segment
    held, useful, shared, cached_free, external = (seg_time @ vals / total).tolist()
    written = float(np.dot(win.written[:k], d)) / total
    # reservation (useful - written) and internal fragmentation (held - useful): means of each
    # step's difference of integer token counts, so a part that is 0 in every step is exactly 0
    steps_in = np.diff(segments.starts + [k])
    useful_steps = np.repeat(vals[:, 1], steps_in)
    reservation = float(np.dot(useful_steps - win.written[:k], d)) / total
    internal = float(seg_time @ (vals[:, 0] - vals[:, 1])) / total
    batch = float(np.dot(win.num_requests[:k], d)) / total
    lengths = win.kv_tokens_read if win.unshared is None else win.unshared
    unshared = written if lengths is win.written else float(np.dot(lengths[:k], d)) / total
    return _means(held, shared, cached_free, external, written, unshared, reservation, internal, parts,
                  capacity_tokens), batch


def _window_means_small(win: DecodeWindow, k: int, durations: np.ndarray, segments: Segments, capacity_tokens: int):
    """:func:`window_means` of a short window in plain Python floats: below a few dozen values
    numpy's fixed cost per call is most of the work. Sums run in step order (numpy's pairwise and
    BLAS sums may differ from these in the last bits; either is deterministic)."""
    d = durations[:k].tolist()
    total = sum(d)
    starts, parts = segments.starts, segments.parts
    held = shared = cached_free = external = internal = 0.0
    written_steps = win.written[:k].tolist()
    if len(starts) == k:  # a segment per step (the usual case): each one's time is its step's duration
        seg_times = d
        useful_steps = [p[1] for p in parts]
    else:
        ends = starts[1:]
        ends.append(k)
        seg_times = [sum(d[s:e]) for s, e in zip(starts, ends)]
        useful_steps = [p[1] for p, s, e in zip(parts, starts, ends) for _ in range(e - s)]
    for t, (h, u, sh, cf, ex) in zip(seg_times, parts):
        held += t * h
        shared += t * sh
        cached_free += t * cf
        external += t * ex
        internal += t * (h - u)  # integer differences: a part 0 in every step is exactly 0
    held /= total
    shared /= total
    cached_free /= total
    external /= total
    internal /= total
    reservation = sum(map(mul, map(sub, useful_steps, written_steps), d)) / total
    written = sum(map(mul, written_steps, d)) / total
    batch = sum(map(mul, win.num_requests[:k].tolist(), d)) / total
    lengths = win.kv_tokens_read if win.unshared is None else win.unshared
    unshared = written if lengths is win.written else sum(map(mul, lengths[:k].tolist(), d)) / total
    return _means(held, shared, cached_free, external, written, unshared, reservation, internal, parts,
                  capacity_tokens), batch


def _means(held: float, shared: float, cached_free: float, external: float, written: float, unshared: float,
           reservation: float, internal: float, parts: list, capacity_tokens: int) -> MemoryParts:
    """A window's MemoryParts from its time-weighted allocator sums, written slots, reservation
    (useful - written) and internal fragmentation (held - useful), in tokens. ``reservation`` and
    ``internal`` are means of each step's integer difference (exactly 0 when 0 in every step: a
    difference of two means was 1e-17 of the cache there). Each part is a mean of quantities
    >= 0; a difference of two means can round a hair below 0 (seen: -4.8e-7 tokens where step mode
    writes 0), which is taken as 0 (:func:`_nonneg`)."""
    return MemoryParts(
        _nonneg(written - shared, capacity_tokens),  # token_states
        _nonneg(reservation, capacity_tokens),  # reservation
        _nonneg(internal, capacity_tokens),  # internal_frag
        external,  # external_frag
        _nonneg(capacity_tokens - (held - shared) - external, capacity_tokens),  # free
        cached_free,
        float(max([p[0] - p[2] for p in parts])),  # peak_used
        unshared,
    )


def _nonneg(x: float, capacity_tokens: int) -> float:
    """``x``, or 0.0 where rounding took a difference of means below 0 (by at most 1e-9 of the
    capacity; a larger negative is not rounding and is left for the invariant checks to see)."""
    return 0.0 if -1e-9 * capacity_tokens <= x < 0.0 else x
