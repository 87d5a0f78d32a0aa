"""``kvsim servebench``: a serving-benchmark result file replayed on kvsim, side by side."""

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.errors import ConfigError
from kvsim.servebench import build, result

ROOT = Path(__file__).resolve().parents[2]
CASE = "llama3-8b-h100x1-sharegpt-n80"


def kvsim(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=600)


def one_line_exit_2(r, *words):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert ".tmp-" not in lines[0], lines[0]  # the user's file, never kvsim's hidden output directory
    for w in words:
        assert w in lines[0], lines[0]


def _lambda_result(path: Path) -> dict:
    """The validation corpus's Lambda run as its benchmark_serving.py --save-result file holds it
    (the keys of vLLM 0.5.4's client: *_latency_ms for E2EL, request_rate "inf"; lengths from lengths.csv)."""
    lens = [r for r in csv.DictReader(open(ROOT / "scenarios/validation/lengths.csv")) if r["case_id"] == CASE]
    c = next(r for r in csv.DictReader(open(ROOT / "scenarios/validation/corpus.csv")) if r["case_id"] == CASE)
    doc = {"backend": "vllm", "model_id": c["model"], "num_prompts": len(lens), "request_rate": "inf",
           "request_throughput": float(c["request_throughput"]), "output_throughput": float(c["output_throughput"]),
           "median_ttft_ms": float(c["ttft_ms"]), "median_tpot_ms": float(c["tpot_ms"]),
           "median_latency_ms": float(c["e2el_ms"]),
           "input_lens": [int(r["input_len"]) for r in lens], "output_lens": [int(r["output_len"]) for r in lens]}
    path.write_text(json.dumps(doc))
    return doc


def test_same_prediction_as_the_validation_case(tmp_path):
    sys.path.insert(0, str(ROOT))
    from bench import validate_serving as vs

    _lambda_result(tmp_path / "r.json")
    out = tmp_path / "out"
    r = kvsim("servebench", str(tmp_path / "r.json"), "--scenario", f"scenarios/validation/{CASE}.yaml",
              "--out", str(out))
    assert r.returncode == 0, r.stderr
    got = {row["metric"]: row for row in csv.DictReader(open(out / "comparison.csv"))}
    assert set(got) == {"request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms",
                        "median_e2el_ms"}
    row = next(x for x in vs.load_corpus() if x["case_id"] == CASE)
    ref = vs.run_case({**row, "_lengths": []}, [])  # (no zero-TTFT rule: servebench times every request)
    counted = vs.run_case(row, [])  # both leave the 0-token outputs' one token out of the totals
    assert vs.zero_output_requests(row) and counted["output_throughput"] < ref["output_throughput"]
    assert float(got["request_throughput"]["kvsim"]) == pytest.approx(ref["request_throughput"], rel=1e-9)
    # (the benchmark starts at 3,600 s)
    assert float(got["output_throughput"]["kvsim"]) == pytest.approx(counted["output_throughput"], rel=1e-9)
    for m in ("ttft_ms", "tpot_ms", "e2el_ms"):
        assert float(got[f"median_{m}"]["kvsim"]) == pytest.approx(ref[m], rel=1e-9)
    assert got["median_ttft_ms"]["target"] == "0.35" and got["median_e2el_ms"]["target"] == ""
    err = float(got["median_tpot_ms"]["error"])
    assert got["median_tpot_ms"]["within"] == ("yes" if abs(err) <= 0.2 else "no")
    assert "median_tpot_ms" in r.stdout and (out / "scenario.yaml").is_file()
    # the written scenario reruns on its own
    again = kvsim("run", str(out / "scenario.yaml"), "--out", str(tmp_path / "again"), "--no-plots")
    assert again.returncode == 0, again.stderr


def test_closed_loop_and_test_prompt_give_the_validation_prediction(tmp_path):
    """A tenstorrent case (one client, 8 prompts of 128/128, V1 with prefix caching) as its result file
    would hold it: servebench's client and test prompt give what the validation's generated history
    trace gives (bench/validate_serving.py)."""
    sys.path.insert(0, str(ROOT))
    from bench import validate_serving as vs

    case = "qwen72b-h100x2-i128-o128"
    row = next(x for x in vs.load_corpus() if x["case_id"] == case)
    doc = {"request_rate": "inf", "max_concurrency": 1, "num_prompts": 8, "mean_ttft_ms": float(row["ttft_ms"]),
           "mean_tpot_ms": float(row["tpot_ms"]), "request_throughput": float(row["request_throughput"]),
           "input_lens": [128] * 8, "output_lens": [128] * 8}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    out = tmp_path / "o"
    r = kvsim("servebench", str(tmp_path / "t.json"), "--scenario", f"scenarios/validation/{case}.yaml", "--out", str(out))
    assert r.returncode == 0, r.stderr
    got = {row["metric"]: float(row["kvsim"]) for row in csv.DictReader(open(out / "comparison.csv"))}
    ref = vs.run_case(row, [])
    assert got["request_throughput"] == pytest.approx(ref["request_throughput"], rel=1e-9)
    assert got["mean_ttft_ms"] == pytest.approx(ref["ttft_ms"], rel=1e-9)
    assert got["mean_tpot_ms"] == pytest.approx(ref["tpot_ms"], rel=1e-9)


