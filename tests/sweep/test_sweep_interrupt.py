"""Ctrl-C during ``kvsim sweep``: the message says how many points are complete and that a rerun
resumes; the rerun runs only the others. Deterministic: the sweep (inline executor) sends itself
SIGINT as its third point starts, never after a timed wait."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[2]
SWEEP = {
    "name": "tiny",
    "base": {"trace": {"synthetic": {"preset": "sharegpt", "num_requests": 30,
                                     "arrival": {"process": "poisson", "rate_per_s": 4.0}}, "length_policy": "cap"},
             "model": "OPT-13B", "gpu": "A100-40GB", "allocator": {"kind": "paged", "block_size": 16}},
    "grid": {"allocator.block_size": [8, 16, 32, 64]},
}
DRIVER = """
import os, signal, sys
import kvsim.api as api
from kvsim import cli
real, calls = api.run_scenario, []
def run_scenario(*a, **k):
    calls.append(1)
    if len(calls) == int(os.environ.get("KVSIM_TEST_SIGINT_AT", "0")):
        os.kill(os.getpid(), signal.SIGINT)
    return real(*a, **k)
api.run_scenario = run_scenario
sys.exit(cli.main(sys.argv[1:]))
"""


def _kvsim(tmp_path: Path, args: list[str], sigint_at: int = 0) -> subprocess.CompletedProcess:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVSIM_TEST_SIGINT_AT": str(sigint_at)}
    return subprocess.run([sys.executable, str(driver), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_ctrl_c_says_how_many_points_are_complete_and_rerun_resumes(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump(SWEEP, sort_keys=False))
    argv = ["sweep", str(sweep), "--out", "sw", "--executor", "inline", "--no-plots", "--no-report"]
    res = _kvsim(tmp_path, argv, sigint_at=3)
    assert res.returncode == 130, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    out = (tmp_path / "sw").resolve()
    assert last == (f"kvsim: interrupted; 2 of 4 points are complete in {out / 'points'} (index.csv lists the rest "
                    "as pending); rerun the same command to resume: complete points are skipped")
    assert "no complete result directory" not in res.stderr
    idx = pd.read_csv(out / "index.csv")
    assert idx["status"].tolist() == ["ok", "ok", "pending", "pending"]
    assert [p.name for p in (out / "points").iterdir() if p.name.startswith(".")] == []  # nothing half-written
    rerun = _kvsim(tmp_path, argv)
    assert rerun.returncode == 0, rerun.stderr
    assert "4 points, 2 already complete (skipped), 2 to run" in rerun.stderr
    assert pd.read_csv(out / "index.csv")["status"].tolist() == ["ok"] * 4
