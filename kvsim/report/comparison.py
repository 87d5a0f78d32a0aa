"""``kvsim compare``: comparison tables and plots over run directories or a sweep directory.

Inputs: single-run directories (``summary.json``), variants directories (subdirectories with
``summary.json``), or a sweep directory (``index.parquet`` + ``points/``; only ok points). Outputs
(``OUT``, default ``<input>/compare`` for one input):

* ``comparison.csv`` -- one row per run: label, source, the sweep's override columns (or the
  scenario keys that differ between runs), ``offered_rate_req_per_s``, every metric column of
  :mod:`kvsim.report.tables`;
* ``fragmentation_breakdown.png`` (always), ``concurrency_comparison.png`` (always),
  ``memory_over_time.png`` (always), ``latency_cdf.png`` (always);
* ``concurrency_vs_block_size.png`` -- when ``allocator.block_size`` takes 2+ values;
* ``throughput_vs_rate.png``, ``normalized_latency_vs_rate.png`` and ``knees.csv`` -- when a
  request-rate key (``trace.rate_scale``, ``trace.synthetic.arrival.rate_per_s``, any key ending in
  ``rate_scale`` / ``rate_per_s``) takes 2+ values;
* ``prefix_hit_ratio_vs_capacity.png`` -- when a summary has ``prefix_cache.hit_ratio_tokens``;
* ``step_time_breakdown.png``, ``bandwidth_utilisation.png`` -- when a summary has the step-time
  breakdown / a bandwidth utilisation (:mod:`kvsim.report.access`);
* ``latency_vs_block_size.png`` and ``bandwidth_vs_block_size.png`` -- when ``allocator.block_size``
  takes 2+ values (bandwidth: ``kv_access.hbm_bandwidth_utilisation``, any timing model with an
  attention kernel; calibrated timing's ``kv_bandwidth_utilisation`` where that is missing).

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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from kvsim.errors import KvsimError

# pyplot comes from kvsim.plots, which selects the Agg backend before importing it.
from kvsim.plots import (
    MAX_LINES,
    METADATA,
    _time_binned,
    legend_outside,
    line_style,
    note_dropped,
    pick_evenly,
    plot_concurrency_comparison,
    plot_fragmentation_bars,
    plot_latency_cdfs,
    plt,
)
from kvsim.report.tables import (
    flatten,
    get_path,
    is_missing,
    point_labels,
    prefix_hit_value,
    resolved_scenario,
    summary_metrics,
)
from kvsim.results import write_text_atomic

KNEE_FACTOR = 2.0
KEEP_UP = 0.8  # the lowest rate counts as unsaturated when throughput >= KEEP_UP x offered rate
BLOCK_KEY = "allocator.block_size"
RATE_KEYS = ("trace.rate_scale", "trace.synthetic.arrival.rate_per_s")
IGNORED_PARAMS = ("name", "description")

PLOT_CAPTIONS = {
    "fragmentation_breakdown.png": "KV memory breakdown (time-weighted): token states, reservation, internal and "
                                   "external fragmentation, free -- as in the vLLM paper's Fig. 2",
    "concurrency_comparison.png": "Max and time-weighted mean number of running requests",
    "concurrency_vs_block_size.png": "Max (solid) and mean (dashed) concurrency vs paged block size",
    "memory_over_time.png": "KV memory in use (1 - free - external fragmentation), time-binned",
    "latency_cdf.png": "TTFT, TPOT and end-to-end latency CDFs (finished requests)",
    "throughput_vs_rate.png": "Throughput vs offered request rate (knee marked)",
    "normalized_latency_vs_rate.png": "Normalized latency (mean E2E / output tokens) vs offered request rate; "
                                      f"knee = highest rate within {KNEE_FACTOR:g}x of the lowest-rate value",
    "prefix_hit_ratio_vs_capacity.png": "Prefix-cache hit ratio (tokens) vs KV cache capacity",
    "bandwidth_vs_block_size.png": "Attention's KV-read bandwidth utilisation (% of peak HBM) vs block size",
    "latency_vs_block_size.png": "TTFT and TPOT (p50 solid, p99 dashed) vs block size",
    "step_time_breakdown.png": "Step time by part: attention, GEMMs, overhead, swaps (% of busy time)",
    "bandwidth_utilisation.png": "Attention's KV-read bandwidth utilisation by run",
}


@dataclass
class Run:
    label: str
    path: Path | None                 # None: an in-memory result (kvsim.run)
    summary: dict
    params: dict                      # the resolved scenario, flattened to dotted keys
    point_id: str | None = None       # sweep points only
    variant: str | None = None        # sweep points of a base with variants
    overrides: dict = field(default_factory=dict)  # sweep points: override key -> value
    _rate: float | None = None

    @property
    def name(self) -> str:
        return str(self.summary.get("name", self.label))

    def offered_rate(self) -> float | None:
        """Requests per second offered by the trace: (n - 1) / (last arrival - first arrival)."""
        if self._rate is None:
            if self.path is None:
                return None
            p = self.path / "requests.parquet"
            if not p.exists():
                return None
            a = pd.read_parquet(p, columns=["arrival_s"])["arrival_s"].to_numpy()
            self._rate = float((len(a) - 1) / (a.max() - a.min())) if len(a) > 1 and a.max() > a.min() else math.nan
        return None if math.isnan(self._rate) else self._rate


# ---------------------------------------------------------------------------------------------------
# Collecting runs


def _is_sweep_dir(p: Path) -> bool:
    return (p / "index.parquet").exists() and (p / "points").is_dir()


def _load_run(path: Path, label: str, **kw) -> Run:
    summary = json.loads((path / "summary.json").read_text())
    params = flatten(resolved_scenario(path) or {})
    return Run(label=label, path=path, summary=summary, params=params, **kw)


def collect_runs(paths: list[str | Path]) -> tuple[list[Run], dict]:
    """Runs of every input, in order. ``meta``: ``sweep`` (bool), ``override_keys``, ``failed``."""
    runs: list[Run] = []
    meta: dict[str, Any] = {"sweep": False, "override_keys": [], "failed": []}
    for raw in paths:
        p = Path(raw)
        if _is_sweep_dir(p):
            meta["sweep"] = True
            idx = pd.read_parquet(p / "index.parquet")
            keys = []
            if (p / "sweep.resolved.yaml").exists():
                keys = (yaml.safe_load((p / "sweep.resolved.yaml").read_text()) or {}).get("override_keys") or []
            keys = [k for k in keys if k in idx.columns]
            meta["override_keys"] += [k for k in keys if k not in meta["override_keys"]]
            labels = point_labels([row.to_dict() for _, row in idx.iterrows()])
            for label, (_, row) in zip(labels, idx.iterrows()):
                if row["status"] != "ok":
                    meta["failed"].append(str(row["point_id"]))
                    continue
                pid = str(row["point_id"])
                variant = row.get("variant") if isinstance(row.get("variant"), str) else None
                ov = {k: (None if is_missing(row[k]) else _py(row[k])) for k in keys}
                runs.append(_load_run(p / str(row["run_dir"]), label, point_id=pid, variant=variant, overrides=ov))
        elif (p / "summary.json").exists():
            s = json.loads((p / "summary.json").read_text())
            runs.append(_load_run(p, str(s.get("name", p.name))))
        elif p.is_dir() and any((c / "summary.json").exists() for c in p.iterdir()):
            for name in variant_order(p):
                runs.append(_load_run(p / name, name))
        else:
            raise KvsimError(f"{p}: not a kvsim run, variants or sweep directory (no summary.json, no index.parquet)")
    labels = [r.label for r in runs]
    if len(set(labels)) < len(labels):  # same variant names from several inputs: qualify them
        for r in runs:
            if labels.count(r.label) > 1:
                r.label = f"{r.path.parent.name}/{r.label}" if r.point_id is None else (r.point_id or r.label)
        twice = [r.label for r in runs]
        for r in runs:  # inputs with the same directory name (a/study, b/study): one more level
            if twice.count(r.label) > 1 and r.point_id is None:
                r.label = f"{r.path.parent.parent.name}/{r.label}"
    if not runs:
        raise KvsimError("nothing to compare: no complete runs in " + ", ".join(str(p) for p in paths))
    return runs, meta


def _py(v):
    return v.item() if hasattr(v, "item") else v


def variant_order(run_dir: Path) -> list[str]:
    """The variant subdirectories of ``run_dir`` in the scenario's order (``scenario.resolved.yaml``
    lists the runs as the scenario file does, baseline first when ``baseline:`` names one); any
    other subdirectory with a ``summary.json`` after them, by name. One order for every table,
    plot and report of a run."""
    run_dir = Path(run_dir)
    have = sorted(c.name for c in run_dir.iterdir() if (c / "summary.json").exists())
    runs: dict = {}
    path = run_dir / "scenario.resolved.yaml"
    if path.exists():
        try:
            runs = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("runs") or {}
        except yaml.YAMLError:
            runs = {}
    order = [str(n) for n in runs if str(n) in have] + [n for n in have if n not in runs]
    base = next((r.get("scenario", {}).get("baseline") for r in runs.values()
                 if isinstance(r, dict) and isinstance(r.get("scenario"), dict)), None)
    if isinstance(base, str) and base in order:
        order.remove(base)
        order.insert(0, base)
    return order


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


def _distinct(runs: list[Run], key: str) -> list:
    vals = []
    for r in runs:
        v = r.params.get(key)
        if v is not None and v not in vals:
            vals.append(v)
    return vals


def rate_key(runs: list[Run]) -> str | None:
    cands = [k for k in RATE_KEYS if len(_distinct(runs, k)) > 1]
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
        parts = [f"{names[k]}={_fmt_val(r0.params.get(k))}" for k in keys if r0.params.get(k) is not None]
        label = ", ".join(parts)
        if len(rs) == 1 and r0.point_id is None and r0.label != label:
            label = f"{r0.label}: {label}" if label else r0.label
        label = label or "all runs"
        while label in out:
            label += "'"
        out[label] = rs
    return out


def _fmt_val(v: Any) -> str:
    if isinstance(v, float) and v == int(v):
        return str(int(v))
    return str(v)


def _pick(runs: list[Run], n: int = MAX_LINES) -> list[Run]:
    return pick_evenly(runs, n)


# ---------------------------------------------------------------------------------------------------
# Tables

VLLM_LATENCIES = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("itl", "itl_s"), ("e2el", "e2e_s"))


def _vllm_pword(q: float) -> str:
    """vLLM's percentile label: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(q)) if float(q) == int(q) else f"{q:g}"


