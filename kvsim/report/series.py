"""How compared runs group into series along a parameter, and the knee rule.

**Series.** Plots against a parameter draw one line per *series*: for a sweep, the points that
agree on every override except the x-axis key(s) (and on the variant); for plain run directories,
the runs with the same run name (variant name), or all runs as one series when every name is
unique.

**Knee rule** (rate plots and ``knees.csv``): per series, with points sorted by offered rate, the
knee is the highest rate up to which normalized latency (mean E2E / output tokens) stays within
``KNEE_FACTOR`` (2x) of its value at the lowest rate (only the first crossing counts). Past the
knee the engine cannot keep up and queues grow. If the lowest rate is itself saturated
(throughput below ``KEEP_UP`` = 80 % of the offered rate) the series has no knee in the tested
range: its knee is left empty and no star is drawn.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from kvsim.plots import MAX_LINES, pick_evenly
from kvsim.report.runs import Run
from kvsim.report.tables import is_missing

KNEE_FACTOR = 2.0
KEEP_UP = 0.8  # the lowest rate counts as unsaturated when throughput >= KEEP_UP x offered rate
BLOCK_KEY = "allocator.block_size"
RATE_KEYS = ("trace.rate_scale", "trace.synthetic.arrival.rate_per_s")
IGNORED_PARAMS = ("name", "description")


def varying_params(runs: list[Run]) -> list[str]:
    keys: list[str] = []
    for r in runs:
        keys += [k for k in r.params if k not in keys]
    out = []
    for k in keys:
        if k in IGNORED_PARAMS or k.split(".")[0] in IGNORED_PARAMS:
            continue
        vals = {json.dumps(r.params.get(k), sort_keys=True, default=str) for r in runs}
        if len(vals) > 1:
            out.append(k)
    return out


def distinct_values(runs: list[Run], key: str) -> list:
    vals = []
    for r in runs:
        v = r.params.get(key)
        if v is not None and v not in vals:
            vals.append(v)
    return vals


def rate_key(runs: list[Run]) -> str | None:
    cands = [k for k in RATE_KEYS if len(distinct_values(runs, k)) > 1]
    if not cands:
        cands = [k for k in varying_params(runs) if k.endswith(("rate_scale", "rate_per_s"))]
    return cands[0] if cands else None


GENERIC_KEY_NAMES = ("kind", "k", "name", "file", "preset", "tokens", "mode", "policy", "enabled")


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key's shortest trailing part that no other key in ``keys`` ends with
    (``allocator.eviction.kind`` -> ``eviction.kind`` next to ``allocator.kind``; else ``kind``)."""
    out = {}
    for k in keys:
        parts = k.split(".")
        first = 2 if parts[-1] in GENERIC_KEY_NAMES and len(parts) > 1 else 1
        for n in range(first, len(parts) + 1):
            cand = ".".join(parts[-n:])
            if not any(o != k and (o == cand or o.endswith("." + cand)) for o in keys):
                break
        out[k] = cand
    return out


def _excluded(k: str, exclude: tuple[str, ...]) -> bool:
    return any(k == e or k.startswith(e + ".") for e in exclude)


def _group(runs: list[Run], keys: list[str]) -> dict[tuple, list[Run]]:
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        sig = tuple(json.dumps(r.params.get(k), sort_keys=True, default=str) for k in keys)
        groups.setdefault(sig, []).append(r)
    return groups


def series_of(runs: list[Run], exclude: tuple[str, ...], x=None) -> dict[str, list[Run]]:
    """Group runs into series: runs that agree on every resolved-scenario key that differs between
    ``runs``, except the x-axis keys ``exclude`` (and keys under them). Labels are the differing
    keys as ``key=value`` (shortest unambiguous key names; keys a run leaves unset are not shown);
    a one-run series of run directories also names its run. When ``x`` (run -> x value) is given
    and a series would hold two runs at the same x, the excluded keys group too (nothing drawn
    over anything else). One series of all runs is labelled "all runs"."""
    varying = varying_params(runs)
    keys = [k for k in varying if not _excluded(k, exclude)]
    groups = _group(runs, keys)
    if x is not None:
        def clash(rs):
            xs = [x(r) for r in rs]
            return len(set(xs)) < len(xs)

        if any(clash(rs) for rs in groups.values()):
            keys = varying
            groups = _group(runs, keys)
    names = short_keys(keys)
    out: dict[str, list[Run]] = {}
    for rs in groups.values():
        r0 = rs[0]
        parts = [f"{names[k]}={value_text(r0.params.get(k))}" for k in keys if r0.params.get(k) is not None]
        label = ", ".join(parts)
        if len(rs) == 1 and r0.point_id is None and r0.label != label:
            label = f"{r0.label}: {label}" if label else r0.label
        label = label or "all runs"
        while label in out:
            label += "'"
        out[label] = rs
    return out


def value_text(v: Any) -> str:
    if isinstance(v, float) and v == int(v):
        return str(int(v))
    return str(v)


def pick_runs(runs: list[Run], n: int = MAX_LINES) -> list[Run]:
    return pick_evenly(runs, n)


# ---------------------------------------------------------------------------------------------------


def knee_of(points: list[tuple[float, float]], factor: float = KNEE_FACTOR,
            throughputs: list[float] | None = None) -> int | None:
    """Index (into ``points`` = [(rate, normalized latency)] sorted by rate) of the knee: the last
    point before normalized latency first exceeds ``factor`` x its lowest-rate value. None when
    the series is empty, or when ``throughputs`` shows the lowest rate already saturated (the
    engine finished fewer than ``KEEP_UP`` x the offered rate): the knee is then below the range."""
    pts = [(x, y) for x, y in points if not is_missing(x) and not is_missing(y)]
    if not pts or pts[0][1] <= 0:
        return None
    if throughputs:
        t0 = throughputs[0]
        if not is_missing(t0) and not is_missing(points[0][0]) and t0 < KEEP_UP * points[0][0]:
            return None
    base = pts[0][1]
    knee = 0
    for i, (_, y) in enumerate(pts):
        if y > factor * base:
            break
        knee = i
    return knee


# ---------------------------------------------------------------------------------------------------
# Plots


def rate_series(runs: list[Run], key: str) -> dict[str, list[Run]]:
    groups = series_of(runs, (key, "trace.synthetic.arrival"), x=lambda r: r.params.get(key))
    return {g: sorted(rs, key=lambda r: (r.offered_rate() or 0.0)) for g, rs in groups.items()}


def knees_frame(runs: list[Run], key: str) -> pd.DataFrame:
    rows = []
    for g, rs in rate_series(runs, key).items():
        pts = [(r.offered_rate(), r.summary.get("normalized_latency_s_per_token")) for r in rs]
        k = knee_of(pts, throughputs=[r.summary.get("throughput_requests_per_s") for r in rs])
        knee = rs[k] if k is not None else None
        rows.append({
            "series": g,
            "points": len(rs),
            "knee_rate_req_per_s": knee.offered_rate() if knee else None,
            f"knee_{key}": knee.params.get(key) if knee else None,
            "knee_label": knee.label if knee else None,
            "normalized_latency_at_lowest_rate": pts[0][1] if pts else None,
            "normalized_latency_at_knee": pts[k][1] if k is not None else None,
            "throughput_requests_per_s_at_knee": knee.summary.get("throughput_requests_per_s") if knee else None,
            "knee_rule": f"highest rate with normalized latency <= {KNEE_FACTOR:g} x its lowest-rate value; "
                         f"empty when the lowest rate is already saturated (throughput < {KEEP_UP:g} x offered)",
        })
    return pd.DataFrame(rows)
