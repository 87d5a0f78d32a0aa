"""``kvsim capacity``: the highest request rate each variant serves within its SLOs.

As Vidur users size a deployment: for each variant of a scenario, find by bisection the largest
``trace.rate_scale`` at which the share of requests meeting every objective (SLO attainment,
docs/metrics.md) is at least ``attainment``. Attainment counts every request of the trace: a
rejected or unfinished request misses its objectives.

Search (per variant): run at ``lo``; if it already misses, the capacity is below the range
(``status = below_range``). Run at ``hi``; if it still meets, the capacity is at least ``hi``
(``above_range``). Otherwise bisect geometrically (``mid = sqrt(lo x hi)``, rate scales span
orders of magnitude) keeping ``lo`` meeting and ``hi`` missing until ``hi / lo <= 1 + tol``; the
answer is the last ``lo`` (``status = ok``). Bisection assumes attainment falls as the rate rises;
if it is not monotonic the answer is *a* boundary, not necessarily the highest passing scale
(every evaluation is listed in ``capacity.json``).

**Objectives.** ``--slo`` takes joint objectives (``ttft_ms=500,tpot_ms=50``: a request is good
when it meets every one; the variant meets when at least ``attainment`` of the trace's requests are
good) and percentile objectives as users write them (``p99_ttft_ms=2000,p50_tpot_ms=100``: "p99
TTFT <= 2 s and p50 TPOT <= 100 ms"), or both; the variant meets when every one holds.
``pQ_METRIC_ms=T`` holds when the Q-th percentile of METRIC over **every** request of the trace is at
most T ms, where a rejected or unfinished request counts as infinitely slow and the percentile is
the nearest-rank one (the ceil(Q/100 x n)-th smallest value): equivalently, at least Q % of the
trace's requests have METRIC <= T. A one-token output has TPOT 0 (as in goodput). With percentile
objectives only, ``attainment`` and goodput count requests within every metric's loosest limit.

**Reuse between steps** (exact): the trace is read, sliced and length-limited once per variant (once
for all variants with the same trace section, seed and model length); each step only divides the
arrival times by its rate scale, as ``trace.rate_scale`` does. Nothing simulated is reused across
rate scales. Each step prints one line on stderr (``--quiet``: none).

Output: a table on stdout, and ``capacity.csv`` (one row per variant) and ``capacity.json``
(also every evaluation) in ``--out`` (default ``results/<scenario name>-capacity``). kvsim only
writes those two files there and replaces them only when ``capacity.json`` says kvsim wrote it.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.errors import ConfigError, did_you_mean, format_choices
from kvsim.units import SET_HELP_UNITS

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
PERCENTILE_KEY = re.compile(r"p(\d+(?:\.\d+)?)_(ttft_ms|tpot_ms|e2e_ms)")
KEY_FORMS = "ttft_ms, tpot_ms, e2e_ms (joint, with --attainment) or pQ_ttft_ms, pQ_tpot_ms, pQ_e2e_ms (e.g. p99_ttft_ms)"
MARKER = "kvsim capacity"


@dataclass(frozen=True)
class Evaluation:
    rate_scale: float
    offered_rate_req_per_s: float | None
    attainment: float
    goodput_requests_per_s: float
    throughput_requests_per_s: float
    requests_total: int
    requests_rejected: int
    meets: bool
    percentiles_ms: dict = field(default_factory=dict)  # pQ_METRIC_ms -> the value reached (inf: unserved)


@dataclass(frozen=True)
class VariantCapacity:
    variant: str
    status: str  # ok | below_range | above_range
    capacity_rate_scale: float | None  # the highest scale found to meet the SLOs (None: below range)
    first_failing_rate_scale: float | None  # the lowest scale found to miss them (None: above range)
    capacity_offered_rate_req_per_s: float | None
    attainment_at_capacity: float | None
    goodput_at_capacity_requests_per_s: float | None
    evaluations: tuple[Evaluation, ...] = ()
    slo_ms: dict = field(default_factory=dict)  # the objectives searched against


def percentile_key(key: str) -> tuple[float, str] | None:
    """``p99_ttft_ms`` -> ``(99.0, "ttft_ms")``; None for a joint key."""
    m = PERCENTILE_KEY.fullmatch(key)
    return (float(m.group(1)), m.group(2)) if m else None


def parse_slo(text: str, where: str = "--slo") -> dict[str, float]:
    """``ttft_ms=500,p99_tpot_ms=50`` -> ``{"ttft_ms": 500.0, "p99_tpot_ms": 50.0}`` (one-line errors)."""
    out: dict[str, float] = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"{where}: {part!r} is not KEY=MS; valid keys: {KEY_FORMS}")
        pk = percentile_key(key)
        if pk is not None and not 0 < pk[0] < 100:
            raise ConfigError(f"{where}: {key}: percentile {pk[0]:g} must be between 0 and 100 (exclusive), "
                              f"e.g. p99_ttft_ms")
        if key not in SLO_KEYS and pk is None:
            examples = [*SLO_KEYS, *(f"p99_{k}" for k in SLO_KEYS), *(f"p50_{k}" for k in SLO_KEYS)]
            raise ConfigError(f"{where}: unknown objective {key!r}{did_you_mean(key, examples)}; "
                              f"valid keys: {KEY_FORMS}")
        try:
            v = float(value)
        except ValueError:
            raise ConfigError(f"{where}: {key}={value!r} is not a number of milliseconds") from None
        if not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{where}: {key}={value} must be a positive, finite number of milliseconds")
        out[key] = v
    if not out:
        raise ConfigError(f"{where}: give at least one objective, e.g. ttft_ms=500,tpot_ms=50 or "
                          f"p99_ttft_ms=2000,p50_tpot_ms=100; valid keys: {KEY_FORMS}")
    return out


def check_search(lo: float, hi: float, tol: float, attainment: float) -> None:
    for name, v in (("--lo", lo), ("--hi", hi), ("--tol", tol), ("--attainment", attainment)):
        if not math.isfinite(v) or v <= 0:
            raise ConfigError(f"capacity: {name} {v} must be a positive, finite number")
    if lo >= hi:
        raise ConfigError(f"capacity: --lo {lo} must be below --hi {hi}")
    if attainment > 1:
        raise ConfigError(f"capacity: --attainment {attainment} is a fraction of requests: at most 1")


def search(evaluate: Callable[[float], Evaluation], lo: float, hi: float, tol: float,
           name: str = "", log: Callable[[str], None] | None = None) -> VariantCapacity:
    """Bisection over the rate scale (see the module docstring). ``evaluate(scale)`` runs once."""
    evals: list[Evaluation] = []

    def ev(scale: float) -> Evaluation:
        t0 = time.perf_counter()
        e = evaluate(scale)
        evals.append(e)
        if log:
            pct = "".join(f", {k} {v:.4g}" for k, v in e.percentiles_ms.items())
            log(f"capacity {name} step {len(evals)}: rate_scale {scale:.4g} -> attainment {e.attainment:.3f}{pct} "
                f"({'meets' if e.meets else 'misses'} the SLOs) [{time.perf_counter() - t0:.1f} s]")
        return e

    def result(status: str, good: Evaluation | None, bad_scale: float | None) -> VariantCapacity:
        return VariantCapacity(
            variant=name, status=status, capacity_rate_scale=None if good is None else good.rate_scale,
            first_failing_rate_scale=bad_scale,
            capacity_offered_rate_req_per_s=None if good is None else good.offered_rate_req_per_s,
            attainment_at_capacity=None if good is None else good.attainment,
            goodput_at_capacity_requests_per_s=None if good is None else good.goodput_requests_per_s,
            evaluations=tuple(sorted(evals, key=lambda e: e.rate_scale)))

    low = ev(lo)
    if not low.meets:
        return result("below_range", None, lo)
    high = ev(hi)
    if high.meets:
        return result("above_range", high, None)
    good, bad = low, hi
    while bad / good.rate_scale > 1 + tol:
        mid = math.sqrt(good.rate_scale * bad)
        e = ev(mid)
        if e.meets:
            good = e
        else:
            bad = mid
    return result("ok", good, bad)


def _offered_rate(trace) -> float | None:
    a = trace.arrival_s
    if len(a) < 2 or a[-1] <= a[0]:
        return None
    return float((len(a) - 1) / (a[-1] - a[0]))


def split_objectives(slo: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """(joint ``{ttft_ms: ..}``, percentile ``{p99_ttft_ms: ..}``) objectives."""
    joint = {k: v for k, v in slo.items() if k in SLO_KEYS}
    return joint, {k: v for k, v in slo.items() if k not in SLO_KEYS}


def percentile_values(requests, objectives: dict[str, float]) -> dict[str, float]:
    """``pQ_METRIC_ms`` -> the nearest-rank Q-th percentile (ms) of METRIC over every request of the
    trace, unserved ones counting as infinitely slow (module docstring)."""
    import numpy as np

    out = {}
    n = len(requests)
    finished = (requests["status"] == "finished").to_numpy()
    for key in objectives:
        q, metric = percentile_key(key)
        v = requests[metric[:-3] + "_s"].to_numpy(dtype=float) * 1000.0
        if metric == "tpot_ms":
            v = np.where(requests["output_tokens"].to_numpy() <= 1, 0.0, v)  # as good_requests does
        v = np.sort(np.where(finished & ~np.isnan(v), v, np.inf))
        out[key] = float(v[max(math.ceil(q / 100.0 * n), 1) - 1]) if n else math.inf
    return out


class TraceCache:
    """Traces read once and reused at every rate scale (exact: ``trace.rate_scale`` is the last
    transform, a division of the arrival times, kvsim.trace.config.build_trace)."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self._unscaled: dict[str, tuple] = {}

    def get(self, scn, scale: float):
        from kvsim.simulate import build_trace
        from kvsim.trace.transforms import scale_rate

        unit = scn.model_copy(update={"trace": scn.trace.model_copy(update={"rate_scale": 1.0})})
        key = json.dumps([unit.trace.model_dump(mode="json"), unit.seed, unit.model.max_model_len_tokens],
                         sort_keys=True)
        if key not in self._unscaled:
            self._unscaled[key] = build_trace(unit, self.base_dir)
        trace, report = self._unscaled[key]
        scaled = scale_rate(trace, scale)
        scaled.validate(report.get("file", "synthetic trace"))
        return scaled, {**report, "rate_scale": scale}


