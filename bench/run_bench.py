"""kvsim speed benchmark: whole-process wall time, event-loop time, simulated requests/s, engine
steps/s and peak RSS, each configuration in a fresh Python process.

    .venv/bin/python bench/run_bench.py [--sizes 10000,100000,1000000] [--skip-synthetic] [--modes fast,step]

Configurations (issue: speed and scale):
1. the Azure LLM inference 2023 conversation trace (all 19,366 requests), Llama-2-7B on A100-80GB,
   one replica, vLLM-style scheduler, paged 16-token blocks, 1 % watermark, <= 128 sequences and
   4,096 tokens per step (prompts over the model's 4,096-token length capped so every request runs);
2. the same with contiguous-max and with buddy;
3. synthetic ShareGPT-like traces of 10k, 100k and 1M requests at a rate that keeps the engine
   busy, with the cost ratio per 10x of requests.
Prints a table and writes bench/results/bench-<date>.csv with the machine, Python and package
versions. Not a test: numbers vary with the machine and its load.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from kvsim.config import load_scenario
from kvsim.simulate import run
import kvsim.simulate as R
loaded = load_scenario(sys.argv[1], sys.argv[2:])
scn = loaded.base
t1 = time.perf_counter()
trace, report = R.build_trace(scn, loaded.path.parent)
t2 = time.perf_counter()
res = run(scn, loaded.path.parent, trace=trace, trace_report=report)
t3 = time.perf_counter()
s = res.summary
print(json.dumps({
    "requests": s["requests_total"], "finished": s["requests_finished"], "rejected": s["requests_rejected"],
    "engine_steps": s["engine_steps"], "rows": res.engine_rows, "event_loop_s": res.engine_wall_s,
    "trace_load_s": t2 - t1, "setup_s": t1 - t0, "in_process_s": t3 - t0,
    "peak_rss_mb": next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024,
    "sim_duration_s": s["duration_s"],
}))
"""

BASE = """
name: bench-{name}
trace: {trace}
model: Llama-2-7B
gpu: A100-80GB
kv_dtype: fp16
allocator: {allocator}
scheduler: {{max_num_seqs: 128, max_num_batched_tokens: 4096}}
timing: {{kind: analytical}}
"""

AZURE = f"{{file: {ROOT / 'traces' / 'azure_conv_2023.csv.gz'}, length_policy: cap}}"
PAGED = "{kind: paged, block_size: 16, watermark: 0.01}"
ALLOCATORS = {
    "paged-16": PAGED,
    "contiguous-max": "{kind: contiguous, reservation: max}",
    "buddy": "{kind: buddy, block_size: 16, reservation: max}",
}


def synthetic(n: int) -> str:
    # ShareGPT-like lengths at 20 req/s: more than one A100-80GB serves, so the engine never idles.
    return (f"{{synthetic: {{preset: sharegpt, num_requests: {n}, arrival: {{process: poisson, rate_per_s: 20}}}}, "
            f"length_policy: cap}}")


def run_case(name: str, trace: str, allocator: str, mode: str, workdir: Path) -> dict:
    path = workdir / f"{name}.yaml"
    path.write_text(BASE.format(name=name, trace=trace, allocator=allocator))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), f"engine.mode={mode}"],
                         capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{name}: child failed:\n{out.stderr}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(case=name, mode=mode, process_wall_s=wall,
               sim_requests_per_s=row["requests"] / row["event_loop_s"],
               steps_per_s=row["engine_steps"] / row["event_loop_s"])
    return row


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version(), "machine": platform.machine(), "processor": platform.processor(),
           "cpus": os.cpu_count(), "platform": platform.platform()}
    for pkg in ("kvsim", "simpy", "numpy", "pandas", "pyarrow", "pydantic"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "?"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="synthetic trace sizes")
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--modes", default="fast", help="engine modes to time: fast,step")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for mode in args.modes.split(","):
            for name, alloc in ALLOCATORS.items():
                rows.append(run_case(f"azure-{name}", AZURE, alloc, mode, work))
                print(_fmt(rows[-1]), flush=True)
            if not args.skip_synthetic:
                for n in [int(x) for x in args.sizes.split(",") if x]:
                    rows.append(run_case(f"sharegpt-{n}", synthetic(n), PAGED, mode, work))
                    print(_fmt(rows[-1]), flush=True)
    syn = [r for r in rows if r["case"].startswith("sharegpt-")]
    for a, b in zip(syn, syn[1:]):
        if a["mode"] == b["mode"]:
            ratio = b["process_wall_s"] / a["process_wall_s"]
            print(f"  {b['case']} / {a['case']} ({b['mode']}): {ratio:.2f}x time for "
                  f"{b['requests'] / a['requests']:.0f}x requests")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"bench-{stamp}.csv"
    info = versions()
    fields = ["case", "mode", "requests", "finished", "rejected", "engine_steps", "rows", "process_wall_s",
              "event_loop_s", "sim_requests_per_s", "steps_per_s", "peak_rss_mb", "trace_load_s", "setup_s",
              "sim_duration_s"] + sorted(info)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, **info})
    print(f"wrote {path}")
    return 0


def _fmt(r: dict) -> str:
    return (f"{r['case']:<22}{r['mode']:<5} {r['requests']:>8} req {r['engine_steps']:>9} steps  "
            f"process {r['process_wall_s']:7.2f} s  loop {r['event_loop_s']:7.2f} s  "
            f"{r['sim_requests_per_s']:9.0f} req/s  {r['steps_per_s']:9.0f} steps/s  {r['peak_rss_mb']:6.0f} MB")


if __name__ == "__main__":
    raise SystemExit(main())