def vllm_metrics(summary: dict) -> dict[str, Any]:
    """One run's metrics as ``vllm bench serve`` names them (its result JSON keys), times in ms.

    From ``summary.json → serving`` (and ``slo`` for ``request_goodput``); a summary from an older
    kvsim without ``serving`` falls back to the seconds distributions (mean, p50 as median, p90, p99)."""
    sv = summary.get("serving")
    row: dict[str, Any] = {}
    if isinstance(sv, dict):
        row.update({"completed": sv.get("completed"), "duration": summary.get("duration_s"),
                    "total_input_tokens": sv.get("total_input_tokens"),
                    "total_output_tokens": sv.get("total_output_tokens"),
                    "request_throughput": sv.get("request_throughput"),
                    "request_goodput": get_path(summary, ("slo", "goodput_requests_per_s")),
                    "output_throughput": sv.get("output_throughput"),
                    "total_token_throughput": sv.get("total_token_throughput")})
        percentiles = sv.get("percentiles") or []
        for name, _ in VLLM_LATENCIES:
            d = sv.get(f"{name}_ms") or {}
            row[f"mean_{name}_ms"] = d.get("mean")
            row[f"median_{name}_ms"] = d.get("median")
            row[f"std_{name}_ms"] = d.get("std")
            for q in percentiles:
                row[f"p{_vllm_pword(q)}_{name}_ms"] = d.get(f"p{q:g}")
        return row
    row.update({"completed": summary.get("requests_finished"), "duration": summary.get("duration_s"),
                "request_throughput": summary.get("throughput_requests_per_s"),
                "request_goodput": None, "output_throughput": summary.get("throughput_output_tokens_per_s")})
    for name, key in VLLM_LATENCIES:
        d = summary.get(key) or {}
        ms = (lambda v: None if not isinstance(v, (int, float)) else v * 1000.0)
        row[f"mean_{name}_ms"] = ms(d.get("mean"))
        row[f"median_{name}_ms"] = ms(d.get("p50"))
        row[f"std_{name}_ms"] = ms(d.get("std"))
        for q in (90, 99):
            row[f"p{q}_{name}_ms"] = ms(d.get(f"p{q}"))
    return row