def evaluator(scn, base_dir: Path, slo: dict[str, float], attainment: float, where: str,
              traces: TraceCache | None = None):
    """``scale -> Evaluation`` for one variant's scenario with ``slo`` and ``trace.rate_scale = scale``."""
    from kvsim.config import SLOConfig
    from kvsim.simulate import run

    joint, pct = split_objectives(slo)
    counted = joint or {metric: max(v for k, v in pct.items() if percentile_key(k)[1] == metric)
                        for metric in {percentile_key(k)[1] for k in pct}}
    base = scn.model_copy(update={"slo": SLOConfig(**counted)})
    traces = traces or TraceCache(base_dir)

    def evaluate(scale: float) -> Evaluation:
        s = base.model_copy(update={"trace": base.trace.model_copy(update={"rate_scale": float(scale)})})
        trace, report = traces.get(s, float(scale))
        res = run(s, base_dir, trace=trace, trace_report=report, where=where)
        sm = res.summary
        att = float(sm["slo"]["attainment"])
        reached = percentile_values(res.requests, pct) if pct else {}
        meets = (not joint or att >= attainment) and all(reached[k] <= v for k, v in pct.items())
        return Evaluation(rate_scale=float(scale), offered_rate_req_per_s=_offered_rate(trace), attainment=att,
                          goodput_requests_per_s=float(sm["slo"]["goodput_requests_per_s"]),
                          throughput_requests_per_s=float(sm["throughput_requests_per_s"]),
                          requests_total=int(sm["requests_total"]), requests_rejected=int(sm["requests_rejected"]),
                          meets=meets, percentiles_ms=reached)

    return evaluate


