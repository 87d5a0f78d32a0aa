"""Summary statistics of a trace (``kvsim trace stats``).

Conventions (the same as ``/work/shared/traces/README.md``, so the numbers can be compared):

* ``duration_s`` = last arrival - first arrival; ``mean_rate_per_s`` = requests / duration_s.
* Quantiles use linear interpolation (numpy ``method="linear"``, pandas' default).
* ``interarrival_cv`` = population std / mean of the gaps between consecutive arrivals (1 for a
  Poisson process, > 1 bursty; gaps of 0 from equal timestamps count).
* Ideal prefix-cache hit ratio with an infinite cache, from the trace's own prefix keys: requests
  are replayed in order; request i hits its leading keys that appeared in any *earlier* request,
  stopping at the first unseen one. ``blocks`` = hits / all keys;
  ``tokens`` = ``sum(min(hits·S, prompt_tokens)) / sum(prompt_tokens)`` with S the key block size.
"""

from __future__ import annotations

import numpy as np

from kvsim.trace.schema import Trace


def _summary(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"mean": None, "p50": None, "p99": None, "max": None}
    q50, q99 = np.quantile(values, [0.5, 0.99], method="linear")
    return {"mean": float(values.mean()), "p50": float(q50), "p99": float(q99), "max": int(values.max())}


def leading_hits(trace: Trace) -> np.ndarray | None:
    """Per request, the number of leading prefix keys seen in an earlier request (int64)."""
    if trace.prefix_keys is None:
        return None
    n = len(trace)
    lengths = np.fromiter((k.shape[0] for k in trace.prefix_keys), np.int64, n)
    if lengths.sum() == 0:
        return np.zeros(n, dtype=np.int64)
    flat = np.concatenate([np.asarray(k, dtype=np.int64) for k in trace.prefix_keys])
    req = np.repeat(np.arange(n, dtype=np.int64), lengths)
    # First request in which each distinct key appears (np.unique's index is the first position).
    _, first_pos, inverse = np.unique(flat, return_index=True, return_inverse=True)
    seen_before = req[first_pos][inverse] < req
    starts = np.cumsum(lengths) - lengths
    pos_in_req = np.arange(flat.size, dtype=np.int64) - np.repeat(starts, lengths)
    # Position of the first unseen key in each request (its length if all were seen).
    first_miss = np.where(seen_before, np.iinfo(np.int64).max, pos_in_req)
    hits = lengths.copy()
    nonempty = lengths > 0
    mins = np.minimum.reduceat(first_miss, starts[nonempty])
    hits[nonempty] = np.minimum(mins, lengths[nonempty])
    return hits


