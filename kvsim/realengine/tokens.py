"""A trace's prompts as token ids, keeping its prefix structure.

With ``prefix_keys`` (blocks of ``prefix_block_tokens`` tokens, chained content keys), block ``j``
of a prompt is drawn from a generator seeded by its key, so equal keys give equal tokens and two
prompts share exactly the prefix the trace says they share. Without them every prompt is drawn
from a generator seeded by (seed, request index): distinct prompts, no accidental prefix hits.
Token ids avoid 0-2 (pad/bos/eos of most vocabularies).
"""

from __future__ import annotations

import numpy as np

FIRST_ID = 3


def _draw(seed: tuple[int, ...] | int, n: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(FIRST_ID, vocab, size=n, dtype=np.int64)


def random_prompt(n: int, vocab: int, seed: tuple[int, ...] | int) -> list[int]:
    return _draw(seed, n, vocab).tolist()


def prompt_tokens(trace, i: int, vocab: int, seed: int) -> list[int]:
    """Request ``i``'s prompt: ``trace.prompt_tokens[i]`` ids in ``[3, vocab)``."""
    n = int(trace.prompt_tokens[i])
    keys = trace.prefix_keys[i] if trace.prefix_keys is not None else None
    if keys is None or len(keys) == 0:
        return _draw((seed, 1, i), n, vocab).tolist()
    b = int(trace.prefix_block_tokens)
    parts = [_draw((seed, 2, int(k) & 0x7FFFFFFFFFFFFFFF), b, vocab) for k in keys]
    out = np.concatenate(parts)[:n] if parts else np.empty(0, dtype=np.int64)
    if len(out) < n:  # keys cover fewer tokens than the prompt: the rest is the request's own
        out = np.concatenate([out, _draw((seed, 1, i), n - len(out), vocab)])
    return out.tolist()
