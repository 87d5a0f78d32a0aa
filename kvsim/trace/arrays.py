"""Helpers for the ragged per-request key arrays (``list[np.ndarray]``)."""

from __future__ import annotations

import numpy as np


def split_flat(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Views of ``flat`` cut into consecutive pieces of ``lengths`` (``sum(lengths) == len(flat)``).

    Equivalent to ``np.split(flat, np.cumsum(lengths)[:-1])`` but several times faster for
    millions of short pieces. The pieces share ``flat``'s buffer: one allocation for all keys.
    """
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]]
    return [flat[a:b] for a, b in zip(starts, ends)]


def flatten(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(concatenated int64 values, int64 lengths) of a list of 1-D arrays."""
    lengths = np.fromiter((a.shape[0] for a in arrays), np.int64, len(arrays))
    if not arrays:
        return np.zeros(0, np.int64), lengths
    return np.concatenate(arrays).astype(np.int64, copy=False), lengths
