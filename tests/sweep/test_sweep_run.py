"""Running sweeps: the index, resuming, failures and retries, crash isolation, the Ray executor."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from sweep_helpers import BLOCK_SIZES, REPO, SHORT, STUDY_SWEEP, kvsim_main, metric_frame

from kvsim.report.tables import METRICS
from kvsim.results import is_complete_run_dir
from kvsim.sweep import load_index, run_sweep
from kvsim.sweep.worker import CRASH_ENV

TRACE = str(REPO / "traces" / "azure_conv_2023.csv.gz")


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = kvsim_main(argv)
    return rc, err.getvalue()


def test_block_size_sweep_index(block_sweep):
    out, df, log = block_sweep
    assert "10 points, 0 already complete (skipped), 10 to run with local executor, 2 jobs" in log
    assert len(df) == 10 and (df["status"] == "ok").all() and (df["error"] == "").all()
    assert df["allocator.block_size"].tolist() == BLOCK_SIZES
    assert str(df["allocator.block_size"].dtype) == "Int64"
    assert df["kv_block_size"].tolist() == BLOCK_SIZES
    assert list(df.columns[:6]) == ["point_id", "point_name", "allocator.block_size", "status", "error", "run_dir"]
    for col in ["throughput_requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p50_s",
                "e2e_p99_s", "concurrency_max", "concurrency_mean", "kv_token_states_frac", "kv_reservation_frac",
                "kv_internal_frag_frac", "kv_external_frag_frac", "kv_free_frac", "preemptions", "requests_finished",
                "requests_rejected", "normalized_latency_s_per_token"]:
        assert col in df.columns and df[col].notna().all(), col
    # internal fragmentation grows with the block size; the 1-token block wastes nothing
    assert df["kv_internal_frag_frac"].iloc[0] == 0
    assert df["kv_internal_frag_frac"].iloc[-1] > df["kv_internal_frag_frac"].iloc[4] > 0
    assert df["concurrency_max"].iloc[0] >= df["concurrency_max"].iloc[-1]
    for _, row in df.iterrows():
        d = out / row["run_dir"]
        assert is_complete_run_dir(d)
        assert json.loads((d / "summary.json").read_text())["name"] == row["point_id"]
    csv = pd.read_csv(out / "index.csv")
    assert csv["point_id"].tolist() == df["point_id"].tolist()
    pd.testing.assert_frame_equal(load_index(out), df)
    resolved = yaml.safe_load((out / "sweep.resolved.yaml").read_text())
    assert resolved["override_keys"] == ["allocator.block_size"] and resolved["set"] == {"trace.end_s": 60}
    assert len(resolved["points"]) == 10
    # the report and the comparison plots are written at the end of the sweep
    assert (out / "report.html").stat().st_size > 10_000
    assert (out / "compare" / "concurrency_vs_block_size.png").exists()


def test_sweep_prints_a_result_table_with_labels_without_hashes(block_sweep):
    out, df, log = block_sweep
    lines = log.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("point ") and "status" in ln)
    assert lines[head].split() == ["point", "status", "req/s", "TTFT", "p50", "s", "TPOT", "p50", "ms", "norm",
                                   "lat", "s/tok", "max", "conc", "frag", "%", "preempt"]
    rows = lines[head + 1:head + 1 + len(df)]
    assert [r.split()[0] for r in rows] == [f"block_size-{b}" for b in BLOCK_SIZES]
    for r, (_, pt) in zip(rows, df.iterrows()):
        cells = r.split()
        assert cells[1] == "ok" and pt["point_id"] not in r  # the id's hash is not shown
        assert float(cells[2]) == pytest.approx(pt["throughput_requests_per_s"], rel=1e-3)
        assert int(cells[6]) == pt["concurrency_max"]
    page = (out / "report.html").read_text()
    assert "block_size-16" in page and "<h2 id=\"point-" in page


def test_rerun_skips_complete_points_and_resumes_deleted_ones(block_sweep_copy):
    out, df = block_sweep_copy
    import shutil

    points = sorted((out / "points").iterdir())
    gone = [points[0], points[4], points[9]]
    for p in gone:
        shutil.rmtree(p)
    before = {p.name: (p.stat().st_ino, (p / "summary.json").stat().st_mtime_ns) for p in points if p not in gone}
    rc, log = run_cli(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "2", "--no-plots",
                       "--no-report"])
    assert rc == 0, log
    assert "10 points, 7 already complete (skipped), 3 to run" in log
    assert "3 ran, 7 skipped, 0 failed" in log
    for name, (ino, mtime) in before.items():
        p = out / "points" / name
        assert (p.stat().st_ino, (p / "summary.json").stat().st_mtime_ns) == (ino, mtime), name
    assert all(is_complete_run_dir(p) for p in gone)
    # the resumed sweep's index equals the uninterrupted one
    pd.testing.assert_frame_equal(metric_frame(pd.read_parquet(out / "index.parquet")), metric_frame(df))


def test_a_point_made_from_another_scenario_is_rerun(block_sweep_copy):
    out, _ = block_sweep_copy
    from kvsim.sweep import load_sweep
    from kvsim.sweep.runner import point_state

    short = load_sweep(STUDY_SWEEP, overrides=["trace.end_s=30"])
    same = load_sweep(STUDY_SWEEP, overrides=["trace.end_s=60"])
    assert [point_state(short, out, p) for p in short.points] == ["stale"] * 10
    assert [point_state(same, out, p) for p in same.points] == ["complete"] * 10


def test_a_point_whose_results_cannot_be_read_is_rerun_and_the_report_rewritten(block_sweep_copy):
    """A complete point with a truncated steps.parquet is not complete: the rerun runs it again
    (saying which file), the report is written anew, and the index is as before."""
    out, df = block_sweep_copy
    from kvsim.sweep import load_sweep
    from kvsim.sweep.runner import point_state

    damaged = sorted((out / "points").iterdir())[3]
    steps = damaged / "steps.parquet"
    steps.write_bytes(steps.read_bytes()[:3000])
    same = load_sweep(STUDY_SWEEP, overrides=["trace.end_s=60"])
    assert sorted(point_state(same, out, p) for p in same.points) == ["complete"] * 9 + ["damaged"]
    report_mtime = (out / "report.html").stat().st_mtime_ns
    rc, log = run_cli(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "1", "--no-plots"])
    assert rc == 0, log
    assert f"kvsim: note: point {damaged.name} is run again: {steps}: cannot read the parquet file" in log
    assert "10 points, 9 already complete (skipped), 1 to run (1 damaged: result files that cannot be read)" in log
    assert "warning" not in log
    pd.read_parquet(steps)  # written again, whole
    assert (out / "report.html").stat().st_mtime_ns != report_mtime
    assert json.loads((out / ".kvsim-output.json").read_text())["complete"] is True
    pd.testing.assert_frame_equal(metric_frame(pd.read_parquet(out / "index.parquet")), metric_frame(df))


def test_a_report_that_cannot_be_written_leaves_no_stale_report(block_sweep_copy, monkeypatch):
    """The sweep's report fails: the earlier compare/ and report.html go (they would look current),
    the warning says so, and the sweep is not marked complete, so the same command writes them."""
    import kvsim.report

    out, _ = block_sweep_copy
    (out / "compare" / "mine.txt").write_text("a user's file")  # not kvsim's: kept
    assert (out / "report.html").is_file()

    def broken(*a, **k):
        raise RuntimeError("no report today")

    monkeypatch.setattr(kvsim.report, "compare", broken)
    rc, log = run_cli(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "1", "--no-plots"])
    assert rc == 0, log
    assert ("kvsim: warning: could not write the sweep report: RuntimeError: no report today (removed the "
            "earlier compare/ and report.html; rerun the same command to write them)") in log
    assert not (out / "report.html").exists()
    # compare/ keeps the user's file and its marker (incomplete, listing nothing): kvsim's to write again
    assert sorted(p.name for p in (out / "compare").iterdir()) == [".kvsim-output.json", "mine.txt"]
    assert json.loads((out / "compare" / ".kvsim-output.json").read_text())["written"] == []
    assert json.loads((out / ".kvsim-output.json").read_text())["complete"] is False
    monkeypatch.undo()
    rc, log = run_cli(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "1", "--no-plots"])
    assert rc == 0 and "warning" not in log, log
    assert (out / "report.html").is_file() and (out / "compare" / "comparison.csv").is_file()
    assert (out / "compare" / "mine.txt").read_text() == "a user's file"
    assert json.loads((out / ".kvsim-output.json").read_text())["complete"] is True


def test_a_no_report_rerun_that_runs_points_withdraws_the_earlier_report(block_sweep_copy):
    """--no-report on a rerun that runs points: the earlier compare/ and report.html no longer show
    them, so kvsim removes what it wrote there (a user's file stays) and says so."""
    out, _ = block_sweep_copy
    (out / "compare" / "mine.txt").write_text("a user's file")
    rc, log = run_cli(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "1", "--no-plots",
                       "--no-report"])  # every point complete: nothing ran, the report still shows them
    assert rc == 0 and "removed" not in log and (out / "report.html").is_file(), log
    rc, log = run_cli(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "1", "--no-plots",
                       "--no-report", "--force"])
    assert rc == 0, log
    assert "kvsim: note: removed the earlier sweep's compare/ and report.html" in log
    assert not (out / "report.html").exists() and not (out / "compare" / "comparison.csv").exists()
    assert (out / "compare" / "mine.txt").read_text() == "a user's file"


