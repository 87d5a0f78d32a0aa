"""The capacity search: objectives, one evaluation per rate scale (with reuse by key), bisection
(the package docstring, kvsim/capacity/__init__.py, describes it)."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kvsim.errors import ConfigError, did_you_mean, format_choices

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
    key: str = ""  # what was simulated (scenario at this scale, trace sha256, objectives, kvsim version)
    rejected_by_reason: dict = field(default_factory=dict)  # summary.json's: reject_reason -> requests
    reused: bool = False  # taken from an earlier capacity.json, not simulated (not written out)


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
        if pk is not None:  # one spelling per objective: p90.0_ttft_ms and p090_ttft_ms are p90_ttft_ms
            key = f"p{pk[0]:g}_{pk[1]}"
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
        if key in out:
            raise ConfigError(f"{where}: {key} is given twice ({out[key]:g} and {v:g} ms); give each objective once")
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
    if not math.isfinite(hi / lo):
        raise ConfigError(f"capacity: --hi {hi} / --lo {lo} is beyond a floating-point number; narrow the range")
    if attainment > 1:
        raise ConfigError(f"capacity: --attainment {attainment} is a fraction of requests: at most 1")


def search(evaluate: Callable[[float], Evaluation], lo: float, hi: float, tol: float,
           name: str = "", log: Callable[[str], None] | None = None,
           on_evaluation: Callable[[Evaluation], None] | None = None) -> VariantCapacity:
    """Bisection over the rate scale (see the module docstring). ``evaluate(scale)`` runs once."""
    evals: list[Evaluation] = []
    most = max_steps(lo, hi, tol)

    def ev(scale: float) -> Evaluation:
        t0 = time.perf_counter()
        e = evaluate(scale)
        evals.append(e)
        if on_evaluation:
            on_evaluation(e)
        if log:
            pct = "".join(f", {k} {v:.4g}" for k, v in e.percentiles_ms.items())
            took = "reused from capacity.json" if e.reused else f"{time.perf_counter() - t0:.1f} s"
            log(f"capacity {name} step {len(evals)}/{most}: rate_scale {scale:.4g} -> attainment {e.attainment:.3f}"
                f"{pct} ({'meets' if e.meets else 'misses'} the SLOs) [{took}]")
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


def why_below_range(r: VariantCapacity, attainment: float) -> str | None:
    """For a ``below_range`` result: why its lowest scale missed. When the requests rejected there
    (a prompt that can never fit is rejected at every rate) already exceed what an objective lets miss,
    no rate can meet it, and the line says so instead of suggesting a lower ``--lo``."""
    if r.status != "below_range" or not r.evaluations:
        return None
    low = r.evaluations[0]
    n, rej = low.requests_total, low.requests_rejected
    joint, pct = split_objectives(r.slo_ms)
    blocked = []
    for key in pct:
        allowed = n - max(math.ceil(percentile_key(key)[0] / 100.0 * n), 1)
        if rej > allowed:
            blocked.append(f"{key} lets at most {allowed} miss")
    if joint and rej > n - math.ceil(attainment * n):
        blocked.append(f"attainment {attainment:g} lets at most {n - math.ceil(attainment * n)} miss")
    if blocked:
        why = ", ".join(f"{k}: {v}" for k, v in low.rejected_by_reason.items()) or "reasons: see summary.json"
        return (f"{r.variant}: {rej} of {n} requests are rejected at rate_scale {low.rate_scale:g} ({why}; "
                f"docs/metrics.md) and {'; '.join(blocked)}: no rate meets the SLOs; relax the objective or "
                f"change what rejects them")
    reached = "".join(f", {k} {v:.4g} ms" for k, v in low.percentiles_ms.items())
    return (f"{r.variant}: misses already at rate_scale {low.rate_scale:g} (attainment {low.attainment:.3f}"
            f"{reached}, {rej} of {n} rejected); try a lower --lo")


def max_steps(lo: float, hi: float, tol: float) -> int:
    """Evaluations the search makes at most: ``lo``, ``hi`` and the bisection steps until
    ``hi / lo <= 1 + tol`` (each halves the log-width)."""
    width, target = math.log(hi / lo), math.log1p(tol)
    return 2 + max(0, math.ceil(math.log2(width / target))) if width > target else 2


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


def evaluation_key(scn, report: dict, percentiles: dict[str, float]) -> str:
    """What an evaluation simulated: the resolved scenario (its ``slo`` and ``trace.rate_scale``
    included), the trace file's sha256 (a synthetic trace: its spec's), the percentile objectives and
    kvsim's version. Equal keys give byte-identical results (same scenario and seed), so an
    evaluation stored under its key in ``capacity.json`` is reused instead of simulated again."""
    import hashlib

    from kvsim.config.resolved import resolved_dict
    from kvsim.version import __version__

    payload = {"scenario": resolved_dict(scn), "trace": report.get("sha256") or report.get("spec_sha256"),
               "percentiles": sorted(percentiles), "kvsim": __version__}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def evaluator(scn, base_dir: Path, slo: dict[str, float], attainment: float, where: str,
              traces: TraceCache | None = None, known: dict[str, Evaluation] | None = None):
    """``scale -> Evaluation`` for one variant's scenario with ``slo`` and ``trace.rate_scale = scale``
    (``known``: evaluations by key, reused instead of simulated; ``meets`` is recomputed for
    ``attainment``)."""
    from kvsim.config import SLOConfig
    from kvsim.simulate import run

    joint, pct = split_objectives(slo)
    counted = joint or {metric: max(v for k, v in pct.items() if percentile_key(k)[1] == metric)
                        for metric in {percentile_key(k)[1] for k in pct}}
    base = scn.model_copy(update={"slo": SLOConfig(**counted)})
    traces = traces or TraceCache(base_dir)

    def meets(att: float, reached: dict[str, float]) -> bool:
        return (not joint or att >= attainment) and all(reached[k] <= v for k, v in pct.items())

    def evaluate(scale: float) -> Evaluation:
        s = base.model_copy(update={"trace": base.trace.model_copy(update={"rate_scale": float(scale)})})
        trace, report = traces.get(s, float(scale))
        key = evaluation_key(s, report, pct)
        if known and key in known:
            old = known[key]
            return replace(old, meets=meets(old.attainment, old.percentiles_ms), reused=True)
        res = run(s, base_dir, trace=trace, trace_report=report, where=where)
        sm = res.summary
        att = float(sm["slo"]["attainment"])
        reached = percentile_values(res.requests, pct) if pct else {}
        return Evaluation(rate_scale=float(scale), offered_rate_req_per_s=_offered_rate(trace), attainment=att,
                          goodput_requests_per_s=float(sm["slo"]["goodput_requests_per_s"]),
                          throughput_requests_per_s=float(sm["throughput_requests_per_s"]),
                          requests_total=int(sm["requests_total"]), requests_rejected=int(sm["requests_rejected"]),
                          meets=meets(att, reached), percentiles_ms=reached, key=key,
                          rejected_by_reason=dict(sm.get("rejected_by_reason") or {}))

    return evaluate


def capacity(loaded, slo: dict[str, float] | None = None, *, attainment: float = 0.9, lo: float = 0.25,
             hi: float = 8.0, tol: float = 0.05, variants: list[str] | None = None,
             log: Callable[[str], None] | None = None,
             known: dict[str, Evaluation] | None = None,
             on_evaluation: Callable[[Evaluation], None] | None = None) -> list[VariantCapacity]:
    """The capacity of every run (variant) of a :class:`kvsim.config.LoadedScenario`. ``slo``
    defaults to the scenario's ``slo:`` key; ``known`` (:func:`known_evaluations`) are reused."""
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
        ev = evaluator(scn, loaded.path.parent, objectives, attainment, str(loaded.path), traces, known)
        found = search(ev, lo, hi, tol, name=name, log=log, on_evaluation=on_evaluation)
        out.append(replace(found, slo_ms=dict(objectives)))
    return out


