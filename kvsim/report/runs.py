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

from kvsim.errors import ConfigError, KvsimError, read_user_text
from kvsim.report.tables import METRICS, flatten, is_missing, point_labels, read_resolved, resolved_entry, resolved_runs


@dataclass
class Run:
    label: str
    path: Path | None                 # None: an in-memory result (kvsim.run)
    summary: dict
    params: dict                      # the resolved scenario, flattened to dotted keys
    point_id: str | None = None       # sweep points only
    variant: str | None = None        # sweep points of a base with variants
    overrides: dict = field(default_factory=dict)  # sweep points: override key -> value
    trace: dict = field(default_factory=dict)      # the trace report of scenario.resolved.yaml ({}: none)
    _rate: float | None = None

    @property
    def name(self) -> str:
        return str(self.summary.get("name", self.label))

    def offered_rate(self) -> float | None:
        """Requests per second offered by the trace: (n - 1) / (last arrival - first arrival)."""
        if self._rate is None:
            if self.path is None:
                return None
            a = read_table(self.path / "requests.parquet", columns=["arrival_s"])["arrival_s"].to_numpy()
            self._rate = float((len(a) - 1) / (a.max() - a.min())) if len(a) > 1 and a.max() > a.min() else math.nan
        return None if math.isnan(self._rate) else self._rate


def _is_sweep_dir(p: Path) -> bool:
    return (p / "index.parquet").exists() and (p / "points").is_dir()


# Keys every kvsim summary.json has (docs/metrics.md), with their JSON type: how a run directory is recognised
RUN_KEYS = {"name": (str, "text"), "kv": (dict, "an object"), "concurrency": (dict, "an object")}
RUN_TABLES = ("requests.parquet", "steps.parquet")
# Numbers every kvsim summary.json has (since the first kvsim) and every comparison plots: checked,
# so that a hand-edited or foreign summary is one line naming the key, not an exception in a plot
RUN_NUMBERS = (("concurrency", "max"), ("concurrency", "mean"),
               *(("kv", f"{part}_frac") for part in ("token_states", "reservation", "internal_frag",
                                                      "external_frag", "free")))


