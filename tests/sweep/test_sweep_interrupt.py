"""Ctrl-C during ``kvsim sweep``: the message says how many points are complete and that a rerun
resumes; the rerun runs only the others. Deterministic: the sweep (inline executor) sends itself
SIGINT as its third point starts, never after a timed wait."""

from __future__ import annotations

import pandas as pd
import yaml
from helpers import kvsim_with_sigint

SWEEP = {
    "name": "tiny",
    "base": {"trace": {"synthetic": {"preset": "sharegpt", "num_requests": 30,
                                     "arrival": {"process": "poisson", "rate_per_s": 4.0}}, "length_policy": "cap"},
             "model": "OPT-13B", "gpu": "A100-40GB", "allocator": {"kind": "paged", "block_size": 16}},
    "grid": {"allocator.block_size": [8, 16, 32, 64]},
}


def test_ctrl_c_says_how_many_points_are_complete_and_rerun_resumes(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    argv = ["sweep", str(sweep), "--out", "sw", "--executor", "inline", "--no-plots", "--no-report"]
    res = kvsim_with_sigint(tmp_path, argv, sigint_at=3)
    assert res.returncode == 130, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    out = (tmp_path / "sw").resolve()
    assert last == (f"kvsim: interrupted; 2 of 4 points are complete in {out / 'points'} (index.csv lists the rest "
                    "as pending); rerun the same command to resume: complete points are skipped")
    assert "no complete result directory" not in res.stderr
    idx = pd.read_csv(out / "index.csv")
    assert idx["status"].tolist() == ["ok", "ok", "pending", "pending"]
    assert [p.name for p in (out / "points").iterdir() if p.name.startswith(".")] == []  # nothing half-written
    rerun = kvsim_with_sigint(tmp_path, argv)
    assert rerun.returncode == 0, rerun.stderr
    assert "4 points, 2 already complete (skipped), 2 to run" in rerun.stderr
    assert pd.read_csv(out / "index.csv")["status"].tolist() == ["ok"] * 4


def test_a_point_finished_when_ctrl_c_came_is_ok_in_the_index(tmp_path, monkeypatch):
    """Ctrl-C after a point's worker finished it on disk but before its outcome reached the runner (a
    worker process's result in flight): the index lists it ``ok``, as the rerun will skip it."""
    import kvsim.sweep.runner as runner
    from kvsim.errors import Interrupted
    from kvsim.sweep.executors import run_point

    def interrupted_after_one(tasks, on_outcome, **kw):
        run_point(tasks[0])  # written and complete on disk; its outcome never delivered
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "execute", interrupted_after_one)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    try:
        runner.run_sweep(sweep, tmp_path / "sw", executor="inline", plots=False, report=False)
    except Interrupted as e:
        assert "1 of 4 points are complete" in str(e)
    else:
        raise AssertionError("not interrupted")
    assert pd.read_csv(tmp_path / "sw" / "index.csv")["status"].tolist() == ["ok", "pending", "pending", "pending"]
