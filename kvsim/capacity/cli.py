"""``kvsim capacity`` on the command line."""

from __future__ import annotations

import sys
from pathlib import Path

from kvsim.capacity.rate_search import Evaluation, capacity, parse_slo, why_below_range
from kvsim.capacity.store import check_out, keep_unfinished, known_evaluations, table_text, write_outputs
from kvsim.errors import Interrupted
from kvsim.units import SET_HELP_UNITS

def _cmd_capacity(args) -> int:
    from kvsim.config import load_scenario
    from kvsim.config.load import parse_set
    from kvsim.errors import ConfigError

    for expr in args.set or []:
        if parse_set(expr)[0] == "trace.rate_scale":  # the search would replace it at every evaluation
            raise ConfigError(f"--set {expr}: kvsim capacity searches trace.rate_scale itself (between --lo "
                              f"and --hi); drop the --set, or give the range with --lo/--hi")
    loaded = load_scenario(args.file, args.set or [])
    slo = parse_slo(args.slo) if args.slo is not None else None
    log = None if args.quiet else (lambda m: print(m, file=sys.stderr))
    out = Path(args.out) if args.out else Path("results") / f"{loaded.name}-capacity"
    check_out(out)  # before hours of simulation, not after
    known = {} if args.fresh else known_evaluations(out)
    if known and log:
        log(f"capacity: {len(known)} evaluations in {out / 'capacity.json'} are reused where the scenario, trace, "
            f"objectives and kvsim version are the same (--fresh: simulate every step)")
    meta = {"scenario_file": str(loaded.path), "slo_ms_given": slo, "attainment": args.attainment,
            "lo": args.lo, "hi": args.hi, "tol": args.tol, "set": list(args.set or [])}
    done: list[Evaluation] = []
    try:
        results = capacity(loaded, slo, attainment=args.attainment, lo=args.lo, hi=args.hi, tol=args.tol,
                           variants=args.variant, log=log, known=known, on_evaluation=done.append)
    except KeyboardInterrupt:
        raise Interrupted(keep_unfinished(out, meta, known, done)) from None
    written = write_outputs(out, results, meta)
    print(table_text(results))
    for r in results:
        why = why_below_range(r, args.attainment)
        if why:
            print(why)
    for p in written.values():
        print(p)
    return 0


def register(subparsers) -> None:
    c = subparsers.add_parser(
        "capacity", help="highest request rate (trace rate_scale) per variant that meets SLOs, by bisection",
        description="For each variant, find by bisection the highest trace.rate_scale at which at least "
                    "--attainment of the trace's requests meet every SLO (rejected and unfinished requests "
                    "miss). Prints a table; writes capacity.csv and capacity.json (every evaluation) to --out. "
                    "See docs/metrics.md (goodput, SLO attainment) and kvsim/capacity/.")
    c.add_argument("file", help="scenario YAML (all its variants are searched)")
    c.add_argument("--slo", metavar="KEY=MS,...",
                   help="objectives in ms: joint ones, met by at least --attainment of the requests together "
                        "(ttft_ms=500,tpot_ms=50; keys ttft_ms, tpot_ms, e2e_ms), and/or percentiles "
                        "(p99_ttft_ms=2000,p50_tpot_ms=100: the nearest-rank p99 TTFT over every request of the "
                        "trace, unserved ones counting as missed, at most 2000 ms); default: the scenario's slo: "
                        "section")
    c.add_argument("--attainment", type=float, default=0.9,
                   help="share of requests that must meet every joint SLO (default 0.9; percentile SLOs carry "
                        "their own share)")
    c.add_argument("--lo", type=float, default=0.25, help="lowest rate_scale tried (default 0.25)")
    c.add_argument("--hi", type=float, default=8.0, help="highest rate_scale tried (default 8)")
    c.add_argument("--tol", type=float, default=0.05,
                   help="stop when the failing scale is within this fraction above the passing one (default 0.05)")
    c.add_argument("--variant", action="append", metavar="NAME", help="search only this variant (repeatable)")
    c.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a scenario key (repeatable); " + SET_HELP_UNITS)
    c.add_argument("--out", help="directory for capacity.csv / capacity.json (default results/<name>-capacity)")
    c.add_argument("--fresh", action="store_true",
                   help="simulate every step, even those whose result --out/capacity.json already holds "
                        "(default: reuse them; exact, as the same scenario, trace and seed give the same result)")
    c.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines on stderr (default: one per bisection step, 'step K/N' with N the "
                        "most steps the search can take, and its wall time)")
    c.set_defaults(func=_cmd_capacity)
