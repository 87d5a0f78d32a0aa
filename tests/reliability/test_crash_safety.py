"""Crash safety of result directories: a killed or interrupted run never leaves a directory at
``--out`` that looks complete, never damages an earlier complete one, and the next run cleans up.

The run under test is ``corpus/long.yaml`` (about 9 s of simulation on one core); each test
stops it shortly after its hidden temporary directory ``.OUT.tmp-<pid>`` appears, i.e. while it is
simulating. Reruns use ``--set trace.synthetic.num_requests=50`` to stay short: stale temporary
directories are cleaned by name, whatever the scenario.
"""

from __future__ import annotations

import json
import signal
import time

from ._cli import (
    assert_no_complete_dir,
    assert_one_line_error,
    copy_corpus,
    finish,
    run_kvsim,
    start_kvsim,
    stderr_lines,
    stop,
    temp_dirs,
    wait_for,
)

LONG = "long.yaml"
RUN_LONG = ["run", LONG, "--out", "out", "--no-plots", "-q"]
SHORT = ["--set", "trace.synthetic.num_requests=50"]


def _start_and_wait_for_temp_dir(tmp_path):
    copy_corpus(LONG, tmp_path)
    proc = start_kvsim(RUN_LONG, tmp_path)
    try:
        tmp = wait_for(lambda: temp_dirs(tmp_path / "out"), proc, timeout=60)
        assert [p.name for p in tmp] == [f".out.tmp-{proc.pid}"]
        # Let it write part of its output (steps are streamed into the temp dir) before stopping it.
        wait_for(lambda: (tmp[0] / "scenario.resolved.yaml").exists(), proc, timeout=30)
        time.sleep(0.5)
        assert proc.poll() is None, "the run finished before it could be stopped: make corpus/long.yaml longer"
    except BaseException:
        stop(proc)
        proc.communicate()
        raise
    return proc, tmp[0]


def test_sigkill_mid_run_leaves_nothing_complete_and_rerun_cleans_up(tmp_path):
    proc, tmp = _start_and_wait_for_temp_dir(tmp_path)
    stop(proc, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    out = tmp_path / "out"
    assert not out.exists(), "a SIGKILLed run created its result directory"
    assert_no_complete_dir(out)
    assert tmp.is_dir() and not (tmp / "summary.json").exists()  # the stale, hidden, partial output

    rerun = run_kvsim(["run", LONG, "--out", "out", "--no-plots", "-q", *SHORT], tmp_path)
    assert rerun.returncode == 0, rerun.describe()
    assert rerun.stdout.strip() == "out"
    assert (out / "summary.json").is_file() and not (out / "INCOMPLETE").exists()
    assert json.loads((out / "summary.json").read_text())["requests_total"] == 50
    assert temp_dirs(out) == [], "the rerun did not remove the killed run's temp dir"


def test_sigkill_never_damages_an_existing_complete_result(tmp_path):
    copy_corpus(LONG, tmp_path)
    first = run_kvsim(["run", LONG, "--out", "out", "--no-plots", "-q", *SHORT], tmp_path)
    assert first.returncode == 0, first.describe()
    out = tmp_path / "out"
    before = {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    proc, _ = _start_and_wait_for_temp_dir(tmp_path)
    stop(proc, signal.SIGKILL)
    proc.communicate(timeout=30)

    after = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert after == before, "a killed run changed the complete result directory it was replacing"


def test_sigint_stops_cleanly_with_exit_130(tmp_path):
    proc, tmp = _start_and_wait_for_temp_dir(tmp_path)
    t0 = time.monotonic()
    stop(proc, signal.SIGINT)
    res = finish(proc, RUN_LONG, tmp_path, timeout=30)
    assert time.monotonic() - t0 < 10, "SIGINT did not stop the run promptly"

    line = assert_one_line_error(res, ["interrupted before any result was finished",
                                       f"kvsim removed its temporary directory {tmp.name}"],
                                 code=130, prefix="kvsim: ")
    assert len(stderr_lines(res)) == 1, line
    out = tmp_path / "out"
    assert not out.exists(), "an interrupted run created its result directory"
    assert_no_complete_dir(out)
    # A single run has nothing finished to keep: kvsim removes the temporary directory it wrote.
    assert not tmp.exists(), f"{tmp} left behind"
