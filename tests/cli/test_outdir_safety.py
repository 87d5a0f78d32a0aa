"""kvsim never deletes what it did not write (kvsim.outdir, docs/outputs.md), refuses non-finite
numbers, and says what happened to requests it did not serve.

Every command that writes is covered: run, sweep, compare, report, trace convert/generate,
calibrate. CLI behaviour (one line, exit 2) is checked in subprocesses; the rest through the API
with a tiny scenario (well under a second per run)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import shutil
import sys
from pathlib import Path

import pytest

from kvsim.errors import CalibrationError, ConfigError
from kvsim.outdir import MARKER, Marker, read_marker, write_marker

ROOT = Path(__file__).resolve().parents[2]

TINY = """\
name: tiny
seed: 0
trace:
  synthetic:
    num_requests: {n}
    arrival: {{process: poisson, rate_per_s: 20}}
    prompt_tokens: {{kind: uniform, low: 10, high: {high}}}
    output_tokens: {{kind: uniform, low: 5, high: 30}}
model: OPT-13B
gpu: A100-40GB
kv_budget: {{tokens: 8192}}
allocator: {{kind: paged, block_size: 16}}
timing: {{kind: constant, step_s: 0.01}}
"""


def subprocess_kvsim(*args, cwd=ROOT):
    """The real command line (for the checks that need a separate process)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "kvsim", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def kvsim(*args, cwd=None):
    """``kvsim ARGS`` in this process (kvsim.cli.main: same exit codes and stderr, no start-up cost)."""
    from kvsim.cli import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def one_line_error(res, *needles):
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def scenario(tmp_path, n=30, high=100, extra="", name="tiny.yaml"):
    d = tmp_path / "scn"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text(TINY.format(n=n, high=high) + extra)
    return p


def run(path, out, **kw):
    from kvsim.api import run_to_dir
    from kvsim.config import load_scenario

    return run_to_dir(load_scenario(path, kw.pop("overrides", [])), out, plots=kw.pop("plots", False),
                      progress=False, warn=kw.pop("warn", lambda m: None), **kw)


def snapshot(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))}


def hidden_leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# --- run -----------------------------------------------------------------------------------------


def test_run_refuses_a_foreign_directory_and_leaves_it_intact(tmp_path):
    scn = scenario(tmp_path)
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    (out / "data").mkdir()
    (out / "data" / "scenario.yaml").write_text("mine")
    before = snapshot(out)
    res = subprocess_kvsim("run", scn, "--out", out, "--no-plots", "-q")
    one_line_error(res, str(out), "not a kvsim output directory", MARKER)
    res = kvsim("run", scn, "--out", out, "--no-plots", "-q", "--force")
    one_line_error(res, "even with --force")
    assert snapshot(out) == before
    assert hidden_leftovers(out) == []


def test_an_out_under_a_regular_file_is_one_line_for_every_directory_command(tmp_path):
    """``--out afile/sub`` (afile a file) was an internal error (FileExistsError, NotADirectoryError, exit 1)
    in run, compare and sweep; now the parent is checked once, in check_out_dir."""
    scn = scenario(tmp_path)
    run_dir = tmp_path / "r"
    run(scn, run_dir)
    sweep = tmp_path / "sw.yaml"
    sweep.write_text(f"name: sw\nbase_file: {scn}\ngrid:\n  allocator.block_size: [16, 32]\n")
    afile = tmp_path / "afile"
    afile.write_text("data")
    for command in (["run", scn], ["compare", run_dir], ["sweep", sweep]):
        for out in (afile / "sub", afile / "x" / "sub"):
            res = kvsim(*command, "--out", out, "-q")
            one_line_error(res, f"--out {out}: {afile} is a file, not a folder")
    assert afile.read_text() == "data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "r", "scn", "sw.yaml"]


