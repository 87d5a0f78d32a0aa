"""Key findings: a few sentences computed from the runs' summaries, opening every report and
printed by ``kvsim compare`` above the headline table.

Each sentence is derived from ``summary.json`` numbers only (docs/metrics.md defines them):

* requests served: finished / total per run when any run left requests unserved;
* throughput: the run with the highest ``throughput_requests_per_s``, against the baseline;
* latency: the runs with the lowest ``ttft_s.p50`` and the lowest ``tpot_s.p50``, against the baseline;
* concurrency: the run with the highest ``concurrency.max`` (ties named together), against the
  baseline -- called a gain only when that run's throughput, median TTFT and normalized latency are
  equal (within ``SAME_WITHIN``, relative) or better than the baseline's; otherwise the sentence
  says which of them got worse (more requests in the batch served more slowly is no gain). TPOT is
  not among them: a larger batch lengthens every decode step, the price of concurrency, not a loss;
* fragmentation: ``kv.fragmentation_frac`` (share of *allocated* KV memory) of the baseline and the
  change of each extreme against it, in percentage points;
* prefix caching: the highest ``prefix_cache.hit_ratio_tokens`` when a run has prefix caching,
  beside the trace's ideal (``prefix_cache.ideal_hit_ratio_tokens``), and the runs below
  ``FAR_BELOW`` (half) of their ideal, with why and what raises it.

When the runs differ in trace, model, GPU or engine profile (``differ``) the findings open by
saying so and the concurrency sentence names what got worse without a cause.

With one run the sentences describe that run. A metric every run lacks is left out; a metric on
which every run agrees is said once ("all runs: ...").
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kvsim.report.tables import get_path

SAME_WITHIN = 0.01  # |change| <= 1 % of the baseline counts as "equal" for the concurrency caveat
SERVICE = ((("throughput_requests_per_s",), True, "throughput"), (("ttft_s", "p50"), False, "median TTFT"),
           (("normalized_latency_s_per_token",), False, "normalized latency"))


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _get(summary: dict, path: tuple[str, ...]) -> float | None:
    return _num(get_path(summary, path))


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _seconds(v: float) -> str:
    return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"


def _pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def _best(values: dict[str, float | None], higher: bool) -> tuple[list[str], float] | None:
    have = {k: v for k, v in values.items() if v is not None}
    if not have:
        return None
    best = (max if higher else min)(have.values())
    return [k for k, v in have.items() if v == best], best


def _extreme(name: str, values: dict[str, float | None], baseline: str, higher: bool,
             fmt: Callable[[float], str], what: str) -> str | None:
    """"Most requests at once: 15 with paged-16 (baseline contiguous-max: 7, +114.3 %)."""
    got = _best(values, higher)
    if got is None:
        return None
    labels, best = got
    have = [v for v in values.values() if v is not None]
    if len(values) == 1:
        return f"{name}: {fmt(best)}."
    if len(set(have)) == 1:
        if len(have) < len(values):  # runs without the metric (no prefix caching) are not "every run"
            return f"{name}: {fmt(best)} in every run that has it ({_names(labels)})."
        return f"{name}: {fmt(best)} in every run."
    base = values.get(baseline)
    tail = ""
    if baseline not in labels and base is not None:
        change = f", {(best - base) / abs(base) * 100:+.1f} %" if base != 0 else ""
        tail = f" (baseline {baseline}: {fmt(base)}{change})"
    elif baseline in labels:
        tail = " (the baseline)"
    return f"{what} {fmt(best)} with {_names(labels)}{tail}."


def _worse_service(s: dict, b: dict) -> list[str]:
    """What of throughput / median TTFT / normalized latency is worse in ``s`` than in ``b`` (beyond
    ``SAME_WITHIN``), as "throughput -20.0 %"; metrics either summary lacks are skipped."""
    worse = []
    for path, higher, name in SERVICE:
        v, w = _get(s, path), _get(b, path)
        if v is None or w is None or w == 0:
            continue
        change = (v - w) / abs(w)
        if (change < -SAME_WITHIN) if higher else (change > SAME_WITHIN):
            worse.append(f"{name} {100 * change:+.1f} %")
    return worse


def _concurrency(summaries: dict[str, dict], base: str, like_for_like: bool = True) -> str | None:
    """The most-requests-at-once sentence; a gain only with equal or better service (module doc)."""
    conc = {lab: _get(s, ("concurrency", "max")) for lab, s in summaries.items()}
    text = _extreme("Maximum concurrent requests", conc, base, True, lambda v: f"{v:.0f}", "Most requests at once:")
    got = _best(conc, True)
    if text is None or got is None or base in got[0] or base not in summaries:
        return text
    worse = {lab: w for lab in got[0] if (w := _worse_service(summaries[lab], summaries[base]))}
    if not worse:
        return text
    why = "; ".join(f"{lab}: {', '.join(w)}" for lab, w in worse.items())
    if not like_for_like:  # another trace, model, GPU or profile: no reading of the cause
        return text[:-1] + f", but no gain: against the baseline {why}."
    return (text[:-1] + f", but no gain: against the baseline {why} -- the extra requests in the batch "
            "are served more slowly.")