def capacity(loaded, slo: dict[str, float] | None = None, *, attainment: float = 0.9, lo: float = 0.25,
             hi: float = 8.0, tol: float = 0.05, variants: list[str] | None = None,
             log: Callable[[str], None] | None = None) -> list[VariantCapacity]:
    """The capacity of every run (variant) of a :class:`kvsim.config.LoadedScenario`. ``slo``
    defaults to the scenario's ``slo:`` key."""
    check_search(lo, hi, tol, attainment)
    runs = loaded.runs
    if variants:
        unknown = [v for v in variants if v not in runs]
        if unknown:
            raise ConfigError(f"{loaded.path}: --variant {unknown[0]!r}{did_you_mean(unknown[0], runs)}; "
                              f"valid choices: {format_choices(runs)}")
        runs = {v: runs[v] for v in variants}
    out = []
    traces = TraceCache(loaded.path.parent)  # shared by the variants: one read of each distinct trace
    for name, scn in runs.items():
        objectives = slo or (scn.slo.as_dict() if scn.slo is not None else None)
        if not objectives:
            raise ConfigError(f"{loaded.path}: capacity needs SLOs: give --slo ttft_ms=..,tpot_ms=.. or "
                              f"--slo p99_ttft_ms=..,p50_tpot_ms=.., or an slo: section in the scenario "
                              f"(keys {format_choices(SLO_KEYS)})")
        ev = evaluator(scn, loaded.path.parent, objectives, attainment, str(loaded.path), traces)
        out.append(replace(search(ev, lo, hi, tol, name=name, log=log), slo_ms=dict(objectives)))
    return out


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
    csv_path, json_path = out / "capacity.csv", out / "capacity.json"
    if csv_path.exists() or json_path.exists():
        try:
            ours = json.loads(json_path.read_text()).get("kind") == MARKER
        except (OSError, ValueError, AttributeError):
            ours = False
        if not ours:
            raise ConfigError(f"--out {out}: holds capacity.csv / capacity.json that kvsim capacity did not write; "
                              f"choose another --out")


