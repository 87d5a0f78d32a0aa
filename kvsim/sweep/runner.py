"""``run_sweep``: validate, skip complete points, run the rest, write the index and the report.

Layout of ``SWEEP_DIR``::

    sweep.resolved.yaml       the sweep: source file, base scenario, every point's id and overrides
    points/<point-id>/        one run directory per point (written atomically by run_to_dir)
    errors/<point-id>.txt     the last traceback of each failed point (removed once it succeeds)
    index.parquet, index.csv  one row per point (see kvsim.sweep.index)
    compare/                  comparison tables and plots (kvsim compare SWEEP_DIR)
    report.html               self-contained HTML report

A point is *complete* when its run directory is complete (:func:`kvsim.results.is_complete_run_dir`),
its results can be read (:func:`kvsim.report.runs.read_run_dir`: summary.json, the tables' Parquet
footers) and it was made from the same resolved scenario and trace (:func:`kvsim.api.run_inputs`: a
trace file's content hash, not only its path); complete points are skipped on a rerun, so an
interrupted sweep resumes where it stopped. A *damaged* point (result files that cannot be read, e.g.
truncated) is run again, as a stale one is. A point killed after its run directory was complete but
before it was renamed into place (``points/.<id>.tmp-<pid>``) counts as complete: the resumed sweep
puts it in place first (:func:`recover_killed_points`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import yaml

from kvsim.errors import ConfigError, Interrupted, KvsimError
from kvsim.outdir import clean_leftovers, finish_killed_commit, open_in_place, set_complete
from kvsim.results import is_complete_run_dir, write_text_atomic, write_yaml
from kvsim.sweep.executors import EXECUTORS, Outcome, execute
from kvsim.sweep.index import STATUS_FAILED, STATUS_OK, build_index, write_index
from kvsim.sweep.spec import LoadedSweep, load_sweep
from kvsim.sweep.worker import make_task


# Everything run_sweep writes at the top of SWEEP_DIR (recorded in its .kvsim-output.json).
SWEEP_OUTPUTS = ("sweep.resolved.yaml", "points", "errors", "index.parquet", "index.csv", "compare", "report.html")


def _made_from(point_dir: Path, want: dict) -> bool:
    """Was ``point_dir`` made from ``want`` (the point's :func:`kvsim.api.run_inputs`: its resolved
    scenario and its trace -- a trace file's content hash, a synthetic spec's), as its
    scenario.resolved.yaml records them?"""
    try:
        doc = yaml.safe_load((point_dir / "scenario.resolved.yaml").read_text(encoding="utf-8")) or {}
        run = next(iter((doc.get("runs") or {}).values()))
        stored = {"scenario": run["scenario"], "trace": run["trace"]}
    except (OSError, yaml.YAMLError, StopIteration, KeyError, TypeError, AttributeError):
        return False
    return stored == yaml.safe_load(yaml.safe_dump(want, sort_keys=False))


def recover_killed_points(out: Path, points, *, finish: bool = True) -> list[str]:
    """Tidy ``points/`` after a killed sweep, before judging which points are complete.

    A point is written into ``points/.<id>.tmp-<pid>``, marked complete, then renamed to
    ``points/<id>`` (:func:`kvsim.outdir.commit`). A sweep killed between the two leaves a finished
    run directory under the temp name: that work is done, so it is put in place (and skipped as
    complete if made from the same scenario) instead of being deleted and run again. Leftovers of
    points killed earlier (incomplete temp dirs, a replacement cut short) are tidied by
    :func:`kvsim.outdir.finish_killed_commit`; directories of live processes are left alone.
    ``finish=False``: only that tidying (:func:`kvsim.outdir.clean_leftovers`), as at the end of a
    sweep, for the leftovers of processes that were still exiting when it started (a worker of a
    killed sweep can outlive its driver by a moment). Returns one note per thing done.
    """
    points_dir = out / "points"
    hidden = [e.name for e in points_dir.iterdir() if e.name.startswith(".")] if points_dir.is_dir() else []
    notes: list[str] = []
    for p in points:
        if any(n.startswith((f".{p.id}.tmp-", f".{p.id}.old-")) for n in hidden):
            d = points_dir / p.id
            notes += finish_killed_commit(d, "run") if finish else clean_leftovers(d)
    return notes


def point_state(sweep: LoadedSweep, out: Path, point) -> str:
    """``complete`` | ``stale`` (complete but from another scenario or trace content) | ``damaged``
    (complete, but its result files cannot be read: :func:`damage_of`) | ``missing``. ``sweep``: loaded
    with its points checked (``run_inputs``, see :func:`_checked`)."""
    d = out / "points" / point.id
    if not is_complete_run_dir(d):
        return "missing"
    if not _made_from(d, sweep.run_inputs[point.id]):
        return "stale"
    return "complete" if damage_of(d) is None else "damaged"


def damage_of(run_dir: Path) -> str | None:
    """Why the results of the complete run directory ``run_dir`` cannot be read by compare and the
    report (one line naming the file), or None. Reads summary.json and the tables' footers only."""
    from kvsim.report.runs import read_run_dir

    try:
        read_run_dir(run_dir)
    except KvsimError as e:
        return str(e)
    return None