def test_rerun_replaces_only_what_kvsim_wrote(tmp_path):
    scn = scenario(tmp_path, extra="variants:\n  a: {allocator: {block_size: 16}}\n  b: {allocator: {block_size: 32}}\n")
    out = tmp_path / "results" / "quickstart"
    run(scn, out)
    marker = read_marker(out)
    assert marker == Marker("run", True, marker.written) and "a/summary.json" in marker.written
    # the user adds their own files, beside and inside kvsim's
    (out / "notes.txt").write_text("my notes")
    (out / "compare").mkdir()
    (out / "compare" / "mine.csv").write_text("x")
    (out / "compare-mine").mkdir()
    (out / "a" / "thoughts.md").write_text("on variant a")
    run(scn, out, overrides=["trace.synthetic.num_requests=12"])
    assert (out / "notes.txt").read_text() == "my notes"
    assert (out / "compare" / "mine.csv").read_text() == "x"
    assert (out / "compare-mine").is_dir()
    assert (out / "a" / "thoughts.md").read_text() == "on variant a"
    assert json.loads((out / "a" / "summary.json").read_text())["requests_total"] == 12  # the new run
    written = read_marker(out).written
    assert "notes.txt" not in written and "a/thoughts.md" not in written and "compare" not in written
    assert hidden_leftovers(out) == []


def test_a_file_of_an_old_run_that_the_new_run_does_not_write_is_removed(tmp_path):
    scn = scenario(tmp_path, extra="variants:\n  a: {}\n  b: {allocator: {block_size: 32}}\n")
    out = tmp_path / "out"
    run(scn, out)
    run(scenario(tmp_path, name="other.yaml"), out)  # no variants now
    assert not (out / "a").exists() and not (out / "b").exists() and (out / "summary.json").is_file()


def test_an_emptied_folder_of_an_old_variant_does_not_block_a_rerun(tmp_path):
    """A variant folder kept for the user's file in it (the rerun had no such variant) and emptied since is
    nothing to keep: the next run that writes that variant takes its place. A folder with a file still
    blocks, and is called a folder."""
    two = scenario(tmp_path, extra="variants:\n  a: {}\n  b: {allocator: {block_size: 32}}\n")
    out = tmp_path / "out"
    run(two, out)
    (out / "b" / "mine.txt").write_text("keep")
    run(scenario(tmp_path, name="one.yaml", extra="variants:\n  a: {}\n"), out)
    assert (out / "b" / "mine.txt").read_text() == "keep" and "b" not in read_marker(out).written
    with pytest.raises(ConfigError, match=r"your folder .*/b has the name of a new kvsim output"):
        run(two, out)
    assert (out / "b" / "mine.txt").read_text() == "keep"
    (out / "b" / "mine.txt").rename(tmp_path / "mine.txt")  # the user moves their file out
    for d in tmp_path.glob(".out.tmp-*"):  # (the refused run's output, kept for the user)
        shutil.rmtree(d)
    run(two, out)
    assert (out / "b" / "summary.json").is_file() and "b/summary.json" in read_marker(out).written
    assert hidden_leftovers(out) == []