def vllm_frame(runs: list[Run], meta: dict) -> pd.DataFrame:
    """``comparison_vllm.csv``: the comparison table's label, source and parameter columns, then
    :func:`vllm_metrics` (vLLM's names, ms)."""
    base = comparison_frame(runs, meta)
    metric_cols = set(summary_metrics(runs[0].summary)) if runs else set()
    keep = [c for c in base.columns if c not in metric_cols]
    rows = [vllm_metrics(r.summary) for r in runs]
    return pd.concat([base[keep].reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def _fixed2(v: Any) -> str:
    """vLLM's console format: integers as they are, other numbers with 2 decimals."""
    v = _py(v)
    if is_missing(v):
        return "n/a"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.2f}"
    return str(int(v)) if isinstance(v, (int, float)) else str(v)


def table_text(df: pd.DataFrame, key: str = "label", fmt=_fixed2) -> str:
    """A transposed plain-text view (one line per metric, one column per run) for the console."""
    cols = [str(v) for v in df[key]]
    names = [c for c in df.columns if c != key and c != "source"]
    cells = [[n] + [fmt(df[n].iloc[i]) for i in range(len(df))] for n in names]
    header = ["metric"] + cols
    widths = [max(len(r[i]) for r in [header, *cells]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [header, *cells])


def baseline_of(runs: list[Run], baseline: str | None = None) -> str:
    """The headline's baseline label: ``baseline`` (a label, or a run/variant name), else the
    scenario's ``baseline:`` key, else the first run."""
    return baseline_choice(runs, baseline)[0]


def baseline_choice(runs: list[Run], baseline: str | None = None) -> tuple[str, str]:
    """(baseline label, why it is the baseline): as :func:`baseline_of`, with the reason in words
    ("--baseline X", the ``baseline:`` key of which run's scenario, or "the first run")."""
    labels = [r.label for r in runs]
    if baseline is not None:
        for r in runs:
            if baseline in (r.label, r.name, r.variant):
                return r.label, f"--baseline {baseline}"
        raise KvsimError(f"compare: --baseline {baseline!r} names no run; runs: {', '.join(labels)}")
    for src in runs:
        w = src.params.get("baseline")
        if not isinstance(w, str):
            continue
        home = lambda r: None if r.path is None else r.path.parent  # noqa: E731 -- the input directory
        for r in sorted(runs, key=lambda r: home(r) != home(src)):  # a run of the same input first
            if w in (r.label, r.name, r.variant):
                where = f" ({src.path.parent if src.point_id is None else src.path.parent.parent})" if src.path else ""
                return r.label, f"the scenario's baseline: {w} key{where}"
    return labels[0], "the first run (no --baseline, no baseline: key)"


def comparison_frame(runs: list[Run], meta: dict | None = None, *, source_root: Path | None = None) -> pd.DataFrame:
    """THE ``comparison.csv`` layout, for ``kvsim run`` (variants) and ``kvsim compare`` alike: one
    row per run in display order (scenario order, baseline first), columns ``label``, ``source``
    (relative to ``source_root`` when given), ``point_id``/``variant`` for sweeps, the parameter
    columns (a sweep's override keys, else the resolved-scenario keys that differ between the runs),
    ``offered_rate_req_per_s``, then :func:`kvsim.report.tables.summary_metrics` (with the
    ``prefix_cache_*`` hit ratios when prefix caching is on)."""
    meta = meta or {"sweep": False, "override_keys": []}
    param_keys = meta["override_keys"] if meta["sweep"] else varying_params(runs)
    rows = []
    for r in runs:
        if r.path is None:
            source = ""
        elif source_root is not None:
            try:
                source = Path(r.path).relative_to(source_root).as_posix() or "."
            except ValueError:
                source = str(r.path)
        else:
            source = str(r.path)
        row: dict[str, Any] = {"label": r.label, "source": source}
        if meta["sweep"]:
            row["point_id"] = r.point_id
            if any(x.variant for x in runs):
                row["variant"] = r.variant
        for k in param_keys:
            v = r.overrides.get(k) if r.point_id is not None and k in r.overrides else r.params.get(k)
            row[k] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
        row["offered_rate_req_per_s"] = r.offered_rate()
        row.update(summary_metrics(r.summary))
        rows.append(row)
    df = pd.DataFrame(rows)
    for k in param_keys:  # one type per column (parquet): mixed values become text
        if k in df.columns and df[k].dtype == object:
            types = {type(v) for v in df[k] if not is_missing(v)}
            if len(types) > 1:
                df[k] = [None if is_missing(v) else str(v) for v in df[k]]
    return df


def in_memory_runs(results: dict) -> list[Run]:
    """Runs for :func:`comparison_frame` from ``{name: RunResult}`` (``kvsim.run``) or
    ``{name: summary dict}``: parameters from each result's scenario, offered rate from its requests."""
    from kvsim.simulate import resolved_dict

    runs = []
    for name, res in results.items():
        if isinstance(res, dict):
            runs.append(Run(label=str(name), path=None, summary=res, params={}))
            continue
        arr = res.requests["arrival_s"].to_numpy() if "arrival_s" in res.requests else None
        rate = math.nan
        if arr is not None and len(arr) > 1 and arr.max() > arr.min():
            rate = float((len(arr) - 1) / (arr.max() - arr.min()))
        runs.append(Run(label=str(name), path=None, summary={"name": name, **res.summary},
                        params=flatten(resolved_dict(res.scenario)), _rate=rate))
    return runs


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


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)
    return path


def _log2_axis(ax, values) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ticks = sorted({float(v) for v in values if v})
    if ticks:
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([_fmt_val(t) for t in ticks])


def _legend(ax, n: int) -> None:
    legend_outside(ax, n)


def _draw_series(ax, groups: dict[str, list[Run]], xfn, yfn, *, suffix: str = "", style_offset: int = 0,
                 linestyle: str | None = None, marker: str | None = None) -> list[str]:
    """One line per series (colour, dash and marker from kvsim.plots.line_style; a one-point series
    is a marker), points in ``xfn`` order. With a single series of a few runs, each point is
    annotated with its run label. At most MAX_LINES series (evenly chosen); returns the labels drawn."""
    shown = pick_evenly(list(groups))
    for i, g in enumerate(shown):
        rs = sorted(groups[g], key=lambda r: xfn(r) or 0)
        st = line_style(i + style_offset)
        xs, ys = [xfn(r) for r in rs], [yfn(r) for r in rs]
        ax.plot(xs, ys, color=st["color"], linestyle=linestyle or st["linestyle"], marker=marker or st["marker"],
                markersize=6, label=f"{g}{suffix}" if g != "all runs" or suffix else g)
        if len(groups) == 1 and len(rs) <= 12 and not suffix.strip().startswith("mean"):
            for r, xv, yv in zip(rs, xs, ys):
                if not is_missing(xv) and not is_missing(yv):
                    ax.annotate(r.label, (xv, yv), textcoords="offset points", xytext=(5, 5), fontsize=7,
                                color=st["color"])
    return shown


def plot_memory_over_time(runs: list[Run], path: Path, bins: int = 400) -> Path:
    fig, ax = plt.subplots(figsize=(10 + 2 * (len(runs) > 20), 4.5))
    shown = _pick(runs)
    for i, r in enumerate(shown):
        steps_path = r.path / "steps.parquet"
        if not steps_path.exists():
            continue
        steps = pd.read_parquet(steps_path, columns=["start_s", "duration_s", "free_bytes", "external_frag_bytes"])
        cap = get_path(r.summary, ("kv", "capacity_bytes"))
        t, v = _time_binned(steps, ["free_bytes", "external_frag_bytes"], bins=bins)
        if not cap or len(t) == 0:
            continue
        used = 1.0 - (v["free_bytes"] + v["external_frag_bytes"]) / cap
        st = line_style(i)
        ax.step(t, 100 * used, where="post", label=r.label, linewidth=1.2, color=st["color"],
                linestyle=st["linestyle"])
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("% of KV capacity in use")
    ax.set_ylim(0, 105)
    ax.set_title("KV memory in use over time (1 - free - external fragmentation)")
    ax.grid(alpha=0.3)
    legend_outside(ax, max(2, len(shown)))
    fig.tight_layout()
    note_dropped(fig, len(shown), len(runs))
    return _save(fig, path)


def plot_concurrency_vs_block_size(runs: list[Run], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.8))
    have = [r for r in runs if r.params.get(BLOCK_KEY) is not None]
    groups = series_of(have, (BLOCK_KEY,), x=lambda r: r.params[BLOCK_KEY])
    bs = lambda r: r.params[BLOCK_KEY]  # noqa: E731
    shown = _draw_series(ax, groups, bs, lambda r: r.summary["concurrency"]["max"], suffix=" (max)", linestyle="-")
    _draw_series(ax, {g: groups[g] for g in shown}, bs, lambda r: r.summary["concurrency"]["mean"],
                 suffix=" (mean)", linestyle="--", marker="s")
    _log2_axis(ax, [r.params.get(BLOCK_KEY) for r in have])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("running requests")
    ax.set_title("Concurrency vs block size: max (solid), time-weighted mean (dashed)")
    ax.grid(alpha=0.3)
    _legend(ax, 2 * len(shown))
    fig.tight_layout()
    note_dropped(fig, len(shown), len(groups))
    return _save(fig, path)


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


