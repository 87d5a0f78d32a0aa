"""Prefix-cache content keys at any block size, derived from a trace's source prefix keys.

A trace carries chained keys ``h[0..m-1]`` for blocks of ``S = trace.prefix_block_tokens`` tokens
(Mooncake: ``hash_ids`` with S = 512): equal ``h[j]`` in two requests means their prompts agree on
the whole prefix ``[0, (j+1)·S)``. The simulator's KV blocks hold ``b`` tokens, usually not S.
:func:`block_keys` gives each request one key per **full** ``b``-token block of its prompt
(``prompt_tokens // b`` keys; a trailing partial block is never shared, so it gets none) such that
two requests get equal keys for block k exactly when the source keys prove their first
``(k+1)·b`` tokens equal.

Rule for the b-block k, covering tokens ``[k·b, (k+1)·b)``:

* It touches the source blocks ``j0 = k·b // S`` .. ``j1 = ((k+1)·b - 1) // S``. When b divides S
  that is one block (j0 = j1, the block's offset inside it is ``k·b mod S``); when b > S or b does
  not divide S it spans several.
* ``key = mix(end_offset, h[j0], ..., h[j1])`` with ``end_offset = (k+1)·b``, a 64-bit SplitMix
  combination (:mod:`kvsim.trace.hashing`; deterministic, never Python's ``hash()``). Because
  the source keys are chained, equal ``h[j1]`` already implies equal tokens up to ``(j1+1)·S``,
  which covers the whole b-block, and the end offset separates the several b-blocks inside one
  source block. Mixing in every covered id keeps the rule safe even for ids that are only
  per-block rather than chained.
* **Partial last source block.** When ``prompt_tokens`` is not a multiple of S, the request's last
  source block holds only ``prompt_tokens mod S`` tokens, and an equal last id proves equality
  only up to *that request's* length. Any b-block that touches this partial source block
  therefore also mixes in the request's ``prompt_tokens``: it can be shared only with a request
  that has the same last id *and* the same prompt length (the same whole prompt), never with a
  request in which that id's block is longer or full.
* **Unknown source blocks.** If a request has fewer source keys than its prompt needs (loaders
  reject such files; hand-built traces might not), b-blocks touching a missing source block get a
  key unique to the request and offset: they are never shared.

Consequences: at ``b = S`` the sharing is exactly that of the source keys' full blocks; two
Mooncake requests whose first 2 ids agree (and whose 3rd differ) share exactly 2·512/16 = 64
16-token blocks, 16 64-token blocks, 2 512-token blocks, one 1024-token block, 21 48-token blocks
(the 22nd, ``[1008, 1056)``, reaches into the differing third source block) and 10 100-token
blocks.

A trace without prefix information (``trace.prefix_keys is None``) gives ``None``: the caller
should treat every block as unshared.
"""

from __future__ import annotations

import numpy as np

from kvsim.trace.arrays import split_flat
from kvsim.trace.hashing import fmix64, mix64
from kvsim.trace.schema import Trace

# Domain-separation tags (arbitrary odd constants) so different kinds of mixed input never collide.
_PARTIAL_TAG = np.int64(0x5A17_C0DE_0000_0001)
_UNKNOWN_TAG = np.int64(0x0BAD_C0DE_0000_0003)


def block_keys(trace: Trace, block_size: int) -> list[np.ndarray] | None:
    """int64 content keys per request, one per full ``block_size`` block of its prompt.

    Invariants: ``len(result[i]) == trace.prompt_tokens[i] // block_size``; equal keys at
    position k in two requests imply equal prompts on ``[0, (k+1)·block_size)`` (per the
    source keys); the result is a pure function of the trace's columns (same keys in every
    process). Returns ``None`` when the trace has no prefix keys.
    """
    if trace.prefix_keys is None:
        return None
    b = int(block_size)
    if b < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    source_block = int(trace.prefix_block_tokens)
    n = len(trace)
    if n == 0:
        return []
    prompt = trace.prompt_tokens.astype(np.int64)
    src_len = np.fromiter((k.shape[0] for k in trace.prefix_keys), np.int64, n)
    src_flat = np.concatenate([np.asarray(k, dtype=np.int64) for k in trace.prefix_keys] + [np.zeros(1, np.int64)])
    src_start = np.cumsum(src_len) - src_len

    n_blocks = prompt // b
    total = int(n_blocks.sum())
    out_start = np.cumsum(n_blocks) - n_blocks
    req = np.repeat(np.arange(n, dtype=np.int64), n_blocks)
    k = np.arange(total, dtype=np.int64) - np.repeat(out_start, n_blocks)
    end_tok = (k + 1) * b
    j0 = (k * b) // source_block
    j1 = (end_tok - 1) // source_block
    del k

    req_len = src_len[req]
    req_start = src_start[req]
    key = fmix64(end_tok)
    unknown = np.zeros(total, dtype=bool)
    span = -(-b // source_block) + 1  # most source blocks one b-block can touch
    for t in range(span):
        j = j0 + t
        use = j <= j1
        if not use.any():
            break
        sel = np.arange(total) if use.all() else np.flatnonzero(use)
        js = j[sel]
        missing = js >= req_len[sel]
        src = src_flat[np.where(missing, len(src_flat) - 1, req_start[sel] + js)]
        key[sel] = mix64(key[sel], src)
        unknown[sel[missing]] = True

    # A b-block touching the request's partial last source block is tied to the prompt length.
    last_src = (prompt - 1) // source_block
    partial = np.flatnonzero((prompt % source_block != 0)[req] & (j1 == last_src[req]))
    if partial.size:
        key[partial] = mix64(mix64(key[partial], _PARTIAL_TAG), prompt[req[partial]])
    lonely = np.flatnonzero(unknown)
    if lonely.size:
        key[lonely] = mix64(mix64(fmix64(np.full(lonely.size, _UNKNOWN_TAG)), req[lonely]), end_tok[lonely])
    return split_flat(key, n_blocks)


def shared_prefix_blocks(keys_a: np.ndarray, keys_b: np.ndarray) -> int:
    """How many leading keys two requests' key arrays have in common."""
    m = min(len(keys_a), len(keys_b))
    diff = np.flatnonzero(keys_a[:m] != keys_b[:m])
    return int(diff[0]) if diff.size else m