def test_empty_directory_is_used(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    run(scenario(tmp_path), out)
    assert (out / "summary.json").is_file() and read_marker(out).complete


@pytest.mark.parametrize("where", ["dot", "scenario_dir", "parent_of_scenario_dir", "root", "home"])
def test_refused_output_locations(tmp_path, where):
    scn = scenario(tmp_path)
    out = {"dot": Path("."), "scenario_dir": scn.parent, "parent_of_scenario_dir": tmp_path, "root": Path("/"),
           "home": Path.home()}[where]
    before = snapshot(scn.parent)
    if where == "dot":
        res = kvsim("run", scn, "--out", ".", "--no-plots", "-q", cwd=scn.parent)
        one_line_error(res, "--out .: is the current directory")
        assert [p.name for p in scn.parent.iterdir()] == [scn.name]  # no ..tmp-NNNN
    else:
        with pytest.raises(ConfigError, match="is (a parent of )?(the|your)"):
            run(scn, out)
    assert snapshot(scn.parent) == before


def test_force_replaces_another_kvsim_command_output_never_a_foreign_one(tmp_path):
    scn = scenario(tmp_path)
    out = tmp_path / "cmp"
    out.mkdir()
    write_marker(out, Marker("compare", True, ("comparison.csv",)))
    (out / "comparison.csv").write_text("old")
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds the output of `kvsim compare`.*--force"):
        run(scn, out)
    assert (out / "comparison.csv").read_text() == "old"
    run(scn, out, force=True)
    assert not (out / "comparison.csv").exists() and (out / "keep.txt").read_text() == "mine"
    assert read_marker(out).command == "run"


@pytest.mark.parametrize("refusal", [False, True])
def test_a_failed_run_leaves_the_old_run(tmp_path, monkeypatch, refusal):
    """An internal failure keeps its temp directory, marked incomplete; a refusal found only while
    running (bad input, one line, exit 2: a KvsimError) with nothing finished leaves none (it did)."""
    import kvsim.api
    from kvsim.errors import CalibrationError

    scn = scenario(tmp_path)
    out = tmp_path / "out"
    run(scn, out)
    before = snapshot(out)
    error = CalibrationError("calibration/x: meta.json is missing") if refusal else RuntimeError("stopped part-way")

    def fail(*a, **k):
        raise error

    monkeypatch.setattr(kvsim.api, "run_scenario", fail)
    with pytest.raises(type(error)):
        run(scn, out)
    assert snapshot(out) == before
    if refusal:
        assert hidden_leftovers(out) == []
        return
    [tmp] = [out.parent / n for n in hidden_leftovers(out)]
    assert read_marker(tmp).complete is False and "stopped part-way" in (tmp / "INCOMPLETE").read_text()


def test_leftovers_of_killed_runs(tmp_path):
    scn = scenario(tmp_path)
    out = tmp_path / "out"
    run(scn, out)
    pid = dead_pid()
    # a killed run's temp dir (ours: marked) is removed; a hidden dir of the user's, same pattern, is not
    ours = tmp_path / f".out.tmp-{pid}"
    ours.mkdir()
    write_marker(ours, Marker("run", False, ()))
    (ours / "steps.parquet").write_text("partial")
    theirs = tmp_path / ".out.tmp-1"
    theirs.mkdir()
    (theirs / "precious").write_text("x")
    # a replacement killed after the swap: the old dir still holds the user's file
    old = tmp_path / f".out.old-{pid}"
    old.mkdir()
    write_marker(old, Marker("run", True, ("summary.json",)))
    (old / "summary.json").write_text("{}")
    (old / "notes.txt").write_text("mine")
    run(scn, out)
    assert not ours.exists() and not old.exists()
    assert (theirs / "precious").read_text() == "x"
    assert (out / "notes.txt").read_text() == "mine"


def test_replacement_killed_between_the_renames_is_undone(tmp_path):
    scn = scenario(tmp_path)
    out = tmp_path / "out"
    run(scn, out)
    before = snapshot(out)
    old = tmp_path / f".out.old-{dead_pid()}"
    out.rename(old)  # as if killed right after renaming the old run away
    from kvsim.outdir import clean_leftovers

    assert clean_leftovers(out) == [f"restored {out} from an interrupted replacement"]
    assert snapshot(out) == before


def test_killed_subprocess_leaves_nothing_complete_and_rerun_succeeds(tmp_path):
    scn = scenario(tmp_path, n=20000, high=800)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "kvsim", "run", str(scn), "--out", str(out), "--no-plots", "-q"],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import time

    tmp = tmp_path / f".out.tmp-{proc.pid}"
    t0 = time.monotonic()
    while not (tmp / "scenario.resolved.yaml").exists() and proc.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert not out.exists()
    if tmp.exists():
        assert read_marker(tmp).complete is False
    run(scn, out, overrides=["trace.synthetic.num_requests=10"])
    assert read_marker(out).complete and hidden_leftovers(out) == []


# --- compare, report ------------------------------------------------------------------------------


def test_compare_keeps_a_users_compare_folder_and_replaces_its_own(tmp_path):
    from kvsim.report import compare

    scn = scenario(tmp_path)
    out = tmp_path / "run"
    run(scn, out)
    (out / "compare").mkdir()
    (out / "compare" / "mine.txt").write_text("mine")
    res = kvsim("compare", out, "-q")
    one_line_error(res, "compare", "not a kvsim output directory")
    assert (out / "compare" / "mine.txt").read_text() == "mine"
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    write_marker(cmp, Marker("compare", True, ("comparison.csv", "stale.png")))
    (cmp / "stale.png").write_text("from an earlier compare")
    (cmp / "extra.txt").write_text("kept")
    written = compare([out], cmp)  # replaces its own earlier output
    assert written["comparison.csv"] == cmp / "comparison.csv" and (cmp / "comparison.csv").is_file()
    assert not (cmp / "stale.png").exists() and (cmp / "extra.txt").read_text() == "kept"
    assert read_marker(cmp).command == "compare"
    with pytest.raises(ConfigError, match="is .*run"):
        compare([out], out)  # never into (or over) an input


