"""Pure transforms of a :class:`~kvsim.trace.schema.Trace`; each returns a new, valid trace.

* :func:`scale_rate` — ``rate_scale`` 2.0 means twice as many requests per second: every arrival
  time is divided by 2 (the trace plays in half the time).
* :func:`slice_time` — keep requests with ``start_s <= arrival < end_s`` (source time axis),
  rebased so a kept request arrives at its offset from ``start_s``.
* :func:`slice_count` — drop the first ``skip_requests`` requests and keep at most
  ``max_requests``; when requests were skipped, times are rebased so the first kept one is at 0.
* :func:`limit_lengths` — requests whose ``prompt + output`` exceeds the model's maximum length:
  ``reject`` leaves them in (the simulator rejects them), ``drop`` removes them, ``cap`` keeps the
  first ``max_model_len - output`` prompt tokens (output is first capped to ``max_model_len - 1``
  so at least one prompt token remains). Capping keeps the *start* of the prompt, so shared
  prefixes survive; the prefix keys are cut to the kept blocks and a block left partial by the
  cut gets a fresh key (mixed with the new length) so it is never taken for the full block.

None of these touches the trace in place.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvsim.trace.hashing import mix64
from kvsim.trace.schema import Trace

LENGTH_POLICIES = ("reject", "cap", "drop")


def _with(trace: Trace, **changes) -> Trace:
    return replace(trace, **changes)


def scale_rate(trace: Trace, rate_scale: float) -> Trace:
    """Divide every arrival time by ``rate_scale`` (> 0)."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    if rate_scale == 1.0:
        return trace
    return _with(trace, arrival_s=trace.arrival_s / rate_scale)


def slice_time(trace: Trace, start_s: float | None = None, end_s: float | None = None) -> Trace:
    """Keep ``start_s <= arrival_s < end_s``; subtract ``start_s`` (when given) from arrivals."""
    a = trace.arrival_s
    lo = 0 if start_s is None else int(np.searchsorted(a, start_s, side="left"))
    hi = len(a) if end_s is None else int(np.searchsorted(a, end_s, side="left"))
    out = trace.select(np.arange(lo, max(lo, hi)))
    if start_s:
        out = _with(out, arrival_s=out.arrival_s - start_s)
    return out


def slice_count(trace: Trace, skip_requests: int = 0, max_requests: int | None = None) -> Trace:
    """Requests ``[skip_requests, skip_requests + max_requests)``; rebased when skipping."""
    if skip_requests < 0 or (max_requests is not None and max_requests < 0):
        raise ValueError("skip_requests and max_requests must be >= 0")
    n = len(trace)
    hi = n if max_requests is None else min(n, skip_requests + max_requests)
    if skip_requests == 0 and hi == n:
        return trace
    out = trace.select(np.arange(min(skip_requests, n), hi))
    if skip_requests and len(out):
        out = _with(out, arrival_s=out.arrival_s - out.arrival_s[0])
    return out


def over_long(trace: Trace, max_model_len_tokens: int | None) -> np.ndarray:
    """Which requests have prompt + output > ``max_model_len_tokens`` (none without a limit)."""
    if not max_model_len_tokens:
        return np.zeros(len(trace), dtype=bool)
    return trace.prompt_tokens > int(max_model_len_tokens) - trace.output_tokens  # without overflow


def counts_in_window(over: np.ndarray, policy: str, skip_requests: int = 0, max_requests: int | None = None) -> dict:
    """``{over_long, capped, dropped}`` among the requests the count slice after the length policy
    reaches (``over``: over-long flags before the policy, :func:`over_long`), so that a count slice
    is not charged with over-long requests it would never have reached: those inside the slice
    and, under ``drop``, those removed from its span; when the slice is short of ``max_requests``
    (the trace ran out), as many of the later removed ones as it lacks (all without a maximum)."""
    n = len(over)
    kept = np.flatnonzero(~over) if policy == "drop" else np.arange(n)
    if skip_requests and skip_requests >= len(kept):
        return {"over_long": 0, "capped": 0, "dropped": 0}
    hi = len(kept) if max_requests is None else min(len(kept), skip_requests + max_requests)
    size = hi - skip_requests
    lo_pos = int(kept[skip_requests]) if skip_requests else 0
    last = int(kept[hi - 1]) + 1 if size > 0 else lo_pos
    k = int(over[lo_pos:last].sum())
    if max_requests is None or size < max_requests:
        tail = int(over[last:].sum())
        k += tail if max_requests is None else min(tail, max_requests - size)
    return {"over_long": k, "capped": k if policy == "cap" else 0, "dropped": k if policy == "drop" else 0}


def limit_lengths(trace: Trace, max_model_len_tokens: int | None, policy: str = "reject") -> tuple[Trace, dict]:
    """Apply a length policy; return the new trace and ``{over_long, capped, dropped}`` counts."""
    if policy not in LENGTH_POLICIES:
        raise ValueError(f"unknown length policy {policy!r}; choose one of {', '.join(LENGTH_POLICIES)}")
    report = {"policy": policy, "max_model_len_tokens": max_model_len_tokens, "over_long": 0, "capped": 0, "dropped": 0}
    if not max_model_len_tokens:
        return trace, report
    limit = int(max_model_len_tokens)
    over = over_long(trace, limit)
    n_over = int(over.sum())
    report["over_long"] = n_over
    if n_over == 0 or policy == "reject":
        return trace, report
    if policy == "drop":
        report["dropped"] = n_over
        return trace.select(~over), report
    if limit < 2:
        raise ValueError(f"cannot cap requests to max_model_len {limit}: need room for 1 prompt + 1 output token")
    output = np.minimum(trace.output_tokens, limit - 1)
    prompt = np.minimum(trace.prompt_tokens, limit - output)
    report["capped"] = n_over
    keys = trace.prefix_keys
    if keys is not None:
        keys = list(keys)
        b = int(trace.prefix_block_tokens)
        for i in np.flatnonzero(prompt < trace.prompt_tokens):
            n_blocks = -(-int(prompt[i]) // b)
            cut = keys[i][:n_blocks].copy()
            if prompt[i] % b:  # the last kept block is now partial: new content, new key
                cut[-1] = mix64(np.array([cut[-1]], np.int64), np.array([prompt[i]], np.int64))[0]
            keys[i] = cut
    return _with(trace, prompt_tokens=prompt, output_tokens=output, prefix_keys=keys), report
