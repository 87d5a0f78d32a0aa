"""The engine profile a run took its defaults from, and what it filled, are recorded in
summary.json, scenario.resolved.yaml and report.html (issue 23 item 5)."""

import json

import yaml

from kvsim.api import run_to_dir
from kvsim.config import load_scenario
from kvsim.report.html import render_report

SCENARIO = """\
trace:
  synthetic:
    num_requests: 6
    arrival: {process: constant, rate_per_s: 1.0e+9}
    prompt_tokens: {kind: fixed, value: 64}
    output_tokens: {kind: fixed, value: 8}
model: Llama-2-7B
timing: {kind: analytical, step_overhead_s: 0.001}
variants:
  today: {}
  old: {engine_profile: kvsim}
  paper: {engine_profile: vllm-2023, allocator: {kind: contiguous}}
  h100: {gpu: H100-SXM-80GB}
"""


def test_profile_and_fills_are_in_summary_resolved_and_report(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(SCENARIO)
    out = tmp_path / "out"
    run_to_dir(load_scenario(f), out, plots=False)
    summaries = {v: json.loads((out / v / "summary.json").read_text()) for v in ("today", "old", "paper", "h100")}
    today = summaries["today"]["engine_profile"]
    assert today["name"] == "vllm-v1" and today["filled"]["allocator.prefix_caching"] is True
    assert today["filled"]["timing.attention_backend"] == "auto-flashattention"
    assert "timing.step_overhead_s" not in today["filled"]  # the scenario gave it
    assert summaries["today"]["kv_access"]["attention_backend"] == "flashattention-paged"
    assert summaries["old"]["engine_profile"] == {"name": "kvsim", "filled": {}}
    paper = summaries["paper"]["engine_profile"]
    assert paper["name"] == "vllm-2023" and "allocator.prefix_caching" not in paper["filled"]  # contiguous KV
    assert summaries["paper"]["kv_access"]["attention_backend"] == "contiguous"  # auto-2023 on contiguous KV
    # the batch limits vLLM derives from the GPU (`vllm serve`): 2048 / 256 on the default A100, 8192 / 1024 on H100
    assert today["filled"]["scheduler.max_num_batched_tokens"] == 2048
    h100 = summaries["h100"]["engine_profile"]["filled"]
    assert (h100["scheduler.max_num_batched_tokens"], h100["scheduler.max_num_seqs"]) == (8192, 1024)
    runs = yaml.safe_load((out / "scenario.resolved.yaml").read_text())["runs"]
    assert {n: {k: r["engine_profile"][k] for k in ("name", "filled")} for n, r in runs.items()} == \
        {n: s["engine_profile"] for n, s in summaries.items()}
    # scenario.resolved.yaml gives each filled value its source
    assert all(set(r["engine_profile"]["sources"]) == set(r["engine_profile"]["filled"]) for r in runs.values())
    src = runs["h100"]["engine_profile"]["sources"]["scheduler.max_num_batched_tokens"]
    assert "get_batch_defaults" in src and "OPENAI_API_SERVER" in src
    assert runs["h100"]["scenario"]["scheduler"]["max_num_batched_tokens"] == 8192
    assert "engine_profile" not in runs["old"]["scenario"]  # kvsim's resolved form is the pre-profile one
    html = render_report(out)
    assert "Engine profiles differ between runs" in html and "vllm-2023: paper" in html