def test_report_overwrites_only_its_own_file(tmp_path):
    scn = scenario(tmp_path)
    out = tmp_path / "run"
    run(scn, out, plots=True)
    assert "report.html" in read_marker(out).written
    assert kvsim("report", out).returncode == 0  # its own report.html: rewritten
    mine = tmp_path / "mine.html"
    mine.write_text("my page")
    one_line_error(kvsim("report", out, "--out", mine), "file exists", "--force")
    assert mine.read_text() == "my page"
    assert kvsim("report", out, "--out", mine, "--force").returncode == 0
    assert "kvsim run" in mine.read_text()


def test_report_never_replaces_a_file_another_command_wrote(tmp_path):
    """``report --out RUN/summary.json`` (or scenario.resolved.yaml, comparison.csv) replaced the run's
    results with HTML (exit 0), after which report and compare of RUN failed. Only ``report.html``,
    the report every run directory has, may be rewritten by ``kvsim report`` (a marker without ``by``,
    as older kvsim wrote, reads as before)."""
    scn = scenario(tmp_path, extra="variants:\n  a: {}\n  b: {allocator: {block_size: 32}}\n")
    out, other = tmp_path / "run", tmp_path / "other"
    run(scn, out, plots=True)
    run(scenario(tmp_path, name="one.yaml"), other)
    assert "by" not in json.loads((out / MARKER).read_text())
    before = snapshot(out)
    for name in ("scenario.resolved.yaml", "comparison.csv", "a/summary.json"):
        one_line_error(kvsim("report", other, "--out", out / name), str(out / name), "`kvsim run` wrote it",
                       "not `kvsim report`")
    (out / "summary.json").write_text("{}")  # a summary of the user's beside the variants: never kvsim's
    one_line_error(kvsim("report", other, "--out", out / "summary.json"), "no kvsim output folder records writing it")
    (out / "summary.json").unlink()
    assert snapshot(out) == before
    assert kvsim("report", out).returncode == 0 and kvsim("compare", out, "-q").returncode == 0
    assert kvsim("report", other, "--out", out / "report.html").returncode == 0  # a report, where a report goes
    assert "report.html" in read_marker(out).written


def test_a_file_written_into_another_commands_directory_is_kept_by_it(tmp_path):
    """``trace convert T RUN/t.jsonl`` put t.jsonl in RUN's marker, so the next ``run --out RUN`` deleted it
    (even while reading it as its trace). Now it is recorded as the trace command's file (``by``): the run
    keeps it, the trace command may rewrite it, and so does a sweep written in place."""
    from kvsim.sweep.runner import run_sweep

    spec = tmp_path / "spec.yaml"
    spec.write_text("num_requests: 10\narrival: {process: poisson, rate_per_s: 2}\n"
                    "prompt_tokens: {kind: uniform, low: 10, high: 20}\n"
                    "output_tokens: {kind: uniform, low: 1, high: 5}\n")
    out = tmp_path / "run"
    run(scenario(tmp_path), out)
    assert kvsim("trace", "generate", spec, out / "t.jsonl").returncode == 0
    data = (out / "t.jsonl").read_bytes()
    on_file = scenario(tmp_path, name="file.yaml")
    on_file.write_text(on_file.read_text().replace(on_file.read_text().split("model:")[0],
                                                   f"name: f\ntrace: {{file: {out / 't.jsonl'}}}\n"))
    run(on_file, out)
    assert (out / "t.jsonl").read_bytes() == data
    from kvsim.outdir import writer_of

    marker = read_marker(out)
    assert "t.jsonl" not in marker.written and writer_of(marker, "t.jsonl") == "trace"
    run(on_file, out)  # the record survives a replacement
    assert writer_of(read_marker(out), "t.jsonl") == "trace"
    assert kvsim("trace", "generate", spec, out / "t.jsonl", "--seed", "3").returncode == 0  # its own file
    sweep_dir = tmp_path / "sweep"
    sweep = {"name": "s", "base_file": str(scenario(tmp_path)), "grid": {"allocator.block_size": [16]}}
    run_sweep(sweep, sweep_dir, executor="inline", plots=False, report=False, base_dir=tmp_path)
    assert kvsim("trace", "generate", spec, sweep_dir / "t.jsonl").returncode == 0
    run_sweep(sweep, sweep_dir, executor="inline", plots=False, report=False, base_dir=tmp_path, force=True)
    assert (sweep_dir / "t.jsonl").is_file() and writer_of(read_marker(sweep_dir), "t.jsonl") == "trace"


