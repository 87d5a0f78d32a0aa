"""The Python API: run scenarios into result directories, and load them back.

``kvsim.run(scenario)`` returns a :class:`RunResult` in memory; ``run_to_dir`` is what
``kvsim run`` calls; ``load_results(dir)`` reads a run directory back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.version import __version__
from kvsim.config import LoadedScenario, Scenario, load_mapping, load_scenario
from kvsim.config.load import MAPPING_PATH
from kvsim.errors import Interrupted, KvsimError, SimulationLimitError, TraceError
from kvsim.dropped import Dropped, warnings_for
from kvsim.outdir import MARKER, RESUME_FILE, atomic_out_dir, check_out_dir
from kvsim.results import write_json, write_parquet, write_text_atomic, write_yaml
from kvsim.config.resolved import resolved_dict
from kvsim.simulate import RunResult, build_trace
from kvsim.simulate import run as run_scenario

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd


def run(scenario: Scenario | LoadedScenario | str | Path | dict, *, base_dir: Path | str | None = None,
        check_invariants: bool = False) -> RunResult | dict[str, RunResult]:
    """Simulate in memory. A scenario with variants returns {variant: RunResult} in the display order
    (the scenario's, its ``baseline:`` variant first), else one RunResult
    (``name``: the variant's, or the scenario's). A dict is a scenario's mapping, validated and
    expanded as a file's would be (bad input: a ConfigError line); relative paths in a dict or
    Scenario are read against ``base_dir`` (default: the current directory), in a file's against
    its directory."""
    loaded = as_loaded(scenario, "run", base_dir)
    base = Path(base_dir) if base_dir is not None else loaded.path.parent
    results = _run_all(loaded, base, check_invariants)
    return results if loaded.variants else next(iter(results.values()))


def as_loaded(scenario, caller: str, base_dir: Path | str | None = None) -> LoadedScenario:
    """``scenario`` (a path, mapping, Scenario or LoadedScenario) as a LoadedScenario; a mapping or
    Scenario is named :data:`MAPPING_PATH` ("scenario", in the current directory or ``base_dir``)."""
    if isinstance(scenario, (str, Path)):
        return load_scenario(scenario)
    if isinstance(scenario, dict):
        return load_mapping(scenario, base_dir)
    if isinstance(scenario, Scenario):  # one run, as given (its variants: already expanded, or not wanted)
        return LoadedScenario(path=MAPPING_PATH, name=str(scenario.name or MAPPING_PATH.stem),
                              base=scenario, variants={})
    if isinstance(scenario, LoadedScenario):
        return scenario
    raise TypeError(f"{caller}(): expected a scenario path, mapping, Scenario or LoadedScenario, "
                    f"got {type(scenario).__name__}")


def _run_all(loaded: LoadedScenario, base_dir: Path, check_invariants: bool) -> dict[str, RunResult]:
    """Every run of ``loaded``, in the one display order (the scenario's, its ``baseline:`` first), as
    load_results, comparison_table and comparison.csv list them."""
    from kvsim.report.runs import baseline_first

    traces = TraceCache(base_dir, str(loaded.path))
    check_runs_supported(loaded, {name: traces.get(scn) for name, scn in loaded.runs.items()})
    results = {name: simulate_variant(loaded, name, scn, base_dir, traces.get(scn), check_invariants=check_invariants)
               for name, scn in loaded.runs.items()}
    return {name: results[name] for name in baseline_first(list(results), loaded.base.baseline)}


def simulate_variant(loaded: LoadedScenario, name: str, scn: Scenario, base_dir: Path, built: tuple,
                     **kw) -> RunResult:
    """One run of ``loaded`` (its trace ``built``: (trace, report)), named ``name``; a simulation
    limit it passes is one line naming the scenario and the run (``FILE: NAME: ...``), a setting it
    refuses one line naming the variant and the ``--set`` argument (LoadedScenario.run_error)."""
    trace, report = built
    try:
        res = run_scenario(scn, base_dir, trace=trace, trace_report=report, where=str(loaded.path), **kw)
    except SimulationLimitError as e:
        raise SimulationLimitError(f"{loaded.path}: {name}: {e}") from None
    except KvsimError as e:
        raise loaded.run_error(name, e) from None
    return dataclasses.replace(res, name=name)


def check_runs_supported(loaded: LoadedScenario, built: dict[str, tuple]) -> None:
    """Before any run is simulated: what a later run would refuse of its settings and its trace
    (:func:`kvsim.build.check_run_supported`, as each run checks it again), so a bad variant is one
    line up front, not after the variants before it ran."""
    from kvsim.build import check_run_supported

    for name, scn in loaded.runs.items():
        try:
            check_run_supported(scn, built[name][0], str(loaded.path))
        except KvsimError as e:
            raise loaded.run_error(name, e) from None


class TraceCache:
    """Variants share one trace when their trace section, seed and max length agree."""

    def __init__(self, base_dir: Path, where: str = "scenario"):
        self.base_dir = base_dir
        self.where = where
        self._cache: dict[str, tuple] = {}

    def get(self, scn: Scenario, where: str | None = None):
        """(trace, report) of ``scn``; a trace that cannot be built is one TraceError line naming
        ``where`` (default: the cache's) and ``trace.file`` or ``trace``."""
        key = json.dumps([scn.trace.model_dump(mode="json"), scn.seed, scn.model.max_model_len_tokens],
                         sort_keys=True)
        if key not in self._cache:
            try:
                self._cache[key] = build_trace(scn, self.base_dir)
            except TraceError as e:
                field = "trace.file" if scn.trace.file is not None else "trace"
                raise TraceError(f"{where or self.where}: {field}: {e}") from None
        return self._cache[key]


class _Progress:
    """One progress bar on stderr for the whole ``kvsim run``: simulated requests, then plotting and
    the report (each counted as a share of the requests so the bar reaches 100 % when the
    directory is complete). Log lines are printed above the bar, each on its own line."""

    FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}"

    def __init__(self, total: int, enabled: bool, extra: int = 0):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total + extra, desc="simulating", file=sys.stderr, leave=False,
                            bar_format=self.FORMAT, dynamic_ncols=True)

    def __call__(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set_description(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text)

    def wrap(self, log):
        """``log`` printing above the bar (the bar is redrawn below the line)."""
        if log is None or self.bar is None:
            return log
        bar = self.bar

        def say(message: str) -> None:
            with bar.external_write_mode(file=sys.stderr):
                log(message)
        return say

    def close(self) -> None:
        if self.bar is not None:
            # tqdm may skip drawing the last update (min interval / iterations); draw the final state
            self.bar.refresh()
            self.bar.close()


def default_out_dir(loaded: LoadedScenario, reports: list[dict]) -> Path:
    payload = {name: resolved_dict(s) for name, s in loaded.runs.items()}
    payload["__traces__"] = [r.get("sha256") for r in reports]
    h = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:8]
    return Path("results") / f"{loaded.name}-{h}"


VARIANT_FILES = ("summary.json", "requests.parquet", "steps.parquet")  # a finished variant has them all


def run_inputs(scn: Scenario, report: dict) -> dict:
    """What a run's results are made from: ``scenario`` (resolved) and ``trace`` (its build report:
    a file's sha256/content_sha256, a synthetic spec's hash and seed, the transforms' counts), in
    JSON form. ``scenario.resolved.yaml`` records it per run; a run is reused (an interrupted
    run's variant, a sweep's complete point) only when it is unchanged."""
    return json.loads(json.dumps({"scenario": resolved_dict(scn), "trace": report}, default=str))


def _fingerprint(scn: Scenario, report: dict, plots: bool, check_invariants: bool) -> dict:
    """What a finished variant was made from (:func:`run_inputs`, kvsim version, flags):
    an interrupted run's variant is reused only when this is unchanged."""
    doc = {"kvsim_version": __version__, **run_inputs(scn, report), "plots": plots,
           "check_invariants": check_invariants}
    return json.loads(json.dumps(doc, sort_keys=True, default=str))


def _write_resume(tmp: Path, done: dict[str, dict]) -> None:
    if done:
        write_text_atomic(tmp / RESUME_FILE, json.dumps(done, sort_keys=True) + "\n")
    else:
        (tmp / RESUME_FILE).unlink(missing_ok=True)


def _keep_finished(tmp: Path, fingerprints: dict[str, dict]) -> list[str]:
    """The variants an interrupted run left finished in ``tmp`` (listed in its RESUME_FILE with
    an unchanged fingerprint, their files all there), in scenario order; everything else in ``tmp``
    (kvsim's own temporary directory) is cleared."""
    try:
        record = json.loads((tmp / RESUME_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = {}
    record = record if isinstance(record, dict) else {}
    kept = [n for n, fp in fingerprints.items()
            if record.get(n) == fp and all((tmp / n / f).is_file() for f in VARIANT_FILES)]
    for e in tmp.iterdir():
        if e.name in (MARKER, RESUME_FILE) or e.name in kept:
            continue
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()
    _write_resume(tmp, {n: fingerprints[n] for n in kept})
    return kept


def _variant_line(name: str, summary: dict, lost: Dropped) -> str:
    """The console line of one finished variant."""
    return (f"{name}: {summary['requests_finished']}/{summary['requests_total']} finished"
            + "".join(f"; {p}" for p in lost.parts())
            + f", max concurrency {summary['concurrency']['max']}, "
              f"token states {100 * summary['kv']['token_states_frac']:.1f}% of KV")


def _interrupted_message(tmp: Path | None, done: list[str], total: int) -> str:
    if not done or tmp is None or not tmp.exists():
        what = "variant" if total > 1 else "result"
        gone = f" (kvsim removed its temporary directory {tmp.name})" if tmp is not None else ""
        return f"interrupted before any {what} was finished{gone}; no result directory was written"
    return (f"interrupted; kept the {len(done)} of {total} variants that had finished ({', '.join(done)}) in "
            f"{tmp.resolve()}; rerun the same command to resume: they are skipped unless the scenario changed")


def _write_resolved(tmp: Path, loaded: LoadedScenario, built: dict, summaries: dict | None = None) -> None:
    """``scenario.resolved.yaml``: every run's scenario with its defaults, its trace report and,
    once the runs are done (``summaries``), the attention backend (and, for an MoE model, the MoE
    kernel) each one resolved; and the engine
    profile with the keys it filled and each one's source (``engine_profile: {name, filled, sources}``)."""
    def entry(name: str, scn) -> dict:
        e = {**run_inputs(scn, built[name][1]),
             "engine_profile": {**scn.profile_filled(), "sources": scn.profile_sources()}}
        if summaries is not None:
            e["attention_backend"] = summaries[name]["kv_access"]["attention_backend"]
            if summaries[name].get("moe_kernel") is not None:  # MoE models only: dense runs keep their form
                e["moe_kernel"] = summaries[name]["moe_kernel"]
        return e

    write_yaml(tmp / "scenario.resolved.yaml", {
        "kvsim_version": __version__, "scenario_file": str(loaded.path), "name": loaded.name,
        "runs": {name: entry(name, scn) for name, scn in loaded.runs.items()},
    })


def _run_progress(loaded: LoadedScenario, built: dict, progress: bool | None, plots: bool):
    """The run's progress bar (on a terminal unless ``progress`` says) and the share of one stage:
    each variant's plots, the comparison plots and the report count as 1/20 of the requests each
    (at least 1)."""
    if progress is None:
        progress = sys.stderr.isatty()
    total = sum(len(t) for t, _ in built.values())
    stage = max(1, total // 20)
    stages = (len(loaded.runs) + (1 if loaded.variants else 0) + 1) * stage if plots else 0
    return _Progress(total, progress, extra=stages), stage


def _run_variant(loaded: LoadedScenario, name: str, scn, d: Path, built: tuple, bar, *, check_invariants: bool,
                 plots, stage: int) -> dict:
    """Run one variant into ``d`` (tables, summary and, with ``plots`` -- the kvsim.plots module --
    its plots); returns its summary."""
    d.mkdir(exist_ok=True)
    bar.set_description(name)
    res = simulate_variant(loaded, name, scn, loaded.path.parent, built, steps_path=d / "steps.parquet",
                           check_invariants=check_invariants, progress=bar)
    summary = {"name": name, "scenario": loaded.name, "kvsim_version": __version__, **res.summary}
    write_parquet(d / "requests.parquet", res.requests)
    write_json(d / "summary.json", summary)
    if plots is not None:
        bar.set_description(f"plotting {name}")
        plots.plot_run_dir(d)
        bar(stage)
    return summary


def _write_comparison(tmp: Path, summaries: dict, bar, *, plots, stage: int) -> None:
    """``comparison.parquet`` / ``.csv`` of this run's variants (and, with ``plots``, its plots)."""
    from kvsim.report.comparison_table import comparison_frame
    from kvsim.report.runs import collect_runs

    cruns, cmeta = collect_runs([tmp])
    cruns = [r for r in cruns if r.label in summaries]  # this run's variants only
    table = comparison_frame(cruns, cmeta, source_root=tmp)
    write_parquet(tmp / "comparison.parquet", table)
    write_text_atomic(tmp / "comparison.csv", table.to_csv(index=False))
    if plots is not None:
        bar.set_description("plotting the comparison")
        plots.plot_comparison_dir(tmp, [r.label for r in cruns])  # scenario order, baseline first
        bar(stage)


def run_to_dir(loaded: LoadedScenario | Scenario | str | Path | dict, out: Path | None = None, *,
               check_invariants: bool = False, progress: bool | None = None, plots: bool = True, log=None,
               warn=None, force: bool = False) -> Path:
    """Run every variant of ``loaded`` (or of the scenario file at that path, or of a mapping or
    Scenario as :func:`run` takes them, relative paths against the current directory) and write the
    result directory atomically. Returns its path.

    ``out`` follows kvsim.outdir's rules (docs/outputs.md): a new or empty directory, or an earlier
    ``kvsim run`` output (replaced, keeping files kvsim did not write); another kvsim command's
    output only with ``force``; never a directory kvsim did not write, nor ``.``, the scenario's
    directory or a parent of them. ``log``: one line per variant (finished, rejected by reason).
    ``warn``: called with a warning line when more than 5 % of a variant's trace was not served,
    and before running with each of the scenario's notes (``Scenario.notes``; default: printed on stderr).
    """
    loaded = as_loaded(loaded, "run_to_dir")
    plotting = None
    if plots:
        from kvsim import plots as plotting
    if warn is None:
        def warn(m: str) -> None:
            print(m, file=sys.stderr)

    base_dir = loaded.path.parent
    runs = loaded.runs
    if out is not None:  # refuse a bad --out before the (possibly slow) trace loading
        check_out_dir(Path(out), "run", force=force, protect=[loaded.path])
    for note in scenario_notes(runs):
        warn(f"kvsim: {note}")
    traces = TraceCache(base_dir, str(loaded.path))
    built = {name: traces.get(scn) for name, scn in runs.items()}
    check_runs_supported(loaded, built)
    if out is None:
        out = default_out_dir(loaded, [r for _, r in built.values()])
    out = Path(out)
    bar, stage = _run_progress(loaded, built, progress, plots)
    log = bar.wrap(log)
    dropped: dict[str, Dropped] = {}
    fps = {name: _fingerprint(s, built[name][1], plots, check_invariants) for name, s in runs.items()}
    where: dict[str, Path] = {}
    done: dict[str, dict] = {}  # finished variants: kept from an interrupted run, or run now
    try:
        with atomic_out_dir(out, "run", force=force, protect=[loaded.path], log=log, resume=True) as tmp:
            where["tmp"] = tmp
            kept = _keep_finished(tmp, fps) if loaded.variants else []
            done.update({n: fps[n] for n in kept})
            if kept and log:
                log(f"resuming an interrupted run: {len(kept)} finished variant(s) kept ({', '.join(kept)})")
            _write_resolved(tmp, loaded, built)
            summaries = {}
            for name, scn in runs.items():
                d = tmp / name if loaded.variants else tmp
                trace, report = built[name]
                if name in kept:
                    summary = summaries[name] = json.loads((d / "summary.json").read_text(encoding="utf-8"))
                    bar(len(trace) + (stage if plots else 0))
                    dropped[name] = Dropped.from_summary(summary, report)
                    if log:
                        log(_variant_line(name, summary, dropped[name]) + " (kept from the interrupted run)")
                    continue
                summary = summaries[name] = _run_variant(loaded, name, scn, d, built[name], bar,
                                                         check_invariants=check_invariants,
                                                         plots=plotting if plots else None, stage=stage)
                if loaded.variants:
                    done[name] = fps[name]
                    _write_resume(tmp, done)
                dropped[name] = Dropped.from_summary(summary, report)
                if log:
                    log(_variant_line(name, summary, dropped[name]))
            # again, now with the attention backend each run resolved (``auto`` -> the kernel it used)
            _write_resolved(tmp, loaded, built, summaries)
            if loaded.variants:
                _write_comparison(tmp, summaries, bar, plots=plotting if plots else None, stage=stage)
            if plots:
                # The self-contained HTML report reads the finished directory (plots embedded).
                from kvsim.report import write_run_report

                bar.set_description("writing report.html")
                write_run_report(tmp, shown_name=out.name)
                bar(stage)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted_message(where.get("tmp"), list(done), len(runs))) from None
    finally:
        bar.close()
    for w in warnings_for(dropped):
        warn(w)
    return out


def scenario_notes(runs: dict) -> list[str]:
    """Each distinct ``Scenario.notes()`` line of the variants ``runs`` once, prefixed by the
    variants it holds for unless it holds for all."""
    by_note: dict[str, list[str]] = {}
    for name, scn in runs.items():
        for note in scn.notes():
            by_note.setdefault(note, []).append(name)
    return [note if len(names) == len(runs) else f"{', '.join(names)}: {note}" for note, names in by_note.items()]


def comparison_table(results: dict) -> pd.DataFrame:
    """The ``comparison.csv`` table (one layout for ``kvsim run`` and ``kvsim compare``:
    kvsim.report.comparison_table.comparison_frame) of in-memory results: ``{name: RunResult}`` as
    ``kvsim.run`` returns them (parameter columns and offered rate included), ``{name: LoadedRun}`` as
    ``kvsim.load_results`` returns them, or ``{name: summary}``; rows in the display order (the
    scenario's ``baseline:`` first; summaries, which do not name the baseline, in the order given,
    which is that order when they come from kvsim.run's or load_results's mapping). Anything else
    is a one-line TypeError."""
    from kvsim.report.comparison_table import comparison_frame
    from kvsim.report.runs import in_memory_runs

    if isinstance(results, dict):
        results = {k: v.path if isinstance(v, LoadedRun) else v for k, v in results.items()}
    return comparison_frame(in_memory_runs(results))


@dataclass
class LoadedRun:
    path: Path
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame


def load_results(path: str | Path) -> LoadedRun | dict[str, LoadedRun]:
    """Read a run directory (or a variants directory: returns {variant: LoadedRun} in the display
    order: the scenario's order from ``scenario.resolved.yaml``, the ``baseline:`` variant first).
    A damaged directory (a summary.json that is not a kvsim run summary, a table missing or not
    Parquet) is one :class:`~kvsim.errors.KvsimError` line naming the file, as ``kvsim compare`` gives."""
    from kvsim.errors import KvsimError
    from kvsim.report.runs import read_run_dir, read_table, variant_order

    path = Path(path)
    if (path / "summary.json").exists():
        summary = read_run_dir(path)  # the one reader of run directories (compare, report)
        return LoadedRun(path, summary, read_table(path / "requests.parquet"), read_table(path / "steps.parquet"))
    subs = variant_order(path) if path.is_dir() else []
    if not subs:
        raise KvsimError(f"{path}: not a kvsim result directory (no summary.json)")
    return {name: load_results(path / name) for name in subs}  # type: ignore[misc]