def default_sweep_dir(sweep: LoadedSweep) -> Path:
    return Path("results") / "sweeps" / sweep.name


def run_sweep(sweep_file_or_spec: str | Path | dict | LoadedSweep, out_dir: str | Path | None = None, *,
              jobs: int | None = None, executor: str = "local", address: str | None = None,
              retries: int = 1, plots: bool = True, report: bool = True, force: bool = False,
              progress: bool | None = None, base_dir: str | Path | None = None, log=None) -> pd.DataFrame:
    """Run every point of a sweep into ``out_dir`` and return the index DataFrame.

    ``sweep_file_or_spec``: a sweep YAML path, the same mapping in memory (relative paths resolve
    against ``base_dir``, default the current directory), or a :class:`LoadedSweep`.
    ``out_dir``: the sweep directory (default ``results/sweeps/<name>``).
    ``jobs``: parallel points (default: the number of CPUs). ``executor``: ``local`` (process pool),
    ``ray`` (``address`` of a cluster, or a local Ray instance) or ``inline`` (this process).
    ``retries``: extra attempts for a failing point. ``plots``: per-point PNGs.
    ``report``: write ``compare/`` and ``report.html`` at the end. ``force``: rerun complete points,
    and let the sweep take over another kvsim command's output at ``out_dir`` (docs/outputs.md).
    ``progress``: a tqdm bar over points (default: when stderr is a terminal). ``log``: a callable
    taking one line of text.

    ``df.attrs["sweep"]`` holds the run's counts: points, ran, skipped, failed, wall_s, sweep_dir.
    Failed points are rows with ``status == "failed"``; this function does not raise for them.
    """
    import os

    t_start = time.perf_counter()
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be >= 1 (got {jobs})")
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; valid executors: {', '.join(EXECUTORS)}")
    sweep = sweep_file_or_spec if isinstance(sweep_file_or_spec, LoadedSweep) else \
        load_sweep(sweep_file_or_spec, base_dir=base_dir)
    sweep = _checked(sweep)
    out = _open_sweep_dir(sweep, out_dir, force)
    say = log or (lambda m: None)
    for note in recover_killed_points(out, sweep.points):
        say(note)

    status: dict[str, tuple[str, str]] = {}
    todo, states = _points_to_run(sweep, out, force, status)
    skipped = len(sweep.points) - len(todo)
    if jobs is None:
        jobs = os.cpu_count() or 1
    for p in todo:
        if states[p.id] == "damaged":
            say(f"kvsim: note: point {p.id} is run again: {damage_of(out / 'points' / p.id)}")
    why = [f"{n} {state}: {what}" for state, what in (("stale", "made from another scenario or trace"),
                                                      ("damaged", "result files that cannot be read"))
           if (n := sum(states[p.id] == state for p in todo))]
    say(f"sweep {sweep.name}: {len(sweep.points)} points, {skipped} already complete (skipped), "
        f"{len(todo)} to run" + (f" ({'; '.join(why)})" if why else "")
        + (f" with {executor} executor, {jobs} jobs" if todo else ""))

    outcomes = _Outcomes(sweep, out, status, say, sys.stderr.isatty() if progress is None else progress, skipped)
    say = outcomes.say
    tasks = [make_task(sweep, p, out, plots) for p in todo]
    restore = None
    try:
        execute(tasks, outcomes.on_outcome, executor=executor, jobs=jobs, retries=retries, address=address,
                on_retry=outcomes.on_retry)
    except KeyboardInterrupt:
        restore = _hold_interrupts()  # a terminal's Ctrl-C reaches the workers too; the index is written first
        done = [p for p in sweep.points if point_state(sweep, out, p) == "complete"]  # on disk: what a rerun skips
        for p in done:  # finished, its outcome not yet received: the index lists it as ok, not pending
            status.setdefault(p.id, (STATUS_OK, ""))
        ok = len(done)
        raise Interrupted(f"interrupted; {ok} of {len(sweep.points)} points are complete in {out / 'points'} "
                          f"(index.csv lists the rest as pending); rerun the same command to resume: complete "
                          "points are skipped") from None
    finally:
        outcomes.close()
        # Also on Ctrl-C: the index lists every point, the unfinished ones as "pending".
        df = build_index(sweep, out, status)
        write_index(df, out)
        if restore is not None:
            restore()
    for note in recover_killed_points(out, sweep.points, finish=False):
        say(note)

    reported = True
    if not report and todo and (gone := _remove_report(out)):  # an earlier report no longer shows these points
        say(f"kvsim: note: removed the earlier sweep's {' and '.join(gone)} from {out} (--no-report: it did not "
            "show the points run now); rerun without --no-report to write them")
    if report:
        try:
            reported = _write_sweep_report(out, df, say)
        except KeyboardInterrupt:
            ok = int((df["status"] == STATUS_OK).sum())
            raise Interrupted(f"interrupted while writing compare/ and report.html; {ok} of {len(sweep.points)} points "
                              f"are complete in {out / 'points'}; rerun the same command to write them (complete "
                              "points are skipped)") from None
    failed = outcomes.failed
    set_complete(out, not failed and len(status) == len(sweep.points) and reported)
    wall = time.perf_counter() - t_start
    df.attrs["sweep"] = {"points": len(sweep.points), "ran": len(todo), "skipped": skipped,
                         "failed": len(failed), "wall_s": wall, "sweep_dir": str(out)}
    say(f"sweep {sweep.name}: {len(todo) - len(failed)} ran, {skipped} skipped, {len(failed)} failed "
        f"in {wall:.1f} s -> {out}")
    return df