# --- trace convert / generate ---------------------------------------------------------------------


def test_trace_outputs_never_overwrite_a_file_without_force(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("num_requests: 10\narrival: {process: poisson, rate_per_s: 2}\n"
                    "prompt_tokens: {kind: uniform, low: 10, high: 20}\noutput_tokens: {kind: uniform, low: 1, high: 5}\n")
    target = tmp_path / "t.csv"
    target.write_text("my data")
    one_line_error(kvsim("trace", "generate", spec, target), "file exists", "--force")
    one_line_error(kvsim("trace", "convert", ROOT / "traces" / "azure_conv_2023.csv.gz", target), "file exists")
    assert target.read_text() == "my data"
    assert kvsim("trace", "generate", spec, target, "--force").returncode == 0
    assert target.read_text().startswith("arrival_s,")
    new = tmp_path / "new.jsonl"
    assert kvsim("trace", "generate", spec, new).returncode == 0 and new.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


# --- sweep ----------------------------------------------------------------------------------------


def test_sweep_refuses_foreign_dirs_and_keeps_user_files_on_rerun(tmp_path):
    from kvsim.sweep.runner import run_sweep

    scn = scenario(tmp_path)
    sweep = {"name": "s", "base_file": str(scn), "grid": {"allocator.block_size": [16, 32]}}
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "a.txt").write_text("a")
    with pytest.raises(ConfigError, match="not a kvsim output directory"):
        run_sweep(sweep, foreign, executor="inline", plots=False, report=False, base_dir=tmp_path)
    assert [p.name for p in foreign.iterdir()] == ["a.txt"]
    out = tmp_path / "sweep"
    run_sweep(sweep, out, executor="inline", plots=False, report=False, base_dir=tmp_path)
    m = read_marker(out)
    assert m.command == "sweep" and m.complete and "points" in m.written
    (out / "notes.txt").write_text("mine")
    df = run_sweep(sweep, out, executor="inline", plots=False, report=False, base_dir=tmp_path, force=True)
    assert df.attrs["sweep"]["ran"] == 2 and (out / "notes.txt").read_text() == "mine"
    run_dir = tmp_path / "a_run"
    run(scn, run_dir)
    with pytest.raises(ConfigError, match="`kvsim run`.*--force"):
        run_sweep(sweep, run_dir, executor="inline", plots=False, report=False, base_dir=tmp_path)


# --- calibrate ------------------------------------------------------------------------------------


def test_calibrate_output_rules(tmp_path):
    from kvsim.calibration.runner import _commit, _prepare_out

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep")
    with pytest.raises(CalibrationError, match="not a calibration directory"):
        _prepare_out(foreign)
    a_run = tmp_path / "run"
    run(scenario(tmp_path), a_run)
    with pytest.raises(CalibrationError, match="`kvsim run`"):
        _prepare_out(a_run)
    tmp = _prepare_out(a_run, force=True)  # --force: another kvsim command's output may be replaced
    (tmp / "meta.json").write_text("{}")
    (a_run / "mine.txt").write_text("kept")
    _commit(tmp, a_run, force=True)
    assert sorted(p.name for p in a_run.iterdir()) == [MARKER, "meta.json", "mine.txt"]
    # a calibration directory from before markers existed (the shipped example's layout) is replaced
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for f in ("meta.json", "measurements.csv", "report_loo.csv"):
        (legacy / f).write_text("old")
    tmp = _prepare_out(legacy)
    for f in ("meta.json", "measurements.csv"):
        (tmp / f).write_text("new")
    _commit(tmp, legacy)
    assert (legacy / "meta.json").read_text() == "new" and not (legacy / "report_loo.csv").exists()
    assert read_marker(legacy) == Marker("calibrate", True, ("measurements.csv", "meta.json"))