def plot_vs_rate(runs: list[Run], key: str, metric: str, ylabel: str, title: str, path: Path,
                 log_y: bool = False) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.8))
    groups = rate_series(runs, key)
    shown = pick_evenly(list(groups))
    for i, g in enumerate(shown):
        rs = groups[g]
        x = [r.offered_rate() for r in rs]
        y = [r.summary.get(metric) for r in rs]
        nl = [(r.offered_rate(), r.summary.get("normalized_latency_s_per_token")) for r in rs]
        st = line_style(i)
        ax.plot(x, y, color=st["color"], linestyle=st["linestyle"], marker=st["marker"], label=g)
        k = knee_of(nl, throughputs=[r.summary.get("throughput_requests_per_s") for r in rs])
        if k is not None and not is_missing(y[k]):
            ax.plot([x[k]], [y[k]], marker="*", markersize=16, color=st["color"], markeredgecolor="black", zorder=5)
            ax.axvline(x[k], color=st["color"], linestyle=":", alpha=0.6)
            ax.annotate(f"knee {x[k]:.3g} req/s", (x[k], y[k]), textcoords="offset points", xytext=(6, 6),
                        fontsize=8, color=st["color"])
    ax.set_xlabel(f"offered request rate (req/s; varied by {key})")
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    _legend(ax, len(shown))
    fig.tight_layout()
    note_dropped(fig, len(shown), len(groups))
    return _save(fig, path)


