"""The headline table: the project's four numbers, baseline vs each variant, with the % change.

One row per metric, read from ``summary.json`` (docs/metrics.md defines each):

=====================================  ======================================  ===========
row                                    summary key                             shown as
=====================================  ======================================  ===========
KV fragmentation                       ``kv.fragmentation_frac``               % of allocated KV
HBM bandwidth utilisation (attention)  ``kv_access.hbm_bandwidth_utilisation``  % of peak
Average KV access latency              ``kv_access.mean_access_latency_ns``     ns
Maximum concurrent requests            ``concurrency.max``                     requests
Throughput                             ``throughput_requests_per_s``            requests/s
Output token throughput                ``throughput_output_tokens_per_s``       tokens/s
Median / p99 time to first token       ``ttft_s.p50`` / ``ttft_s.p99``          s (ms below 1 s)
Median time per output token           ``tpot_s.p50``                          s (ms below 1 s)
Normalized latency                     ``normalized_latency_s_per_token``       s/token
=====================================  ======================================  ===========

A value a summary lacks (a run from an older kvsim, or a timing model without the section) is
shown as "n/a", and so is a change against a missing or zero baseline. The change is relative:
``(variant - baseline) / |baseline| x 100`` (for the fractions, a change of the fraction itself,
not of percentage points). The baseline is the run named by ``baseline:`` in the scenario (or
``kvsim compare --baseline``), else the first run.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pandas as pd

from kvsim.report.tables import get_path

NA = "n/a"


@dataclass(frozen=True)
class HeadlineMetric:
    label: str
    path: tuple[str, ...]
    unit: str  # "%" (a fraction shown x100), "ns", "requests", "s", "s/token", "requests/s", "tokens/s"
    better: str  # "lower" or "higher"


HEADLINE: tuple[HeadlineMetric, ...] = (
    HeadlineMetric("KV fragmentation (% of allocated KV)", ("kv", "fragmentation_frac"), "%", "lower"),
    HeadlineMetric("HBM bandwidth utilisation of attention (% of peak)",
                   ("kv_access", "hbm_bandwidth_utilisation"), "%", "higher"),
    HeadlineMetric("Average KV access latency (ns)", ("kv_access", "mean_access_latency_ns"), "ns", "lower"),
    HeadlineMetric("Maximum concurrent requests", ("concurrency", "max"), "requests", "higher"),
    HeadlineMetric("Throughput (requests/s)", ("throughput_requests_per_s",), "requests/s", "higher"),
    HeadlineMetric("Output token throughput (tokens/s)", ("throughput_output_tokens_per_s",), "tokens/s", "higher"),
    HeadlineMetric("Median time to first token (TTFT)", ("ttft_s", "p50"), "s", "lower"),
    HeadlineMetric("p99 time to first token (TTFT)", ("ttft_s", "p99"), "s", "lower"),
    HeadlineMetric("Median time per output token (TPOT)", ("tpot_s", "p50"), "s", "lower"),
    HeadlineMetric("Normalized latency (s/token)", ("normalized_latency_s_per_token",), "s/token", "lower"),
)


def metric_value(summary: dict, metric: HeadlineMetric) -> float | None:
    v = get_path(summary, metric.path)
    if isinstance(v, dict):  # a distribution: its mean
        v = v.get("mean")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def pct_change(base: float | None, value: float | None) -> float | None:
    if base is None or value is None or base == 0:
        return None
    return (value - base) / abs(base) * 100.0


def pick_baseline(labels: list[str], baseline: str | None) -> str:
    """``baseline`` if it names a run, else the first label."""
    if baseline is not None and baseline in labels:
        return baseline
    return labels[0]


@dataclass(frozen=True)
class Headline:
    baseline: str
    others: tuple[str, ...]
    values: dict  # label -> {metric label -> float | None}
    changes: dict  # other label -> {metric label -> float | None}


def headline(summaries: dict[str, dict], baseline: str | None = None) -> Headline:
    """The table's numbers for runs ``{label: summary}`` (in display order)."""
    if not summaries:
        raise ValueError("headline: no runs")
    labels = list(summaries)
    base = pick_baseline(labels, baseline)
    others = tuple(lab for lab in labels if lab != base)
    values = {lab: {m.label: metric_value(summaries[lab], m) for m in HEADLINE} for lab in [base, *others]}
    changes = {lab: {m.label: pct_change(values[base][m.label], values[lab][m.label]) for m in HEADLINE}
               for lab in others}
    return Headline(base, others, values, changes)


