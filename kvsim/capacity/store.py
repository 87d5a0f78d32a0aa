"""capacity.csv / capacity.json: the table, the files kvsim capacity writes (and only replaces when it
wrote them), the evaluations a later run reuses, and what Ctrl-C keeps."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.capacity.rate_search import MARKER, SLO_KEYS, Evaluation, VariantCapacity
from kvsim.errors import ConfigError
from kvsim.outdir import check_creatable

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd

def known_evaluations(out: Path) -> dict[str, Evaluation]:
    """Evaluations (by key) in a ``capacity.json`` kvsim wrote in ``out``; {} when there is none."""
    try:
        doc = json.loads((Path(out) / "capacity.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("kind") != MARKER:
        return {}
    out_evals = {}
    for e in _stored_evaluations(doc):
        try:
            e = {**e, "reused": True, "percentiles_ms": {k: math.inf if x is None else float(x)
                                                         for k, x in (e.get("percentiles_ms") or {}).items()}}
            ev = Evaluation(**e)
        except (TypeError, ValueError, AttributeError):
            continue  # written by another kvsim version, or damaged: simulate again
        if ev.key:
            out_evals[ev.key] = ev
    return out_evals


def _stored_evaluations(doc: dict) -> list:
    """The evaluation records of a capacity.json, skipping whatever is not shaped as kvsim writes it."""
    def dicts(x):
        return [e for e in x if isinstance(e, dict)] if isinstance(x, list) else []

    stored = [e for v in dicts(doc.get("variants")) for e in dicts(v.get("evaluations"))]
    return stored + dicts(doc.get("evaluations_unfinished"))


def results_frame(results: list[VariantCapacity]) -> pd.DataFrame:
    import pandas as pd

    rows = []
    for r in results:
        row = {k: v for k, v in asdict(r).items() if k not in ("evaluations", "slo_ms")}
        row["evaluations"] = len(r.evaluations)
        row.update({k: r.slo_ms.get(k) for k in SLO_KEYS})
        row.update({k: v for k, v in r.slo_ms.items() if k not in SLO_KEYS})
        at = next((e for e in r.evaluations if e.rate_scale == r.capacity_rate_scale), None)
        row.update({f"{k}_at_capacity": v for k, v in (at.percentiles_ms if at else {}).items()})
        rows.append(row)
    return pd.DataFrame(rows)


def table_text(results: list[VariantCapacity]) -> str:
    header = ["variant", "status", "capacity rate_scale", "offered req/s", "attainment", "goodput req/s",
              "first failing scale"]
    f = (lambda v, spec: "n/a" if v is None else format(v, spec))
    rows = [[r.variant, r.status, f(r.capacity_rate_scale, ".4g"), f(r.capacity_offered_rate_req_per_s, ".4g"),
             f(r.attainment_at_capacity, ".3f"), f(r.goodput_at_capacity_requests_per_s, ".4g"),
             f(r.first_failing_rate_scale, ".4g")] for r in results]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in [header, *rows])


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that is a file, or holds capacity.csv / capacity.json kvsim did not write."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    check_creatable(out, "--out")  # before the search, not after it
    csv_path, json_path = out / "capacity.csv", out / "capacity.json"
    if csv_path.exists() or json_path.exists():
        try:
            ours = json.loads(json_path.read_text()).get("kind") == MARKER
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise ConfigError(f"--out {out}: holds capacity.csv / capacity.json that kvsim capacity did not write; "
                              f"choose another --out")


def _finite(obj):
    """JSON has no infinity: a percentile that falls on an unserved request is written as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_outputs(out: Path, results: list[VariantCapacity], meta: dict) -> dict[str, Path]:
    """Write ``capacity.csv`` and ``capacity.json`` into ``out`` (atomically each); refuse to
    replace files of those names that kvsim did not write."""
    from kvsim.version import __version__
    from kvsim.results import write_json, write_text_atomic

    out = Path(out)
    check_out(out)
    csv_path, json_path = out / "capacity.csv", out / "capacity.json"
    out.mkdir(parents=True, exist_ok=True)
    variants = [asdict(r) for r in results]
    for v in variants:  # a rerun that reused evaluations writes what a fresh run writes
        v["evaluations"] = [{k: x for k, x in e.items() if k != "reused"} for e in v["evaluations"]]
    doc = {"kind": MARKER, "kvsim_version": __version__, **meta, "variants": variants}
    write_json(json_path, _finite(doc))  # first: it marks the directory as kvsim capacity's
    write_text_atomic(csv_path, results_frame(results).to_csv(index=False))
    return {"capacity.csv": csv_path, "capacity.json": json_path}


def keep_unfinished(out: Path, meta: dict, known: dict[str, Evaluation], done: list[Evaluation]) -> str:
    """After Ctrl-C: keep every evaluation (earlier and this run's) in ``capacity.json`` marked
    ``complete: false`` for the rerun to reuse; drop the capacity.csv it no longer matches. The message."""
    from kvsim.results import write_json
    from kvsim.version import __version__

    kept = {**{k: e for k, e in known.items()}, **{e.key: e for e in done if e.key}}
    if not kept:
        return "interrupted before any capacity step finished; nothing was written"
    out.mkdir(parents=True, exist_ok=True)
    evals = [{k: x for k, x in asdict(e).items() if k != "reused"} for e in kept.values()]
    write_json(out / "capacity.json", _finite({"kind": MARKER, "kvsim_version": __version__, **meta,
                                               "complete": False, "variants": [], "evaluations_unfinished": evals}))
    (out / "capacity.csv").unlink(missing_ok=True)  # kvsim's (check_out), and no longer this run's answer
    return (f"interrupted; {len(done)} step(s) of this run and {len(known)} earlier kept in {out / 'capacity.json'} "
            f"(marked complete: false); rerun the same command to reuse them")


