"""Plots that read result files (or the DataFrames loaded from them). Matplotlib, Agg backend.

Per run: memory breakdown over time, concurrency over time, latency CDFs. Across variants: the
fragmentation breakdown as stacked bars (vLLM paper Fig. 2 style) and a concurrency comparison.
"""

from __future__ import annotations

import json
from pathlib import Path

import sys

import matplotlib

if "matplotlib.pyplot" not in sys.modules:  # keep a notebook's inline backend if pyplot is already up
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

PART_LABELS = {
    "token_states": "token states",
    "reservation": "reservation",
    "internal_frag": "internal fragmentation",
    "external_frag": "external fragmentation",
    "free": "free",
}
PART_COLORS = {
    "token_states": "#2b8a3e",
    "reservation": "#f59f00",
    "internal_frag": "#e8590c",
    "external_frag": "#c92a2a",
    "free": "#dee2e6",
}
METADATA = {"Software": None}  # keep PNGs free of version strings that vary between machines

# Line styles for plots with many runs: 10 colours x 4 dash patterns = 40 distinguishable lines,
# each with a marker as well. Plots with more runs than MAX_LINES draw MAX_LINES evenly chosen runs
# and say so in a note on the figure (every run stays in comparison.csv).
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h")
MAX_LINES = 40