# --- non-finite numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN", ".Inf"])
def test_non_finite_numbers_are_refused_in_a_scenario(tmp_path, value):
    scn = scenario(tmp_path)
    scn.write_text(scn.read_text().replace("rate_per_s: 20", f"rate_per_s: {value}"))
    for command in (["validate"], ["run", "--out", tmp_path / "o"]):
        res = kvsim(command[0], scn, *command[1:])
        one_line_error(res, str(scn), "trace.synthetic.arrival.rate_per_s", "is not allowed")


@pytest.mark.parametrize("key, value", [("trace.end_s", "inf"), ("trace.end_s", "1e400"),
                                        ("trace.rate_scale", "1e400"), ("trace.rate_scale", "-Infinity")])
def test_numbers_that_parse_to_infinity_are_refused(tmp_path, key, value):
    """YAML reads ``inf`` and ``1e400`` as strings, which pydantic would turn into infinities: the trace
    section refuses them as the other sections do (--set and the file alike)."""
    scn = scenario(tmp_path)
    one_line_error(kvsim("validate", scn, "--set", f"{key}={value}"), key, "finite")
    written = scenario(tmp_path, name="inf.yaml")
    section, field = key.split(".")
    written.write_text(written.read_text().replace(f"{section}:\n", f"{section}:\n  {field}: {value}\n", 1))
    one_line_error(kvsim("validate", written), str(written), key, "finite")


def test_non_finite_numbers_are_refused_everywhere(tmp_path):
    from kvsim.config import load_scenario
    from kvsim.sweep.spec import load_sweep
    from kvsim.trace.cli import load_spec

    scn = scenario(tmp_path, extra="variants:\n  fast: {timing: {step_s: .inf}}\n")
    with pytest.raises(ConfigError, match=r"tiny.yaml: variants.fast.timing.step_s: \.inf is not allowed"):
        load_scenario(scn)
    ok = scenario(tmp_path, name="ok.yaml")
    with pytest.raises(ConfigError, match=r"--set kv_budget.tokens=.nan: kv_budget.tokens: \.nan"):
        load_scenario(ok, ["kv_budget.tokens=.nan"])
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"name: s\nbase_file: {ok}\ngrid:\n  timing.step_s: [0.01, -.inf]\n")
    with pytest.raises(ConfigError, match=r"s.yaml: grid.timing.step_s\[1\]: -\.inf"):
        load_sweep(sweep)
    with pytest.raises(ConfigError, match=r"sweep: grid.timing.step_s\[0\]"):
        load_sweep({"name": "s", "base_file": str(ok), "grid": {"timing.step_s": [float("nan")]}})
    spec = tmp_path / "spec.yaml"
    spec.write_text("num_requests: 5\narrival: {process: poisson, rate_per_s: .inf}\n")
    with pytest.raises(ConfigError, match=r"spec.yaml: arrival.rate_per_s: \.inf"):
        load_spec(spec)
    from kvsim.config import Scenario

    with pytest.raises(Exception, match="finite"):  # the Python API (pydantic models) too
        Scenario.model_validate({"trace": {"file": "x.csv"}, "model": "OPT-13B",
                                 "timing": {"kind": "constant", "step_s": float("inf")}})


# --- what was dropped -----------------------------------------------------------------------------


