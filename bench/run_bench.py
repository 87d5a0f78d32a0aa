"""kvsim speed benchmark: whole-process wall time, event-loop time, simulated requests/s, engine
steps/s and peak RSS, each configuration in a fresh Python process.

    .venv/bin/python bench/run_bench.py [--sizes 10000,100000,1000000] [--skip-synthetic] [--modes fast,step]

Configurations (issue: speed and scale):
1. the Azure LLM inference 2023 conversation trace (all 19,366 requests), Llama-2-7B on A100-80GB,
   one replica, vLLM-style scheduler, paged 16-token blocks, 1 % watermark, <= 128 sequences and
   4,096 tokens per step (prompts over the model's 4,096-token length capped so every request runs);
2. the same with contiguous-max and with buddy;
3. synthetic ShareGPT-like traces of 10k, 100k and 1M requests at a rate that keeps the engine
   busy, with the cost ratio per 10x of requests;
4. the whole `kvsim run` command line process on the Azure paged-16 case (`--out` a temporary
   directory): with its default outputs (plots and report.html) and with `--no-plots`.
Beside the cases, a fixed reference workload (pure Python heapq/dict/float loop shaped like an event
simulator, plus a numpy sort/reduction; no kvsim code) runs in fresh processes, interleaved with
the cases; its median is the `reference` row, and every case's `normalised` column is its process
wall time divided by that median (`event_loop_normalised` likewise for the event loop), so runs on
different days and machines compare.
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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Child processes import kvsim from this checkout (ahead of any installed or editable kvsim; they run
# in ROOT, as `python -c` puts the working directory first on sys.path).
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}

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

# The fixed reference workload (never change it: its time is the yardstick across days; if it must
# change, bump REFERENCE_VERSION). Deterministic: the same `check` string on every machine.
REFERENCE_VERSION = 1
REFERENCE_CHECK = "150000:-2322203.222:954460305"
REFERENCE = r"""
import heapq, json, random, time
import numpy as np
t0 = time.perf_counter()
EVENTS, KEYS, ARRAY = 150_000, 4096, 2_000_000
rng = random.Random(20261130)
heap = [(rng.random(), k) for k in range(KEYS)]
heapq.heapify(heap)
count, level, acc = {}, {}, 0.0
for _ in range(EVENTS):  # an event loop: pop the earliest event, update per-key state, push the next
    t, k = heapq.heappop(heap)
    n = count.get(k, 0) + 1
    count[k] = n
    lv = level.get(k, 0.0) * 0.5 + t
    level[k] = lv
    acc += lv - n
    heapq.heappush(heap, (t + rng.expovariate(1.0 + (k & 7)), k))
t1 = time.perf_counter()
x = (np.arange(ARRAY, dtype=np.int64) * 2654435761) % 1000003  # a fixed numpy sort and reductions
a = np.sort(x)
c = int(np.cumsum(a % 97).sum() % 1000000007) ^ int(np.bincount(x % 4096, minlength=4096).argmax())
t2 = time.perf_counter()
print(json.dumps({"python_s": t1 - t0, "numpy_s": t2 - t1, "reference_s": t2 - t0,
                  "check": f"{sum(count.values())}:{round(acc, 3)}:{c}"}))
"""


def run_reference() -> dict:
    """One run of the reference workload in a fresh process (its own timing, interpreter start excluded)."""
    out = subprocess.run([sys.executable, "-c", REFERENCE], capture_output=True, text=True, env=CHILD_ENV,
                         cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"reference workload failed:\n{out.stderr}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if row["check"] != REFERENCE_CHECK:
        raise SystemExit(f"reference workload: check {row['check']!r} != {REFERENCE_CHECK!r}: the workload "
                         "changed (bump REFERENCE_VERSION and REFERENCE_CHECK, and say so in bench/README.md)")
    return row


# engine_profile: kvsim -- the configuration below is the one Vidur was measured with (vLLM v0-style:
# 1 % watermark, no prefix caching, whole-prompt blocks at admission), so the bench stays like for like
# with its earlier figures. The default profile (vllm-v1) turns prefix caching on, which runs the
# block-id allocator (every block through its pool): bench/README.md ("What the default profile
# costs", "h-bidgroup") gives the measured cost; bench/paired.py --profile vllm-v1 measures it.
BASE = """
name: bench-{name}
engine_profile: kvsim
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
                         capture_output=True, text=True, env=CHILD_ENV, cwd=ROOT)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{name}: child failed:\n{out.stderr}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(case=name, mode=mode, process_wall_s=wall,
               sim_requests_per_s=row["requests"] / row["event_loop_s"],
               steps_per_s=row["engine_steps"] / row["event_loop_s"])
    return row


def compile_bytecode() -> bool:
    """Byte-compile kvsim's sources once, as any Python does on a package's first import (or pip at
    install), so that the timed processes read cached bytecode. Without this, an environment with
    PYTHONDONTWRITEBYTECODE set (this project's build sandbox) recompiles kvsim's ~110 modules in
    every process: ~0.2 s of "import time" no user pays. Returns whether it succeeded."""
    out = subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "kvsim")], capture_output=True,
                         text=True, env=CHILD_ENV, cwd=ROOT)
    return out.returncode == 0


