"""A window's time-weighted means: the plain-Python evaluation of short windows and the numpy one
agree (to rounding), and both equal the means computed from the definition."""

from __future__ import annotations

import numpy as np
import pytest

import kvsim.fast.means as means
from kvsim.fast.means import Segments, window_means
from kvsim.fast.window import DecodeWindow
from kvsim.kv.base import UsageSums


def _case(rng, k: int):
    durations = rng.random(k + 3) * rng.choice([1e-4, 1e-2, 1.0])
    written = rng.integers(0, 10**6, k + 3)
    batch = rng.integers(1, 256, k + 3)
    read = written + rng.integers(0, 1000, k + 3)
    win = DecodeWindow(None, None, None, batch, read, k, None, written, batch, batch)
    starts = sorted(set([0] + rng.integers(1, k, int(rng.integers(0, k))).tolist())) if k > 1 else [0]
    sums = [UsageSums(*(int(x) for x in rng.integers(0, 10**6, 5))) for _ in starts]
    seg = Segments(sums[0])
    for s, u in zip(starts[1:], sums[1:]):
        seg.add(s, u)
    return win, durations, seg, starts, sums


def _definition(win, k, d, starts, sums, capacity):
    d = d[:k]
    total = d.sum()
    per_step = np.zeros((k, 5))
    for i, s in enumerate(starts):
        u = sums[i]
        per_step[s:] = (u.held_tokens, u.useful_tokens, u.shared_tokens, u.cached_free_tokens, u.external_tokens)
    held, useful, shared, cached, external = (per_step * d[:, None]).sum(axis=0) / total
    written = (win.written[:k] * d).sum() / total
    return dict(token_states=written - shared, reservation=useful - written, internal_frag=held - useful,
                external_frag=external, free=capacity - (held - shared) - external, cached_free=cached,
                unshared=(win.kv_tokens_read[:k] * d).sum() / total,
                peak_used=max(u.held_tokens - u.shared_tokens for u in sums)), (win.num_requests[:k] * d).sum() / total


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 9, 16, 24, 25, 40])
def test_small_and_numpy_means_agree_with_the_definition(k, monkeypatch):
    rng = np.random.default_rng(k)
    capacity = 5 * 10**6
    for _ in range(30):
        win, d, seg, starts, sums = _case(rng, k)
        want, want_batch = _definition(win, k, d, starts, sums, capacity)
        got = {}
        for small in (0, 1 << 30):  # the numpy evaluation, then the plain-Python one
            monkeypatch.setattr(means, "SMALL_WINDOW_STEPS", small)
            got[small] = window_means(win, k, d, seg, capacity)
        for memory, batch in got.values():
            assert batch == pytest.approx(want_batch, rel=1e-12)
            for name, v in want.items():
                scale = max(abs(v), capacity * 1e-3)  # differences of sums near zero: absolute
                assert abs(getattr(memory, name) - v) <= 1e-11 * scale, name


def test_a_difference_of_means_rounded_below_zero_is_zero():
    """A fast-mode row wrote reservation_bytes of -4.8e-7 where step mode writes 0 (useful == written
    in every step, their time-weighted means apart in the last bit). Larger negatives stay visible."""
    from kvsim.fast.means import _means

    written = 1000.0 + 2e-13
    parts = [(1000, 1000, 0, 0, 0)]
    m = _means(1000.0, 0.0, 0.0, 0.0, written, written, -1e-13, -1e-13, parts, 5000)
    assert m.reservation == 0.0 and m.internal_frag == 0.0 and m.token_states > 0
    assert _means(1000.0, 0.0, 0.0, 0.0, written, written, -50.0, 0.0, parts, 5000).reservation < -49


@pytest.mark.parametrize("small", [0, 1 << 30])
@pytest.mark.parametrize("k", [3, 40])
def test_parts_zero_in_every_step_are_exactly_zero(k, small, monkeypatch):
    """useful == written == held in every step (paged, block size 1, no reservation): reservation and
    internal fragmentation are 0.0, not a difference of two means (was 1.86e-7 bytes per row, and
    kv.reservation_frac 7e-18 in the summary)."""
    monkeypatch.setattr(means, "SMALL_WINDOW_STEPS", small)
    rng = np.random.default_rng(7)
    d = rng.random(k) * 0.0137
    written = np.arange(100_003, 100_003 + k)
    win = DecodeWindow(None, None, None, written * 0 + 8, written, k, None, written, written * 0 + 8,
                       written * 0 + 8)
    starts = list(range(0, k, 2)) if k > 3 else list(range(k))
    seg = Segments(UsageSums(int(written[0]), int(written[0]), 0, 0, 0))
    for s in starts[1:]:
        seg.add(s, UsageSums(int(written[s]), int(written[s]), 0, 0, 0))
    # a segment spanning two steps holds its first step's count: written must match it step by step
    win.written[:] = [written[max(s for s in starts if s <= i)] for i in range(k)]
    memory, _ = window_means(win, k, d, seg, 10**6)
    assert memory.reservation == 0.0 and memory.internal_frag == 0.0 and memory.token_states > 0
