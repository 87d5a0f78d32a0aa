"""The CLI in a subprocess: models, validate, the quickstart run (files, acceptance properties,
determinism), overrides and one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]


def kvsim(*args, cwd=ROOT, env=None):
    return subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_models_json_has_the_kv_bytes_per_token():
    out = kvsim("models", "--json")
    assert out.returncode == 0, out.stderr
    table = json.loads(out.stdout)
    assert table["models"]["OPT-13B"]["kv_bytes_per_token"]["fp16"] == 819_200
    assert table["models"]["Llama-3-70B"]["kv_bytes_per_token"]["fp16"] == 327_680
    assert table["models"]["Llama-3-8B"]["kv_bytes_per_token"]["fp8"] == 65_536
    assert set(table["gpus"]) >= {"A100-40GB", "A100-80GB", "H100-SXM-80GB", "H200-141GB", "L40S"}
    assert set(table["models"]) >= {"OPT-13B", "Llama-2-7B", "Llama-2-13B", "Llama-3-8B", "Llama-3-70B", "Qwen2.5-7B"}


def test_models_table_prints():
    out = kvsim("models")
    assert out.returncode == 0 and "OPT-13B" in out.stdout and "819200" in out.stdout
    # each GPU's host link (what swaps and offloads are priced on) is in the table, not only in --json
    from kvsim.hw import GPUS

    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines() if line.split()[:1] in ([g] for g in GPUS)}
    assert set(rows) == set(GPUS) and all(GPUS[g].host_link in rows[g] for g in GPUS)


@pytest.fixture(scope="module")
def quickstart_runs(tmp_path_factory):
    """The quickstart scenario, shortened to its first 3 minutes, run twice into two directories."""
    tmp = tmp_path_factory.mktemp("qs")
    outs = []
    for i in range(2):
        out = tmp / f"run{i}"
        res = kvsim("run", "scenarios/quickstart.yaml", "--out", str(out), "--set", "trace.end_s=180", "-q",
                    env={"PYTHONHASHSEED": str(i)})
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == str(out)
        outs.append(out)
    return outs


def test_quickstart_writes_every_file(quickstart_runs):
    out = quickstart_runs[0]
    for name in ("scenario.resolved.yaml", "comparison.csv", "fragmentation_breakdown.png",
                 "concurrency_comparison.png", "latency_cdf.png"):
        assert (out / name).stat().st_size > 0, name
    for variant in ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"):
        d = out / variant
        for name in ("requests.parquet", "steps.parquet", "summary.json", "memory_breakdown.png",
                     "concurrency.png", "latency_cdf.png"):
            assert (d / name).stat().st_size > 0, f"{variant}/{name}"
        s = json.loads((d / "summary.json").read_text())
        for key in ("requests_total", "requests_finished", "requests_rejected", "duration_s",
                    "throughput_requests_per_s", "throughput_output_tokens_per_s", "preemptions",
                    "recomputed_tokens"):
            assert key in s, key
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            assert set(s[key]) >= {"mean", "p50", "p90", "p99"}
        assert set(s["concurrency"]) >= {"max", "mean"}
        kv = s["kv"]
        fracs = [kv[f"{p}_frac"] for p in ("token_states", "reservation", "internal_frag", "external_frag", "free")]
        assert sum(fracs) == pytest.approx(1.0, abs=1e-9)
        req = pd.read_parquet(d / "requests.parquet")
        assert {"arrival_s", "admitted_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
                "ttft_s", "tpot_s", "e2e_s", "preemptions"} <= set(req.columns)
        steps = pd.read_parquet(d / "steps.parquet")
        assert {"start_s", "duration_s", "batch_size", "prefill_tokens", "decode_tokens", "running", "waiting",
                "token_states_bytes", "kv_bytes_read"} <= set(steps.columns)


def test_quickstart_paged_beats_contiguous_max(quickstart_runs):
    out = quickstart_runs[0]
    paged = json.loads((out / "paged-16" / "summary.json").read_text())
    cmax = json.loads((out / "contiguous-max" / "summary.json").read_text())
    assert paged["concurrency"]["max"] > cmax["concurrency"]["max"]
    assert paged["kv"]["token_states_frac"] > cmax["kv"]["token_states_frac"]
    assert cmax["kv"]["internal_frag_frac"] > paged["kv"]["internal_frag_frac"]


def test_same_scenario_twice_gives_identical_tables(quickstart_runs):
    a, b = quickstart_runs
    for variant in ("contiguous-max", "paged-16"):
        for name in ("requests.parquet", "steps.parquet", "summary.json"):
            assert (a / variant / name).read_bytes() == (b / variant / name).read_bytes(), f"{variant}/{name}"


def test_validate_prints_capacity():
    out = kvsim("validate", "scenarios/quickstart.yaml")
    assert out.returncode == 0, out.stderr
    assert "paged-16: ok" in out.stdout and "KV capacity" in out.stdout


@pytest.mark.parametrize("body,key", [
    ("allocator: {kind: paged, blok_size: 16}", "allocator.blok_size"),
    ("allocator: {kind: pagd}", "allocator"),
    ("kv_dtype: fp9", "kv_dtype"),
    ("scheduler: {max_num_seqs: -3}", "scheduler.max_num_seqs"),
    ("model: OPT-13", "model"),
    ("frontend: {per_request_s: -0.001}", "frontend.per_request_s"),
    ("frontend: {servers: 0}", "frontend.servers"),
    ("frontend: {per_requst_s: 0.001}", "frontend.per_requst_s"),
])
def test_bad_yaml_gives_one_line_naming_the_key(tmp_path, body, key):
    f = tmp_path / "bad.yaml"
    f.write_text("trace: {file: x.csv}\nmodel: OPT-13B\n" + body + "\n")
    out = kvsim("validate", str(f))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert str(f) in lines[0] and key in lines[0]


def test_set_override_changes_the_run(tmp_path):
    out = tmp_path / "o"
    res = kvsim("run", "scenarios/quickstart.yaml", "--out", str(out), "--set", "trace.end_s=30",
                "--set", "variants.paged-16.allocator.block_size=32", "-q", "--no-plots")
    assert res.returncode == 0, res.stderr
    assert json.loads((out / "paged-16" / "summary.json").read_text())["kv"]["block_size"] == 32


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_token_budget_below_the_max_length_is_refused_by_validate_as_by_run(tmp_path, command):
    """QA (thirtieth session): validate said ok where run refused the unchunked budget."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    f = tmp_path / "s.yaml"
    f.write_text("engine_profile: kvsim\nmodel: Llama-3-8B\ngpu: A100-40GB\ntrace: {file: t.csv}\n"
                 "scheduler: {max_num_batched_tokens: 100}\n")
    out = kvsim(command, str(f), *(["--out", str(tmp_path / "o"), "-q", "--no-plots"] if command == "run" else []))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    assert str(f) in lines[0] and "max_num_batched_tokens (100)" in lines[0] and "(8192)" in lines[0]
