"""Held-out check of multi-step scheduling and the ``vllm-v0.6`` constants against Lambda's own table of
vLLM v0.5.4 / v0.6.0 / v0.6.0 with ``--num-scheduler-steps 10`` (docs/validation.md, "The Lambda
runs are multi-step"; data: ``scenarios/validation/lambda_v060_steps.csv``, one printed row each).

    .venv/bin/python bench/multistep_check.py [--out DIR]   # default results/multistep-check

Each row runs its model on H100s (the table names no GPU: assumed, see the data's note) under
``engine_profile: vllm-v0.6`` with the row's server settings (``max_num_seqs``, ``max_model_len``,
chunked prefill, ``num_scheduler_steps``), all prompts at once (``rps inf``). The printed runs used
ShareGPT, whose per-request lengths the table does not give: each run draws its prompts, seeded, from
the 80 (prompt, output) pairs of the first collection's Lambda file of the same model family
(``scenarios/validation/traces/<case>.csv``: the same client and dataset, seed 0), so the lengths
are ShareGPT's but not the run's own. Nothing is fitted on these rows. Prints, per row, the printed
output throughput and median TPOT beside kvsim's, and per model the step-10 / step-1 throughput
ratio.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "scenarios" / "validation" / "lambda_v060_steps.csv"
LENGTHS = {"Llama-3.1-8B": "llama3-8b-h100x1-sharegpt-n80", "Llama-3.1-70B": "llama3-70b-h100x4-sharegpt-n80",
           "Llama-3.1-405B": "llama3-70b-h100x4-sharegpt-n80"}  # 405B: the 70B run's lengths (same tokenizer)


def trace_text(model: str, n: int, seed: int = 0) -> str:
    """``n`` requests at t = 0, (prompt, output) pairs drawn with replacement from the model family's
    80-prompt Lambda file (outputs of 0 tokens run as 1, as the validation does)."""
    rows = list(csv.DictReader(open(ROOT / "scenarios" / "validation" / "traces" / f"{LENGTHS[model]}.csv")))
    pairs = [(int(r["prompt_tokens"]), max(1, int(r["output_tokens"]))) for r in rows]
    rng = random.Random(seed)
    return "arrival_s,prompt_tokens,output_tokens\n" + "".join(
        f"0,{p},{o}\n" for p, o in (rng.choice(pairs) for _ in range(n)))


def scenario_text(row: dict) -> str:
    chunked = row["chunked_prefill"] == "true"
    return "\n".join([
        f"name: {row['kvsim_model']}-{row['vllm']}-steps{row['num_scheduler_steps']}",
        "engine_profile: vllm-v0.6",
        "seed: 0",
        "trace: {file: trace.csv}",
        f"model: {{preset: {row['kvsim_model']}, max_model_len_tokens: {row['max_model_len']}}}",
        "gpu: H100-SXM-80GB",
        f"weight_dtype: {row['weight_dtype']}",
        "kv_dtype: bf16",
        f"parallel: {{tensor: {row['tensor_parallel']}}}",
        "allocator: {kind: paged, block_size: 16}",
        "kv_budget: {gpu_memory_utilization: 0.9}",
        f"scheduler: {{max_num_seqs: {row['max_num_seqs']}, chunked_prefill: {str(chunked).lower()}"
        + (f", num_scheduler_steps: {row['num_scheduler_steps']}" if row["num_scheduler_steps"] != "1" else "") + "}",
        "timing: {kind: analytical}",
        ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "multistep-check")
    args = ap.parse_args(argv)
    marker = args.out / ".multistep-check"  # this script's folder: it replaces only what it wrote there
    if args.out.exists() and any(args.out.iterdir()) and not marker.is_file():
        print(f"bench/multistep_check.py: --out {args.out}: a non-empty folder this script did not make; "
              f"valid choices: a new or empty folder, or one it made before", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    marker.write_text("written by bench/multistep_check.py: trace.csv, scenario.yaml and run/ in each subfolder\n")
    lines = ["| model | vLLM | chunked prefill | steps | output tok/s: printed / kvsim / error "
             "| median TPOT ms: printed / kvsim |", "|---|---|---|---:|---|---|"]
    ratios: dict[str, dict[str, tuple[float, float]]] = {}
    for row in csv.DictReader(open(DATA)):
        d = args.out / f"{row['kvsim_model']}-{row['vllm']}-steps{row['num_scheduler_steps']}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "trace.csv").write_text(trace_text(row["kvsim_model"], int(row["num_prompts"])))
        (d / "scenario.yaml").write_text(scenario_text(row))
        r = subprocess.run([sys.executable, "-m", "kvsim", "run", str(d / "scenario.yaml"), "--out", str(d / "run"),
                            "--force", "--quiet"], capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return r.returncode
        s = json.loads((d / "run" / "summary.json").read_text())["serving"]
        pub, sim = float(row["output_throughput"]), s["output_throughput"]
        lines.append(f"| {row['model']} | {row['vllm']} | {row['chunked_prefill']} | {row['num_scheduler_steps']} "
                     f"| {pub:.0f} / {sim:.0f} / {sim / pub - 1:+.0%} "
                     f"| {float(row['median_tpot_ms']):.1f} / {s['tpot_ms']['median']:.1f} |")
        if row["vllm"] == "v0.6.0":
            ratios.setdefault(row["model"], {})[row["num_scheduler_steps"]] = (pub, sim)
    lines.append("")
    for model, by in ratios.items():
        if "1" in by and "10" in by:
            lines.append(f"{model}: step 10 / step 1 output throughput: printed {by['10'][0] / by['1'][0]:.2f}, "
                         f"kvsim {by['10'][1] / by['1'][1]:.2f}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
