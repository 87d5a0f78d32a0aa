"""How a run priced an MoE model's routed experts (``timing.moe_kernel`` after resolving ``auto``)
is recorded in summary.json, scenario.resolved.yaml and report.html, beside the attention backend."""

import json

import yaml

from kvsim.api import run_to_dir
from kvsim.config import load_scenario
from kvsim.report.html import render_report

SCENARIO = """\
trace:
  synthetic:
    num_requests: 4
    arrival: {process: constant, rate_per_s: 1.0e+9}
    prompt_tokens: {kind: fixed, value: 64}
    output_tokens: {kind: fixed, value: 4}
model: Mixtral-8x7B
gpu: H100-SXM-80GB
parallel: {tensor: 2}
timing: {kind: analytical}
variants:
  fused: {}
  roofline: {timing: {kind: analytical, moe_kernel: none}}
  int4: {weight_dtype: int4}
  dense: {model: Llama-3-8B, parallel: {tensor: 1}}
"""


def test_moe_kernel_is_in_summary_resolved_and_report(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(SCENARIO)
    out = tmp_path / "out"
    run_to_dir(load_scenario(f), out, plots=False)
    got = {v: json.loads((out / v / "summary.json").read_text())["moe_kernel"]
           for v in ("fused", "roofline", "int4", "dense")}
    # auto under the vllm-v1 profile -> the fused Triton kernel; the weight-only int4 kernel has no
    # reading and keeps the roofline terms ("none"); a dense model has no MoE kernel (null)
    assert got == {"fused": "vllm-fused-moe-triton", "roofline": "none", "int4": "none", "dense": None}
    runs = yaml.safe_load((out / "scenario.resolved.yaml").read_text())["runs"]
    assert runs["fused"]["moe_kernel"] == "vllm-fused-moe-triton" and runs["int4"]["moe_kernel"] == "none"
    assert "moe_kernel" not in runs["dense"]  # dense runs keep their resolved form
    html = render_report(out)
    assert "MoE kernel: vllm-fused-moe-triton: fused" in html
    assert "none (weight roofline and fixed MoE-layer terms): roofline, int4" in html