def run_cli_case(name: str, trace: str, allocator: str, mode: str, workdir: Path, plots: bool) -> dict:
    """The whole `python -m kvsim run SCENARIO --out DIR -q` process (what the `kvsim` script runs), DIR a
    fresh temporary directory; its wall time from the parent, its peak RSS from ``wait4``."""
    path = workdir / f"{name}.yaml"
    path.write_text(BASE.format(name=name, trace=trace, allocator=allocator))
    out_dir = Path(tempfile.mkdtemp(dir=workdir)) / "out"
    args = ["run", str(path), "--out", str(out_dir), "-q", "--set", f"engine.mode={mode}"]
    args += [] if plots else ["--no-plots"]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "kvsim", *args], stdout=subprocess.DEVNULL, stderr=err,
                                env=CHILD_ENV, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own resource usage (peak RSS)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{name}: kvsim run failed:\n{err.read().decode(errors='replace')}")
    summary = json.loads((out_dir / "summary.json").read_text())
    return {"case": name, "mode": mode, "requests": summary["requests_total"], "finished": summary["requests_finished"],
            "rejected": summary["requests_rejected"], "engine_steps": summary["engine_steps"],
            "process_wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024, "sim_duration_s": summary["duration_s"]}


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
    ap.add_argument("--skip-cli", action="store_true", help="skip the whole `kvsim run` process cases")
    ap.add_argument("--reference-repeats", type=int, default=5,
                    help="at least this many runs of the reference workload (one before each case, the rest "
                         "at the end)")
    ap.add_argument("--no-compile", action="store_true",
                    help="do not byte-compile kvsim first (processes then read whatever __pycache__ holds, or "
                         "compile from source where PYTHONDONTWRITEBYTECODE is set)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    bytecode = "as found" if args.no_compile else ("compiled" if compile_bytecode() else "compile failed")
    rows = []
    refs: list[float] = []

    def reference() -> None:
        refs.append(run_reference()["reference_s"])

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for mode in args.modes.split(","):
            for name, alloc in ALLOCATORS.items():
                reference()
                rows.append(run_case(f"azure-{name}", AZURE, alloc, mode, work))
                print(_fmt(rows[-1]), flush=True)
            if not args.skip_cli:
                for plots in (True, False):
                    reference()
                    rows.append(run_cli_case("azure-paged-16-cli" + ("" if plots else "-noplots"), AZURE, PAGED,
                                             mode, work, plots))
                    print(_fmt(rows[-1]), flush=True)
            if not args.skip_synthetic:
                for n in [int(x) for x in args.sizes.split(",") if x]:
                    reference()
                    rows.append(run_case(f"sharegpt-{n}", synthetic(n), PAGED, mode, work))
                    print(_fmt(rows[-1]), flush=True)
        while len(refs) < args.reference_repeats:
            reference()
    ref = statistics.median(refs)
    for r in rows:
        r["reference_s"] = ref
        r["normalised"] = r["process_wall_s"] / ref
        if r.get("event_loop_s") is not None:
            r["event_loop_normalised"] = r["event_loop_s"] / ref
    rows.insert(0, {"case": "reference", "mode": f"v{REFERENCE_VERSION}", "process_wall_s": ref, "reference_s": ref,
                    "normalised": 1.0, "reference_runs_s": ";".join(f"{x:.4f}" for x in refs)})
    print(f"reference workload v{REFERENCE_VERSION}: median {ref:.3f} s of {len(refs)} fresh-process runs "
          f"({', '.join(f'{x:.3f}' for x in refs)})")
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
    info["bytecode"] = bytecode
    info["dont_write_bytecode_env"] = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
    fields = ["case", "mode", "requests", "finished", "rejected", "engine_steps", "rows", "process_wall_s",
              "event_loop_s", "sim_requests_per_s", "steps_per_s", "peak_rss_mb", "trace_load_s", "setup_s",
              "sim_duration_s", "reference_s", "normalised", "event_loop_normalised",
              "reference_runs_s"] + sorted(info)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, **info})
    print(f"wrote {path}")
    return 0


def _fmt(r: dict) -> str:
    if "event_loop_s" not in r:  # a whole-CLI case: no event-loop figures
        return (f"{r['case']:<26}{r['mode']:<5} {r['requests']:>8} req {r['engine_steps']:>9} steps  "
                f"process {r['process_wall_s']:7.2f} s  {'(whole `kvsim run` process)':>46}  "
                f"{r['peak_rss_mb']:6.0f} MB")
    return (f"{r['case']:<26}{r['mode']:<5} {r['requests']:>8} req {r['engine_steps']:>9} steps  "
            f"process {r['process_wall_s']:7.2f} s  loop {r['event_loop_s']:7.2f} s  "
            f"{r['sim_requests_per_s']:9.0f} req/s  {r['steps_per_s']:9.0f} steps/s  {r['peak_rss_mb']:6.0f} MB")


if __name__ == "__main__":
    raise SystemExit(main())
