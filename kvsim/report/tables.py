"""Flat metric rows from ``summary.json``, and flat parameter rows from resolved scenarios.

:func:`summary_metrics` is the one place that decides which summary numbers become table columns
(the sweep index, ``comparison.csv`` and the HTML report all use it). Optional sections are
included when a summary has them: ``prefix_cache.*`` (prefix caching) as ``prefix_cache_<key>``
and ``kv_bandwidth_utilisation`` (calibrated timing).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError

# column -> path into summary.json
METRICS: dict[str, tuple[str, ...]] = {
    "requests_total": ("requests_total",),
    "requests_finished": ("requests_finished",),
    "requests_rejected": ("requests_rejected",),
    "requests_unfinished": ("requests_unfinished",),
    "duration_s": ("duration_s",),
    "throughput_requests_per_s": ("throughput_requests_per_s",),
    "throughput_output_tokens_per_s": ("throughput_output_tokens_per_s",),
    "throughput_input_tokens_per_s": ("throughput_input_tokens_per_s",),
    "throughput_total_tokens_per_s": ("throughput_total_tokens_per_s",),
    "goodput_requests_per_s": ("slo", "goodput_requests_per_s"),
    "slo_attainment": ("slo", "attainment"),
    "ttft_mean_s": ("ttft_s", "mean"),
    "ttft_p50_s": ("ttft_s", "p50"),
    "ttft_p99_s": ("ttft_s", "p99"),
    "tpot_mean_s": ("tpot_s", "mean"),
    "tpot_p50_s": ("tpot_s", "p50"),
    "tpot_p99_s": ("tpot_s", "p99"),
    "itl_mean_s": ("itl_s", "mean"),
    "itl_p50_s": ("itl_s", "p50"),
    "itl_p99_s": ("itl_s", "p99"),
    "itl_max_s": ("itl_s", "max"),
    "e2e_mean_s": ("e2e_s", "mean"),
    "e2e_p50_s": ("e2e_s", "p50"),
    "e2e_p99_s": ("e2e_s", "p99"),
    "normalized_latency_s_per_token": ("normalized_latency_s_per_token",),
    "concurrency_max": ("concurrency", "max"),
    "concurrency_mean": ("concurrency", "mean"),
    "concurrency_mean_batch_size": ("concurrency", "mean_batch_size"),
    "kv_capacity_tokens": ("kv", "capacity_tokens"),
    "kv_block_size": ("kv", "block_size"),
    "kv_bytes_per_token": ("kv", "bytes_per_token"),
    "kv_token_states_frac": ("kv", "token_states_frac"),
    "kv_reservation_frac": ("kv", "reservation_frac"),
    "kv_internal_frag_frac": ("kv", "internal_frag_frac"),
    "kv_external_frag_frac": ("kv", "external_frag_frac"),
    "kv_free_frac": ("kv", "free_frac"),
    "kv_peak_used_frac": ("kv", "peak_used_frac"),
    "kv_fragmentation_frac": ("kv", "fragmentation_frac"),
    "preemptions": ("preemptions",),
    "preemptions_swap": ("preemptions_by_mode", "swap"),
    "swapped_out_bytes": ("swapped_out_bytes",),
    "recomputed_tokens": ("recomputed_tokens",),
    "engine_steps": ("engine_steps",),
    "busy_frac": ("busy_frac",),
}
INT_METRICS = ("requests_total", "requests_finished", "requests_rejected", "requests_unfinished",
               "concurrency_max", "kv_capacity_tokens", "kv_block_size", "kv_bytes_per_token",
               "preemptions", "preemptions_swap", "swapped_out_bytes", "recomputed_tokens", "engine_steps")
PREFIX_HIT_KEY = ("prefix_cache", "hit_ratio_tokens")
BANDWIDTH_KEY = "kv_bandwidth_utilisation"
ACCESS_KEY = "kv_access"
ACCESS_DEPRECATED = ("mean_access_latency_ns",)  # = page_fetch_time_ns, kept in summary.json for old readers


# Summary keys renamed since: a summary.json written before the rename is read under its old key.
RENAMED_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {("kv", "block_size"): ("kv", "block_size_tokens")}


def get_path(d: dict, path: tuple[str, ...] | list[str], default: Any = None) -> Any:
    """``d[path[0]][path[1]]...``, or ``default``; a key in :data:`RENAMED_KEYS` missing from ``d``
    is looked up under its old name (summaries written by older kvsim versions)."""
    node = d
    for p in path:
        if not isinstance(node, dict) or p not in node:
            old = RENAMED_KEYS.get(tuple(path))
            return default if old is None else get_path(d, old, default)
        node = node[p]
    return node


def _num(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return v
    return None


def summary_metrics(summary: dict) -> dict[str, Any]:
    """The metric columns of one run (missing values are None)."""
    row = {col: _num(get_path(summary, path)) for col, path in METRICS.items()}
    pc = summary.get("prefix_cache")
    if isinstance(pc, dict):
        for k, v in flatten(pc).items():
            if _num(v) is not None:
                row[f"prefix_cache_{k.replace('.', '_')}"] = v
    access = summary.get(ACCESS_KEY)
    if isinstance(access, dict):  # how the attention kernels read the KV (the headline's access latency)
        for k, v in access.items():
            if k not in ACCESS_DEPRECATED and _num(v) is not None:
                row[f"{ACCESS_KEY}_{k}"] = v
    bw = summary.get(BANDWIDTH_KEY)
    if isinstance(bw, dict):
        for k, v in flatten(bw).items():
            if _num(v) is not None:
                row[f"{BANDWIDTH_KEY}_{k.replace('.', '_')}"] = v
    elif _num(bw) is not None:
        row[BANDWIDTH_KEY] = bw
    return row


def prefix_hit_value(summary: dict) -> float | None:
    v = get_path(summary, PREFIX_HIT_KEY)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings to dotted keys; lists become JSON text."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, key))
            else:
                out[key] = json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v
    return out


def read_resolved(path: Path) -> dict | None:
    """The document of a ``*.resolved.yaml`` file kvsim wrote into a results directory, or None when
    there is none (a directory from an older kvsim, or a copy without it). A file that is there but
    not a YAML mapping (truncated, edited) is damage: one ConfigError line naming it, never a
    silent fallback that would change which runs are compared, their order or their baseline."""
    from kvsim.errors import read_user_text
    from kvsim.yamlio import load_yaml

    path = Path(path)
    if not path.exists():
        return None
    doc = load_yaml(read_user_text(path, "kvsim's resolved file"), str(path))
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: damaged: expected the mapping kvsim writes, got "
                          f"{'an empty file' if doc is None else type(doc).__name__} (rerun kvsim to rewrite it)")
    return doc


def resolved_runs(path: Path) -> dict:
    """``runs`` of the ``scenario.resolved.yaml`` at ``path`` ({name: {scenario: ..., ...}}, in the
    scenario's order; {} without the file), checked as :func:`read_resolved` does."""
    doc = read_resolved(path)
    if doc is None:
        return {}
    runs = doc.get("runs")
    if not isinstance(runs, dict) or not all(isinstance(r, dict) for r in runs.values()):
        raise ConfigError(f"{path}: damaged: runs: expected a mapping of run name -> its resolved scenario; "
                          "rerun kvsim to rewrite it")
    return runs


def resolved_entry(run_dir: Path) -> dict:
    """The ``runs`` entry of a run directory (or variant subdirectory) in its scenario.resolved.yaml
    (``scenario``, ``trace`` report, ...), or {}."""
    run_dir = Path(run_dir)
    for path, name in ((run_dir / "scenario.resolved.yaml", None),
                       (run_dir.parent / "scenario.resolved.yaml", run_dir.name)):
        if not path.exists():
            continue
        runs = resolved_runs(path)
        if name is None and len(runs) == 1:
            return next(iter(runs.values()))
        if name is not None and name in runs:
            return runs[name]
    return {}


def resolved_scenario(run_dir: Path) -> dict | None:
    """The resolved scenario of a run directory (or variant subdirectory), or None."""
    return resolved_entry(run_dir).get("scenario")


def point_labels(rows: list[dict]) -> list[str]:
    """Display labels of sweep points (index rows with ``point_id``, ``point_name``, ``variant``):
    the point's ``name:`` if it has one, else its id without the trailing hash (``block_size-8``
    for ``block_size-8-5a1ffe33``), prefixed by the variant when the id does not already say it.
    Directories keep the hash (it makes ids unique); a label that would repeat falls back to the id."""
    out = []
    for r in rows:
        pid, name, variant = str(r["point_id"]), r.get("point_name"), r.get("variant")
        label = name if isinstance(name, str) else pid.rsplit("-", 1)[0]
        if isinstance(variant, str) and not isinstance(name, str) and not label.startswith(variant):
            label = f"{variant}_{label}"
        out.append(label)
    return [lab if out.count(lab) == 1 else str(r["point_id"]) for lab, r in zip(out, rows)]


def is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def fmt(v: Any) -> str:
    """Compact text for tables: 4 significant digits for floats."""
    if is_missing(v):
        return ""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if v == int(v) and abs(v) < 1e15:
            return str(int(v))
        return f"{v:.4g}"
    return str(v)