def test_killed_sweep_resumes(tmp_path):
    """Kill a sweep (driver and workers) mid-way; the rerun runs only the points not complete."""
    out = tmp_path / "sweep"
    sizes = [1, 16, 64, 256]
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": {"trace": {"file": TRACE, "end_s": 60}, "model": "OPT-13B", "gpu": "A100-40GB"},
        "grid": {"allocator.block_size": sizes}}))
    proc = subprocess.Popen([sys.executable, "-m", "kvsim", "sweep", str(sweep), "--out", str(out), "--jobs", "1",
                             "--no-plots", "--no-report", "-q"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = [p for p in out.glob("points/*") if is_complete_run_dir(p)]
            if len(done) >= 1 or proc.poll() is not None:
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its pool workers: a session of our own
        proc.wait()
    # Every complete run directory counts, the hidden `.<id>.tmp-<pid>` of a point killed after it
    # was marked complete and before its rename included: the rerun must keep that work too
    # (the deterministic case: test_sweep_killed_commit.py).
    complete = sorted(p.name for p in (out / "points").iterdir() if is_complete_run_dir(p))
    assert 1 <= len(complete) < len(sizes), f"the sweep was not killed mid-way: {complete}, exit {proc.returncode}"
    assert not (out / "index.parquet").exists()  # killed before the end: no index yet
    df = run_sweep(sweep, out, jobs=2, plots=False, report=False)
    info = df.attrs["sweep"]
    seen = f"complete after the kill: {complete}; the rerun: {info}; driver exit {proc.returncode}"
    assert info["skipped"] == len(complete) and info["ran"] == len(sizes) - len(complete) and info["failed"] == 0, seen
    assert (df["status"] == "ok").all() and len(df) == len(sizes), seen
    leftovers = [p.name for p in (out / "points").iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers  # temporary dirs of the killed points were cleaned up


def test_failing_point_is_retried_recorded_and_exit_code_is_1(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": {"trace": {"file": TRACE, "end_s": 30}, "model": "OPT-13B", "gpu": "A100-40GB"},
        "points": [{"name": "good"}, {"name": "too-slow", "limits.max_sim_time_s": 0.5}],
    }))
    out = tmp_path / "out"
    rc, log = run_cli(["sweep", str(sweep), "--out", str(out), "--jobs", "2", "--no-plots", "--retries", "1"])
    assert rc == 1
    assert "attempt 1 failed (SimulationLimitError" in log and "retrying" in log
    assert "FAILED after 2 attempt(s)" in log
    df = pd.read_parquet(out / "index.parquet")
    assert df["status"].tolist() == ["ok", "failed"]
    assert df["point_name"].tolist() == ["good", "too-slow"]
    assert df.loc[1, "error"].startswith("SimulationLimitError: ") and pd.isna(df.loc[1, "throughput_requests_per_s"])
    assert df.loc[1, "limits.max_sim_time_s"] == 0.5 and pd.isna(df.loc[0, "limits.max_sim_time_s"])
    err_file = out / "errors" / f"{df.loc[1, 'point_id']}.txt"
    assert "failed after 2 attempt(s)" in err_file.read_text() and "Traceback" in err_file.read_text()
    assert (out / "report.html").exists(), log  # the report still covers the points that ran
    # a rerun retries only the failed point
    rc, log = run_cli(["sweep", str(sweep), "--out", str(out), "--jobs", "2", "--no-plots", "--retries", "0",
                       "--no-report"])
    assert rc == 1 and "1 already complete (skipped), 1 to run" in log


def test_crashing_worker_fails_only_its_point(tmp_path, monkeypatch):
    sweep = {"base": {"trace": {"file": TRACE, "end_s": 20}, "model": "OPT-13B", "gpu": "A100-40GB"},
             "grid": {"allocator.block_size": [8, 16, 32]}}
    monkeypatch.setenv(CRASH_ENV, "block_size-16-")
    logs: list[str] = []
    df = run_sweep(sweep, tmp_path / "out", jobs=2, retries=1, plots=False, report=False, log=logs.append)
    assert df["status"].tolist() == ["ok", "failed", "ok"]
    assert "worker process died" in df.loc[1, "error"]
    assert df.attrs["sweep"]["failed"] == 1


def test_python_api_inline_executor_and_dict_spec(tmp_path):
    spec = {"name": "api", "base": {"trace": {"file": TRACE, "end_s": 20}, "model": "OPT-13B", "gpu": "A100-40GB"},
            "points": [{"name": "fp16"}, {"name": "fp8", "kv_dtype": "fp8"}]}
    df = run_sweep(spec, tmp_path / "out", executor="inline", plots=False, report=False)
    assert df["point_name"].tolist() == ["fp16", "fp8"] and (df["status"] == "ok").all()
    assert df.loc[1, "kv_bytes_per_token"] * 2 == df.loc[0, "kv_bytes_per_token"]
    assert df.attrs["sweep"]["ran"] == 2
    again = run_sweep(spec, tmp_path / "out", executor="inline", plots=False, report=False)
    assert again.attrs["sweep"]["skipped"] == 2
    pd.testing.assert_frame_equal(again, df)
    with pytest.raises(Exception, match="unknown executor"):
        run_sweep(spec, tmp_path / "o2", executor="dask")


def test_ray_executor_gives_identical_index(block_sweep, tmp_path):
    if os.environ.get("CI") != "true":  # CI installs the ray extra: there a missing Ray must fail
        pytest.importorskip("ray", reason="Ray is the optional extra kvsim[ray] (CI installs it)")
    out_local, df_local, _ = block_sweep
    out = tmp_path / "ray"
    rc, log = run_cli(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "2", "--no-plots",
                       "--no-report", "--executor", "ray"])
    assert rc == 0, log
    assert "with ray executor" in log
    df_ray = pd.read_parquet(out / "index.parquet")
    pd.testing.assert_frame_equal(df_ray, df_local)
    for col in METRICS:
        assert df_ray[col].equals(df_local[col]), col
    # same simulator output, byte for byte
    for pid in df_local["point_id"]:
        a = pd.read_parquet(out_local / "points" / pid / "requests.parquet")
        b = pd.read_parquet(out / "points" / pid / "requests.parquet")
        pd.testing.assert_frame_equal(a, b)