def _closed(path: Path, **extra) -> None:
    rng = np.random.default_rng(1)
    n = 24
    doc = {"model_id": "x", "num_prompts": n, "request_rate": 50.0, "burstiness": 1.0, "max_concurrency": 3,
           "request_throughput": 5.0, "mean_ttft_ms": 50.0, "mean_tpot_ms": 10.0, "p99_ttft_ms": 90.0,
           "mean_itl_ms": 10.0, "median_itl_ms": 9.0,
           "input_lens": rng.integers(20, 400, n).tolist(), "output_lens": rng.integers(0, 60, n).tolist(), **extra}
    path.write_text(json.dumps(doc))


def test_closed_loop_result_runs_with_its_client_bound(tmp_path):
    _closed(tmp_path / "c.json")
    out = tmp_path / "o"
    r = kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
              "--engine-profile", "vllm-v1", "--no-test-prompt", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = (out / "scenario.yaml").read_text()
    assert "max_concurrency: 3" in text and "engine_profile: vllm-v1" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["client"]["max_concurrency"] == 3
    rows = {row["metric"]: row for row in csv.DictReader(open(out / "comparison.csv"))}
    assert rows["p99_ttft_ms"]["within"] == "" and rows["mean_ttft_ms"]["within"] in ("yes", "no")
    # kvsim's values are its run's serving section; vLLM's mean ITL is the mean over every gap
    serving = summary["serving"]
    assert float(rows["mean_itl_ms"]["kvsim"]) == serving["itl_ms"]["mean_with_stalls"]
    assert float(rows["median_itl_ms"]["kvsim"]) == serving["itl_ms"]["median"] and rows["median_itl_ms"]["target"] == ""
    assert float(rows["p99_ttft_ms"]["kvsim"]) == serving["ttft_ms"]["p99"]
    # ... but throughput counts from the benchmark's start (0 here), before the first drawn gap, as vLLM's
    # client times it (QA, twenty-ninth session); the run's own summary counts from its first arrival
    assert float(rows["request_throughput"]["kvsim"]) < serving["request_throughput"]
    # the trace: the printed lengths in order (a request that streamed nothing runs one token)
    tr = pd.read_csv(out / "trace.csv")
    doc = json.loads((tmp_path / "c.json").read_text())
    assert tr["prompt_tokens"].tolist() == doc["input_lens"]
    assert tr["output_tokens"].tolist() == [max(1, o) for o in doc["output_lens"]]


def test_the_test_prompt_goes_first_and_is_cached_for_request_0(tmp_path):
    _closed(tmp_path / "c.json")
    out = tmp_path / "o"
    r = kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB", "--out", str(out))
    assert r.returncode == 0, r.stderr
    tr = pd.read_csv(out / "trace.csv")
    doc = json.loads((tmp_path / "c.json").read_text())
    assert len(tr) == 25 and tr["arrival_s"].iloc[0] == 0 and (tr["arrival_s"].iloc[1:] >= 3600).all()
    assert tr["prefix_keys"].iloc[0] == tr["prefix_keys"].iloc[1]  # request 0's prompt, sent twice
    assert len(set(tr["prefix_keys"].iloc[1:])) == 24  # no other prompt shares a block
    assert tr["prompt_tokens"].iloc[1:].tolist() == doc["input_lens"]
    run = kvsim("run", str(out / "scenario.yaml"), "--out", str(tmp_path / "full"), "--no-plots")
    assert run.returncode == 0, run.stderr
    q = pd.read_parquet(tmp_path / "full" / "requests.parquet").sort_values("request_id")
    full = doc["input_lens"][0] // 16 * 16
    assert q["cached_tokens"].iloc[1] >= full - 16 and (q["cached_tokens"].iloc[2:] == 0).all()
    # kvsim's figures are the benchmark's requests only: 24 of them, timed from 3,600 s on (the benchmark's
    # start, before the first drawn gap: vLLM's client counts that wait in its duration)
    rows = {row["metric"]: float(row["kvsim"]) for row in csv.DictReader(open(out / "comparison.csv"))}
    bench = q[q["request_id"] >= 1]
    assert bench["arrival_s"].min() > 3600
    span = bench["finish_s"].max() - 3600
    assert rows["request_throughput"] == pytest.approx(24 / span, rel=1e-9)
    # the step-level ITL distribution is the run's (a request table has no step times): printed, not NaN
    assert rows["median_itl_ms"] == json.loads((out / "summary.json").read_text())["serving"]["itl_ms"]["median"]
    off = kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                "--no-test-prompt", "--out", str(tmp_path / "off"))
    assert off.returncode == 0 and len(pd.read_csv(tmp_path / "off" / "trace.csv")) == 24


