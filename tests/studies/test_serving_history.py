"""bench/serving_history.py: corpus runs replayed after the earlier runs of their server (prefix cache
state carried from run to run), the history data file, and the hit-rate check against the printed rate."""

from __future__ import annotations

import csv
import gzip
import shutil
from pathlib import Path

import pandas as pd
import pytest

from helpers import load_bench

vs = load_bench("validate_serving")
H = vs.history
HISTORY = vs.SCENARIO_DIR / H.HISTORY


def _rows() -> dict[str, dict]:
    return {r["case_id"]: r for r in vs.load_corpus()}


def test_every_dennislee22_case_has_its_server_history_in_time_order():
    rows = _rows()
    cases = [r for r in rows.values() if "dennislee22" in r["source_url"]]
    assert len(cases) == 55 and all(r.get("_history") for r in cases)
    for r in cases:
        runs = r["_history"]
        assert runs[-1].case_id == r["case_id"]
        assert [x.log_time for x in runs] == sorted(x.log_time for x in runs)
        assert len({x.server for x in runs}) == 1
    # README Test 4, pid 113: 10, 1, 20 prompts before the 30-prompt run (log times 20:57:18 ... 21:02:58)
    n30 = rows["qwen2-7b-a100x1-u25-i1024-o1024-n30"]["_history"]
    assert [x.num_prompts for x in n30] == [10, 1, 20, 30]
    # a run whose printed log lines are a copy of another run's: no history, its own run alone
    assert len(rows["qwen2-72b-a100x2-kv677-i1024-o1024-n10"]["_history"]) == 1


def test_prompt_keys_depend_only_on_the_request_index():
    a, b = H.prompt_keys(3, 1024), H.prompt_keys(3, 4096)
    assert len(a) == 64 and b[:64] == a and len(set(b)) == 256
    assert not set(a) & set(H.prompt_keys(4, 1024))
    part = H.prompt_keys(0, 20)  # a partial last block: a key of its index and length
    assert len(part) == 2 and part[-1] < 0 and part[-1] not in H.prompt_keys(0, 24) + H.prompt_keys(1, 20)


def test_history_trace_has_each_runs_test_prompt_then_its_requests():
    runs = _rows()["qwen2-7b-a100x1-u25-i1024-o1024-n20"]["_history"]  # 10, 1, 20 prompts
    lines = H.trace_text(runs).splitlines()
    assert lines[0] == H.HISTORY_TRACE_HEADER and len(lines) == 1 + (1 + 10) + (1 + 1) + (1 + 20)
    starts = sorted({int(line.split(",")[0]) for line in lines[1:]})
    assert len(starts) == 6  # test prompt and run, three times
    first_key = {line.split(",")[3].split()[0] for line in lines[1:] if int(line.split(",")[0]) in starts[::2]}
    assert first_key == {"1"}  # every test prompt is request 0's prompt


def test_replayed_history_reproduces_the_printed_hit_rate():
    # README Test 4 (pid 113): a fresh server, then 10, 1 and 20 prompts; printed 40.6 % during the 20-prompt run
    row = _rows()["qwen2-7b-a100x1-u25-i1024-o1024-n20"]
    pred = vs.run_case(row, [])
    assert pred["history_runs"] == 3 and pred["hit_rate_printed"] == 40.6
    assert abs(pred["hit_rate_kvsim"] - 40.6) < 0.5
    cold = vs.run_case({**row, "_history": row["_history"][-1:]}, [])  # the same run on a fresh server
    # half its prompts were cached by the 10-prompt run (the per-request prefill cost, 5.85 ms since the
    # thirtieth session's refit, is paid cached or not: 1.45x here, 1.5x+ before)
    assert cold["ttft_ms"] > 1.3 * pred["ttft_ms"]


def test_phases_that_overlap_are_refused():
    runs = _rows()["qwen2-7b-a100x1-u25-i1024-o1024-n1"]["_history"]  # 10 prompts, then 1
    starts = [s for s, _, _ in H.phases(runs)]
    reqs = pd.DataFrame({"arrival_s": [float(starts[0]), float(starts[1]), float(starts[2]), float(starts[3])],
                         "finish_s": [starts[0] + 5.0, starts[2] + 1.0, starts[2] + 5.0, starts[3] + 5.0]})
    with pytest.raises(H.HistoryError, match="did not finish before the next began"):
        H.measured(reqs, runs)
    reqs.loc[1, "finish_s"] = starts[1] + 5.0
    assert H.measured(reqs, runs)["arrival_s"].tolist() == [float(starts[3])]


