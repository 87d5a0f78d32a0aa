"""Seeded synthetic trace generator for a :class:`~kvsim.trace.spec.SyntheticTraceSpec`.

Determinism: each random input draws from its own numpy ``Generator``, spawned from
``np.random.SeedSequence(seed)`` in the fixed order of :data:`STREAMS`. Child *i* of a
SeedSequence does not depend on how many children are spawned, so adding a new input (appended to
:data:`STREAMS`) or enabling an option never changes what the other inputs draw: turning on
``sampling`` leaves arrivals and lengths exactly as they were.

Structure:

* Arrivals: gaps are exponential (Poisson), Gamma with shape ``1/cv^2`` (mean ``1/rate``) or
  constant; the first request arrives at t = 0. With conversations the process gives the arrival
  of each conversation's first turn, and later turns follow after a think time (measured from the
  previous turn's *arrival*, since a trace is open-loop; pick it longer than a response takes).
* Lengths: drawn per request (per turn: the new user message) from the prompt/output
  distributions, or the preset's.
* Prefix keys (``prefix_block_tokens``-token blocks, chained) exist when a system prompt or
  conversations are enabled. Key values are small non-negative integers assigned in generation
  order: the system prompt's full blocks get keys ``0 .. S-1`` in every request that carries it;
  every other block gets a fresh key, except that turn k+1 reuses turn k's full-block keys (its
  prompt extends turn k's prompt). A block straddling two segments is fresh (its content is new).
* ``num_samples`` exists when ``sampling`` is given: ``n`` or ``beam_width`` for a ``fraction``
  of the requests, 1 for the rest; ``source["num_samples_kind"]`` says which. With ``beam_width``
  the ``beam`` column is 1 for the chosen requests: they run a beam search (``kvsim.kv.beam``).

Presets approximate the two workloads of the vLLM paper (Kwon et al., SOSP 2023, Table 1 / Fig. 11)
with log-normal lengths of the published means: ShareGPT (prompt 161.31, output 337.99 tokens) and
Alpaca (19.31, 58.45). The spreads (cv) are our reading of the paper's histograms, not published
numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kvsim.errors import TraceError
from kvsim.trace.arrays import split_flat
from kvsim.trace.schema import MAX_REQUESTS, MAX_TOKENS, Trace
from kvsim.trace.spec import (
    ArrivalSpec,
    EmpiricalLength,
    FixedLength,
    LognormalLength,
    SyntheticTraceSpec,
    UniformLength,
    ZipfLength,
)

# Append-only: the index of a name is its SeedSequence child.
STREAMS = ("arrival", "prompt", "output", "system_prompt", "turns", "think_time", "sampling", "priority")

PRESETS: dict[str, dict[str, LognormalLength]] = {
    "sharegpt": {
        "prompt_tokens": LognormalLength(mean=161.31, cv=1.2),
        "output_tokens": LognormalLength(mean=337.99, cv=0.9),
    },
    "alpaca": {
        "prompt_tokens": LognormalLength(mean=19.31, cv=0.6),
        "output_tokens": LognormalLength(mean=58.45, cv=0.8),
    },
}


def rng_streams(seed: int) -> dict[str, np.random.Generator]:
    children = np.random.SeedSequence(seed).spawn(len(STREAMS))
    return {name: np.random.default_rng(child) for name, child in zip(STREAMS, children)}


# ---- distributions ---------------------------------------------------------------------------


class _EmpiricalCache:
    """Loads each empirical source file once per generation."""

    def __init__(self, base_dir: Path | None):
        self.base_dir = base_dir
        self._traces: dict[tuple[str, str], Trace] = {}

    def column(self, dist: EmpiricalLength, field: str) -> np.ndarray:
        from kvsim.trace.fileio import resolve_path
        from kvsim.trace.load import load_trace

        key = (dist.file, dist.format)
        if key not in self._traces:
            path = resolve_path(dist.file, self.base_dir, "empirical length file")
            self._traces[key] = load_trace(path, dist.format)
        which = dist.column or ("prompt" if field == "prompt_tokens" else "output")
        trace = self._traces[key]
        return trace.prompt_tokens if which == "prompt" else trace.output_tokens


def sample_lengths(dist, n: int, rng: np.random.Generator, field: str = "prompt_tokens",
                   empirical: _EmpiricalCache | None = None) -> np.ndarray:
    """``n`` int64 token counts (each >= 1) from a length distribution."""
    if isinstance(dist, FixedLength):
        return np.full(n, dist.value, dtype=np.int64)
    if isinstance(dist, UniformLength):
        return rng.integers(dist.low, dist.high, size=n, endpoint=True, dtype=np.int64)
    if isinstance(dist, LognormalLength):
        sigma = dist.sigma if dist.sigma is not None else math.sqrt(math.log1p(dist.cv**2))
        mu = math.log(dist.mean) - sigma**2 / 2  # so that E[X] = mean
        x = np.rint(rng.lognormal(mu, sigma, size=n))
        hi = dist.max_tokens if dist.max_tokens is not None else MAX_TOKENS
        return np.clip(x, dist.min_tokens, hi).astype(np.int64)
    if isinstance(dist, ZipfLength):
        support = np.arange(dist.min_tokens, dist.max_tokens + 1, dtype=np.float64)
        cdf = np.cumsum(support ** -dist.exponent)
        cdf /= cdf[-1]
        idx = np.searchsorted(cdf, rng.random(n), side="right")
        return (dist.min_tokens + np.minimum(idx, len(support) - 1)).astype(np.int64)
    if isinstance(dist, EmpiricalLength):
        values = (empirical or _EmpiricalCache(None)).column(dist, field)
        return values[rng.integers(0, len(values), size=n)].astype(np.int64)
    raise TypeError(f"unknown length distribution {dist!r}")  # pragma: no cover


def _gaps(arrival: ArrivalSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    mean = 1.0 / arrival.rate_per_s
    if arrival.process == "constant":
        return np.full(n, mean)
    if arrival.process == "poisson":
        return rng.exponential(mean, size=n)
    shape = 1.0 / arrival.cv**2
    return rng.gamma(shape, mean / shape, size=n)


def sample_arrivals(arrival: ArrivalSpec, rng: np.random.Generator, n: int | None = None,
                    duration_s: float | None = None) -> np.ndarray:
    """Arrival times (first at 0): ``n`` of them, or all before ``duration_s``."""
    if n is not None:
        gaps = _gaps(arrival, n, rng)
        out = np.cumsum(gaps) - gaps[0] if n else np.zeros(0)
        return out
    # Draw in batches from the same stream until past the horizon (deterministic for a seed).
    parts, t0, first = [], 0.0, True
    batch = max(1024, int(arrival.rate_per_s * duration_s * 1.1) + 64)
    while True:
        gaps = _gaps(arrival, batch, rng)
        if first:
            gaps[0] = 0.0
            first = False
        times = t0 + np.cumsum(gaps)
        parts.append(times[times < duration_s])
        if times[-1] >= duration_s:
            return np.concatenate(parts)
        t0 = times[-1]


# ---- the generator ---------------------------------------------------------------------------


def generate_trace(spec: SyntheticTraceSpec, seed: int | None = None, base_dir: Path | None = None) -> Trace:
    """Generate the trace described by ``spec`` (``seed`` defaults to ``spec.seed``, then 0)."""
    seed = spec.seed if seed is None else seed
    seed = 0 if seed is None else int(seed)
    rngs = rng_streams(seed)
    empirical = _EmpiricalCache(base_dir)
    preset = PRESETS.get(spec.preset or "", {})
    prompt_dist = spec.prompt_tokens or preset.get("prompt_tokens")
    output_dist = spec.output_tokens or preset.get("output_tokens")

    if spec.conversation is None:
        arrival_s = sample_arrivals(spec.arrival, rngs["arrival"], spec.num_requests, spec.duration_s)
        n = len(arrival_s)
        message = sample_lengths(prompt_dist, n, rngs["prompt"], "prompt_tokens", empirical)
        output = sample_lengths(output_dist, n, rngs["output"], "output_tokens", empirical)
        has_sys = _system_prompt_mask(spec, n, rngs["system_prompt"])
        sys_tokens = spec.system_prompt.tokens if spec.system_prompt else 0
        prompt = message + np.where(has_sys, sys_tokens, 0)
        if n and int(prompt.max()) > MAX_TOKENS:
            raise TraceError(f"synthetic trace: request {int(np.argmax(prompt > MAX_TOKENS))}: system_prompt.tokens + "
                             f"prompt_tokens = {int(prompt.max())} tokens; a prompt may have at most {MAX_TOKENS} (2**32)")
        keys = _single_turn_keys(prompt, has_sys, sys_tokens, spec.prefix_block_tokens) if spec.system_prompt else None
        session = None
    else:
        arrival_s, prompt, output, keys, session = _conversations(spec, rngs, prompt_dist, output_dist, empirical)
        n = len(arrival_s)

    if n == 0:
        raise TraceError(f"synthetic trace: no requests fall within duration_s={spec.duration_s}")

    num_samples = None
    beam = None
    if spec.sampling is not None:
        chosen = rngs["sampling"].random(n) < spec.sampling.fraction
        num_samples = np.where(chosen, spec.sampling.samples, 1).astype(np.int64)
        if spec.sampling.kind == "beam_search":  # the chosen requests run a beam search
            beam = (chosen & (num_samples > 1)).astype(np.int64)
    priority = None
    if spec.priority is not None:
        values = np.asarray(spec.priority.values, dtype=np.int64)
        weights = None
        if spec.priority.weights is not None:
            w = np.asarray(spec.priority.weights, dtype=np.float64)
            weights = w / w.sum()
        priority = values[rngs["priority"].choice(len(values), size=n, p=weights)]

    trace = Trace(
        arrival_s=np.asarray(arrival_s, dtype=np.float64),
        prompt_tokens=prompt.astype(np.int64),
        output_tokens=output.astype(np.int64),
        prefix_keys=keys,
        prefix_block_tokens=spec.prefix_block_tokens if keys is not None else None,
        session_id=session,
        priority=priority,
        num_samples=num_samples,
        beam=beam,
        source={
            "kind": "synthetic",
            "seed": seed,
            "spec": spec.model_dump(mode="json", exclude_none=True),
            "num_samples_kind": spec.sampling.kind if spec.sampling is not None else None,
        },
    )
    trace.validate("synthetic trace")
    return trace


def _system_prompt_mask(spec: SyntheticTraceSpec, n: int, rng: np.random.Generator) -> np.ndarray:
    if spec.system_prompt is None:
        return np.zeros(n, dtype=bool)
    return rng.random(n) < spec.system_prompt.fraction


def _single_turn_keys(prompt: np.ndarray, has_sys: np.ndarray, sys_tokens: int, block: int) -> list[np.ndarray]:
    """Keys ``0..S-1`` for the system prompt's full blocks, fresh sequential keys elsewhere."""
    n_sys_keys = sys_tokens // block
    n_keys = -(-prompt // block)
    shared = np.where(has_sys, n_sys_keys, 0)
    total = int(n_keys.sum())
    starts = np.cumsum(n_keys) - n_keys
    pos = np.arange(total, dtype=np.int64) - np.repeat(starts, n_keys)
    is_shared = pos < np.repeat(shared, n_keys)
    fresh_index = np.cumsum(~is_shared) - 1
    flat = np.where(is_shared, pos, n_sys_keys + fresh_index).astype(np.int64)
    return split_flat(flat, n_keys)


def _conversations(spec, rngs, prompt_dist, output_dist, empirical):
    """Multi-turn sessions; returns arrival, prompt, output, keys, session ids (sorted by arrival)."""
    conv = spec.conversation
    block = spec.prefix_block_tokens
    # Conversation starts: enough for num_requests turns (each has >= 1), or all within duration.
    if spec.num_requests is not None:
        starts = sample_arrivals(spec.arrival, rngs["arrival"], spec.num_requests)
        turns = sample_lengths(conv.turns, len(starts), rngs["turns"], "turns", empirical)
        cum = np.cumsum(turns)
        n_conv = int(np.searchsorted(cum, spec.num_requests, side="left")) + 1
        starts, turns = starts[:n_conv], turns[:n_conv].copy()
        turns[-1] -= int(cum[n_conv - 1]) - spec.num_requests  # trim the last conversation
    else:
        starts = sample_arrivals(spec.arrival, rngs["arrival"], duration_s=spec.duration_s)
        turns = sample_lengths(conv.turns, len(starts), rngs["turns"], "turns", empirical)
    n_conv = len(starts)
    n = int(turns.sum())
    if n > MAX_REQUESTS:
        raise TraceError(f"synthetic trace: {len(starts)} conversations x conversation.turns make {n} requests; "
                         f"at most {MAX_REQUESTS:,} (the num_requests limit)")
    message = sample_lengths(prompt_dist, n, rngs["prompt"], "prompt_tokens", empirical)
    output = sample_lengths(output_dist, n, rngs["output"], "output_tokens", empirical)
    think = conv.think_time_s
    think_s = (np.full(n, think.mean_s) if think.kind == "fixed"
               else rngs["think_time"].exponential(think.mean_s, size=n) if think.mean_s > 0 else np.zeros(n))
    has_sys = _system_prompt_mask(spec, n_conv, rngs["system_prompt"])
    sys_tokens = spec.system_prompt.tokens if spec.system_prompt else 0
    n_sys_keys = sys_tokens // block

    session = np.repeat(np.arange(n_conv, dtype=np.int64), turns)
    first = np.cumsum(turns) - turns  # index of each conversation's first turn
    turn_index = np.arange(n, dtype=np.int64) - np.repeat(first, turns)
    # Arrivals: start + cumulative think time of the turns before (turn 0 waits nothing).
    think_s = np.where(turn_index == 0, 0.0, think_s)
    arrival = np.repeat(starts, turns) + _segment_cumsum(think_s, first, turns)

    # Prompts: turn 0 = sys + message; turn k = prompt_{k-1} + output_{k-1} + message_k.
    prompt = np.empty(n, dtype=np.int64)
    keys: list[np.ndarray] = [None] * n  # type: ignore[list-item]
    next_key = n_sys_keys
    sys_keys = np.arange(n_sys_keys, dtype=np.int64)
    for c in range(n_conv):
        i0 = int(first[c])
        carry_keys = sys_keys if has_sys[c] else sys_keys[:0]
        history = sys_tokens if has_sys[c] else 0
        inherit = len(carry_keys)
        for i in range(i0, i0 + int(turns[c])):
            length = history + int(message[i])
            if length > MAX_TOKENS:
                raise TraceError(f"synthetic trace: conversation {c}, turn {i - i0 + 1}: the accumulated prompt "
                                 f"(system prompt + earlier prompts and outputs + message) has {length} tokens; a prompt "
                                 f"may have at most {MAX_TOKENS} (2**32): use fewer turns or shorter lengths")
            need = -(-length // block)
            fresh = np.arange(next_key, next_key + need - inherit, dtype=np.int64)
            next_key += need - inherit
            k = np.concatenate([carry_keys[:inherit], fresh])
            prompt[i] = length
            keys[i] = k
            # The next turn repeats this prompt and its answer; only full blocks keep their keys.
            history = length + int(output[i])
            carry_keys = k
            inherit = length // block

    order = np.argsort(arrival, kind="stable")
    if spec.duration_s is not None:  # later turns of late conversations fall past the horizon
        order = order[arrival[order] < spec.duration_s]
    return arrival[order], prompt[order], output[order], [keys[i] for i in order], session[order]


def _segment_cumsum(values: np.ndarray, first: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Cumulative sums restarting at each segment start."""
    total = np.cumsum(values)
    seg_base = np.repeat(total[first] - values[first], lengths)
    return total - seg_base