CAPACITY_KEYS = ("kv_budget", "gpu", "kv_dtype", "model", "parallel")


CAPACITY_SAME_WITHIN = 0.02  # capacities this close (relative), or within one block, are one capacity


def _capacity_tokens(r: Run):
    return (get_path(r.summary, ("prefix_cache", "capacity_tokens"))
            or get_path(r.summary, ("kv", "capacity_tokens")))


def capacity_levels(runs: list[Run]) -> dict[str, float]:
    """{run label: its KV capacity level}: capacities that differ by at most one block (the largest
    block size of the runs) or ``CAPACITY_SAME_WITHIN`` are one level (the smallest of them) --
    variants with the same budget differ only by block rounding, not in capacity."""
    caps = {r.label: float(c) for r in runs if (c := _capacity_tokens(r))}
    block = max([float(get_path(r.summary, ("kv", "block_size")) or 1) for r in runs] or [1.0])
    levels: dict[str, float] = {}
    start = None
    for lab, c in sorted(caps.items(), key=lambda kv: kv[1]):
        if start is None or (c - start > block and c > start * (1 + CAPACITY_SAME_WITHIN)):
            start = c
        levels[lab] = start
    return levels


def plot_prefix_hit_vs_capacity(runs: list[Run], path: Path) -> Path:
    """Hit ratio against capacity where capacities really differ (a line per series, one x tick
    per capacity level); a bar per run where they do not (:func:`capacity_levels`)."""
    fig, ax = plt.subplots(figsize=(10, 4.8))
    have = [r for r in runs if prefix_hit_value(r.summary) is not None]
    levels = capacity_levels(have)
    distinct = sorted(set(levels.values()))
    if len(distinct) <= 1:
        shown = pick_evenly(have, 3 * MAX_LINES)
        xs = range(len(shown))
        ax.bar(xs, [100 * prefix_hit_value(r.summary) for r in shown],
               color=[line_style(i)["color"] for i in xs])
        ax.set_xticks(list(xs), [r.label for r in shown], rotation=20 if len(shown) > 4 else 0, ha="right"
                      if len(shown) > 4 else "center")
        cap = f"{distinct[0]:,.0f} tokens" if distinct else "unknown"
        ax.set_xlabel(f"run (KV cache capacity {cap} in every run, up to block rounding)")
        n_series = len(have)
        ideals = {v for r in shown if (v := get_path(r.summary, ("prefix_cache", "ideal_hit_ratio_tokens"))) is not None}
        if len(ideals) == 1:
            ax.axhline(100 * ideals.pop(), color="black", linestyle="--", linewidth=1,
                       label="the trace's ideal (unbounded cache)")
            ax.legend(loc="lower right", fontsize=8)
    else:
        from matplotlib.ticker import FixedLocator, NullLocator

        lv = lambda r: levels.get(r.label)  # noqa: E731
        groups = series_of(have, CAPACITY_KEYS, x=lv)
        shown = _draw_series(ax, groups, lv, lambda r: 100 * prefix_hit_value(r.summary))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(distinct))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{c:,.0f}" for c in distinct])
        ax.set_xlabel("KV cache capacity (tokens, log scale)")
        n_series = len(groups)
        _legend(ax, len(shown))
    ax.set_ylabel("prefix-cache hit ratio (% of prompt tokens)")
    ax.set_ylim(bottom=0)
    ax.set_title("Prefix-cache hit ratio vs capacity" if len(distinct) > 1 else
                 "Prefix-cache hit ratio by run (one KV capacity)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    note_dropped(fig, len(shown), n_series)
    return _save(fig, path)


def _bandwidth_pct(r: Run) -> float | None:
    """kv_access.hbm_bandwidth_utilisation (every timing model with an attention kernel), else
    calibrated timing's kv_bandwidth_utilisation, in %."""
    from kvsim.report.access import bandwidth_values

    v = bandwidth_values(r.summary)
    got = v.get("hbm", v.get("copy"))
    return None if got is None else 100 * got


def plot_bandwidth_vs_block_size(runs: list[Run], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.8))
    have = [r for r in runs if _bandwidth_pct(r) is not None]

    def bs(r: Run):
        return get_path(r.summary, ("kv", "block_size")) or r.params.get(BLOCK_KEY) or 1

    groups = series_of(have, (BLOCK_KEY,), x=bs)
    shown = _draw_series(ax, groups, bs, _bandwidth_pct)
    _log2_axis(ax, [bs(r) for r in have])
    ax.set_xlabel("block size (tokens)")
    ax.set_ylabel("KV-read bandwidth utilisation (% of peak HBM)")
    ax.set_title("Attention's KV-read bandwidth utilisation vs block size")
    ax.grid(alpha=0.3)
    _legend(ax, len(shown))
    fig.tight_layout()
    note_dropped(fig, len(shown), len(groups))
    return _save(fig, path)


