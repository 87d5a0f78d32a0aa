"""Resource bounds: requests that can never fit are rejected and counted (not retried forever), and
``limits.max_sim_time_s`` / ``limits.max_wall_time_s`` stop a run with one line, exit 2 and no
complete-looking result directory."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from ._cli import (
    assert_no_complete_dir,
    assert_one_line_error,
    copy_corpus,
    run_kvsim,
    temp_dirs,
)
from .cases import BASE

# 12 requests on a 256-token KV budget (OPT-13B max length 2048): 5 whose KV footprint
# (prompt + output - 1) exceeds the whole budget (one by a single token), 2 longer than the model,
# 5 that fit (one with 255 + 1 = 256 tokens: the whole budget even for a contiguous reservation).
NEVER_FIT_TRACE = "arrival_s,prompt_tokens,output_tokens\n" + "".join(
    f"{0.1 * i:.1f},{p},{o}\n" for i, (p, o) in enumerate([
        (100, 20), (1000, 10), (50, 30), (257, 1), (1500, 100), (2000, 100), (120, 40),
        (300, 5), (60, 60), (2040, 10), (900, 900), (255, 1),
    ]))


def _never_fit_scenario(allocator: dict) -> str:
    tree = dict(BASE, trace={"file": "t.csv"}, kv_budget={"tokens": 256}, allocator=allocator)
    return yaml.safe_dump(tree, sort_keys=False)


@pytest.mark.parametrize("allocator", [
    {"kind": "paged", "block_size": 16, "watermark": 0.0},
    {"kind": "contiguous", "reservation": "oracle"},
    {"kind": "buddy", "min_block_tokens": 16, "reservation": "oracle"},
], ids=lambda a: a["kind"])
def test_requests_that_never_fit_are_rejected_and_counted(tmp_path, allocator):
    (tmp_path / "t.csv").write_text(NEVER_FIT_TRACE)
    (tmp_path / "s.yaml").write_text(_never_fit_scenario(allocator))
    t0 = time.monotonic()
    res = run_kvsim(["run", "s.yaml", "--out", "out", "--no-plots", "-q"], tmp_path, timeout=60)
    assert res.returncode == 0, res.describe()
    assert time.monotonic() - t0 < 30, "rejecting 7 requests should not take long: a retry loop?"
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["requests_total"] == 12
    assert s["rejected_by_reason"] == {"exceeds_kv_capacity": 5, "exceeds_max_model_len": 2}
    assert s["requests_rejected"] == 7
    assert s["requests_finished"] == 5
    assert s["requests_unfinished"] == 0


def test_a_trace_of_only_impossible_requests_finishes_with_all_rejected(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1000,10\n1,1500,10\n2,3000,10\n")
    (tmp_path / "s.yaml").write_text(_never_fit_scenario({"kind": "paged", "block_size": 16}))
    res = run_kvsim(["run", "s.yaml", "--out", "out", "--no-plots", "-q"], tmp_path, timeout=60)
    assert res.returncode == 0, res.describe()
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (s["requests_rejected"], s["requests_finished"]) == (3, 0)
    assert s["rejected_by_reason"] == {"exceeds_kv_capacity": 2, "exceeds_max_model_len": 1}


def test_chunked_prefill_recompute_longer_than_the_budget_is_scheduled(tmp_path):
    """3 requests of 30 + 200 tokens on 256 KV tokens: two get preempted part-way, and their
    recompute (30 prompt + ~50 generated tokens) is longer than the 64-token step budget, so it
    must be chunked like a prompt."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,30,200\n0,30,200\n0,30,200\n")
    tree = dict(BASE, trace={"file": "t.csv"}, kv_budget={"tokens": 256},
                allocator={"kind": "paged", "block_size": 16, "watermark": 0.0},
                scheduler={"chunked_prefill": True, "max_num_batched_tokens": 64})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    res = run_kvsim(["run", "s.yaml", "--out", "out", "--no-plots", "-q", "--check-invariants"], tmp_path,
                    timeout=60)
    assert res.returncode == 0, res.describe()
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["requests_finished"] == 3 and s["preemptions"] > 0


LIMIT_CASES = {
    "max_sim_time_s": (["--set", "limits.max_sim_time_s=5"], ["limits.max_sim_time_s = 5"]),
    "max_wall_time_s": (["--set", "limits.max_wall_time_s=0.5"], ["limits.max_wall_time_s = 0.5"]),
}


@pytest.mark.parametrize("limit", list(LIMIT_CASES))
def test_limits_stop_the_run_with_one_line(tmp_path, limit):
    argv, expect = LIMIT_CASES[limit]
    copy_corpus("long.yaml", tmp_path)
    t0 = time.monotonic()
    res = run_kvsim(["run", "long.yaml", "--out", "out", "--no-plots", "-q", *argv], tmp_path, timeout=60)
    elapsed = time.monotonic() - t0
    assert_one_line_error(res, expect)
    assert elapsed < 8, f"the {limit} limit took {elapsed:.1f} s to stop a ~9 s run"
    out = tmp_path / "out"
    assert not out.exists()
    assert_no_complete_dir(out)
    for tmp in temp_dirs(out):
        assert (tmp / "INCOMPLETE").is_file()
        assert "SimulationLimitError" in (tmp / "INCOMPLETE").read_text()


def test_limit_message_names_the_scenario_and_variant(tmp_path):
    copy_corpus("long.yaml", tmp_path)
    res = run_kvsim(["run", "long.yaml", "--out", "out", "--no-plots", "-q", "--set", "limits.max_sim_time_s=5"],
                    tmp_path, timeout=60)
    assert_one_line_error(res, ["long.yaml", "long", "limits.max_sim_time_s"])
    assert res.stderr.startswith("kvsim: error: long.yaml: ")
