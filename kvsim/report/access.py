"""The access side of a comparison: where step time goes, how well attention uses HBM bandwidth,
and latency against the page size. Plots read ``summary.json`` numbers (docs/metrics.md):

* ``step_time_breakdown.png`` -- per run, the busy time (``busy_time_s``) split into attention
  (``step_time_breakdown_s.attention_s``), GEMMs (``linear_compute_s + compute_s``: the linear
  layers and the LM head), MoE routed experts (``moe_experts_s``), KV writes (``kv_write_s``),
  parallel communication (``parallel_comm_s``), overhead (``overhead_s``), swaps (``swap_s``) and
  the rest (:func:`step_time_shares`; 0 where the parts add up to the step, docs/metrics.md "The
  step-time identity");
* ``bandwidth_utilisation.png`` -- per run, ``kv_access.hbm_bandwidth_utilisation`` (the headline
  row) and, under calibrated timing, ``kv_bandwidth_utilisation``;
* ``latency_vs_block_size.png`` -- TTFT (p50, p99) and TPOT (p50) against ``allocator.block_size``
  when it takes 2+ values (a sweep or variants over the page size).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kvsim.plots import METADATA, legend_outside, note_dropped, pick_evenly, plt
from kvsim.report.tables import get_path

# (share name, label, colour, breakdown keys summed)
STEP_PARTS = (
    ("attention", "attention kernel", "#1c7ed6", ("attention_s",)),
    ("gemm", "GEMMs (linear layers + LM head)", "#f59f00", ("linear_compute_s", "compute_s")),
    ("moe", "MoE routed experts", "#e8590c", ("moe_experts_s",)),
    ("kv_write", "KV writes", "#15aabf", ("kv_write_s",)),
    ("comm", "parallel communication", "#7048e8", ("parallel_comm_s",)),
    ("overhead", "per-step overhead", "#868e96", ("overhead_s",)),
    ("swap", "swaps (host link)", "#c92a2a", ("swap_s",)),
)
REST = ("rest", "rest (other terms)", "#dee2e6")
MAX_BARS = 24


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def step_time_shares(summary: dict) -> dict[str, float] | None:
    """{part: share of busy time} for :data:`STEP_PARTS` plus ``rest`` = 1 - their sum (>= 0; a
    timing model whose terms overlap, as the roofline's ``max``, can sum past 1: rest is then 0
    and the shares are scaled to 1). None when the summary lacks the breakdown or busy time."""
    b = summary.get("step_time_breakdown_s")
    busy = _num(summary.get("busy_time_s"))
    if not isinstance(b, dict) or not busy:
        return None
    parts = {name: sum(_num(b.get(k)) or 0.0 for k in keys) / busy for name, _, _, keys in STEP_PARTS}
    total = sum(parts.values())
    if total > 1.0:
        parts = {k: v / total for k, v in parts.items()}
        total = 1.0
    parts[REST[0]] = max(0.0, 1.0 - total)
    return parts


def _bar_axis(n: int):
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.45 * n + 1.6)))
    return fig, ax


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=METADATA)
    plt.close(fig)
    return path


def plot_step_time_breakdown(summaries: dict[str, dict], path: Path) -> Path:
    """Stacked horizontal bars: each run's busy time by part (% of its busy time; the total in
    seconds at the bar's end). Runs in display order, top to bottom."""
    have = {lab: sh for lab, s in summaries.items() if (sh := step_time_shares(s)) is not None}
    labels = pick_evenly(list(have), MAX_BARS)
    fig, ax = _bar_axis(len(labels))
    y = np.arange(len(labels))[::-1]
    left = np.zeros(len(labels))
    for name, label, color, _ in (*STEP_PARTS, (*REST, ())):
        vals = np.array([100 * have[lab][name] for lab in labels])
        if not vals.any():
            continue
        ax.barh(y, vals, left=left, color=color, label=label, edgecolor="white", linewidth=0.5)
        for yi, li, v in zip(y, left, vals):
            if v >= 7:
                ax.text(li + v / 2, yi, f"{v:.0f}%", ha="center", va="center", fontsize=8)
        left += vals
    for yi, lab in zip(y, labels):
        busy = _num(summaries[lab].get("busy_time_s")) or 0.0
        ax.text(101, yi, f"{busy:.4g} s busy", va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.set_xlim(0, 118)
    ax.set_xlabel("% of busy time (step_time_breakdown_s / busy_time_s)")
    ax.set_title("Step time by part")
    legend_outside(ax, len(STEP_PARTS) + 1)
    fig.tight_layout()
    note_dropped(fig, len(labels), len(have))
    return _save(fig, path)


def bandwidth_values(summary: dict) -> dict[str, float]:
    """{series: utilisation} of one run: ``hbm`` (kv_access.hbm_bandwidth_utilisation, every
    timing model with an attention kernel) and ``copy`` (kv_bandwidth_utilisation, calibrated)."""
    out = {}
    if (v := _num(get_path(summary, ("kv_access", "hbm_bandwidth_utilisation")))) is not None:
        out["hbm"] = v
    bw = summary.get("kv_bandwidth_utilisation")
    if isinstance(bw, dict):
        bw = bw.get("mean", bw.get("value"))
    if (v := _num(bw)) is not None:
        out["copy"] = v
    return out


def plot_bandwidth_utilisation(summaries: dict[str, dict], path: Path) -> Path:
    """Bars per run: the attention kernel's KV reads as a share of peak HBM bandwidth (and of the
    calibrated copy bandwidth where the summary has it)."""
    have = {lab: v for lab, s in summaries.items() if (v := bandwidth_values(s))}
    labels = pick_evenly(list(have), MAX_BARS)
    fig, ax = _bar_axis(len(labels))
    y = np.arange(len(labels))[::-1]
    series = [("hbm", "of peak HBM bandwidth (kv_access.hbm_bandwidth_utilisation)", "#1c7ed6"),
              ("copy", "of the calibrated copy bandwidth (kv_bandwidth_utilisation)", "#74c0fc")]
    drawn = [s for s in series if any(s[0] in have[lab] for lab in labels)]
    h = 0.8 / max(1, len(drawn))
    for i, (key, label, color) in enumerate(drawn):
        vals = [100 * have[lab].get(key, float("nan")) for lab in labels]
        pos = y + (len(drawn) - 1) * h / 2 - i * h
        ax.barh(pos, vals, height=h, color=color, label=label)
        for p, v in zip(pos, vals):
            if v == v:
                ax.text(v + 0.5, p, f"{v:.1f}%", va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.set_xlim(0, 110)
    ax.set_xlabel("KV-read bandwidth utilisation of attention (%" + (", " + drawn[0][1] if len(drawn) == 1 else "")
                  + ")")
    ax.set_title("Attention's KV reads: bandwidth utilisation by run")
    legend_outside(ax, len(drawn))
    fig.tight_layout()
    note_dropped(fig, len(labels), len(have))
    return _save(fig, path)
