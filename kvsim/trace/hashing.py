"""Deterministic 64-bit mixing of integer arrays (no Python ``hash()``, no randomisation).

:func:`fmix64` is the SplitMix64 finaliser, a bijection on 64-bit words with full avalanche;
:func:`mix64` combines two words order-dependently (``mix64(a, b) != mix64(b, a)``). Both work on
whole numpy arrays with wrapping uint64 arithmetic and return int64 views, so the same inputs give
the same keys on every machine and in every process.
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _u64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64).view(np.uint64) if np.asarray(x).dtype != np.uint64 else np.asarray(x)


def fmix64(x) -> np.ndarray:
    """SplitMix64 finaliser of an int64/uint64 array; returns int64."""
    with np.errstate(over="ignore"):
        z = _u64(x) + _GOLDEN  # a fresh array; the rest works in place to spare temporaries
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z.view(np.int64)


def mix64(a, b) -> np.ndarray:
    """An order-dependent 64-bit combination of ``a`` and ``b`` (broadcasting); returns int64."""
    ua = _u64(fmix64(a))
    with np.errstate(over="ignore"):
        z = _u64(b) + _GOLDEN
        z += ua << np.uint64(6)
        z += ua >> np.uint64(2)
        z ^= ua
        return fmix64(z)


def mix_many(*parts) -> np.ndarray:
    """Chain :func:`mix64` over ``parts`` left to right (each an int array or scalar)."""
    acc = fmix64(np.asarray(parts[0], dtype=np.int64))
    for p in parts[1:]:
        acc = mix64(acc, p)
    return acc