def plot_latency_vs_block_size(runs: list[Run], path: Path) -> Path:
    """TTFT and TPOT (p50 solid, p99 dashed) against the block size, one line per series."""
    have = [r for r in runs if r.params.get(BLOCK_KEY) is not None]
    groups = series_of(have, (BLOCK_KEY,), x=lambda r: r.params[BLOCK_KEY])
    bs = lambda r: r.params[BLOCK_KEY]  # noqa: E731
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, key, name in ((axes[0], "ttft_s", "time to first token"), (axes[1], "tpot_s", "time per output token")):
        p50 = lambda r, k=key: get_path(r.summary, (k, "p50"))  # noqa: E731
        p99 = lambda r, k=key: get_path(r.summary, (k, "p99"))  # noqa: E731
        shown = _draw_series(ax, groups, bs, p50, suffix=" (p50)", linestyle="-")
        _draw_series(ax, {g: groups[g] for g in shown}, bs, p99, suffix=" (p99)", linestyle="--", marker="s")
        _log2_axis(ax, [bs(r) for r in have])
        ax.set_yscale("log")
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel(f"{name} (s, log scale)")
        ax.set_title(f"{name[0].upper()}{name[1:]} vs block size")
        ax.grid(alpha=0.3, which="both")
    legend_outside(axes[1], 2 * len(shown))
    fig.tight_layout()
    note_dropped(fig, len(shown), len(groups))
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------------