def _hold_interrupts():
    """Ignore further Ctrl-C while an interrupted sweep writes its index (the main thread only); returns
    the function that restores the handler, or None where it cannot be changed."""
    import signal

    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals are the main thread's
        return None
    return lambda: signal.signal(signal.SIGINT, old)


def _checked(sweep: LoadedSweep) -> LoadedSweep:
    """``sweep`` with every point checked as ``kvsim run`` would before simulating (its trace built,
    once per distinct trace; :func:`kvsim.sweep.spec.check_points_supported`) and ``run_inputs`` set:
    done by load_sweep unless it was told ``check_capacity=False``. A bad point is an input error (one
    line, exit 2) before anything is written, not a failure of the point that would retry it."""
    import dataclasses

    from kvsim.sweep.spec import check_points_supported

    if sweep.run_inputs is not None:
        return sweep
    return dataclasses.replace(sweep, run_inputs=check_points_supported(sweep.points, sweep.anchor.parent,
                                                                        str(sweep.path)))


def _open_sweep_dir(sweep: LoadedSweep, out_dir: str | Path | None, force: bool) -> Path:
    """The sweep directory, opened in place (kvsim.outdir: a new/empty directory or an earlier
    sweep's, resumed; another kvsim command's output only with force, its files only; never a
    directory kvsim did not write), with ``points/`` and ``sweep.resolved.yaml``."""
    out = Path(out_dir) if out_dir is not None else default_sweep_dir(sweep)
    open_in_place(out, "sweep", SWEEP_OUTPUTS, force=force, protect=[sweep.path, sweep.anchor])
    out = out.resolve()
    (out / "points").mkdir(parents=True, exist_ok=True)
    write_yaml(out / "sweep.resolved.yaml", sweep.resolved())
    return out