def line_style(i: int) -> dict:
    """Colour, dash pattern and marker of the i-th series (distinct for i < 40)."""
    return {"color": f"C{i % 10}", "linestyle": LINESTYLES[(i // 10) % len(LINESTYLES)],
            "marker": MARKERS[i % len(MARKERS)]}


def pick_evenly(items: list, n: int = MAX_LINES) -> list:
    """At most ``n`` of ``items``, evenly spaced, first and last included."""
    if len(items) <= n:
        return list(items)
    idx = np.unique(np.linspace(0, len(items) - 1, n).round().astype(int))
    return [items[i] for i in idx]


def note_dropped(fig, shown: int, total: int) -> None:
    """Say on the figure that only ``shown`` of ``total`` runs are drawn."""
    if shown < total:
        fig.text(0.01, 0.005, f"showing {shown} of {total} runs (evenly chosen); every run is in comparison.csv",
                 fontsize=8, color="#c92a2a", ha="left", va="bottom")


def legend_outside(ax, n: int) -> None:
    if n > 1 and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7 if n > 12 else 8, loc="upper left", bbox_to_anchor=(1.01, 1),
                  ncol=1 + (n - 1) // 20)


def latency_axis(ax, values: np.ndarray) -> None:
    """Log scale when the values span more than ~1.5 decades (so ticks at powers of ten are labelled),
    else linear (a symlog axis over less than a decade has no labelled tick)."""
    v = values[np.isfinite(values) & (values > 0)] if values.size else values
    if v.size and v.max() / v.min() >= 30:
        ax.set_xscale("log")
    else:
        ax.set_xscale("linear")


def _time_binned(steps: pd.DataFrame, columns: list[str], bins: int = 1500) -> tuple[np.ndarray, dict]:
    """Time-weighted means of ``columns`` over ``bins`` equal time bins (long runs have millions
    of rows; a plot needs a few thousand points)."""
    start = steps["start_s"].to_numpy()
    dur = steps["duration_s"].to_numpy()
    if len(start) == 0:
        return np.zeros(0), {c: np.zeros(0) for c in columns}
    t0, t1 = float(start[0]), float(start[-1] + dur[-1])
    if len(start) <= bins or t1 <= t0:
        return start, {c: steps[c].to_numpy(dtype=float) for c in columns}
    edges = np.linspace(t0, t1, bins + 1)
    mid = start + dur / 2
    idx = np.clip(np.searchsorted(edges, mid, side="right") - 1, 0, bins - 1)
    w = np.bincount(idx, weights=dur, minlength=bins)
    keep = w > 0
    out = {}
    for c in columns:
        s = np.bincount(idx, weights=steps[c].to_numpy(dtype=float) * dur, minlength=bins)
        out[c] = s[keep] / w[keep]
    return edges[:-1][keep], out


def plot_memory_breakdown(steps: pd.DataFrame, title: str, path: Path) -> None:
    cols = [f"{p}_bytes" for p in PART_LABELS]
    t, v = _time_binned(steps, cols)
    total = sum(v[c] for c in cols)
    total = np.where(total > 0, total, 1)
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.stackplot(t, *[100 * v[c] / total for c in cols], labels=list(PART_LABELS.values()),
                 colors=[PART_COLORS[p] for p in PART_LABELS], step="post")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("% of KV capacity")
    ax.set_ylim(0, 100)
    ax.set_title(f"KV memory over time: {title}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)


def plot_concurrency(steps: pd.DataFrame, title: str, path: Path) -> None:
    t, v = _time_binned(steps, ["running_mean", "waiting"])
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.step(t, v["running_mean"], where="post", label="running requests", color="#1971c2")
    ax.step(t, v["waiting"], where="post", label="waiting requests", color="#868e96", alpha=0.7)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests")
    ax.set_title(f"Concurrency: {title}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)


def plot_latency_cdfs(requests_by_run: dict[str, pd.DataFrame], path: Path, total_runs: int | None = None) -> None:
    """TTFT, TPOT and E2E CDFs, one line per run (at most MAX_LINES, evenly chosen, with a note).
    ``total_runs``: how many runs the caller had, when it already chose the ones passed here."""
    names = pick_evenly(list(requests_by_run))
    total = max(total_runs or 0, len(requests_by_run))
    fig, axes = plt.subplots(1, 3, figsize=(14 + 2 * (len(names) > 20), 4.2))
    for ax, (col, label) in zip(axes, [("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E latency (s)")]):
        seen = []
        for i, name in enumerate(names):
            req = requests_by_run[name]
            v = np.sort(req.loc[req["status"] == "finished", col].dropna().to_numpy())
            if v.size:
                st = line_style(i)
                ax.plot(v, np.arange(1, v.size + 1) / v.size, label=name, color=st["color"],
                        linestyle=st["linestyle"], linewidth=1.3)
                seen.append(v)
        latency_axis(ax, np.concatenate(seen) if seen else np.zeros(0))
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3, which="both")
    legend_outside(axes[-1], len(names))
    fig.suptitle("Latency CDFs (finished requests)")
    fig.tight_layout()
    note_dropped(fig, len(names), total)
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)


CACHED_LABEL = "cached prefix blocks (evictable)"
CACHED_COLOR = "#a5d8ff"
WASTE_PARTS = ("reservation", "internal_frag", "external_frag")


def _cached_frac(summary: dict) -> float:
    """Time-weighted share of KV capacity in free blocks that still hold reusable prefix content
    (``prefix_cache.cached_free_frac_mean``; 0 without prefix caching). Part of ``free``."""
    v = (summary.get("prefix_cache") or {}).get("cached_free_frac_mean")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def allocated_shares(summary: dict) -> dict[str, float]:
    """The vLLM paper's view (Fig. 2): each part as a share of *allocated* KV memory (token states +
    reservation + internal + external fragmentation; free memory excluded). Fractions."""
    kv = summary["kv"]
    parts = ("token_states", *WASTE_PARTS)
    alloc = sum(kv[f"{p}_frac"] for p in parts)
    return {p: (kv[f"{p}_frac"] / alloc if alloc > 0 else 0.0) for p in parts}


def plot_fragmentation_bars(summaries: dict[str, dict], path: Path) -> None:
    """Two panels per variant: left, the share of KV *capacity* (time-weighted) with the free part
    split into cached prefix blocks (evictable, reusable) and truly free; right, the vLLM paper's
    view: the share of *allocated* KV memory, whose waste part is ``kv.fragmentation_frac``."""
    names = list(summaries)
    width = max(10, 1.1 * len(names) + 6)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(width, 4.8), gridspec_kw={"width_ratios": [1.25, 1]})
    x = np.arange(len(names))
    bottom = np.zeros(len(names))
    cached = np.array([100 * _cached_frac(summaries[n]) for n in names])
    for part, label in PART_LABELS.items():
        vals = np.array([100 * summaries[n]["kv"][f"{part}_frac"] for n in names])
        if part == "free" and cached.any():
            ax.bar(x, cached, bottom=bottom, label=CACHED_LABEL, color=CACHED_COLOR, hatch="//", edgecolor="white")
            _bar_labels(ax, x, bottom, cached)
            bottom = bottom + cached
            vals = np.maximum(vals - cached, 0.0)
            label = "free (empty)"
        ax.bar(x, vals, bottom=bottom, label=label, color=PART_COLORS[part])
        _bar_labels(ax, x, bottom, vals)
        bottom = bottom + vals
    ax.set_ylabel("% of KV capacity (time-weighted)")
    ax.set_ylim(0, 100)
    ax.set_title("Share of KV capacity")
    ax.set_xticks(x, names, rotation=20 if len(names) > 2 else 0, ha="right" if len(names) > 2 else "center")

    bottom = np.zeros(len(names))
    shares = [allocated_shares(summaries[n]) for n in names]
    for part in ("token_states", *WASTE_PARTS):
        vals = np.array([100 * sh[part] for sh in shares])
        ax2.bar(x, vals, bottom=bottom, color=PART_COLORS[part])
        _bar_labels(ax2, x, bottom, vals)
        bottom = bottom + vals
    for i, n in enumerate(names):
        frag = summaries[n]["kv"].get("fragmentation_frac")
        if frag is None:
            frag = sum(shares[i][p] for p in WASTE_PARTS)
        ax2.text(i, 101, f"waste {100 * frag:.1f}%", ha="center", va="bottom", fontsize=8)
    ax2.set_ylabel("% of allocated KV memory (time-weighted)")
    ax2.set_ylim(0, 108)
    ax2.set_title("Share of allocated KV (vLLM paper's view)")
    ax2.set_xticks(x, names, rotation=20 if len(names) > 2 else 0, ha="right" if len(names) > 2 else "center")
    fig.legend(*ax.get_legend_handles_labels(), loc="upper left", bbox_to_anchor=(0.0, 1.0), ncol=6, fontsize=8,
               frameon=False)
    fig.suptitle("KV memory breakdown by variant", y=0.93, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)


def _bar_labels(ax, x, bottom, vals) -> None:
    for i, v in enumerate(vals):
        if v >= 4:
            ax.text(x[i], bottom[i] + v / 2, f"{v:.1f}", ha="center", va="center", fontsize=8)


def plot_concurrency_comparison(summaries: dict[str, dict], path: Path) -> None:
    names = list(summaries)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names) + 3), 4.5))
    mx = [summaries[n]["concurrency"]["max"] for n in names]
    mean = [summaries[n]["concurrency"]["mean"] for n in names]
    ax.bar(x - 0.2, mx, 0.4, label="max", color="#1971c2")
    ax.bar(x + 0.2, mean, 0.4, label="mean (time-weighted)", color="#74c0fc")
    ax.set_xticks(x, names, rotation=20 if len(names) > 2 else 0, ha="right" if len(names) > 2 else "center")
    ax.set_ylabel("running requests")
    ax.set_title("Concurrency by variant")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)