def default_compare_dir(paths: list[str | Path]) -> Path:
    if len(paths) != 1:
        raise KvsimError("compare: give --out DIR when comparing more than one input")
    return Path(paths[0]) / "compare"


METRIC_NAMES = ("kvsim", "vllm")


def compare(paths: list[str | Path], out: str | Path | None = None, log=None, *, metric_names: str = "kvsim",
            baseline: str | None = None, show=None, force: bool = False) -> dict[str, Path]:
    """Write comparison tables and plots for ``paths`` into ``out``; returns {file name: path}.

    ``show`` (e.g. ``print``) receives the headline table first and, with ``metric_names="vllm"``,
    the vLLM-named view, as text. ``baseline`` names the headline's baseline run.

    ``out`` is a kvsim output directory (kvsim.outdir): written atomically, replacing only an
    earlier ``compare`` output (another kvsim command's only with ``force``), never a directory
    kvsim did not write, nor one holding an input."""
    from kvsim.outdir import atomic_out_dir

    if metric_names not in METRIC_NAMES:
        raise KvsimError(f"compare: --metric-names {metric_names!r}: valid choices are {', '.join(METRIC_NAMES)}")
    say = log or (lambda m: None)
    runs, meta = collect_runs(paths)
    base_label, why = baseline_choice(runs, baseline)
    final = Path(out) if out is not None else default_compare_dir(paths)
    with atomic_out_dir(final, "compare", force=force, protect=paths, log=say) as tmp:
        written = _write_comparison(runs, meta, tmp, say, metric_names=metric_names, base_label=base_label,
                                    show=show, why=why)
    return {name: final / name for name in written}


