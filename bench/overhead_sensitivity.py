"""How the engine's CPU overhead (docs/engine_overhead.md) moves the vLLM paper's batching figure:
the mean number of batched requests of Orca (Max / Pow2 / Oracle) and vLLM (paged-16) on
scenarios/studies/vllm_sharegpt.yaml at 2 requests/s, for a few overhead settings.

    .venv/bin/python bench/overhead_sensitivity.py [--rate 2.0]

The per-sequence values are a sensitivity range, not measurements: no public per-sequence
constant is known (docs/engine_overhead.md). Prints one line per setting (deterministic).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SETTINGS = [
    ("no overhead", ["timing.step_overhead_s=0.0"]),
    ("default: 2 ms per step", []),
    ("2 ms + 50 us per sequence", ["timing.overhead={per_seq_s: 5.0e-5}"]),
    ("2 ms + 200 us per sequence", ["timing.overhead={per_seq_s: 2.0e-4}"]),
    ("10 ms per step", ["timing.step_overhead_s=0.01"]),
]


def main(argv=None) -> int:
    from kvsim.api import run
    from kvsim.config import load_scenario

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second (default 2, the paper's Fig. 13a)")
    args = ap.parse_args(argv)
    scenario = ROOT / "scenarios" / "studies" / "vllm_sharegpt.yaml"
    print("| overhead | " + " | ".join(["orca-max", "orca-pow2", "orca-oracle", "vllm-paged-16"])
          + " | vLLM / Orca (Oracle) |\n|---|---:|---:|---:|---:|---:|")
    for label, extra in SETTINGS:
        results = run(load_scenario(scenario, [f"trace.synthetic.arrival.rate_per_s={args.rate}", *extra]))
        mean = {name: r.summary["concurrency"]["mean"] for name, r in results.items()}
        cells = [f"{mean[k]:.2f}" for k in ("orca-max", "orca-pow2", "orca-oracle", "vllm-paged-16")]
        print(f"| {label} | " + " | ".join(cells) + f" | {mean['vllm-paged-16'] / mean['orca-oracle']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
