"""The runs ``kvsim compare`` and the reports read: single-run, variants and sweep directories
(or in-memory results) as :class:`Run` rows with their labels, in display order, and the
headline's baseline among them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from kvsim.errors import KvsimError
from kvsim.report.tables import flatten, is_missing, point_labels, resolved_scenario


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
                ov = {k: (None if is_missing(row[k]) else py_value(row[k])) for k in keys}
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


def py_value(v):
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
