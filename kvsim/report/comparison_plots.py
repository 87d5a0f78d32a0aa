"""The comparison plots of ``kvsim compare`` (one PNG each, series from :mod:`kvsim.report.series`)
and their captions."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

# pyplot comes from kvsim.plots, which selects the Agg backend before importing it.
from kvsim.plots import (
    MAX_LINES,
    METADATA,
    _time_binned,
    legend_outside,
    line_style,
    note_dropped,
    pick_evenly,
    plt,
)
from kvsim.report.runs import Run, read_table
from kvsim.report.series import (
    BLOCK_KEY,
    KNEE_FACTOR,
    value_text,
    pick_runs,
    knee_of,
    rate_series,
    series_of,
)
from kvsim.report.tables import get_path, is_missing, prefix_hit_value

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
    "step_time_breakdown.png": "Step time by part: attention, GEMMs, MoE experts, KV writes, communication, overhead, swaps (% of busy time)",
    "bandwidth_utilisation.png": "Attention's KV-read bandwidth utilisation by run",
}


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
        ax.set_xticklabels([value_text(t) for t in ticks])


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
    shown = pick_runs(runs)
    for i, r in enumerate(shown):
        steps = read_table(r.path / "steps.parquet",
                           columns=["start_s", "duration_s", "free_bytes", "external_frag_bytes"])
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


def bandwidth_pct(r: Run) -> float | None:
    """kv_access.hbm_bandwidth_utilisation (every timing model with an attention kernel), else
    calibrated timing's kv_bandwidth_utilisation, in %."""
    from kvsim.report.access import bandwidth_values

    v = bandwidth_values(r.summary)
    got = v.get("hbm", v.get("copy"))
    return None if got is None else 100 * got


def plot_bandwidth_vs_block_size(runs: list[Run], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.8))
    have = [r for r in runs if bandwidth_pct(r) is not None]

    def bs(r: Run):
        return get_path(r.summary, ("kv", "block_size")) or r.params.get(BLOCK_KEY) or 1

    groups = series_of(have, (BLOCK_KEY,), x=bs)
    shown = _draw_series(ax, groups, bs, bandwidth_pct)
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
