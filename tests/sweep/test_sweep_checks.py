"""A sweep checks every point as ``kvsim run`` would before anything runs, and reuses a complete point
only when its scenario and its trace content are unchanged."""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml
from sweep_helpers import REPO, kvsim_main

from kvsim.errors import ConfigError
from kvsim.sweep import run_sweep
from kvsim.sweep.executors import execute
from kvsim.sweep.spec import load_sweep

TINY = yaml.safe_load((REPO / "tests" / "reliability" / "corpus" / "tiny.yaml").read_text())


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = kvsim_main(argv)
    return rc, out.getvalue(), err.getvalue()


def write_trace(path, n: int, prompt: int) -> None:
    path.write_text("".join(f'{{"arrival_s": {i * 0.1}, "prompt_tokens": {prompt}, "output_tokens": 8}}\n'
                            for i in range(n)))


def test_a_point_whose_trace_file_content_changed_is_rerun(tmp_path):
    """Same path, other content: the points are stale (as ``kvsim run``'s resume treats it), not skipped."""
    trace = tmp_path / "t.jsonl"
    write_trace(trace, 20, 50)
    base = {k: v for k, v in TINY.items() if k != "trace"} | {"trace": {"file": str(trace)}}
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": base, "grid": {"allocator.block_size": [16, 32]}}))
    first = run_sweep(sweep, tmp_path / "o", executor="inline", plots=False, report=False)
    again = run_sweep(sweep, tmp_path / "o", executor="inline", plots=False, report=False)
    assert again.attrs["sweep"]["skipped"] == 2
    write_trace(trace, 30, 60)
    logs: list[str] = []
    third = run_sweep(sweep, tmp_path / "o", executor="inline", plots=False, report=False, log=logs.append)
    assert third.attrs["sweep"]["skipped"] == 0 and third.attrs["sweep"]["ran"] == 2, logs
    assert "2 stale: made from another scenario or trace" in logs[0]
    assert (third["requests_finished"] == 30).all() and (first["requests_finished"] == 20).all()


GRID = {"scheduler.chunked_prefill": [True, False], "scheduler.max_num_batched_tokens": [16, 2048]}


def test_dry_run_refuses_a_point_kvsim_run_would_refuse(tmp_path):
    """check_token_budget at every point up front: one line naming the sweep file and the point, exit 2."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": TINY, "grid": GRID}))
    for extra in (["--dry-run"], ["--out", str(tmp_path / "o")]):
        rc, out, err = run_cli(["sweep", str(sweep), *extra])
        lines = err.strip().splitlines()
        assert rc == 2 and out == "" and len(lines) == 1, err
        assert lines[0].startswith(f"kvsim: error: {sweep}: point chunked_prefill-False_")
        assert "scheduler.max_num_batched_tokens (16) is smaller" in lines[0]
    assert not (tmp_path / "o").exists()


def test_a_point_its_trace_cannot_be_simulated_with_is_refused_up_front(tmp_path):
    """check_trace_supported (here: radix with parallel samples) with the trace built once per distinct trace."""
    base = TINY | {"trace": {"synthetic": {**TINY["trace"]["synthetic"], "sampling": {"n": 2, "fraction": 1.0}}}}
    spec = {"base": base, "grid": {"allocator.kind": ["paged", "radix"]}}
    with pytest.raises(ConfigError, match=r"^sweep: point kind-radix-[0-9a-f]{8}: allocator.kind: radix models one"):
        load_sweep(spec, base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"point kind-radix-[0-9a-f]{8}: allocator.kind: radix"):
        run_sweep(load_sweep(spec, base_dir=tmp_path, check_capacity=False), tmp_path / "o", executor="inline")
    assert not (tmp_path / "o").exists()


def test_a_config_error_in_a_worker_is_not_retried(monkeypatch):
    """A ConfigError is the input's: the same on every attempt."""
    calls, outcomes, retried = [], [], []

    def boom(task):
        calls.append(task)
        raise ConfigError("s.yaml: point p: bad")

    monkeypatch.setattr("kvsim.sweep.executors.run_point", boom)
    execute([{"point_id": "p"}], outcomes.append, executor="inline", retries=3, on_retry=lambda *a: retried.append(a))
    assert len(calls) == 1 and retried == [] and outcomes[0].attempts == 1 and not outcomes[0].ok
    assert outcomes[0].error == "ConfigError: s.yaml: point p: bad"