def test_arrivals_follow_the_client(tmp_path):
    _closed(tmp_path / "a.json", max_concurrency=None, start_times=[100.0 + 0.5 * i for i in range(24)])
    res = result.load(tmp_path / "a.json")
    t, how = build.arrivals(res, 0)
    assert t.tolist() == [0.5 * i for i in range(24)] and "start_times" in how
    # a closed loop's start_times are its sends, not its arrivals: the rate is drawn instead
    _closed(tmp_path / "b.json", start_times=[float(i) for i in range(24)])
    t, how = build.arrivals(result.load(tmp_path / "b.json"), 0)
    assert t[-1] == pytest.approx(24 / 50.0) and (np.diff(t) > 0).all() and "gamma" in how
    assert build.arrivals(result.load(tmp_path / "b.json"), 0)[0].tolist() == t.tolist()  # seeded
    _closed(tmp_path / "c.json", request_rate="inf")
    assert (build.arrivals(result.load(tmp_path / "c.json"), 0)[0] == 0).all()


def test_without_per_request_lengths_the_means_are_used(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"num_prompts": 10, "request_rate": "inf", "completed": 10, "total_input_tokens": 1000,
                             "total_output_tokens": 205, "request_throughput": 2.0}))
    res = result.load(p)
    assert not res.per_request and res.input_lens == [100] * 10 and res.output_lens == [20] * 10


def test_several_results_run_one_by_one_into_one_table(tmp_path):
    one = {"request_rate": 20.0, "request_throughput": 1.0, "median_ttft_ms": 30.0, "input_lens": [50] * 6,
           "output_lens": [8] * 6}
    (tmp_path / "sweep.jsonl").write_text(json.dumps(one) + "\n" + json.dumps({**one, "request_rate": 40.0}) + "\n")
    (tmp_path / "c1.json").write_text(json.dumps({**one, "max_concurrency": 2}))
    out = tmp_path / "o"
    r = kvsim("servebench", str(tmp_path / "sweep.jsonl"), str(tmp_path / "c1.json"), "--model", "Llama-3-8B",
              "--gpu", "A100-80GB", "--out", str(out))
    assert r.returncode == 0, r.stderr
    table = pd.read_csv(out / "comparison.csv")
    assert table["result"].drop_duplicates().tolist() == ["sweep-0", "sweep-1", "c1"]
    for d in ("sweep-0", "sweep-1", "c1"):
        assert (out / d / "scenario.yaml").is_file() and (out / d / "summary.json").is_file()
    assert "max_concurrency: 2" in (out / "c1" / "scenario.yaml").read_text()
    # the two rates ran as two runs: their kvsim throughputs differ
    thr = table[table["metric"] == "request_throughput"].set_index("result")["kvsim"]
    assert thr["sweep-0"] != thr["sweep-1"]
    assert "within target:" in r.stdout
    only = kvsim("servebench", str(tmp_path / "sweep.jsonl"), "--index", "1", "--model", "Llama-3-8B",
                 "--gpu", "A100-80GB", "--out", str(tmp_path / "o1"))
    assert only.returncode == 0 and "request_rate" not in only.stderr
    assert "20 req/s" not in (tmp_path / "o1" / "scenario.yaml").read_text()


def test_appended_results_need_an_index(tmp_path):
    p = tmp_path / "two.json"
    one = {"request_rate": "inf", "request_throughput": 1.0, "input_lens": [5], "output_lens": [3]}
    p.write_text(json.dumps(one) + "\n" + json.dumps({**one, "request_throughput": 2.0}) + "\n")
    with pytest.raises(Exception, match="--index"):
        result.load(p)
    assert result.load(p, 1).published["request_throughput"] == 2.0


