"""Whether the compared runs serve one workload on one setup: the same trace (content and slice),
model, GPU and engine profile. When they do not, a change against the baseline mixes the
settings being compared with these, so ``kvsim compare`` says which differ (a ``kvsim: note:``
line) and the key findings open with it and make no causal reading (kvsim/report/findings.py).

The request rate (``rate_scale``, ``rate_per_s``) is not part of the trace's identity: a rate
sweep compares one workload at several loads (docs/report.md, "Offered request rate").
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kvsim.report.runs import Run

SLICE = ("trace.start_s", "trace.end_s", "trace.skip_requests", "trace.max_requests")
ASPECTS = ("trace", "model", "gpu", "engine_profile")
SHOWN_LABELS = 3  # runs named per value; more are counted


def trace_identity(run: Run) -> str | None:
    """The trace a run replayed, in words: a file by name and content hash, a synthetic trace by
    preset and a hash of its spec without the arrival rate (and its seed); with the slice. None
    when the run does not record it (an in-memory result, an older run directory)."""
    p = run.params
    if run.trace.get("source") == "file" or p.get("trace.file"):
        sha = run.trace.get("content_sha256") or run.trace.get("sha256")
        name = Path(str(p.get("trace.file") or run.trace.get("file") or "?")).name
        source = f"{name} ({sha[:8]})" if sha else name
    elif any(k.startswith("trace.synthetic.") for k in p):
        spec = {k: v for k, v in p.items() if k.startswith("trace.synthetic.") and not k.endswith("rate_per_s")}
        spec["seed"] = p.get("trace.synthetic.seed") if p.get("trace.synthetic.seed") is not None else p.get("seed")
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:8]
        source = f"synthetic {p.get('trace.synthetic.preset') or 'custom'} ({digest})"
    else:
        return None
    cut = [f"{k.split('.')[1]} {p[k]}" for k in SLICE if p.get(k) not in (None, 0)]
    return source + (f" [{', '.join(cut)}]" if cut else "")


def _value(run: Run, aspect: str) -> str | None:
    if aspect == "trace":
        return trace_identity(run)
    v = run.params.get(f"{aspect}.name", run.params.get(aspect))
    if aspect == "engine_profile" and v is None:
        v = (run.summary.get("engine_profile") or {}).get("name") if isinstance(run.summary.get("engine_profile"),
                                                                               dict) else None
    return None if v is None else str(v)


def workload_differences(runs: list[Run]) -> list[str]:
    """One phrase per aspect (:data:`ASPECTS`) on which the runs that record it differ, e.g.
    ``model: OPT-13B (tiny); Llama-3-8B (a, b)``; [] when they agree (or record nothing)."""
    out = []
    for aspect in ASPECTS:
        groups: dict[str, list[str]] = {}
        for r in runs:
            v = _value(r, aspect)
            if v is not None:
                groups.setdefault(v, []).append(r.label)
        if len(groups) > 1:
            out.append(f"{aspect}: " + "; ".join(f"{v} ({_labels(labels)})" for v, labels in groups.items()))
    return out


def _labels(labels: list[str]) -> str:
    if len(labels) <= SHOWN_LABELS:
        return ", ".join(labels)
    return ", ".join(labels[:SHOWN_LABELS]) + f" and {len(labels) - SHOWN_LABELS} more"


def differences_note(diffs: list[str]) -> str:
    """The ``kvsim: note:`` line for :func:`workload_differences`."""
    aspects = ", ".join(d.split(":", 1)[0] for d in diffs)
    return (f"kvsim: note: compare: the runs differ in {aspects}, so a change against the baseline is not the "
            f"effect of the compared settings alone -- " + " | ".join(diffs))
