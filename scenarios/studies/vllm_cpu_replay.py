"""The measured-vs-predicted study on a running vLLM-CPU engine (docs/studies.md, issue 22 item 5).

    PYTHONPATH=. /work/vllm-venv/bin/python scenarios/studies/vllm_cpu_replay.py [--repeats N] [--threads T]

1. ``kvsim calibrate --engine vllm`` on the 2-layer config -> calibration/vllm-cpu/tiny-llama-2l
2. ``kvsim replay --engine vllm`` of scenarios/studies/vllm_cpu_replay.yaml, N times
   -> results/vllm_cpu_replay/replay-<i>  (the engine's own run-to-run spread)
3. ``kvsim run`` of the same scenario with the calibration -> results/vllm_cpu_replay/predicted
4. prints and writes results/vllm_cpu_replay/study.csv: per variant and metric, each measured run,
   the prediction and the error against the measured median.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCENARIO = HERE / "vllm_cpu_replay.yaml"
MODEL = HERE / "models" / "tiny-llama-2l" / "config.json"
CALIB = ROOT / "calibration" / "vllm-cpu" / "tiny-llama-2l"
OUT = ROOT / "results" / "vllm_cpu_replay"
METRICS = {"throughput_output_tokens_per_s": ("throughput_output_tokens_per_s",), "tpot_p50_s": ("tpot_s", "p50"),
           "ttft_p50_s": ("ttft_s", "p50"), "e2e_p50_s": ("e2e_s", "p50")}


def kvsim(*args: str) -> None:
    print("+ kvsim", " ".join(args), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "kvsim", *args], check=True, cwd=ROOT)


def metric(summary: dict, path: tuple[str, ...]) -> float:
    v = summary
    for k in path:
        v = v[k]
    return float(v)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-calibrate", action="store_true")
    a = ap.parse_args()
    if not a.skip_calibrate:
        kvsim("calibrate", "--engine", "vllm", "--model", str(MODEL), "--device", "cpu", "--eager",
              "--threads", str(a.threads), "--block-sizes", "32", "--batches", "1", "2", "4", "8", "16", "32", "64",
              "--contexts", "128", "512", "2048", "--repeats", "9",
              "--out", str(CALIB), "--force")
    for i in range(1, a.repeats + 1):
        kvsim("replay", "--engine", "vllm", str(SCENARIO), "--eager", "--threads", str(a.threads), "--no-plots",
              "--out", str(OUT / f"replay-{i}"), "--force")
    kvsim("run", str(SCENARIO), "--set", f"timing.file={CALIB}", "--out", str(OUT / "predicted"), "--force", "-q")
    import numpy as np

    rows = []
    for variant in ("moderate", "overloaded"):
        pred = json.loads((OUT / "predicted" / variant / "summary.json").read_text())
        for name, path in METRICS.items():
            meas = [metric(json.loads((OUT / f"replay-{i}" / variant / "summary.json").read_text()), path)
                    for i in range(1, a.repeats + 1)]
            p = metric(pred, path)
            med = float(np.median(meas))
            rows.append({"variant": variant, "metric": name, "measured": meas, "measured_median": med,
                         "measured_spread": (max(meas) - min(meas)) / med if med else None,
                         "predicted": p, "error": p / med - 1 if med else None})
    import csv

    with open(OUT / "study.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(f"{r['variant']:<11} {r['metric']:<32} measured {', '.join(f'{m:.4g}' for m in r['measured'])} "
              f"(spread {100 * r['measured_spread']:.1f} %)  predicted {r['predicted']:.4g}  "
              f"error {100 * r['error']:+.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
