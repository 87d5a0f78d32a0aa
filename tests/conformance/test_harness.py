"""The conformance harness without vLLM (runs in every install): the kvsim side, the comparison and
its failure message, the CLI's answers when vLLM is missing. tests/conformance/test_vllm.py runs the
cases against vLLM where it is importable (the conformance extra; `make test` installs it)."""

import importlib.util
import subprocess
import sys
from dataclasses import replace

import pytest

from kvsim.conformance.cases import EXCEPTIONS, Case, Req, builtin_cases, random_requests
from kvsim.conformance.compare import compare
from kvsim.conformance.kvsim_side import run_kvsim, token_keys
from kvsim.conformance.runner import select
from kvsim.conformance.timeline import REQUEST_FIELDS, STEP_FIELDS, Timeline

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_cases_are_distinct_and_name_only_known_exceptions():
    cases = builtin_cases()
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    assert {"priority-waiting-queue", "parallel-samples-as-group"} <= {e for c in cases for e in c.exceptions}
    assert [c.name for c in cases if c.blocks_ahead] == ["prompt_blocks_at_admission"]
    with pytest.raises(ValueError, match="unknown exception"):
        Case("x", "", (), num_blocks=1, exceptions=("no-such",))
    assert set(EXCEPTIONS) >= {e for c in cases for e in c.exceptions}


def test_token_keys_share_exactly_the_equal_prefixes():
    a, b, c = token_keys([(1, 2, 3, 4), (1, 2, 9, 4), (1, 2, 3, 4, 5)])
    assert a[:2].tolist() == b[:2].tolist() and a[2] != b[2] and a[3] != b[3]
    assert c[:4].tolist() == a.tolist()


def test_step_and_fast_replays_agree_and_record_every_step():
    case = Case("t", "", random_requests(3, 25, (20, 200), (5, 60), rate_per_s=40.0), num_blocks=60)
    step, fast = run_kvsim(case, "step"), run_kvsim(case, "fast")
    assert step.requests == fast.requests
    assert len(step.steps) == len(fast.steps) and all(s is not None for s in step.steps)
    assert fast.windows, "the fast engine ran no decode window here"
    assert any(s["preemptions"] for s in step.steps)
    for (first, k), sums in zip(fast.windows, fast.window_sums):
        span = step.steps[first:first + k]
        assert sums["scheduled_tokens"] == sum(s["scheduled_tokens"] for s in span)
    assert set(step.steps[0]) == set(STEP_FIELDS)
    assert all(set(r) == set(REQUEST_FIELDS) for r in step.requests.values())


def test_prefix_hits_are_counted_per_step_and_per_request():
    shared = tuple(range(100))
    reqs = (Req(shared + (1000,), 3), Req(shared + (2000, 2001), 3, arrival_s=0.05))
    tl = run_kvsim(Case("p", "", reqs, num_blocks=50, prefix_caching=True), "step")
    assert tl.requests[1]["cached_tokens"] == 96  # 6 full 16-token blocks of the 100 shared tokens
    assert sum(s["prefix_hit_tokens"] for s in tl.steps) == 96


def test_a_difference_names_the_case_step_field_and_both_values():
    case = Case("c", "", random_requests(1, 5, (10, 40), (2, 5)), num_blocks=100)
    ref = run_kvsim(case, "step")
    got = Timeline("kvsim-step", [dict(s) for s in ref.steps], {k: dict(v) for k, v in ref.requests.items()})
    assert compare("c", ref, got) == []
    got.steps[3]["running"] += 1
    got.requests[2]["finish_step"] += 1
    diffs = compare("c", ref, got)
    assert [d.message() for d in diffs] == [
        f"case c: kvsim-step differs from vLLM at step 3: running vllm={ref.steps[3]['running']} "
        f"kvsim={ref.steps[3]['running'] + 1}",
        f"case c: kvsim-step differs from vLLM at request 2: finish_step vllm={ref.requests[2]['finish_step']} "
        f"kvsim={ref.requests[2]['finish_step'] + 1}"]