def paged_ideal_hit_ratio(trace: Trace, block_size: int) -> dict | None:
    """The hit ratio a paged prefix cache of unbounded size reaches on ``trace`` (what
    ``allocator: {kind: paged, prefix_caching: true, block_size: B}`` measures when nothing is
    evicted and requests are admitted in arrival order): per request, in arrival order, the
    leading *full* B-token blocks whose keys an earlier request produced, at most
    ``(prompt - 1) // B`` of them (the last prompt token is always computed); a request with
    parallel samples or beams neither hits nor produces (the paged cache is bypassed for them). Ratios over
    ``sum(ceil(prompt / B))`` blocks and over all prompt tokens. It differs from the trace-level
    ``ideal_hit_ratio_*`` above, which also counts a request's partial last source block."""
    from kvsim.trace.prefix import block_keys

    keys = block_keys(trace, block_size)
    if keys is None:
        return None
    b = int(block_size)
    seen: set[int] = set()
    hit_blocks = 0
    samples = trace.num_samples
    for i, k in enumerate(keys):
        if samples is not None and samples[i] > 1:
            continue  # parallel samples / beams bypass the paged prefix cache: no hits, nothing cached
        limit = min((int(trace.prompt_tokens[i]) - 1) // b, k.shape[0])
        h = 0
        for key in k[:limit].tolist():
            if key not in seen:
                break
            h += 1
        hit_blocks += h
        seen.update(k.tolist())
    total_blocks = int(((trace.prompt_tokens + b - 1) // b).sum())
    return {
        "block_size": b,
        "hit_ratio_blocks": hit_blocks / total_blocks if total_blocks else 0.0,
        "hit_ratio_tokens": hit_blocks * b / float(trace.prompt_tokens.sum()),
    }


def trace_stats(trace: Trace, block_size: int | None = None) -> dict:
    """A JSON-able dict of summary statistics (see the module docstring for definitions).
    With ``block_size``, ``prefix.paged_ideal`` is :func:`paged_ideal_hit_ratio` at that
    block size."""
    n = len(trace)
    a = trace.arrival_s
    duration = float(a[-1] - a[0]) if n else 0.0
    gaps = np.diff(a)
    cv = None
    if gaps.size and gaps.mean() > 0:
        cv = float(gaps.std() / gaps.mean())
    out: dict = {
        "requests": n,
        "duration_s": duration,
        "mean_rate_per_s": (n / duration) if duration > 0 else None,
        "prompt_tokens": _summary(trace.prompt_tokens),
        "output_tokens": _summary(trace.output_tokens),
        "interarrival_cv": cv,
        "distinct_arrival_times": int(np.unique(a).size),
    }
    if trace.session_id is not None:
        out["sessions"] = int(np.unique(trace.session_id).size)
    if trace.num_samples is not None:
        out["num_samples"] = _summary(trace.num_samples)
        if trace.source.get("num_samples_kind"):
            out["num_samples"]["kind"] = trace.source["num_samples_kind"]
    if trace.priority is not None:
        levels, counts = np.unique(trace.priority, return_counts=True)
        out["priority_counts"] = {str(int(v)): int(c) for v, c in zip(levels, counts)}
    hits = leading_hits(trace)
    if hits is not None:
        block = int(trace.prefix_block_tokens)
        lengths = np.fromiter((k.shape[0] for k in trace.prefix_keys), np.int64, n)
        all_keys = int(lengths.sum())
        distinct = int(np.unique(np.concatenate(trace.prefix_keys)).size) if all_keys else 0
        hit_tokens = np.minimum(hits * block, trace.prompt_tokens)
        out["prefix"] = {
            "block_tokens": block,
            "blocks": all_keys,
            "distinct_blocks": distinct,
            "ideal_hit_ratio_blocks": float(hits.sum() / all_keys) if all_keys else None,
            "ideal_hit_ratio_tokens": float(hit_tokens.sum() / trace.prompt_tokens.sum()),
        }
        if block_size:
            out["prefix"]["paged_ideal"] = paged_ideal_hit_ratio(trace, block_size)
    else:
        out["prefix"] = None
    return out


def format_stats(stats: dict, title: str = "") -> str:
    """A neat two-column table for humans."""
    rows: list[tuple[str, str]] = []

    def num(v, digits=1) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, int):
            return f"{v:,}"
        return f"{v:,.{digits}f}"

    rows.append(("requests", num(stats["requests"])))
    d = stats["duration_s"]
    rows.append(("duration", f"{num(d)} s ({d / 60:,.1f} min)"))
    rows.append(("mean rate", f"{num(stats['mean_rate_per_s'], 2)} req/s"))
    rows.append(("inter-arrival CV", num(stats["interarrival_cv"], 2)))
    rows.append(("distinct arrival times", num(stats["distinct_arrival_times"])))
    for key, label in (("prompt_tokens", "prompt tokens"), ("output_tokens", "output tokens")):
        s = stats[key]
        rows.append((label, f"mean {num(s['mean'])} / p50 {num(s['p50'])} / p99 {num(s['p99'])} / max {num(s['max'])}"))
    if "sessions" in stats:
        rows.append(("sessions", num(stats["sessions"])))
    if "num_samples" in stats:
        s = stats["num_samples"]
        kind = f" ({s['kind']})" if s.get("kind") else ""
        rows.append(("samples per request", f"mean {num(s['mean'], 2)} / max {num(s['max'])}{kind}"))
    if "priority_counts" in stats:
        rows.append(("priorities", ", ".join(f"{k}: {v:,}" for k, v in stats["priority_counts"].items())))
    p = stats["prefix"]
    if p is None:
        rows.append(("ideal prefix hit", "n/a (no prefix keys)"))
    else:
        rows.append(("prefix blocks", f"{p['blocks']:,} of {p['block_tokens']} tokens, {p['distinct_blocks']:,} distinct"))
        rb, rt = p["ideal_hit_ratio_blocks"], p["ideal_hit_ratio_tokens"]
        rows.append(("ideal prefix hit", f"{rb * 100:.2f} % of blocks, {rt * 100:.2f} % of tokens" if rb is not None else "n/a"))
        pi = p.get("paged_ideal")
        if pi:
            rows.append((f"paged ideal ({pi['block_size']}-token blocks)",
                         f"{pi['hit_ratio_blocks'] * 100:.2f} % of blocks, {pi['hit_ratio_tokens'] * 100:.2f} % of tokens"))
    width = max(len(k) for k, _ in rows)
    lines = [title] if title else []
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    return "\n".join(lines)
