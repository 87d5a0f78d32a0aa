"""``SWEEP_DIR/index.parquet`` (and ``index.csv``): one row per point.

Columns, in order: ``point_id``, ``point_name``, ``variant`` (only when the base scenario has
variants), one column per overridden key (named by its dotted key, e.g. ``allocator.block_size``),
``status`` (``ok`` | ``failed`` | ``pending``), ``error`` (one line, empty when ok), ``run_dir``
(relative to the sweep directory, ``points/<point_id>``), then the metrics of
:data:`kvsim.report.tables.METRICS` (and any optional ``prefix_cache_*`` /
``kv_bandwidth_utilisation`` columns). The index depends only on the sweep and the run
directories, so a resumed sweep and a fresh one, or the local and Ray executors, give equal indexes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.report.tables import INT_METRICS, METRICS, summary_metrics
from kvsim.results import write_parquet, write_text_atomic

STATUS_OK, STATUS_FAILED, STATUS_PENDING = "ok", "failed", "pending"


def _cell(v: Any) -> Any:
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return v


def _override_column(values: list[Any]) -> pd.Series:
    """One dtype per column (parquet needs it): numbers stay numbers, mixed columns become text."""
    present = [v for v in values if v is not None]
    if all(isinstance(v, bool) for v in present):
        return pd.Series(values, dtype="boolean")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pd.Series(values, dtype="Int64")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return pd.Series([float(v) if v is not None else None for v in values], dtype="float64")
    return pd.Series([None if v is None else (v if isinstance(v, str) else json.dumps(v, sort_keys=True))
                      for v in values], dtype="object")


def build_index(sweep, sweep_dir: Path, status: dict[str, tuple[str, str]]) -> pd.DataFrame:
    """``status``: point id -> (status, error). Metrics come from each ok point's summary.json."""
    sweep_dir = Path(sweep_dir)
    rows: list[dict] = []
    extra_cols: list[str] = []
    for p in sweep.points:
        st, err = status.get(p.id, (STATUS_PENDING, ""))
        row: dict[str, Any] = {"point_id": p.id, "point_name": p.name}
        if sweep.has_variants:
            row["variant"] = p.variant
        row["_overrides"] = {k: _cell(p.overrides.get(k)) for k in sweep.override_keys}
        row.update(status=st, error=err or "", run_dir=f"points/{p.id}")
        metrics: dict[str, Any] = {}
        if st == STATUS_OK:
            summary = json.loads((sweep_dir / "points" / p.id / "summary.json").read_text())
            metrics = summary_metrics(summary)
            for k in metrics:
                if k not in METRICS and k not in extra_cols:
                    extra_cols.append(k)
        row["_metrics"] = metrics
        rows.append(row)

    base_cols = ["point_id", "point_name"] + (["variant"] if sweep.has_variants else [])
    data: dict[str, Any] = {c: pd.Series([r[c] for r in rows], dtype="object") for c in base_cols}
    for k in sweep.override_keys:
        data[k] = _override_column([r["_overrides"][k] for r in rows])
    for c in ("status", "error", "run_dir"):
        data[c] = pd.Series([r[c] for r in rows], dtype="object")
    for c in list(METRICS) + extra_cols:
        vals = [r["_metrics"].get(c) for r in rows]
        if c in INT_METRICS:
            data[c] = pd.Series(vals, dtype="Int64")
        else:
            data[c] = pd.Series([float(v) if v is not None else None for v in vals], dtype="float64")
    return pd.DataFrame(data)


def write_index(df: pd.DataFrame, sweep_dir: Path) -> None:
    sweep_dir = Path(sweep_dir)
    write_parquet(sweep_dir / "index.parquet", df)
    write_text_atomic(sweep_dir / "index.csv", df.to_csv(index=False))


RESULT_COLUMNS = (  # (index column, console header, scale): the sweep's closing table
    ("throughput_requests_per_s", "req/s", 1.0), ("ttft_p50_s", "TTFT p50 s", 1.0),
    ("tpot_p50_s", "TPOT p50 ms", 1000.0), ("normalized_latency_s_per_token", "norm lat s/tok", 1.0),
    ("concurrency_max", "max conc", 1.0), ("kv_fragmentation_frac", "frag %", 100.0),
    ("preemptions", "preempt", 1.0),
)


def result_table_text(df: pd.DataFrame) -> str:
    """The compact table ``kvsim sweep`` prints at the end: one line per point (its label without
    the directory's hash, :func:`kvsim.report.tables.point_labels`), its status and key metrics."""
    from kvsim.report.tables import fmt, is_missing, point_labels

    labels = point_labels([r.to_dict() for _, r in df.iterrows()])
    cols = [c for c in RESULT_COLUMNS if c[0] in df.columns]
    header = ["point", "status"] + [h for _, h, _ in cols]
    rows = []
    for lab, (_, r) in zip(labels, df.iterrows()):
        cells = [lab, str(r["status"])]
        for c, _, scale in cols:
            v = r[c]
            cells.append("" if is_missing(v) or v is pd.NA else fmt(float(v) * scale if scale != 1.0 else
                                                                    (v.item() if hasattr(v, "item") else v)))
        rows.append(cells)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in [header, *rows])


def load_index(sweep_dir: str | Path) -> pd.DataFrame:
    """Read ``SWEEP_DIR/index.parquet``."""
    from kvsim.errors import KvsimError

    path = Path(sweep_dir) / "index.parquet"
    if not path.exists():
        raise KvsimError(f"{sweep_dir}: not a sweep directory (no index.parquet)")
    return pd.read_parquet(path)