def test_hit_rate_counts_the_last_thousand_admitted_requests():
    n = 1200
    reqs = pd.DataFrame({"request_id": range(n), "admitted_s": [float(i) for i in range(n)],
                         "prompt_tokens": [100] * n, "cached_tokens": [0] * 200 + [50] * 1000})
    assert H.hit_rate(reqs) == 50.0
    reqs.loc[0, "cached_tokens"] = -1  # never admitted: not counted
    assert H.hit_rate(reqs) == 50.0


def _copy_corpus(tmp_path: Path) -> Path:
    for name in ("corpus.csv", vs.LENGTHS, H.HISTORY):
        shutil.copy(vs.SCENARIO_DIR / name, tmp_path / name)
    return tmp_path / "corpus.csv"


def test_bad_history_row_is_one_line(tmp_path, capsys):
    corpus = _copy_corpus(tmp_path)
    with open(tmp_path / H.HISTORY, newline="") as f:
        header, *body = list(csv.reader(f))
    body[3][header.index("num_prompts")] = "many"
    with open(tmp_path / H.HISTORY, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([header, *body])
    assert vs.main(["--corpus", str(corpus), "--out", str(tmp_path), "--write-scenarios"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and H.HISTORY in err and "line 5" in err and "many" in err


def test_history_row_that_disagrees_with_its_case_is_one_line(tmp_path, capsys):
    corpus = _copy_corpus(tmp_path)
    text = (tmp_path / H.HISTORY).read_text()
    row = next(line for line in text.splitlines() if ",qwen2-7b-a100x1-u25-i1024-o1024-n20," in line)
    (tmp_path / H.HISTORY).write_text(text.replace(row, row.replace(",20,1024,1024,", ",21,1024,1024,", 1)))
    assert vs.main(["--corpus", str(corpus), "--out", str(tmp_path), "--write-scenarios"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "qwen2-7b-a100x1-u25-i1024-o1024-n20" in err and "server history" in err


def test_history_traces_are_gzip_and_a_file_it_did_not_write_is_kept(tmp_path):
    row = _rows()["qwen2-7b-a100x1-u25-i1024-o1024-n1"]
    assert vs.trace_path(row).endswith(".csv.gz")
    written = vs.write_scenarios([row], tmp_path)
    trace = tmp_path / vs.trace_path(row)
    assert trace in written and gzip.decompress(trace.read_bytes()).decode() == H.trace_text(row["_history"])
    assert vs.write_scenarios([row], tmp_path) == []  # unchanged: not rewritten
    trace.write_bytes(b"my own bytes")
    with pytest.raises(vs.CorpusError, match="not generated by this script"):
        vs.write_scenarios([row], tmp_path)
    assert trace.read_bytes() == b"my own bytes"


def test_which_cases_get_the_clients_test_prompt():
    rows = list(_rows().values())
    with_prompt = [r for r in rows if H.sends_test_prompt(r)]
    assert all(r.get("_history") for r in with_prompt)
    assert not any(r.get("_history") for r in rows if r["engine_profile"] in ("vllm-v0.6", "sglang"))
    one_client = _rows()["qwen3-14b-a100x1-i128-o128"]  # tenstorrent, --max-concurrency 1, 8 prompts
    assert H.sends_test_prompt(one_client) and len(one_client["_history"]) == 1
    assert "test prompt" in vs.scenario_text(one_client)


def test_the_test_prompt_leaves_request_0_cached():
    from kvsim.api import run
    from kvsim.config import load_scenario

    row = _rows()["qwen3-14b-a100x1-i128-o128"]
    requests = run(load_scenario(vs.SCENARIO_DIR / f"{row['case_id']}.yaml", [])).requests
    run_reqs = H.measured(requests, row["_history"]).sort_values("request_id")
    assert len(requests) == 1 + 8 and len(run_reqs) == 8
    # 128 tokens: 8 blocks of 16, of which vLLM can hit at most 7 (one token is always computed)
    assert run_reqs["cached_tokens"].tolist() == [112] + [0] * 7