@pytest.mark.parametrize("content, words", [
    ("not json", ["line 1", "not JSON"]),
    ('{"request_throughput": 1.0, "input_lens": [1], "output_lens": [1]}', ["request_rate", "missing"]),
    ('{"request_rate": "inf", "max_concurrency": 0, "request_throughput": 1, "input_lens": [1], "output_lens": [1]}',
     ["max_concurrency"]),
    ('{"request_rate": "inf", "request_throughput": 1, "input_lens": [1, 2], "output_lens": [1]}', ["input_lens"]),
    ('{"request_rate": "inf", "input_lens": [1], "output_lens": [1]}', ["no printed metric"]),
    # without per-request lengths: the request count and the means are bounded
    *((f'{{"request_rate": 4.0, "completed": 20, "total_input_tokens": 2000, "total_output_tokens": 400, '
       f'"request_throughput": 2.0, "num_prompts": {n}}}',
       ["num_prompts", "expected an integer 1..10000000", f"got {got}"])
      for n, got in (("-5", "-5"), ("0.5", "0.5"), ("0", "0"), ("1e12", "1000000000000.0"))),
    ('{"request_rate": 4.0, "completed": 0, "total_input_tokens": 2000, "total_output_tokens": 400, '
     '"request_throughput": 2.0}', ["completed", "expected an integer 1.."]),
    ('{"request_rate": 4.0, "completed": 2, "total_input_tokens": 4e9, "total_output_tokens": 400, '
     '"request_throughput": 2.0}', ["total_input_tokens", "0..1048576 tokens per completed request"]),
    ('{"request_rate": 4.0, "completed": 2, "total_input_tokens": 100, "total_output_tokens": Infinity, '
     '"request_throughput": 2.0}', ["total_output_tokens", "finite"]),
    # absurd lengths are refused before any per-block key is built; a prompt has at least one token
    ('{"request_rate": "inf", "request_throughput": 1, "input_lens": [5, 1000000000], "output_lens": [1, 1]}',
     ["input_lens[1]", "1..1048576", "1000000000"]),
    ('{"request_rate": "inf", "request_throughput": 1, "input_lens": [5, 5], "output_lens": [1, 1048577]}',
     ["output_lens[1]", "0..1048576"]),
    ('{"request_rate": "inf", "request_throughput": 1, "input_lens": [5, 0], "output_lens": [1, 1]}',
     ["input_lens[1]", "1..1048576", "got 0"]),
    # send times: finite and in request order (an open loop replays them)
    ('{"request_rate": 4.0, "request_throughput": 1, "input_lens": [5, 5], "output_lens": [1, 1], '
     '"start_times": [0.0, NaN]}', ["start_times[1]", "finite", "nan"]),
    ('{"request_rate": 4.0, "request_throughput": 1, "input_lens": [5, 5], "output_lens": [1, 1], '
     '"start_times": [0.0, Infinity]}', ["start_times[1]", "finite", "inf"]),
    ('{"request_rate": 4.0, "request_throughput": 1, "input_lens": [5, 5, 5], "output_lens": [1, 1, 1], '
     '"start_times": [2.0, 3.0, 1.0]}', ["start_times[2]", "non-decreasing", "1.0 after 3.0"]),
    # burstiness 0 is refused, not taken for 1
    ('{"request_rate": 4.0, "burstiness": 0, "request_throughput": 1, "input_lens": [5], "output_lens": [1]}',
     ["burstiness", "> 0", "got 0"]),
    ('{"request_rate": 0, "request_throughput": 1, "input_lens": [5], "output_lens": [1]}',
     ["request_rate", "> 0", "got 0"]),
    # a printed metric is finite (the file's own key named)
    ('{"request_rate": "inf", "request_throughput": 1, "mean_ttft_ms": "inf", "input_lens": [5], "output_lens": [1]}',
     ["mean_ttft_ms", "finite", "'inf'"]),
    ('{"request_rate": "inf", "median_latency_ms": Infinity, "input_lens": [5], "output_lens": [1]}',
     ["median_latency_ms", "finite"]),
    # one entry per prompt sent (QA, twenty-ninth session: a mismatch ran silently)
    ('{"request_rate": "inf", "request_throughput": 1, "num_prompts": 50, "input_lens": [5, 5], "output_lens": [1, 1]}',
     ["num_prompts is 50", "hold 2 requests"]),
])
def test_bad_result_is_one_line_exit_2(tmp_path, content, words):
    p = tmp_path / "bad.json"
    p.write_text(content)
    one_line_exit_2(kvsim("servebench", str(p), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                          "--out", str(tmp_path / "o")), str(p), *words)


def test_send_times_are_ordered_only_where_they_are_replayed(tmp_path):
    """kvsim replays start_times only in an open loop: a closed loop's are checked finite, not ordered."""
    _closed(tmp_path / "c.json", start_times=[float(24 - i) for i in range(24)])
    assert result.load(tmp_path / "c.json").start_times[0] == 24.0
    _closed(tmp_path / "o.json", max_concurrency=None, start_times=[0.0, 0.0] + [1.0] * 22)  # ties are in order
    assert build.arrivals(result.load(tmp_path / "o.json"), 0)[0].tolist() == [0.0, 0.0] + [1.0] * 22
    _closed(tmp_path / "n.json", start_times=[float("nan")] * 24)
    with pytest.raises(ConfigError, match=r"start_times\[0\]: expected a finite send time"):
        result.load(tmp_path / "n.json")


