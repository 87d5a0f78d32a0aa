"""Rerun the studies of docs/studies.md (a), (b) and (d) and print their tables as Markdown.

    .venv/bin/python bench/studies.py [--out results/studies] [--only a,b,d] [--md FILE]

Each study is the `kvsim run` / `kvsim sweep` command that docs/studies.md shows (with
``--no-plots``); the tables are read back from the run directories' ``summary.json`` files and the
sweep's ``index.csv``, in the rows and units docs/studies.md uses, so updating that page after a
model change is a copy of this script's output (deterministic: ``seed: 0``, byte-identical reruns).
Not a test: it prints what kvsim computes, it checks nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "scenarios" / "studies"


def _kvsim(*args: str) -> None:
    cmd = [sys.executable, "-m", "kvsim", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"studies: {' '.join(cmd[2:])} failed (exit {done.returncode}):\n{done.stderr.strip()}")


def _flat(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _summaries(run_dir: Path) -> dict[str, dict]:
    """``{variant: flat summary}`` of a `kvsim run` output directory, in the scenario's order."""
    return {p.parent.name: _flat(json.loads(p.read_text()))
            for p in sorted(run_dir.glob("*/summary.json"))}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def _chg(new, base) -> str:
    if new is None or base in (None, 0):
        return ""
    return f"{100 * (new / base - 1):+.1f} %"


# (label, summary key, formatter, show change)
HEADLINE_ROWS = [
    ("KV fragmentation (% of allocated KV)", "kv.fragmentation_frac", _pct, True),
    ("HBM bandwidth utilisation of attention (% of peak)", "kv_access.hbm_bandwidth_utilisation", _pct, True),
    ("Average KV access latency (ns per token and layer)", "kv_access.kv_load_latency_ns", "{:.2f}".format, True),
    ("Maximum concurrent requests", "concurrency.max", "{:d}".format, True),
    ("time per page fetch (ns; secondary, not comparable across layouts)", "kv_access.page_fetch_time_ns",
     "{:.2f}".format, False),
    ("mean concurrency", "concurrency.mean", "{:.2f}".format, False),
    ("throughput (requests/s)", "throughput_requests_per_s", "{:.3f}".format, True),
    ("TPOT p50 (ms)", "tpot_s.p50", lambda s: f"{1000 * s:.1f}", True),
    ("normalized latency (s/token)", "normalized_latency_s_per_token", "{:.2f}".format, True),
    ("preemptions", "preemptions", "{:d}".format, False),
]


def _variant_table(runs: dict[str, dict], baseline: str, rows) -> str:
    names = [baseline] + [n for n in runs if n != baseline]
    head = "| metric | " + " | ".join(f"{n} (baseline)" if n == baseline else n for n in names) + " |"
    lines = [head, "|---" * (len(names) + 1) + "|"]
    for label, key, fmt, change in rows:
        cells = []
        for n in names:
            v = runs[n].get(key)
            cell = "n/a" if v is None else fmt(v)
            if change and n != baseline:
                c = _chg(v, runs[baseline].get(key))
                cell += f" ({c})" if c else ""
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    backends = sorted({str(runs[n].get("kv_access.attention_backend")) for n in names})
    lines.append("")
    lines.append(f"attention backend(s): {', '.join(backends)}")
    return "\n".join(lines)


SWEEP_ROWS = [
    ("normalized latency (s/token)", "normalized_latency_s_per_token", "{:.3f}"),
    ("throughput (requests/s)", "throughput_requests_per_s", "{:.3f}"),
    ("TPOT p50 (ms)", "tpot_p50_ms", "{:.1f}"),
    ("HBM bandwidth utilisation of attention", "hbm_pct", "{:.1f} %"),
    ("average KV access latency (ns per token and layer)", "kv_load_latency_ns", "{:.2f}"),
    ("time per page fetch (ns)", "page_fetch_time_ns", "{:.1f}"),
    ("attention kernel time (s)", "attention_kernel_s", "{:,.0f}"),
    ("mean concurrency", "concurrency_mean", "{:.2f}"),
    ("preemptions", "preemptions", "{:d}"),
    ("KV fragmentation (% of allocated)", "frag_pct", "{:.2f} %"),
]