def headline_frame(h: Headline) -> pd.DataFrame:
    """Numbers for ``headline.csv``: one row per metric; columns ``metric``, ``unit``, ``summary_key``,
    ``baseline:<label>``, then ``<label>`` and ``<label> change_pct`` per other run (empty = n/a).
    Fractions are in % here too (x100), as displayed."""
    rows = []
    for m in HEADLINE:
        scale = 100.0 if m.unit == "%" else 1.0
        row = {"metric": m.label, "unit": m.unit, "summary_key": ".".join(m.path)}
        v = h.values[h.baseline][m.label]
        row[f"baseline:{h.baseline}"] = None if v is None else v * scale
        for lab in h.others:
            v = h.values[lab][m.label]
            row[lab] = None if v is None else v * scale
            row[f"{lab} change_pct"] = h.changes[lab][m.label]
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return NA
    if unit == "%":
        return f"{v * 100:.1f} %"
    if unit == "requests":
        return f"{v:.0f}"
    if unit == "s":
        return f"{v * 1000:.3g} ms" if abs(v) < 1 else f"{v:.3g} s"
    return f"{v:.4g}"


def _fmt_change(c: float | None) -> str:
    return NA if c is None else f"{c:+.1f} %"


def headline_cells(h: Headline) -> tuple[list[str], list[list[str]]]:
    """Header and text rows: metric, baseline value, then value and change per other run."""
    header = ["metric", f"{h.baseline} (baseline)"]
    for lab in h.others:
        header += [lab, f"{lab} vs baseline"]
    rows = []
    for m in HEADLINE:
        row = [m.label, _fmt_value(h.values[h.baseline][m.label], m.unit)]
        for lab in h.others:
            row += [_fmt_value(h.values[lab][m.label], m.unit), _fmt_change(h.changes[lab][m.label])]
        rows.append(row)
    return header, rows


def headline_text(h: Headline) -> str:
    """A plain-text table for the console."""
    header, rows = headline_cells(h)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    return "\n".join(lines)


def _change_class(m: HeadlineMetric, c: float | None) -> str:
    """``better``/``worse`` for a change in the metric's good/bad direction (none when 0 or n/a)."""
    if c is None or c == 0:
        return ""
    return "better" if (c > 0) == (m.better == "higher") else "worse"


def headline_html(h: Headline, table_id: str = "headline") -> str:
    """The table as HTML (escaped), with a caption saying what the change means: one column per run
    (the value, the change against the baseline below it), so that a handful of runs fits a
    1280 px window without a horizontal scroll (docs/report.md)."""
    esc = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    head = '<th class="k">metric</th><th class="k">better</th>' + f"<th>{esc(h.baseline)} (baseline)</th>"
    head += "".join(f"<th>{esc(lab)}</th>" for lab in h.others)
    body = []
    for m in HEADLINE:
        cells = [f'<td class="k">{esc(m.label)}</td><td class="k">{esc(m.better)}</td>',
                 f"<td>{esc(_fmt_value(h.values[h.baseline][m.label], m.unit))}</td>"]
        for lab in h.others:
            c = h.changes[lab][m.label]
            cls = _change_class(m, c)
            cells.append(f"<td>{esc(_fmt_value(h.values[lab][m.label], m.unit))}<br>"
                         f'<span class="chg {cls}">{esc(_fmt_change(c))}</span></td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    caption = ("Each run's value, and below it the change = (run &minus; baseline) / |baseline| "
               "(green: better, red: worse, in the direction of the \"better\" column). n/a: the summary "
               "lacks the key (docs/report.md, headline table).")
    return (f'<div class="scroll"><table id="{esc(table_id)}" class="headline"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div><p class="meta">{caption}</p>')