def test_unset_burstiness_is_poisson(tmp_path):
    _closed(tmp_path / "c.json")
    doc = json.loads((tmp_path / "c.json").read_text())
    del doc["burstiness"]
    (tmp_path / "c.json").write_text(json.dumps(doc))
    assert result.load(tmp_path / "c.json").burstiness == 1.0


def _over_long(path: Path, over: int, n: int = 20) -> None:
    """A result of ``n`` requests whose first ``over`` prompts are longer than Llama-3-8B's 8,192 tokens."""
    doc = {"request_rate": 20.0, "request_throughput": 2.0, "mean_ttft_ms": 40.0,
           "input_lens": [9000] * over + [300] * (n - over), "output_lens": [20] * n}
    path.write_text(json.dumps(doc))


def test_unserved_requests_are_a_warning_as_for_kvsim_run(tmp_path):
    args = ("--model", "Llama-3-8B", "--gpu", "A100-80GB", "--no-test-prompt")
    _over_long(tmp_path / "all.json", 20)
    r = kvsim("servebench", str(tmp_path / "all.json"), *args, "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    warning = [line for line in r.stderr.splitlines() if line.startswith("kvsim: warning:")]
    assert len(warning) == 1 and str(tmp_path / "all.json") in warning[0], r.stderr
    assert "served none of its 20 requests" in warning[0] and "exceeds_max_model_len 20" in warning[0]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["requests_finished"] == 0
    _over_long(tmp_path / "some.json", 4)  # 20 %: kvsim run's warning (more than 5 % not served)
    r = kvsim("servebench", str(tmp_path / "some.json"), *args, "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    assert "20.0% of the trace's 20 requests were not served: 4 rejected (exceeds_max_model_len 4)" in r.stderr
    _over_long(tmp_path / "one.json", 1)  # 5 %: no warning
    r = kvsim("servebench", str(tmp_path / "one.json"), *args, "--out", str(tmp_path / "o"))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_a_rejected_test_prompt_says_why(tmp_path):
    _over_long(tmp_path / "r.json", 1)
    one_line_exit_2(kvsim("servebench", str(tmp_path / "r.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                          "--out", str(tmp_path / "o")),
                    str(tmp_path / "r.json"), "test prompt", "rejected: exceeds_max_model_len",
                    "9000 prompt + 20 output tokens exceed the model's max_model_len 8192", "--no-test-prompt")
    assert not (tmp_path / "o").exists()


def test_the_validation_doc_lists_the_printed_statistics():
    stats = list(dict.fromkeys(k.split("_")[0] for k in result.PREDICTED if k.endswith("_ms")))
    doc = (ROOT / "docs/validation.md").read_text()
    section = doc[doc.index("## Your own results: `kvsim servebench`"):doc.index("## The corpus")]
    assert stats == ["mean", "median", "p90", "p99"]
    assert " / ".join(stats) + " of TTFT, TPOT, ITL and E2EL" in " ".join(section.split())


def test_bad_invocations_are_one_line_exit_2(tmp_path):
    _closed(tmp_path / "c.json")
    one_line_exit_2(kvsim("servebench", str(tmp_path / "nope.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB"),
                    "nope.json")
    one_line_exit_2(kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B"), "--gpu")
    one_line_exit_2(kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                          "--engine-profile", "vllm-v9", "--out", str(tmp_path / "o")), "engine_profile")
    for expr in ("trace.max_requests=5", "trace.rate_scale=2", "trace={file: x.csv}", "client.max_concurrency=2"):
        # servebench writes the trace and client from the result: a cut or rescaled trace is not its run
        one_line_exit_2(kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                              "--set", expr, "--out", str(tmp_path / "o")), "trace.length_policy")
        assert not (tmp_path / "o").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    one_line_exit_2(kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                          "--out", str(mine)), str(mine))
    assert (mine / "notes.txt").read_text() == "keep" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_sglang_names_and_an_infinite_rate(tmp_path):
    p = tmp_path / "sg.jsonl"
    p.write_text('{"backend": "sglang", "request_rate": Infinity, "max_concurrency": 4, "completed": 2, '
                 '"request_throughput": 1.0, "median_e2e_latency_ms": 900.0, "p90_ttft_ms": 80.0, '
                 '"input_lens": [100, 200], "output_lens": [10, 20]}\n')
    res = result.load(p)
    assert res.request_rate == float("inf") and res.max_concurrency == 4
    assert res.published == {"request_throughput": 1.0, "median_e2el_ms": 900.0, "p90_ttft_ms": 80.0}


def test_a_request_that_streamed_nothing_counts_ttft_zero(tmp_path):
    doc = {"request_rate": "inf", "mean_ttft_ms": 50.0, "median_ttft_ms": 60.0, "input_lens": [40, 60, 80, 100],
           "output_lens": [10, 0, 12, 9], "ttfts": [0.06, 0.0, 0.06, 0.061]}
    (tmp_path / "z.json").write_text(json.dumps(doc))
    assert result.load(tmp_path / "z.json").zero_ttft == frozenset({1})
    out = tmp_path / "o"
    r = kvsim("servebench", str(tmp_path / "z.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
              "--no-test-prompt", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = {row["metric"]: float(row["kvsim"]) for row in csv.DictReader(open(out / "comparison.csv"))}
    ttft = json.loads((out / "summary.json").read_text())["serving"]["ttft_ms"]
    reqs = pd.read_csv(out / "trace.csv")
    assert len(reqs) == 4 and rows["mean_ttft_ms"] < ttft["mean"]  # one of four counted as 0
    # the others' TTFTs are kvsim's own: the mean is theirs over four
    run = kvsim("run", str(out / "scenario.yaml"), "--out", str(tmp_path / "full"), "--no-plots")
    assert run.returncode == 0
    t = pd.read_parquet(tmp_path / "full" / "requests.parquet").sort_values("request_id")["ttft_s"].to_numpy() * 1e3
    assert rows["mean_ttft_ms"] == pytest.approx((t[0] + t[2] + t[3]) / 4, rel=1e-9)


def _lambda_files(folder: str, count: int):
    """The copied Lambda result files of ``scenarios/validation/<folder>``: each names its source (at the
    first collection's commits) and a deployment scenario that exists, and loads as a result with
    per-request lengths; yields (file's keys, loaded result)."""
    files = sorted((ROOT / "scenarios/validation" / folder).glob("*.json"))
    assert len(files) == count
    for f in files:
        d = json.loads(f.read_text())
        commit = "a4f9f437" if "H100" in d["kvsim_source"] else "a9b42a5f"  # the first collection's commits
        assert d["kvsim_source"].startswith(f"https://github.com/LambdaLabsML/vllm-benchmark/blob/{commit}")
        assert f"/results/prompt_{d['num_prompts']}/" in d["kvsim_source"] and d["num_prompts"] == len(d["input_lens"])
        dep = d["kvsim_deployment"]
        assert (ROOT / "scenarios/validation" / (f"{folder}/{dep}" if dep.endswith(".yaml") else dep + ".yaml")).is_file()
        res = result.load(f)
        assert res.per_request and res.zero_ttft == frozenset(i for i, t in enumerate(d["ttfts"]) if t == 0)
        assert {"request_throughput", "median_ttft_ms", "median_tpot_ms"} <= set(res.published)
        yield d, res


def test_the_fourth_collection_files_are_whole_and_name_their_source_and_deployment():
    for d, res in _lambda_files("lambda_prompt10", 13):
        assert d["num_prompts"] == 10 and "median_e2el_ms" in res.published
        # the copied per-request lengths add up to the printed totals
        assert sum(d["input_lens"]) == d["total_input_tokens"] and sum(d["output_lens"]) == d["total_output_tokens"]


def test_stream_chunk_tokens_reads_multi_step_rounds_from_the_gaps():
    outs = [120, 429, 233, 9, 3, 31, 101, 1, 0, 57]
    tok = [[0.007] * (o - 1) for o in outs]  # a gap per token
    ten = [[0.072] * (-(-(o - 1) // 10)) for o in outs]  # the Lambda files: first token alone, then 10 a chunk
    assert result.stream_chunk_tokens(outs, tok) == 1
    assert result.stream_chunk_tokens(outs, ten) == 10
    ten[1] = ten[1][:-1]  # one request a gap short (the client re-tokenises the text): still 10
    assert result.stream_chunk_tokens(outs, ten) == 10
    assert result.stream_chunk_tokens([3, 2, 3, 2], [[0.1]] * 4) == 1  # too short to show any chunking
    assert result.stream_chunk_tokens(outs, None) == 1 and result.stream_chunk_tokens(outs, ten[:3]) == 1


def test_a_multi_step_file_gets_a_note_unless_the_run_has_its_rounds(tmp_path):
    doc = _lambda_result(tmp_path / "r.json")
    doc["itls"] = [[0.07] * (-(-(o - 1) // 10)) if o >= 1 else [] for o in doc["output_lens"]]
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert result.load(tmp_path / "r.json").chunk_tokens == 10
    args = ("servebench", str(tmp_path / "r.json"), "--scenario", f"scenarios/validation/{CASE}.yaml")
    same = kvsim(*args, "--out", str(tmp_path / "a"))  # the corpus scenario runs 10-step rounds already
    assert same.returncode == 0 and "num_scheduler_steps" not in same.stderr, same.stderr
    one = kvsim(*args, "--out", str(tmp_path / "b"), "--set", "scheduler.num_scheduler_steps=1")
    assert one.returncode == 0, one.stderr
    assert "--set scheduler.num_scheduler_steps=10" in one.stderr


def test_the_fifth_collection_files_are_whole_and_name_their_source_and_deployment():
    for d, _ in _lambda_files("lambda_loads", 6):
        n = d["num_prompts"]
        assert n in (20, 40, 160)
        # the copied lists agree with the printed figures: every request completed, the median TTFT
        assert round(d["request_throughput"] * d["duration"]) == n
        assert 1000 * float(np.median(d["ttfts"])) == pytest.approx(d["median_ttft_ms"], rel=1e-9)


def test_a_trace_error_names_the_result_not_kvsims_hidden_trace(tmp_path):
    """Every request dropped by ``--set trace.length_policy=drop``: the trace kvsim wrote from the result has
    none left; the one line names the user's result file (the hidden trace.csv is kvsim's)."""
    _over_long(tmp_path / "all.json", 20)
    one_line_exit_2(kvsim("servebench", str(tmp_path / "all.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                          "--no-test-prompt", "--set", "trace.length_policy=drop", "--out", str(tmp_path / "o")),
                    f"{tmp_path / 'all.json'}: its requests as a kvsim trace: no requests left", "length_policy=drop")


def test_a_result_file_with_a_bom_is_read(tmp_path):
    """QA (twenty-ninth session): a UTF-8 BOM was reported as 'line 1: not JSON'."""
    p = tmp_path / "bom.json"
    p.write_text('{"request_rate": "inf", "request_throughput": 1, "input_lens": [5, 5], "output_lens": [3, 3]}',
                 encoding="utf-8-sig")
    r = kvsim("servebench", str(p), "--model", "Llama-3-8B", "--gpu", "A100-80GB", "--no-test-prompt",
              "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr


def _ramp(path: Path, **extra) -> None:
    """A vllm bench serve --ramp-up-strategy result: request_rate "inf" with the ramp's keys (vLLM 0.32)."""
    _closed(path, **{"max_concurrency": None, "request_rate": "inf", "ramp_up_strategy": "linear",
                     "ramp_up_start_rps": 1, "ramp_up_end_rps": 4, **extra})


def test_a_ramp_up_follows_vllms_per_request_rates(tmp_path):
    """QA (thirty-first session): a ramp-up's "inf" rate was replayed all at once (+5,881 % throughput).
    vLLM 0.32's _get_current_request_rate: start + (end - start) * i / (n - 1), or start * (end / start) ** p."""
    _ramp(tmp_path / "lin.json", burstiness=float("inf"))
    res = result.load(tmp_path / "lin.json")
    rates = 1 + 3 * np.arange(24) / 23
    assert build.request_rates(res) == pytest.approx(rates)
    t, how = build.arrivals(res, 0)
    assert t == pytest.approx(np.cumsum(1 / rates)) and "linear ramp-up from 1 to 4" in how  # even gaps: 1 / rate
    _ramp(tmp_path / "exp.json", ramp_up_strategy="exponential")
    res = result.load(tmp_path / "exp.json")
    assert build.request_rates(res) == pytest.approx(4 ** (np.arange(24) / 23))
    t, how = build.arrivals(res, 7)
    # gamma gaps of mean 1 / rate, not scaled to a total (vLLM scales only without a ramp-up); seeded
    gaps = np.random.default_rng(7).gamma(shape=1.0, scale=1 / build.request_rates(res))
    assert t == pytest.approx(np.cumsum(gaps)) and "gamma" in how and t[0] > 0


@pytest.mark.parametrize("extra, words", [
    ({"ramp_up_strategy": "cubic"}, ["ramp_up_strategy", "exponential, linear", "'cubic'"]),
    ({"ramp_up_start_rps": 0}, ["ramp_up_start_rps", "0 < start <= end"]),
    ({"ramp_up_start_rps": 5}, ["ramp_up_start_rps", "got 5 and 4"]),
    ({"ramp_up_end_rps": None}, ["ramp_up_end_rps", "missing"]),
])
def test_a_bad_ramp_up_is_one_line_exit_2(tmp_path, extra, words):
    _ramp(tmp_path / "r.json", **extra)
    one_line_exit_2(kvsim("servebench", str(tmp_path / "r.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
                          "--out", str(tmp_path / "o")), str(tmp_path / "r.json"), *words)


def test_burstiness_inf_sends_evenly(tmp_path):
    """QA (thirty-first session): vllm bench serve --burstiness inf (JSON Infinity) was refused; vLLM 0.32's
    get_request then waits 1 / rate between sends."""
    for i, inf in enumerate((float("inf"), "inf")):
        _closed(tmp_path / f"b{i}.json", max_concurrency=None, burstiness=inf)
        res = result.load(tmp_path / f"b{i}.json")
        t, how = build.arrivals(res, 0)
        assert math.isinf(res.burstiness) and t == pytest.approx((np.arange(24) + 1) / 50.0)
        assert "evenly spaced" in how
    r = kvsim("servebench", str(tmp_path / "b0.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
              "--out", str(tmp_path / "o"))
    assert r.returncode == 0 and "evenly spaced arrivals (burstiness inf) at 50 req/s" in r.stdout, r.stderr


def test_replayed_send_times_count_from_the_benchmarks_start(tmp_path):
    """QA (thirty-first session): replayed start_times were timed from the first send, while vLLM's duration
    starts before get_request's first gap (+11 % throughput at 1 req/s). start_times are perf_counter
    values on no saved base; vLLM 0.32 sends the last at num_prompts / rate after its start."""
    _closed(tmp_path / "a.json", max_concurrency=None, request_rate=1.0, num_prompts=24,
            start_times=[5001.0 + i for i in range(24)])
    t, how = build.arrivals(result.load(tmp_path / "a.json"), 0)
    assert t.tolist() == [1.0 + i for i in range(24)] and "the last send less 24 s" in how
    # a send lags its schedule: never before the first send
    _closed(tmp_path / "b.json", max_concurrency=None, request_rate=50.0, start_times=[7.0 + i for i in range(24)])
    assert build.arrivals(result.load(tmp_path / "b.json"), 0)[0].tolist() == [float(i) for i in range(24)]
    # a ramp-up's even gaps fix the span (sum of 1 / rate); its drawn gaps do not (from the first send)
    starts = (100 + np.cumsum(1 / (1 + 3 * np.arange(24) / 23))).tolist()
    _ramp(tmp_path / "r.json", burstiness=float("inf"), start_times=starts)
    assert build.arrivals(result.load(tmp_path / "r.json"), 0)[0] == pytest.approx(np.asarray(starts) - 100)
    _ramp(tmp_path / "g.json", start_times=starts)
    assert build.arrivals(result.load(tmp_path / "g.json"), 0)[0][0] == 0.0
    r = kvsim("servebench", str(tmp_path / "a.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
              "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    got = {row["metric"]: float(row["kvsim"]) for row in csv.DictReader(open(tmp_path / "o" / "comparison.csv"))}
    assert got["request_throughput"] < 24 / 24.0  # the 24 s from the start to the last send, and more


def test_failed_requests_get_a_note(tmp_path):
    """QA (thirty-first session): a result with failed requests ran with no word that kvsim replays them all."""
    _closed(tmp_path / "f.json", max_concurrency=None, request_rate="inf", failed=2,
            errors=[""] * 22 + ["Bad Request: prompt too long"] * 2)
    assert result.load(tmp_path / "f.json").failed == 2
    _closed(tmp_path / "e.json", errors=[""] * 23 + ["timeout"])  # no "failed" (vLLM 0.4-0.6): the errors
    _closed(tmp_path / "c.json", completed=20)  # nor errors: num_prompts less completed
    assert result.load(tmp_path / "e.json").failed == 1 and result.load(tmp_path / "c.json").failed == 4
    r = kvsim("servebench", str(tmp_path / "f.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
              "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    note = [ln for ln in r.stderr.splitlines() if "failed" in ln]
    assert len(note) == 1 and "2 of 24 requests failed in the printed run" in note[0]
    assert "replays all 24" in note[0] and "# note: 2 of 24" in (tmp_path / "o" / "scenario.yaml").read_text()
    ok = kvsim("servebench", str(tmp_path / "c.json"), "--model", "Llama-3-8B", "--gpu", "A100-80GB",
               "--index", "0", "--out", str(tmp_path / "o2"))
    assert ok.returncode == 0 and "4 of 24 requests failed" in ok.stderr, ok.stderr


def test_the_printed_table_is_refused_naming_the_files_servebench_reads(tmp_path):
    """QA (thirty-first session): the printed table gave only 'line 1: not JSON'."""
    p = tmp_path / "print.txt"
    p.write_text("INFO 10-01 benchmark_serving.py:123] Namespace(backend='vllm')\n"
                 "============ Serving Benchmark Result ============\nSuccessful requests:   1000\n")
    one_line_exit_2(kvsim("servebench", str(p), "--model", "Llama-3-8B", "--gpu", "A100-80GB", "--out",
                          str(tmp_path / "o")), str(p), "line 1: not JSON", "--save-result",
                    "SGLang's bench_serving.py --output-file", "not the printed 'Serving Benchmark Result' table")
