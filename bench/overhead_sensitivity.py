"""The vLLM paper's batching figure (Kwon et al., SOSP 2023, Fig. 13a: mean number of batched
requests, OPT-13B on one A100-40GB, ShareGPT at 2 requests/s) against kvsim, and what moves it:
scenarios/studies/vllm_sharegpt.yaml (Orca Max / Pow2 / Oracle and vLLM paged-16, engine profile
vllm-2023) at 2 requests/s, the study as it stands, then one setting changed per row.

    .venv/bin/python bench/overhead_sensitivity.py [--rate 2.0] [--only figure|sensitivity]

Prints two Markdown tables (deterministic: seed 0): per system the paper's value, kvsim's and the
gap; then the sensitivity rows. The CPU-overhead rows are a sensitivity range, not measurements:
no public per-step constant of the 2023 engine is known (docs/engine_overhead.md). Not a test: it
prints what kvsim computes and checks nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SYSTEMS = [("orca-max", "Orca (Max)"), ("orca-pow2", "Orca (Pow2)"), ("orca-oracle", "Orca (Oracle)"),
           ("vllm-paged-16", "vLLM")]
# Fig. 13a's bar labels (docs/studies.md, "(f)", says where they come from); the text of section 6.2
# gives the ratios: vLLM batches 2.2x Orca (Oracle) and 4.3x Orca (Max)
PAPER = {"orca-max": 7.00, "orca-pow2": 9.81, "orca-oracle": 13.62, "vllm-paged-16": 30.42}
PAPER_RATIO_ORACLE, PAPER_RATIO_MAX = 2.2, 4.3

SETTINGS = [
    ("the study (vllm-2023: prompt-only steps, 2 ms per step)", []),
    ("prompts mixed into decode steps (kvsim before)", ["scheduler.prefill_only_steps=false"]),
    ("no CPU overhead", ["timing.step_overhead_s=0.0"]),
    ("5 ms per step", ["timing.step_overhead_s=0.005"]),
    ("13 ms per step", ["timing.step_overhead_s=0.013"]),
    ("2 ms + 200 us per sequence", ["timing.overhead={per_seq_s: 2.0e-4}"]),
    ("KV 12 GiB (15,729 tokens; beyond what kvsim fits)", ["kv_budget={bytes: 12 GiB, allow_beyond_gpu: true}"]),
    ("drop requests over 2,048 tokens", ["trace.length_policy=drop"]),
]


def batched(rate: float, extra: list[str]) -> dict[str, float]:
    from kvsim.api import run
    from kvsim.config import load_scenario

    scenario = ROOT / "scenarios" / "studies" / "vllm_sharegpt.yaml"
    results = run(load_scenario(scenario, [f"trace.synthetic.arrival.rate_per_s={rate}", *extra]))
    return {name: r.summary["concurrency"]["mean"] for name, r in results.items()}


def figure_table(mean: dict[str, float]) -> str:
    rows = ["| system | paper (Fig. 13a) | kvsim | gap |", "|---|---:|---:|---:|"]
    for key, label in SYSTEMS:
        gap = mean[key] / PAPER[key] - 1
        rows.append(f"| {label} | {PAPER[key]:.2f} | {mean[key]:.2f} | {gap:+.0%} |")
    v = mean["vllm-paged-16"]
    rows.append(f"| vLLM / Orca (Oracle) | {PAPER_RATIO_ORACLE} (text) | {v / mean['orca-oracle']:.2f} | |")
    rows.append(f"| vLLM / Orca (Max) | {PAPER_RATIO_MAX} (text) | {v / mean['orca-max']:.2f} | |")
    return "\n".join(rows)


def sensitivity_row(label: str, mean: dict[str, float]) -> str:
    cells = " | ".join(f"{mean[k]:.2f}" for k, _ in SYSTEMS)
    v = mean["vllm-paged-16"]
    return f"| {label} | {cells} | {v / mean['orca-oracle']:.2f} | {v / mean['orca-max']:.2f} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second (default 2, the paper's Fig. 13a)")
    ap.add_argument("--only", choices=("figure", "sensitivity"), help="print only one of the two tables")
    args = ap.parse_args(argv)
    base = batched(args.rate, [])
    if args.only != "sensitivity":
        print(figure_table(base))
    if args.only != "figure":
        if args.only is None:
            print()
        print("| setting | " + " | ".join(label for _, label in SYSTEMS) + " | vLLM / Oracle | vLLM / Max |")
        print("|---|" + "---:|" * (len(SYSTEMS) + 2))
        for label, extra in SETTINGS:
            print(sensitivity_row(label, batched(args.rate, extra) if extra else base), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
