"""``kvsim compare PATH... [--out DIR]`` and ``kvsim report DIR [--out FILE]`` (see docs/report.md)."""

from __future__ import annotations

import sys
from pathlib import Path


def _cmd_compare(args) -> int:
    from kvsim.report.comparison import compare

    log = None if args.quiet else (lambda m: print(m, file=sys.stderr))
    written = compare(args.paths, Path(args.out) if args.out else None, log=log, metric_names=args.metric_names,
                      baseline=args.baseline, show=lambda text: print(text + "\n"), force=args.force)
    for p in written.values():
        print(p)
    return 0


def _cmd_report(args) -> int:
    from kvsim.report.html import write_run_report

    print(write_run_report(Path(args.dir), Path(args.out) if args.out else None, force=args.force))
    return 0


def register(subparsers) -> None:
    c = subparsers.add_parser(
        "compare", help="comparison tables and plots over run, variants or sweep directories",
        description="Print key findings and the headline table (fragmentation, HBM bandwidth utilisation, KV "
                    "access latency, max concurrency, throughput, TTFT, TPOT, normalized latency: baseline vs each "
                    "run with the % change; the first line says which run is the baseline and why) and write "
                    "headline.csv, comparison.csv and comparison plots (fragmentation breakdown, concurrency, "
                    "memory over time, latency CDFs, step-time breakdown, bandwidth utilisation, and when the "
                    "inputs vary them: concurrency, latency and bandwidth vs block size, throughput and "
                    "normalized latency vs request rate with the knee, prefix hit ratio vs capacity). "
                    "See docs/report.md.")
    c.add_argument("paths", nargs="+", metavar="PATH", help="run dir, variants dir or sweep dir (several allowed)")
    c.add_argument("--out", help="output directory (default PATH/compare for one input; required for several): new, "
                                 "empty or an earlier `kvsim compare` output (replaced, keeping files kvsim did not "
                                 "write); never a directory kvsim did not write (docs/outputs.md)")
    c.add_argument("--force", action="store_true", help="also replace another kvsim command's output at --out")
    c.add_argument("--metric-names", choices=["kvsim", "vllm"], default="kvsim",
                   help="vllm: also print and write comparison_vllm.csv with vLLM's serving-benchmark names and ms "
                        "units (mean/median/std/pNN of ttft, tpot, itl, e2el; request/output/total token throughput, "
                        "request_goodput)")
    c.add_argument("--baseline", metavar="RUN",
                   help="the headline table's and key findings' baseline run (label or variant name; default: the scenario's "
                        "baseline: key, else the first run)")
    c.add_argument("-q", "--quiet", action="store_true", help="no notes on stderr")
    c.set_defaults(func=_cmd_compare)

    r = subparsers.add_parser(
        "report", help="write a self-contained report.html for a run, variants or sweep directory",
        description="Write DIR/report.html: resolved scenario, summary table(s) and every plot embedded, "
                    "no network access needed to view it.")
    r.add_argument("dir", help="run, variants or sweep directory")
    r.add_argument("--out", help="output file (default DIR/report.html); an existing file only if it is a kvsim "
                                 "report (its folder's .kvsim-output.json says so) or with --force")
    r.add_argument("--force", action="store_true", help="overwrite an existing output file that is not a kvsim report")
    r.set_defaults(func=_cmd_report)
