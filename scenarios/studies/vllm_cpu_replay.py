"""The measured-vs-predicted study on a running vLLM-CPU engine (docs/studies.md (e), issue 22 item 5).

    PYTHONPATH=. /work/vllm-venv/bin/python scenarios/studies/vllm_cpu_replay.py \
        [--replays N] [--calibrations M] [--clock cpu|wall] [--threads T] [--skip-calibrate] [--skip-replay]

1. ``kvsim calibrate --engine vllm`` on the 2-layer config, M times: the first writes
   calibration/vllm-cpu/tiny-llama-2l (the shipped one), the others results/vllm_cpu_replay/cal-<j>
   (the calibration's own spread);
2. ``kvsim replay --engine vllm`` of scenarios/studies/vllm_cpu_replay.yaml, N times
   --clock cpu|wall -> results/vllm_cpu_replay/replay-<clock>-<i> (the engine's own run-to-run spread);
3. ``kvsim run`` of the same scenario with each calibration -> results/vllm_cpu_replay/predicted-<j>;
4. prints and writes results/vllm_cpu_replay/study-<clock>.csv (per variant and metric: every replay, every
   prediction, the error of the median prediction against the median replay) and steps-<clock>.csv (per
   replay: the host's contention, wall / CPU time of the engine's busy steps, and the calibrated
   step-time model priced on the exact shapes the engine ran, against their CPU and wall times:
   the model's step error apart from scheduling and queueing).
Every command records the load average before and after it (loadavg.csv).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCENARIO = HERE / "vllm_cpu_replay.yaml"
MODEL = HERE / "models" / "tiny-llama-2l" / "config.json"
CALIB = ROOT / "calibration" / "vllm-cpu" / "tiny-llama-2l"
OUT = ROOT / "results" / "vllm_cpu_replay"
VARIANTS = ("moderate", "overloaded")
METRICS = {"throughput_output_tokens_per_s": ("throughput_output_tokens_per_s",), "tpot_p50_s": ("tpot_s", "p50"),
           "ttft_p50_s": ("ttft_s", "p50"), "e2e_p50_s": ("e2e_s", "p50"), "preemptions": ("preemptions",)}
GRID = ["--block-sizes", "32", "--batches", "1", "2", "4", "8", "16", "24", "32", "48", "64",
        "--contexts", "128", "512", "1024", "2048", "4096", "--chunks", "32", "128", "512", "1024", "2048",
        "--cached", "0", "1024", "3072", "--mixed-batches", "4", "16", "32", "--mixed-chunks", "128", "512", "1024",
        "--repeats", "9"]
LOADS: list[dict] = []


def kvsim(tag: str, *args: str) -> None:
    print("+ kvsim", " ".join(args), file=sys.stderr, flush=True)
    before = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "kvsim", *args], check=True, cwd=ROOT,
                   env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    LOADS.append({"command": tag, "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)})


def metric(summary: dict, path: tuple[str, ...]) -> float:
    v = summary
    for k in path:
        v = v[k]
    return float(v)


def step_check(replay_dir: Path, calib: Path) -> dict:
    """The calibrated model priced on the engine's own step shapes (engine_steps.parquet)."""
    import pandas as pd

    from kvsim.realengine.calibrate import _timing_for, model_spec
    from kvsim.realengine.vllm_engine import StepShape, read_model_config

    cp, cfg = read_model_config(MODEL)
    timing = _timing_for(calib, model_spec(cp, cfg), "bf16", 32)
    e = pd.read_parquet(replay_dir / "engine_steps.parquet")
    keys = ("decode_seqs", "decode_context", "prefill_seqs", "prefill_tokens", "prefill_cached", "prefill_pairs")
    e["pred_s"] = [timing.step_time(StepShape(decode_tokens=int(r.decode_seqs), **{k: int(getattr(r, k)) for k in keys})
                                    .batch_shape()).duration_s for r in e.itertuples()]
    kind = e.prefill_seqs.eq(0).map({True: "decode", False: "prefill+mixed"})
    out = {"steps": len(e), "busy_wall_s": e.duration_s.sum(), "busy_cpu_s": e.cpu_s.sum(),
           "contention_wall_over_cpu": e.duration_s.sum() / e.cpu_s.sum(),
           "model_over_cpu": e.pred_s.sum() / e.cpu_s.sum(), "model_over_wall": e.pred_s.sum() / e.duration_s.sum()}
    for k, g in e.groupby(kind):
        out[f"{k}_steps"] = len(g)
        out[f"{k}_model_over_cpu"] = g.pred_s.sum() / g.cpu_s.sum()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--calibrations", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="the replays' clock (kvsim replay --clock): cpu (default) leaves the shared host's other "
                         "processes out of the timeline; wall is real time")
    ap.add_argument("--skip-calibrate", action="store_true", help="use the calibrations already written")
    ap.add_argument("--skip-replay", action="store_true", help="use the replays already written")
    a = ap.parse_args()
    cals = [CALIB] + [OUT / f"cal-{j}" for j in range(2, a.calibrations + 1)]
    if not a.skip_calibrate:
        for j, c in enumerate(cals, 1):
            kvsim(f"calibrate-{j}", "calibrate", "--engine", "vllm", "--model", str(MODEL.relative_to(ROOT)),
                  "--device", "cpu", "--eager", "--threads", str(a.threads), *GRID,
                  "--out", str(c.relative_to(ROOT)), "--force")
    if not a.skip_replay:
        for i in range(1, a.replays + 1):
            kvsim(f"replay-{i}", "replay", "--engine", "vllm", str(SCENARIO), "--eager", "--threads", str(a.threads),
                  "--no-plots", "--clock", a.clock, "--out", str(OUT / f"replay-{a.clock}-{i}"), "--force")
    for j, c in enumerate(cals, 1):
        kvsim(f"predict-{j}", "run", str(SCENARIO), "--set", f"timing.file={c}", "--out", str(OUT / f"predicted-{j}"),
              "--force", "-q", "--no-plots")
    import numpy as np

    def spread(xs):
        m = float(np.median(xs))
        return (max(xs) - min(xs)) / m if m else 0.0

    rows = []
    for v in VARIANTS:
        for name, path in METRICS.items():
            meas = [metric(json.loads((OUT / f"replay-{a.clock}-{i}" / v / "summary.json").read_text()), path)
                    for i in range(1, a.replays + 1)]
            pred = [metric(json.loads((OUT / f"predicted-{j}" / v / "summary.json").read_text()), path)
                    for j in range(1, len(cals) + 1)]
            med, pmed = float(np.median(meas)), float(np.median(pred))
            rows.append({"variant": v, "metric": name, "measured": meas, "measured_median": med,
                         "measured_spread": spread(meas), "predicted": pred, "predicted_median": pmed,
                         "predicted_spread": spread(pred), "error": pmed / med - 1 if med else None})
    with open(OUT / f"study-{a.clock}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    steps = [{"replay": i, "variant": v, "calibration": j, **step_check(OUT / f"replay-{a.clock}-{i}" / v, c)}
             for i in range(1, a.replays + 1) for v in VARIANTS for j, c in enumerate(cals, 1)]
    with open(OUT / f"steps-{a.clock}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(steps[0]))
        w.writeheader()
        w.writerows(steps)
    if LOADS:
        with open(OUT / f"loadavg-{a.clock}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(LOADS[0]))
            w.writeheader()
            w.writerows(LOADS)
    for r in rows:
        err = "" if r["error"] is None else f"error {100 * r['error']:+.1f} %"
        print(f"{r['variant']:<11} {r['metric']:<31} measured {', '.join(f'{m:.4g}' for m in r['measured'])} "
              f"(spread {100 * r['measured_spread']:.1f} %)  predicted {', '.join(f'{p:.4g}' for p in r['predicted'])} "
              f"(spread {100 * r['predicted_spread']:.1f} %)  {err}")
    for s in steps:
        print(f"replay {s['replay']} {s['variant']:<11} cal {s['calibration']}: wall/cpu {s['contention_wall_over_cpu']:.3f}"
              f"  model/cpu {s['model_over_cpu']:.3f} (decode {s.get('decode_model_over_cpu', float('nan')):.3f}, "
              f"prefill+mixed {s.get('prefill+mixed_model_over_cpu', float('nan')):.3f})  model/wall "
              f"{s['model_over_wall']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
