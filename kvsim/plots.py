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


def plot_latency_cdfs(requests_by_run: dict[str, pd.DataFrame], path: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (col, label) in zip(axes, [("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E latency (s)")]):
        for name, req in requests_by_run.items():
            v = np.sort(req.loc[req["status"] == "finished", col].dropna().to_numpy())
            if v.size:
                ax.plot(v, np.arange(1, v.size + 1) / v.size, label=name)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.set_xscale("symlog", linthresh=1e-3)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Latency CDFs (finished requests)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)


def plot_fragmentation_bars(summaries: dict[str, dict], path: Path) -> None:
    names = list(summaries)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names) + 3), 4.5))
    bottom = np.zeros(len(names))
    for part, label in PART_LABELS.items():
        vals = np.array([100 * summaries[n]["kv"][f"{part}_frac"] for n in names])
        ax.bar(names, vals, bottom=bottom, label=label, color=PART_COLORS[part])
        for i, v in enumerate(vals):
            if v >= 4:
                ax.text(i, bottom[i] + v / 2, f"{v:.1f}", ha="center", va="center", fontsize=8)
        bottom += vals
    ax.set_ylabel("% of KV capacity (time-weighted)")
    ax.set_ylim(0, 100)
    ax.set_title("KV memory breakdown by variant")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)


def plot_concurrency_comparison(summaries: dict[str, dict], path: Path) -> None:
    names = list(summaries)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names) + 3), 4.5))
    mx = [summaries[n]["concurrency"]["max"] for n in names]
    mean = [summaries[n]["concurrency"]["mean"] for n in names]
    ax.bar(x - 0.2, mx, 0.4, label="max", color="#1971c2")
    ax.bar(x + 0.2, mean, 0.4, label="mean (time-weighted)", color="#74c0fc")
    ax.set_xticks(x, names, rotation=20, ha="right")
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