def _points_to_run(sweep: LoadedSweep, out: Path, force: bool, status: dict) -> tuple[list, dict[str, str]]:
    """(points to run, every point's :func:`point_state`); complete points go into ``status`` as ok."""
    todo = []
    states: dict[str, str] = {}
    for p in sweep.points:
        state = states[p.id] = "missing" if force else point_state(sweep, out, p)
        if state == "complete":
            status[p.id] = (STATUS_OK, "")
        else:
            todo.append(p)
    return todo, states


class _Outcomes:
    """Points' outcomes as they come in: ``status``, the failed ones (with ``errors/<id>.txt``),
    the progress bar and log lines printed above it."""

    def __init__(self, sweep: LoadedSweep, out: Path, status: dict, say, progress: bool, skipped: int):
        self.status = status
        self.errors_dir = out / "errors"
        self.failed: list[Outcome] = []
        self._say = say
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=len(sweep.points), initial=skipped, unit="point", desc=f"sweep {sweep.name}",
                            file=sys.stderr)

    def say(self, msg: str) -> None:
        """A log line; while the bar is shown, printed above it."""
        if self.bar is None:
            self._say(msg)
        else:
            with self.bar.external_write_mode(file=sys.stderr):
                self._say(msg)

    def on_outcome(self, o: Outcome) -> None:
        err_file = self.errors_dir / f"{o.point_id}.txt"
        if o.ok:
            self.status[o.point_id] = (STATUS_OK, "")
            if err_file.exists():
                err_file.unlink()
        else:
            self.status[o.point_id] = (STATUS_FAILED, o.error)
            self.failed.append(o)
            self.errors_dir.mkdir(exist_ok=True)
            write_text_atomic(err_file, f"point {o.point_id} failed after {o.attempts} attempt(s)\n\n{o.traceback}")
            self.say(f"point {o.point_id} FAILED after {o.attempts} attempt(s): {o.error}")
        if self.bar is not None:
            self.bar.update(1)

    def on_retry(self, point_id: str, attempt: int, error: str) -> None:
        self.say(f"point {point_id} attempt {attempt} failed ({error}); retrying")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _write_sweep_report(out: Path, df: pd.DataFrame, say) -> bool:
    """``compare/`` and ``report.html``; a failure is a warning (the sweep's results stand), and the
    report of an earlier sweep in ``out`` is removed then, so that no stale report looks current.
    Returns whether the report was written."""
    try:
        from kvsim.report import compare, write_run_report

        if (df["status"] == STATUS_OK).any():
            compare([out], out / "compare", log=say)  # replaces an earlier compare/ (kvsim.outdir)
        write_run_report(out)
    except Exception as e:  # noqa: BLE001 -- the sweep's results stand without the report
        gone = _remove_report(out)
        say(f"kvsim: warning: could not write the sweep report: {type(e).__name__}: {e}"
            + (f" (removed the earlier {' and '.join(gone)}; rerun the same command to write them)" if gone else ""))
        return False
    return True


def _remove_report(out: Path) -> list[str]:
    """Delete the ``compare/`` and ``report.html`` an earlier sweep wrote in ``out`` (what kvsim wrote
    only: kvsim.outdir's markers); returns the names removed."""
    from kvsim.outdir import read_marker, withdraw_output, writer_of

    gone = []
    if withdraw_output(out / "compare"):
        gone.append("compare/")
    marker = read_marker(out)
    report = out / "report.html"
    if marker is not None and writer_of(marker, "report.html") is not None and report.is_file():
        report.unlink()
        gone.append("report.html")
    return gone
