"""A sweep killed at the last step of writing a point: the point's run directory is complete (its
marker says so) but still under its hidden temp name ``points/.<id>.tmp-<pid>``. The work is done:
a resumed sweep puts it in place and skips the point, and leaves no temp directory behind.

The kill is made deterministic: a driver subprocess (``inline`` executor, so the point is written by
the driver itself) exits abruptly, as SIGKILL would (no ``finally``, no cleanup), at the moment it
renames a complete point temp directory into place.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

import yaml
from sweep_helpers import REPO

from kvsim.outdir import Marker, read_marker, write_marker
from kvsim.results import is_complete_run_dir
from kvsim.sweep import run_sweep

TRACE = str(REPO / "traces" / "azure_conv_2023.csv.gz")

# Run a sweep in this process; die (exit 86, nothing cleaned up) when a complete point temp
# directory is about to be renamed to points/<id>.
KILLED_AT_RENAME = r"""
import os, sys
from pathlib import Path

real_replace = os.replace

def replace(src, dst, *args, **kwargs):
    s = Path(src)
    if s.parent.name == "points" and s.name.startswith(".") and ".tmp-" in s.name and s.is_dir():
        os._exit(86)
    return real_replace(src, dst, *args, **kwargs)

os.replace = replace
from kvsim.sweep import run_sweep
run_sweep(sys.argv[1], sys.argv[2], executor="inline", plots=False, report=False, force=sys.argv[3] == "force")
"""


def _sweep_file(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "base": {"trace": {"file": TRACE, "end_s": 10}, "model": "OPT-13B", "gpu": "A100-40GB"},
        "grid": {"allocator.block_size": [16, 32]}}))
    return sweep


def _kill_at_rename(sweep, out, force: bool = False) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED_AT_RENAME, str(sweep), str(out), "force" if force else ""],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 86, proc.stderr


def test_point_killed_before_its_rename_is_kept_not_rerun(tmp_path):
    sweep, out = _sweep_file(tmp_path), tmp_path / "sweep"
    _kill_at_rename(sweep, out)
    entries = sorted((out / "points").iterdir())
    assert len(entries) == 1 and entries[0].name.startswith(".") and ".tmp-" in entries[0].name, entries
    tmp = entries[0]
    # what the killed sweep left is a complete run directory (the user's notion of a finished point)
    assert is_complete_run_dir(tmp) and read_marker(tmp).complete
    assert not (out / "index.parquet").exists()
    point_id = tmp.name[1:].rsplit(".tmp-", 1)[0]
    summary = tmp / "summary.json"
    kept = (summary.stat().st_ino, summary.read_bytes())

    logs: list[str] = []
    df = run_sweep(sweep, out, executor="inline", plots=False, report=False, log=logs.append)
    info = df.attrs["sweep"]
    assert (info["skipped"], info["ran"], info["failed"]) == (1, 1, 0), logs
    assert (df["status"] == "ok").all() and len(df) == 2
    done = out / "points" / point_id / "summary.json"
    assert (done.stat().st_ino, done.read_bytes()) == kept  # the finished work itself, put in place
    assert [p.name for p in (out / "points").iterdir() if p.name.startswith(".")] == []
    assert any("interrupted" in m and point_id in m for m in logs), logs


def test_replacement_killed_between_its_renames_keeps_new_output_and_user_files(tmp_path):
    """``--force`` rerun killed after ``points/<id>`` was moved aside and before the new complete
    directory took its place: the new output goes in place and the user's file comes back."""
    sweep, out = _sweep_file(tmp_path), tmp_path / "sweep"
    first = run_sweep(sweep, out, executor="inline", plots=False, report=False)
    point_id = first["point_id"].iloc[0]
    (out / "points" / point_id / "notes.txt").write_text("mine\n")
    _kill_at_rename(sweep, out, force=True)
    hidden = sorted(p.name for p in (out / "points").iterdir() if p.name.startswith("."))
    kinds = sorted("old" if ".old-" in h else "tmp" if ".tmp-" in h else h for h in hidden)
    assert kinds == ["old", "tmp"], hidden
    assert not (out / "points" / point_id).exists()
    tmp = next(p for p in (out / "points").iterdir() if ".tmp-" in p.name)
    assert is_complete_run_dir(tmp)
    new_ino = (tmp / "summary.json").stat().st_ino

    df = run_sweep(sweep, out, executor="inline", plots=False, report=False)
    info = df.attrs["sweep"]
    assert (info["skipped"], info["ran"], info["failed"]) == (2, 0, 0)
    d = out / "points" / point_id
    assert (d / "summary.json").stat().st_ino == new_ino and (d / "notes.txt").read_text() == "mine\n"
    assert [p.name for p in (out / "points").iterdir() if p.name.startswith(".")] == []


@contextmanager
def _live_process():
    """A process that stays alive (a sleep) until the block ends, for temp dirs named after it."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_complete_temp_dir_of_a_live_process_is_left_alone(tmp_path):
    """Only a dead writer's output is taken over: a running sweep's finished point is its own."""
    sweep, out = _sweep_file(tmp_path), tmp_path / "sweep"
    first = run_sweep(sweep, out, executor="inline", plots=False, report=False)
    point_id = first["point_id"].iloc[0]
    with _live_process() as live:
        tmp = out / "points" / f".{point_id}.tmp-{live.pid}"
        (out / "points" / point_id).rename(tmp)
        assert is_complete_run_dir(tmp)
        df = run_sweep(sweep, out, executor="inline", plots=False, report=False)
        assert (df.attrs["sweep"]["skipped"], df.attrs["sweep"]["ran"]) == (1, 1)
        assert is_complete_run_dir(tmp) and is_complete_run_dir(out / "points" / point_id)


def test_leftover_of_a_worker_still_exiting_when_the_rerun_starts_is_removed(tmp_path, monkeypatch):
    """A SIGKILLed worker can outlive its driver by a moment: its temp directory is then still a live
    process's at the start of the rerun, and must be tidied at the end of the sweep."""
    import kvsim.sweep.runner as runner

    sweep, out = _sweep_file(tmp_path), tmp_path / "sweep"
    first = run_sweep(sweep, out, executor="inline", plots=False, report=False)
    point_id = first["point_id"].iloc[0]
    with _live_process() as exiting:
        tmp = out / "points" / f".{point_id}.tmp-{exiting.pid}"
        tmp.mkdir()
        write_marker(tmp, Marker("run", False, ()))  # as _new_temp leaves it: the point was being written
        real_execute = runner.execute

        def execute_once_it_is_gone(*args, **kwargs):
            exiting.kill()
            exiting.wait()
            return real_execute(*args, **kwargs)

        monkeypatch.setattr(runner, "execute", execute_once_it_is_gone)
        df = run_sweep(sweep, out, executor="inline", plots=False, report=False)
    assert df.attrs["sweep"]["skipped"] == 2 and (df["status"] == "ok").all()
    assert [p.name for p in (out / "points").iterdir() if p.name.startswith(".")] == []