def test_run_validate_and_report_say_what_was_rejected(tmp_path):
    # OPT-13B's max length is 2048: prompts up to 4000 tokens make a share of the requests too long
    scn = scenario(tmp_path, n=40, high=4000)
    scn.write_text(scn.read_text().replace("kv_budget: {tokens: 8192}", "kv_budget: {tokens: 12000}"))
    out = tmp_path / "out"
    res = kvsim("run", scn, "--out", out)
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    n_rej = summary["rejected_by_reason"]["exceeds_max_model_len"]
    assert 0.05 * 40 < n_rej < 40
    fin = summary["requests_finished"]
    assert f"tiny: {fin}/40 finished; {n_rej} rejected (exceeds_max_model_len {n_rej})" in res.stderr
    warn = [ln for ln in res.stderr.splitlines() if ln.startswith("kvsim: warning:")]
    assert len(warn) == 1 and "length_policy: cap" in warn[0] and "max_model_len_tokens" in warn[0]
    # validate predicts the same counts without simulating
    v = kvsim("validate", scn)
    assert v.returncode == 0, v.stderr
    assert f"{40 - n_rej}/40 requests admissible; {n_rej} rejected (exceeds_max_model_len {n_rej})" in v.stdout
    assert "warning:" in v.stderr and "length_policy: cap" in v.stderr
    html = (out / "report.html").read_text()
    assert "Requests not served" in html and f"{n_rej} rejected (exceeds_max_model_len {n_rej})" in html
    assert "length_policy: cap" in html
    # with length_policy: cap nothing is rejected, and the console says how many were capped
    res = kvsim("run", scn, "--out", out, "--set", "trace.length_policy=cap", "--no-plots")
    assert res.returncode == 0, res.stderr
    assert f"tiny: 40/40 finished; {n_rej} capped to max_model_len" in res.stderr
    assert "warning:" not in res.stderr


def test_validate_predictions_match_the_simulation_for_every_reason(tmp_path):
    from kvsim.config import load_scenario
    from kvsim.dropped import predict_rejections
    from kvsim.simulate import build_trace, run as simulate

    scn = scenario(tmp_path, n=60, high=4000)  # too long for OPT-13B (2048), or for a 1024-token KV cache
    scn.write_text(scn.read_text().replace("kv_budget: {tokens: 8192}", "kv_budget: {tokens: 1024}"))
    s = load_scenario(scn).base
    trace, _ = build_trace(s, scn.parent)
    predicted = predict_rejections(s, trace)
    actual = simulate(s, scn.parent).summary["rejected_by_reason"]
    assert predicted == actual
    assert predicted["exceeds_max_model_len"] > 0 and predicted["exceeds_kv_capacity"] > 0


def test_remove_output_deletes_only_kvsim_files(tmp_path):
    from kvsim.outdir import remove_output

    out = tmp_path / "out"
    run(scenario(tmp_path), out)
    (out / "notes.txt").write_text("mine")
    assert remove_output(out) and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert not remove_output(out)  # no marker any more: nothing to do
    run(scenario(tmp_path), tmp_path / "out2")
    assert remove_output(tmp_path / "out2") and not (tmp_path / "out2").exists()


def test_the_python_api_takes_paths_and_mappings_and_refuses_the_rest(tmp_path):
    """run_to_dir takes a scenario path as run does; run takes a scenario mapping, validated as a file is
    (a ConfigError line); anything else is a TypeError naming what it takes (they were AttributeErrors)."""
    import yaml

    import kvsim
    from kvsim.api import run_to_dir

    scn = scenario(tmp_path)
    out = run_to_dir(str(scn), tmp_path / "o", plots=False, progress=False, warn=lambda m: None)
    assert (out / "summary.json").is_file()
    raw = yaml.safe_load(scn.read_text())
    raw["trace"]["synthetic"]["num_requests"] = 3
    assert kvsim.run(raw).summary["requests_total"] == 3
    with pytest.raises(ConfigError, match="^scenario: trace: required key is missing"):
        kvsim.run({"model": "OPT-13B"})
    with pytest.raises(TypeError, match="run\\(\\): expected a scenario path, mapping, Scenario or LoadedScenario, got int"):
        kvsim.run(5)


def test_an_out_that_cannot_be_created_is_one_line_before_any_work(tmp_path):
    """/proc/NAME (or any folder the file system will not create) was an internal error, exit 1 --
    for capacity only after its whole search; now every directory command refuses it first."""
    from kvsim.outdir import check_creatable

    with pytest.raises(ConfigError, match=r"^--out /proc/kvsim-qa/sub: cannot be created in /proc"):
        check_creatable("/proc/kvsim-qa/sub")
    ok = tmp_path / "new" / "deeper"
    check_creatable(ok)  # creatable: nothing left behind
    assert list(tmp_path.iterdir()) == []
    res = kvsim("sweep", str(ROOT / "scenarios" / "studies" / "block_size_sweep.yaml"), "--out", "/proc/kvsim-qa")
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "kvsim: error: --out /proc/kvsim-qa: cannot be created in /proc (No such file or directory); "
        "choose another --out"], res.stderr
