"""``kvsim sweep FILE``: run a sweep (see docs/sweeps.md). Exit 0 when every point is ok, 1 when
any point failed (the index records which and why), 2 for an invalid sweep file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvsim.cliargs import nonnegative_int, positive_int
from kvsim.errors import ConfigError
from kvsim.units import SET_HELP_UNITS


def _cmd_sweep(args) -> int:
    from kvsim.sweep.runner import run_sweep
    from kvsim.sweep.spec import load_sweep

    if args.address is not None and args.executor != "ray":
        raise ConfigError(f"--address {args.address}: a Ray cluster address, for --executor ray only "
                          f"(this sweep's executor: {args.executor})")
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr))
    sweep = load_sweep(args.file, overrides=args.set or [])
    if args.dry_run:
        for p in sweep.points:
            print(f"{p.id}\t{p.label}")
        print(f"{len(sweep.points)} points, all valid", file=sys.stderr)
        return 0
    df = run_sweep(sweep, Path(args.out) if args.out else None, jobs=args.jobs, executor=args.executor,
                   address=args.address, retries=args.retries, plots=not args.no_plots,
                   report=not args.no_report, force=args.force, progress=False if args.quiet else None,
                   log=log)
    info = df.attrs["sweep"]
    if not args.quiet:
        from kvsim.sweep.index import result_table_text

        print(result_table_text(df) + "\n(point: the label; points/<id>/ adds a hash that keeps directories "
              "unique; every metric: index.csv, report.html)", file=sys.stderr)
    print(info["sweep_dir"])
    if info["failed"]:
        bad = df.loc[df["status"] != "ok", "point_id"].tolist()
        print(f"kvsim: error: {len(bad)} of {len(df)} points failed: {', '.join(bad[:10])}"
              f"{' ...' if len(bad) > 10 else ''} (see the index's error column and errors/*.txt; "
              f"rerun the same command to retry only those)", file=sys.stderr)
        return 1
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep", help="run a parameter sweep (grid / points over a base scenario) into a sweep directory",
        description="Run every point of a sweep YAML (see docs/sweeps.md) into SWEEP_DIR/points/<id>/, "
                    "then write SWEEP_DIR/index.parquet, index.csv, compare/ and report.html. Points "
                    "already complete are skipped, so rerunning resumes an interrupted sweep.")
    p.add_argument("file", help="sweep YAML")
    p.add_argument("--out", help="sweep directory (default results/sweeps/<name>): new, empty or an earlier sweep's "
                                 "(resumed); never a directory kvsim did not write (docs/outputs.md)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key of every point, e.g. --set trace.end_s=60 (repeatable; like the sweep's set:); "
                        + SET_HELP_UNITS)
    p.add_argument("-j", "--jobs", type=positive_int, default=None, help="points run in parallel (default: CPU count)")
    p.add_argument("--executor", choices=("local", "ray", "inline"), default="local",
                   help="local: process pool (default); ray: Ray tasks; inline: this process, one by one")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (auto, ray://host:10001, host:6379); default: start a local Ray")
    p.add_argument("--retries", type=nonnegative_int, default=1, help="extra attempts for a failing point (default 1)")
    p.add_argument("--force", action="store_true",
                   help="rerun points that are already complete; also replace another kvsim command's output at --out")
    p.add_argument("--no-plots", action="store_true", help="skip per-point PNG plots")
    p.add_argument("--no-report", action="store_true", help="skip compare/ and report.html at the end")
    p.add_argument("--dry-run", action="store_true", help="validate every point as kvsim run would (each distinct trace built once) and list "
                        "the points (id, overrides); run nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or log lines")
    p.set_defaults(func=_cmd_sweep)
    return p