def _write_comparison(runs, meta, out: Path, say, *, metric_names: str, base_label, show,
                      why: str = "") -> dict[str, Path]:
    from kvsim.report.headline import headline, headline_frame, headline_text

    written: dict[str, Path] = {}

    from kvsim.report.findings import key_findings

    head = headline({r.label: r.summary for r in runs}, base_label)
    write_text_atomic(out / "headline.csv", headline_frame(head).to_csv(index=False))
    written["headline.csv"] = out / "headline.csv"
    if show is not None:
        findings = key_findings({r.label: r.summary for r in runs}, base_label)
        if findings:
            show("Key findings\n" + "\n".join(f"- {f}" for f in findings))
        reason = f" -- {why}; another: --baseline LABEL" if why else ""
        show(f"Headline (baseline: {head.baseline}{reason})\n{headline_text(head)}")
    table = comparison_frame(runs, meta)
    write_text_atomic(out / "comparison.csv", table.to_csv(index=False))
    written["comparison.csv"] = out / "comparison.csv"
    if metric_names == "vllm":
        vtable = vllm_frame(runs, meta)
        write_text_atomic(out / "comparison_vllm.csv", vtable.to_csv(index=False))
        written["comparison_vllm.csv"] = out / "comparison_vllm.csv"
        if show is not None:
            metric_cols = ["label"] + [c for c in vtable.columns if c in vllm_metrics(runs[0].summary)]
            show("Serving metrics (vLLM names, ms)\n" + table_text(vtable[metric_cols]))

    def attempt(name: str, fn) -> None:
        """Draw one output; a failure is reported and the other outputs are still written."""
        try:
            fn(out / name)
        except Exception as e:  # noqa: BLE001
            say(f"compare: could not write {name}: {type(e).__name__}: {e}")
            return
        written[name] = out / name

    summaries = {r.label: r.summary for r in runs}
    attempt("fragmentation_breakdown.png", lambda p: plot_fragmentation_bars(summaries, p))
    attempt("concurrency_comparison.png", lambda p: plot_concurrency_comparison(summaries, p))
    attempt("memory_over_time.png", lambda p: plot_memory_over_time(runs, p))

    def cdfs(p: Path) -> None:
        reqs = {r.label: pd.read_parquet(r.path / "requests.parquet", columns=["status", "ttft_s", "tpot_s", "e2e_s"])
                for r in _pick(runs) if (r.path / "requests.parquet").exists()}
        plot_latency_cdfs(reqs, p, total_runs=len(runs))

    attempt("latency_cdf.png", cdfs)
    if len(_distinct(runs, BLOCK_KEY)) > 1:
        attempt("concurrency_vs_block_size.png", lambda p: plot_concurrency_vs_block_size(runs, p))
    else:
        say("compare: block size does not vary: no concurrency_vs_block_size.png")
    key = rate_key(runs)
    if key is not None:
        attempt("throughput_vs_rate.png", lambda p: plot_vs_rate(
            runs, key, "throughput_requests_per_s", "throughput (requests/s)", "Throughput vs request rate", p))
        attempt("normalized_latency_vs_rate.png", lambda p: plot_vs_rate(
            runs, key, "normalized_latency_s_per_token", "normalized latency (s/token)",
            "Normalized latency vs request rate", p, log_y=True))
        attempt("knees.csv", lambda p: write_text_atomic(p, knees_frame(runs, key).to_csv(index=False)))
    else:
        say("compare: request rate does not vary: no throughput/latency-vs-rate plots")
    if any(prefix_hit_value(r.summary) is not None for r in runs):
        attempt("prefix_hit_ratio_vs_capacity.png", lambda p: plot_prefix_hit_vs_capacity(runs, p))
    from kvsim.report.access import plot_bandwidth_utilisation, plot_step_time_breakdown, step_time_shares

    if any(step_time_shares(s) is not None for s in summaries.values()):
        attempt("step_time_breakdown.png", lambda p: plot_step_time_breakdown(summaries, p))
    if any(_bandwidth_pct(r) is not None for r in runs):
        attempt("bandwidth_utilisation.png", lambda p: plot_bandwidth_utilisation(summaries, p))
    if len(_distinct(runs, BLOCK_KEY)) > 1:
        attempt("latency_vs_block_size.png", lambda p: plot_latency_vs_block_size(runs, p))
        if any(_bandwidth_pct(r) is not None for r in runs):
            attempt("bandwidth_vs_block_size.png", lambda p: plot_bandwidth_vs_block_size(runs, p))
    if meta["failed"]:
        say(f"compare: left out {len(meta['failed'])} failed point(s): {', '.join(meta['failed'][:5])}")
    return written