def read_summary(run_dir: Path) -> dict:
    """The ``summary.json`` of ``run_dir``, checked: valid JSON, an object, with :data:`RUN_KEYS`.
    Anything else is one :class:`ConfigError` line naming the file (or the directory, when it is
    not a kvsim run) and what was expected."""
    run_dir = Path(run_dir)
    path = run_dir / "summary.json"
    try:
        doc = json.loads(read_user_text(path, "the run summary"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON (line {e.lineno} col {e.colno}: {e.msg})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object (a kvsim run summary), got {_json_type(doc)}")
    missing = [k for k in RUN_KEYS if k not in doc]
    if missing:
        raise ConfigError(f"{run_dir}: not a kvsim run directory (its summary.json has no "
                          f"{', '.join(missing)} key{'s' * (len(missing) > 1)})")
    for key, (kind, what) in RUN_KEYS.items():
        if not isinstance(doc[key], kind):
            raise ConfigError(f"{path}: {key}: expected {what}, got {_json_type(doc[key])}")
    for section, key in RUN_NUMBERS:
        if key not in doc[section]:
            raise ConfigError(f"{path}: {section}.{key}: missing (every kvsim run summary has it)")
    _check_numbers(path, doc)
    return doc


def _check_numbers(path: Path, doc: dict) -> None:
    """Every metric of the tables (:data:`METRICS`) that ``doc`` has is a number or null, under
    objects: else one ConfigError line naming the key (a summary from an older kvsim lacks some,
    which show as n/a; a text or list in their place is a damaged or hand-made file)."""
    for keys in METRICS.values():
        node = doc
        for i, k in enumerate(keys):
            if not isinstance(node, dict):  # null: a section the run did not have (slo: null)
                if node is None:
                    break
                raise ConfigError(f"{path}: {'.'.join(keys[:i])}: expected an object, got {_json_type(node)}")
            if k not in node:
                break
            node = node[k]
        else:
            if node is not None and (isinstance(node, bool) or not isinstance(node, (int, float))):
                raise ConfigError(f"{path}: {'.'.join(keys)}: expected a number, got {_json_type(node)}")


def _json_type(v) -> str:
    names = {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null"}
    return names.get(type(v), "a number")


def read_table(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """A run's Parquet table; a file that is not one (truncated, corrupt) is one ConfigError line."""
    import pyarrow as pa

    if not Path(path).is_file():
        hint = f" (a kvsim run directory has summary.json, {' and '.join(RUN_TABLES)})" \
            if Path(path).name in RUN_TABLES else ""
        raise ConfigError(f"{path}: missing{hint}")
    try:
        return pd.read_parquet(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise _table_error(path, e) from None


def _table_error(path: Path, e: Exception) -> ConfigError:
    """``PATH: cannot read the parquet file: why``, without pyarrow's "Could not open ... '<path>': " prefix."""
    text = str(e).strip()
    why = text.split("': ", 1)[1] if text.startswith("Could not open") and "': " in text else text
    return ConfigError(f"{path}: cannot read the parquet file: {why}")


def check_tables(run_dir: Path) -> None:
    """Every table of ``run_dir`` (:data:`RUN_TABLES`: kvsim writes both for every run, with or
    without plots) is there and a readable Parquet file (its footer is read): a missing or corrupt
    table is an input error in ``compare`` and ``report`` alike, not a run silently left out of a plot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for name in RUN_TABLES:
        path = Path(run_dir) / name
        if not path.is_file():
            raise ConfigError(f"{path}: missing (a kvsim run directory has summary.json, {' and '.join(RUN_TABLES)})")
        try:
            pq.read_metadata(path)
        except (pa.ArrowException, OSError) as e:
            raise _table_error(path, e) from None


def read_run_dir(run_dir: Path) -> dict:
    """The checked summary of a run directory (:func:`read_summary`), once its tables are known to be
    readable (:func:`check_tables`). The one reader of run directories for compare and report."""
    summary = read_summary(run_dir)
    check_tables(run_dir)
    return summary


def load_run(path: Path, label: str, summary: dict | None = None, **kw) -> Run:
    summary = read_run_dir(path) if summary is None else summary
    entry = resolved_entry(path)
    params = flatten(entry.get("scenario") or {})
    return Run(label=label, path=path, summary=summary, params=params, trace=entry.get("trace") or {}, **kw)


def collect_runs(paths: list[str | Path]) -> tuple[list[Run], dict]:
    """Runs of every input, in order. ``meta``: ``sweep`` (bool), ``override_keys``, ``failed``,
    ``left_out`` (variant directories without a summary.json), ``ignored`` (folders of a variants
    directory that its scenario.resolved.yaml does not list). A run given twice is refused."""
    runs: list[Run] = []
    meta: dict[str, Any] = {"sweep": False, "override_keys": [], "failed": [], "left_out": [], "ignored": []}
    given: list[str] = []  # the input each run came from
    for raw in paths:
        found = _runs_of(Path(raw), meta)
        runs += found
        given += [str(raw)] * len(found)
    refuse_repeated_runs(runs, given)
    labels = [r.label for r in runs]
    if len(set(labels)) < len(labels):  # same variant names from several inputs: qualify them
        # by the input's directory: a variants directory holds the run, a single-run directory is it
        homes = [r.path if r.path == Path(src) else r.path.parent for r, src in zip(runs, given)]
        for r, home in zip(runs, homes):
            if labels.count(r.label) > 1:
                r.label = f"{home.name}/{r.label}" if r.point_id is None else (r.point_id or r.label)
        twice = [r.label for r in runs]
        for r, home in zip(runs, homes):  # inputs with the same directory name (a/study, b/study): one more level
            if twice.count(r.label) > 1 and r.point_id is None:
                r.label = f"{home.parent.name}/{r.label}"
    if not runs:
        raise KvsimError("nothing to compare: no complete runs in " + ", ".join(str(p) for p in paths))
    return runs, meta


def _runs_of(p: Path, meta: dict[str, Any]) -> list[Run]:
    """The runs of one input (a sweep, single-run or variants directory); updates ``meta``."""
    found: list[Run] = []
    if _is_sweep_dir(p):
        meta["sweep"] = True
        idx = read_table(p / "index.parquet")
        keys = (read_resolved(p / "sweep.resolved.yaml") or {}).get("override_keys") or []
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
            found.append(load_run(p / str(row["run_dir"]), label, point_id=pid, variant=variant, overrides=ov))
    elif (p / "summary.json").exists():
        s = read_run_dir(p)
        found.append(load_run(p, s["name"], s))
    elif p.is_dir() and any((c / "summary.json").exists() for c in p.iterdir()):
        for name in variant_order(p):
            found.append(load_run(p / name, name))
        meta["left_out"] += [str(p / name) for name in variants_without_summary(p)]
        meta["ignored"] += [str(p / name) for name in unlisted_variants(p)]
    else:
        raise KvsimError(f"{p}: not a kvsim run, variants or sweep directory (no summary.json, no index.parquet)")
    return found


def refuse_repeated_runs(runs: list[Run], given: list[str]) -> None:
    """One run given twice (the same directory twice, a variants directory and one of its variants, a
    sweep and one of its points) would be compared with itself under two labels: refused."""
    seen: dict[Path, str] = {}
    for run, raw in zip(runs, given):
        where = Path(run.path).resolve()
        if where in seen:
            how = f"{raw} twice" if seen[where] == raw else f"as {seen[where]} and as {raw}"
            raise KvsimError(f"compare: the run {run.path} is given twice ({how}); give each run directory once")
        seen[where] = raw


def py_value(v):
    return v.item() if hasattr(v, "item") else v


def variant_order(run_dir: Path) -> list[str]:
    """The variant subdirectories of ``run_dir`` in the scenario's order (``scenario.resolved.yaml``
    lists the runs as the scenario file does, baseline first when ``baseline:`` names one). Only the
    runs it lists are the run's variants: another subdirectory with a ``summary.json`` (a copy a
    user left there) is not one (:func:`unlisted_variants`); without the file, every subdirectory
    with a ``summary.json``, by name. One order for every table, plot and report of a run."""
    run_dir = Path(run_dir)
    have = sorted(c.name for c in run_dir.iterdir() if (c / "summary.json").exists())
    runs = _scenario_runs(run_dir)
    order = [str(n) for n in runs if str(n) in have] if runs else have
    return baseline_first(order, scenario_baseline(run_dir))


def scenario_baseline(run_dir: Path) -> str | None:
    """The ``baseline:`` variant named by ``run_dir``'s scenario.resolved.yaml, or None."""
    base = next((r["scenario"].get("baseline") for r in _scenario_runs(Path(run_dir)).values()
                 if isinstance(r.get("scenario"), dict)), None)
    return base if isinstance(base, str) else None


def baseline_first(names: list[str], baseline) -> list[str]:
    """``names`` with ``baseline`` (when it is one of them) moved first: the display order."""
    if isinstance(baseline, str) and baseline in names:
        return [baseline] + [n for n in names if n != baseline]
    return list(names)


def variants_without_summary(run_dir: Path) -> list[str]:
    """The variants that ``run_dir``'s scenario.resolved.yaml lists but that have no ``summary.json``
    (deleted, or a folder copied without it): left out of compare and report, with a note."""
    run_dir = Path(run_dir)
    return [str(n) for n in _scenario_runs(run_dir) if not (run_dir / str(n) / "summary.json").exists()]


def unlisted_variants(run_dir: Path) -> list[str]:
    """Subdirectories of ``run_dir`` with a ``summary.json`` that its scenario.resolved.yaml does not
    list as runs (e.g. ``recompute-backup``, a copy of a variant): not compared or reported, with a note."""
    run_dir = Path(run_dir)
    runs = _scenario_runs(run_dir)
    if not runs:
        return []
    return sorted(c.name for c in run_dir.iterdir() if c.name not in runs and (c / "summary.json").exists())


def _scenario_runs(run_dir: Path) -> dict:
    """The ``runs`` of ``run_dir``'s scenario.resolved.yaml, in the scenario's order ({} if there is
    no such file; a damaged one is a ConfigError line: :func:`resolved_runs`)."""
    return resolved_runs(run_dir / "scenario.resolved.yaml")


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


def in_memory_runs(results) -> list[Run]:
    """Runs for :func:`comparison_frame` from ``{name: RunResult}`` (``kvsim.run``),
    ``{name: run directory Path}`` (a ``kvsim.load_results`` LoadedRun's) or ``{name: summary dict}``: parameters from each
    result's scenario, offered rate from its requests; in the one display order (the given order,
    the ``baseline:`` run moved first, as :func:`variant_order`; summary dicts, which do not name the
    baseline, in the given order: kvsim.run and load_results give theirs baseline first). Anything
    else is a TypeError line."""
    if not isinstance(results, dict):
        raise TypeError(f"comparison_table(): expected a mapping {{name: RunResult, LoadedRun or summary dict}} "
                        f"(as kvsim.run or kvsim.load_results return), got {type(results).__name__}")
    runs = [_in_memory_run(str(name), res) for name, res in results.items()]
    order = baseline_first([r.label for r in runs], next((r.params.get("baseline") for r in runs), None))
    return sorted(runs, key=lambda r: order.index(r.label))


def _in_memory_run(name: str, res) -> Run:
    from kvsim.config.resolved import resolved_dict
    from kvsim.simulate import RunResult

    if isinstance(res, dict):
        return Run(label=name, path=None, summary=res, params={})
    if isinstance(res, Path):  # a run directory (kvsim.api passes a LoadedRun's)
        return load_run(res, name)
    if not isinstance(res, RunResult):
        raise TypeError(f"comparison_table(): {name!r}: expected a RunResult, LoadedRun or summary dict, "
                        f"got {type(res).__name__}")
    arr = res.requests["arrival_s"].to_numpy() if "arrival_s" in res.requests else None
    rate = math.nan
    if arr is not None and len(arr) > 1 and arr.max() > arr.min():
        rate = float((len(arr) - 1) / (arr.max() - arr.min()))
    return Run(label=name, path=None, summary={"name": name, **res.summary},
               params=flatten(resolved_dict(res.scenario)), _rate=rate)
