"""The comparison tables: ``comparison.csv`` (one layout for ``kvsim run`` and ``kvsim compare``),
``comparison_vllm.csv`` (vLLM's metric names) and their plain-text console view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.report.runs import Run, py_value
from kvsim.report.series import varying_params
from kvsim.report.tables import get_path, is_missing, summary_metrics

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
    v = py_value(v)
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
        # what priced the run, resolved (an `auto` backend, a profile's defaults): not a scenario key that differs
        row["attention_backend"] = get_path(r.summary, ("kv_access", "attention_backend"))
        row["engine_profile"] = get_path(r.summary, ("engine_profile", "name"))
        row.update(summary_metrics(r.summary))
        rows.append(row)
    df = pd.DataFrame(rows)
    for k in param_keys:  # one type per column (parquet): mixed values become text
        if k in df.columns and df[k].dtype == object:
            types = {type(v) for v in df[k] if not is_missing(v)}
            if len(types) > 1:
                df[k] = [None if is_missing(v) else str(v) for v in df[k]]
    return df