def _sweep_table(out: Path) -> str:
    idx = pd.read_csv(out / "index.csv")
    cols: list[tuple[int, dict]] = []
    for _, row in idx.iterrows():
        s = _flat(json.loads((out / row["run_dir"] / "summary.json").read_text()))
        cols.append((int(row["allocator.block_size"]), {
            "normalized_latency_s_per_token": s["normalized_latency_s_per_token"],
            "throughput_requests_per_s": s["throughput_requests_per_s"],
            "tpot_p50_ms": 1000 * s["tpot_s.p50"],
            "hbm_pct": 100 * s["kv_access.hbm_bandwidth_utilisation"],
            "kv_load_latency_ns": s["kv_access.kv_load_latency_ns"],
            "page_fetch_time_ns": s["kv_access.page_fetch_time_ns"],
            "attention_kernel_s": s["kv_access.attention_kernel_s"],
            "concurrency_mean": s["concurrency.mean"],
            "preemptions": int(s["preemptions"]),
            "frag_pct": max(0.0, 100 * s["kv.fragmentation_frac"]),  # -1e-16 is rounding, not a gain
        }))
    cols.sort(key=lambda c: c[0])
    best = min(cols, key=lambda c: c[1]["normalized_latency_s_per_token"])[0]
    lines = ["| block size | " + " | ".join(str(b) for b, _ in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for label, key, fmt in SWEEP_ROWS:
        cells = [(f"**{fmt.format(v[key])}**" if b == best and key in (
            "normalized_latency_s_per_token", "throughput_requests_per_s") else fmt.format(v[key]))
                 for b, v in cols]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/studies", help="where the run directories go")
    ap.add_argument("--only", default="a,b,d", help="comma-separated subset of a,b,d")
    ap.add_argument("--md", help="also write the Markdown to this file")
    args = ap.parse_args(argv)
    out = (ROOT / args.out).resolve()
    only = set(args.only.split(","))
    parts: list[str] = []
    if "a" in only:
        _kvsim("run", "scenarios/studies/seed_table.yaml", "--out", str(out / "seed_table"), "--no-plots")
        parts.append("## (a) seed table\n\n" + _variant_table(_summaries(out / "seed_table"), "contiguous",
                                                           HEADLINE_ROWS))
        _kvsim("run", "scenarios/studies/seed_table.yaml", "--set", "timing.attention_backend=auto-2023",
               "--out", str(out / "seed_table_2023"), "--no-plots")
        parts.append("## (a) seed table, attention_backend=auto-2023\n\n"
                     + _variant_table(_summaries(out / "seed_table_2023"), "contiguous", HEADLINE_ROWS))
    if "b" in only:
        for scale in ("1", "0.2"):
            d = out / f"block_size_sweep_{scale}"
            _kvsim("sweep", "scenarios/studies/block_size_sweep.yaml", "--set", f"trace.rate_scale={scale}",
                   "--out", str(d), "--no-plots")
            parts.append(f"## (b) block-size sweep, trace.rate_scale={scale}\n\n" + _sweep_table(d))
    if "d" in only:
        _kvsim("run", "scenarios/studies/fp8_dequant.yaml", "--out", str(out / "fp8_dequant"), "--no-plots")
        rows = [("KV capacity (tokens)", "kv.capacity_tokens", "{:,d}".format, False)] + HEADLINE_ROWS[1:]
        parts.append("## (d) fp8 dequantisation\n\n" + _variant_table(_summaries(out / "fp8_dequant"), "fp16", rows))
    md = "\n\n".join(parts) + "\n"
    print(md)
    if args.md:
        Path(args.md).write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