def plot_run_dir(run_dir: Path) -> list[Path]:
    """Draw the per-run plots from the files in ``run_dir``; returns the PNG paths."""
    run_dir = Path(run_dir)
    steps = pd.read_parquet(run_dir / "steps.parquet")
    requests = pd.read_parquet(run_dir / "requests.parquet")
    name = json.loads((run_dir / "summary.json").read_text())["name"]
    out = [run_dir / "memory_breakdown.png", run_dir / "concurrency.png", run_dir / "latency_cdf.png"]
    plot_memory_breakdown(steps, name, out[0])
    plot_concurrency(steps, name, out[1])
    plot_latency_cdfs({name: requests}, out[2])
    return out


def plot_comparison_dir(parent: Path, run_names: list[str]) -> list[Path]:
    """Cross-variant plots from the run subdirectories of ``parent``."""
    parent = Path(parent)
    summaries = {n: json.loads((parent / n / "summary.json").read_text()) for n in run_names}
    requests = {n: pd.read_parquet(parent / n / "requests.parquet") for n in run_names}
    out = [parent / "fragmentation_breakdown.png", parent / "concurrency_comparison.png", parent / "latency_cdf.png"]
    plot_fragmentation_bars(summaries, out[0])
    plot_concurrency_comparison(summaries, out[1])
    plot_latency_cdfs(requests, out[2])
    return out