def write_outputs(out: Path, results: list[VariantCapacity], meta: dict) -> dict[str, Path]:
    """Write ``capacity.csv`` and ``capacity.json`` into ``out`` (atomically each); refuse to
    replace files of those names that kvsim did not write."""
    from kvsim.version import __version__
    from kvsim.results import write_json, write_text_atomic

    out = Path(out)
    check_out(out)
    csv_path, json_path = out / "capacity.csv", out / "capacity.json"
    out.mkdir(parents=True, exist_ok=True)
    doc = {"kind": MARKER, "kvsim_version": __version__, **meta,
           "variants": [asdict(r) for r in results]}
    write_text_atomic(csv_path, results_frame(results).to_csv(index=False))
    write_json(json_path, doc)
    return {"capacity.csv": csv_path, "capacity.json": json_path}


def _cmd_capacity(args) -> int:
    from kvsim.config import load_scenario

    loaded = load_scenario(args.file, args.set or [])
    slo = parse_slo(args.slo) if args.slo is not None else None
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr))
    out = Path(args.out) if args.out else Path("results") / f"{loaded.name}-capacity"
    check_out(out)  # before hours of simulation, not after
    results = capacity(loaded, slo, attainment=args.attainment, lo=args.lo, hi=args.hi, tol=args.tol,
                       variants=args.variant, log=log)
    meta = {"scenario_file": str(loaded.path), "slo_ms_given": slo, "attainment": args.attainment,
            "lo": args.lo, "hi": args.hi, "tol": args.tol, "set": list(args.set or [])}
    written = write_outputs(out, results, meta)
    print(table_text(results))
    for p in written.values():
        print(p)
    return 0


def register(subparsers) -> None:
    c = subparsers.add_parser(
        "capacity", help="highest request rate (trace rate_scale) per variant that meets SLOs, by bisection",
        description="For each variant, find by bisection the highest trace.rate_scale at which at least "
                    "--attainment of the trace's requests meet every SLO (rejected and unfinished requests "
                    "miss). Prints a table; writes capacity.csv and capacity.json (every evaluation) to --out. "
                    "See docs/metrics.md (goodput, SLO attainment) and kvsim/capacity.py.")
    c.add_argument("file", help="scenario YAML (all its variants are searched)")
    c.add_argument("--slo", metavar="KEY=MS,...",
                   help="objectives in ms: joint ones, met by at least --attainment of the requests together "
                        "(ttft_ms=500,tpot_ms=50; keys ttft_ms, tpot_ms, e2e_ms), and/or percentiles "
                        "(p99_ttft_ms=2000,p50_tpot_ms=100: the nearest-rank p99 TTFT over every request of the "
                        "trace, unserved ones counting as missed, at most 2000 ms); default: the scenario's slo: "
                        "section")
    c.add_argument("--attainment", type=float, default=0.9,
                   help="share of requests that must meet every joint SLO (default 0.9; percentile SLOs carry "
                        "their own share)")
    c.add_argument("--lo", type=float, default=0.25, help="lowest rate_scale tried (default 0.25)")
    c.add_argument("--hi", type=float, default=8.0, help="highest rate_scale tried (default 8)")
    c.add_argument("--tol", type=float, default=0.05,
                   help="stop when the failing scale is within this fraction above the passing one (default 0.05)")
    c.add_argument("--variant", action="append", metavar="NAME", help="search only this variant (repeatable)")
    c.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key (repeatable); " + SET_HELP_UNITS)
    c.add_argument("--out", help="directory for capacity.csv / capacity.json (default results/<name>-capacity)")
    c.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr (default: one per bisection step, with its wall time)")
    c.set_defaults(func=_cmd_capacity)