def key_findings(summaries: dict[str, dict], baseline: str | None = None, differ: list[str] = ()) -> list[str]:
    """The findings for runs ``{label: summary}`` (display order); ``baseline`` defaults to the first.
    ``differ``: what the runs do not share (trace, model, gpu, engine_profile:
    :func:`kvsim.report.workload.workload_differences`), said first; then no causal reading is made."""
    if not summaries:
        return []
    labels = list(summaries)
    base = baseline if baseline in summaries else labels[0]
    out: list[str] = []
    if differ:
        out.append(f"Not like for like: the runs differ in {_names(list(differ))}, so the changes below compare "
                   "the runs as a whole, not the effect of one setting.")

    lost = []
    for lab, s in summaries.items():
        total, fin = _get(s, ("requests_total",)), _get(s, ("requests_finished",))
        if total and fin is not None and fin < total:
            lost.append(f"{lab} {int(fin)}/{int(total)}")
    if lost:
        fracs = {ln.rsplit(" ", 1)[1] for ln in lost}
        if len(lost) == len(summaries) > 1 and len(fracs) == 1:
            out.append(f"Not every request was served: {fracs.pop()} finished in every run; "
                       "see \"Requests not served\".")
        else:
            out.append("Not every request was served (finished/total): " + ", ".join(lost)
                       + "; see \"Requests not served\".")

    thr = {lab: _get(s, ("throughput_requests_per_s",)) for lab, s in summaries.items()}
    out.append(_extreme("Throughput", thr, base, True, lambda v: f"{v:.3g} req/s", "Highest throughput:"))
    ttft = {lab: _get(s, ("ttft_s", "p50")) for lab, s in summaries.items()}
    out.append(_extreme("Median time to first token", ttft, base, False, _seconds, "Lowest median TTFT:"))
    tpot = {lab: _get(s, ("tpot_s", "p50")) for lab, s in summaries.items()}
    out.append(_extreme("Median time per output token", tpot, base, False, _seconds, "Lowest median TPOT:"))
    out.append(_concurrency(summaries, base, like_for_like=not differ))

    frag = {lab: _get(s, ("kv", "fragmentation_frac")) for lab, s in summaries.items()}
    have = {k: v for k, v in frag.items() if v is not None}
    if have:
        b = frag.get(base)
        if len(have) == 1 or b is None:
            out.append("KV fragmentation (share of allocated KV): "
                       + ", ".join(f"{k} {_pct(v)}" for k, v in have.items()) + ".")
        elif len(set(have.values())) == 1:
            out.append(f"KV fragmentation (share of allocated KV): {_pct(b)} in every run.")
        else:
            lo = min(have, key=have.get)
            hi = max(have, key=have.get)
            parts = [f"baseline {base} {_pct(b)}"]
            for k in dict.fromkeys([lo, hi]):
                if k != base:
                    parts.append(f"{k} {_pct(have[k])} ({100 * (have[k] - b):+.1f} points)")
            out.append("KV fragmentation (share of allocated KV): " + "; ".join(parts) + ".")

    out += _prefix_findings(summaries, base)
    return [s for s in out if s]


FAR_BELOW = 0.5  # a hit ratio under half the trace's ideal gets the explanation


def _prefix_findings(summaries: dict[str, dict], base: str) -> list[str | None]:
    """The highest prefix-cache hit ratio, beside the trace's ideal (``prefix_cache.ideal_hit_ratio_tokens``:
    an unbounded cache), and one line on the runs far below the ideal."""
    hit = {lab: _get(s, ("prefix_cache", "hit_ratio_tokens")) for lab, s in summaries.items()}
    if all(v is None for v in hit.values()):
        return []
    ideal = {lab: _get(s, ("prefix_cache", "ideal_hit_ratio_tokens")) for lab, s in summaries.items()}
    text = _extreme("Prefix-cache hit ratio (prompt tokens)", hit, base, True, _pct,
                    "Highest prefix-cache hit ratio (prompt tokens):")
    got = _best(hit, True)
    if text and got and (best_ideal := ideal.get(got[0][0])) is not None:
        text = text[:-1] + f"; the trace's ideal (an unbounded cache): {_pct(best_ideal)}."
    far = [f"{lab} {_pct(v)} vs {_pct(ideal[lab])}" for lab, v in hit.items()
           if v is not None and ideal.get(lab) and v < FAR_BELOW * ideal[lab]]
    note = None
    if far:
        note = ("Far below the trace's ideal prefix hit ratio: " + ", ".join(far) + ". The KV cache is too small "
                "to keep shared prefixes until they are reused; a larger KV budget (kv_budget) or offload "
                "tiers (allocator.offload) would raise it.")
    return [text, note]