def test_kv_blocks_ahead_is_the_only_allowance():
    case = Case("c", "", random_requests(1, 5, (10, 40), (2, 5)), num_blocks=100)
    ref = run_kvsim(case, "step")
    ahead = Timeline("vllm", [dict(s) for s in ref.steps], ref.requests)
    ahead.steps[0]["kv_blocks_used"] -= 2
    ahead.steps[0]["kv_blocks_ahead"] = 2  # vLLM holds 2 blocks fewer, kvsim holds them ahead: equal
    assert compare("c", ahead, ref, blocks_ahead=True) == []
    assert [d.field for d in compare("c", ahead, ref)] == ["kv_blocks_used"]  # per_chunk: no allowance
    ahead.steps[0]["kv_blocks_ahead"] = 1
    assert [d.field for d in compare("c", ahead, ref, blocks_ahead=True)] == ["kv_blocks_used"]


def test_select_names_the_valid_cases():
    assert [c.name for c in select(["basic", "priority"])] == ["basic", "priority"]
    with pytest.raises(ValueError, match="unknown case.*nope.*choose from basic"):
        select(["nope"])


def _kvsim(*args):
    return subprocess.run([sys.executable, "-m", "kvsim", "conformance", "vllm", *args],
                          capture_output=True, text=True, timeout=300)


def test_cli_lists_cases_without_vllm():
    r = _kvsim("--list", "--cases", "basic,priority")
    assert r.returncode == 0
    assert r.stdout.splitlines()[1].startswith("priority: ") and "priority-waiting-queue" in r.stdout


def test_cli_bad_case_is_one_line_exit_2():
    r = _kvsim("--cases", "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "choose from basic" in r.stderr


def test_cases_flag_strips_names_and_refuses_an_empty_list():
    """--cases '' or ',' ran all 47 cases (exit 0); ' basic' was an unknown case."""
    from kvsim.conformance.cli import parse_cases

    assert parse_cases(None) is None
    assert parse_cases(" basic , priority,") == ["basic", "priority"]
    for text in ("", ",", " , "):
        with pytest.raises(ValueError, match="names no case.*choose from basic.*leave --cases out"):
            parse_cases(text)
    for text in ("", ","):
        r = _kvsim("--list", "--cases", text)  # --list needs no vLLM: the refusal comes first
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--cases: " in r.stderr and r.stdout == ""
    r = _kvsim("--list", "--cases", " basic, priority")
    assert r.returncode == 0 and [ln.split(":")[0] for ln in r.stdout.splitlines()] == ["basic", "priority"]


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_cli_without_vllm_is_one_line_exit_2():
    r = _kvsim("--cases", "basic")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "vLLM is not importable" in r.stderr and "kvsim[conformance]" in r.stderr
    assert r.stdout == ""


def test_exception_cases_change_only_what_they_name():
    # kvsim alone: the priority case has priorities, the sampling case samples; nothing else does
    by = {c.name: c for c in builtin_cases()}
    assert any(q.priority for q in by["priority"].requests)
    assert all(q.n == 3 for q in by["parallel_sampling"].requests)
    assert not any(q.priority or q.n > 1 for c in by.values() if not c.exceptions for q in c.requests)
    assert replace(by["reserve_full_isl_off"], reserve_full_isl=True).requests == by["reserve_full_isl_on"].requests


def test_client_cases_replay_alike_in_both_modes_and_bound_the_flight():
    case = Case("c", "", random_requests(16, 20, (20, 200), (5, 60)), num_blocks=40, max_concurrency=3)
    step, fast = run_kvsim(case, "step"), run_kvsim(case, "fast")
    assert step.requests == fast.requests
    finish = sorted(r["finish_step"] for r in step.requests.values())
    first = sorted(r["first_scheduled_step"] for r in step.requests.values())
    # at most 3 in flight: the (k+3)-th request is first scheduled after the k-th finish
    assert all(first[k + 3] > finish[k] for k in range(len(first) - 3))
    with pytest.raises(ValueError, match="one sample"):
        Case("x", "", (Req((1, 2), 2, n=2),), num_blocks=4, max_concurrency=1)
