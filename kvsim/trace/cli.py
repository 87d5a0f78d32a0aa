"""``kvsim trace`` sub-commands: ``stats``, ``convert`` and ``generate``.

:func:`register` adds the ``trace`` command to an argparse sub-parser set; each leaf sets
``func`` (a handler taking the parsed ``argparse.Namespace`` and returning an exit code) via
``set_defaults``. Handlers raise :class:`~kvsim.errors.KvsimError` subclasses for bad input; the
caller prints them as one line and exits with status 2. :func:`main` runs the sub-commands
stand-alone (``python -m kvsim.trace.cli stats FILE``) with that same error convention.
"""

from __future__ import annotations

import argparse
import json

from kvsim.errors import TraceError
from kvsim.cliargs import OneLineParser, nonnegative_int
import sys
import warnings
from pathlib import Path

from kvsim.errors import ConfigError, KvsimError, did_you_mean, format_choices
from kvsim.trace.formats import FORMAT_CHOICES  # light: `kvsim --help` must not import pandas (trace.load does)

_FORMAT_HELP = "source format: auto (detect from the columns), azure, mooncake or generic"


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``trace {stats,convert,generate}`` to ``subparsers``; return the ``trace`` parser."""
    parser = subparsers.add_parser(
        "trace", help="inspect, convert and generate request traces",
        description="Inspect, convert and generate request traces (see docs/traces.md).",
    )
    sub = parser.add_subparsers(dest="trace_command", metavar="{stats,convert,generate}")
    sub.required = True

    p = sub.add_parser("stats", help="summary statistics of a trace file",
                       description="Print summary statistics of a trace file.")
    p.add_argument("file", help="trace file (.csv, .jsonl or .parquet, optionally .gz)")
    p.add_argument("--format", default="auto", choices=FORMAT_CHOICES, help=_FORMAT_HELP)
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--block-size", type=int, default=None, metavar="B",
                   help="also the hit ratio an unbounded paged prefix cache with B-token blocks reaches "
                        "(full blocks only, last prompt token always computed)")
    p.add_argument("--on-unsorted", default="error", choices=("error", "sort"))
    p.add_argument("--on-zero-output", default="error", choices=("error", "drop"))
    g = p.add_argument_group("slicing, as a scenario's trace: section applies it (the statistics describe "
                             "what a run replays)")
    g.add_argument("--start-s", type=float, default=None, metavar="S",
                   help="keep requests arriving at or after S seconds (source time axis), rebased to 0 (trace.start_s)")
    g.add_argument("--end-s", type=float, default=None, metavar="S",
                   help="keep requests arriving before S seconds (trace.end_s)")
    g.add_argument("--skip-requests", type=int, default=0, metavar="N",
                   help="then skip the first N requests (trace.skip_requests)")
    g.add_argument("--max-requests", type=int, default=None, metavar="N",
                   help="then keep at most N requests (trace.max_requests)")
    g.add_argument("--rate-scale", type=float, default=1.0, metavar="X",
                   help="then divide arrival times by X: 2 = twice the request rate (trace.rate_scale)")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("convert", help="convert a trace to kvsim's generic schema",
                       description="Convert a trace to the generic schema; OUT's extension picks the container: "
                                   ".csv, .jsonl (.json and .ndjson also write JSON lines, one object per line, not "
                                   "a JSON array), .parquet (.pq); text may end in .gz.")
    p.add_argument("input", metavar="IN", help="source trace file")
    p.add_argument("output", metavar="OUT", help="output file (an existing file only with --force, unless kvsim "
                                                 "wrote it into a kvsim output directory)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--format", default="auto", choices=FORMAT_CHOICES, help=_FORMAT_HELP)
    p.add_argument("--on-unsorted", default="error", choices=("error", "sort"))
    p.add_argument("--on-zero-output", default="error", choices=("error", "drop"))
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("generate", help="generate a synthetic trace from a YAML spec",
                       description="Generate a synthetic trace from a SyntheticTraceSpec YAML file.")
    p.add_argument("spec", metavar="SPEC.yaml", help="generator spec (see docs/traces.md)")
    p.add_argument("output", metavar="OUT", help="output file (.csv, .jsonl, .parquet, + .gz for text; .json and "
                                                 ".ndjson also write JSON lines, .pq parquet); an existing file "
                                                 "only with --force")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--seed", type=nonnegative_int, default=None, help="seed >= 0 (default: the spec's seed, else 0)")
    p.set_defaults(func=cmd_generate)
    return parser


def _load(args):
    from kvsim.trace.load import load_trace

    return load_trace(args.file if hasattr(args, "file") else args.input, args.format,
                      on_unsorted=args.on_unsorted, on_zero_output=args.on_zero_output)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")


def _check_slicing(args) -> dict:
    """The slicing flags as ``{trace key: value}`` (only those given), after checking their ranges."""
    import math

    start, end = getattr(args, "start_s", None), getattr(args, "end_s", None)
    rate = getattr(args, "rate_scale", 1.0)
    skip, most = getattr(args, "skip_requests", 0), getattr(args, "max_requests", None)
    for flag, v in (("--start-s", start), ("--end-s", end), ("--rate-scale", rate)):
        if v is not None and not math.isfinite(v):
            raise TraceError(f"{flag}: must be a finite number, got {v}")
    if start is not None and start < 0:
        raise TraceError(f"--start-s: must be >= 0, got {start:g}")
    if end is not None and end <= 0:
        raise TraceError(f"--end-s: must be > 0, got {end:g}")
    if start is not None and end is not None and end <= start:
        raise TraceError(f"--end-s ({end:g}) must be greater than --start-s ({start:g})")
    if not rate > 0:
        raise TraceError(f"--rate-scale: must be > 0, got {rate:g}")
    if skip < 0 or (most is not None and most < 1):
        raise TraceError("--skip-requests must be >= 0 and --max-requests >= 1")
    out = {"start_s": start, "end_s": end, "skip_requests": skip or None, "max_requests": most,
           "rate_scale": rate if rate != 1.0 else None}
    return {k: v for k, v in out.items() if v is not None}


def _apply_slicing(trace, sl: dict):
    """The scenario's order (kvsim/trace/config.py): time slice, request count slice, rate scale.
    (A scenario's length policy applies between the two slices; stats show lengths as they are.)"""
    from kvsim.trace import transforms

    if "start_s" in sl or "end_s" in sl:
        trace = transforms.slice_time(trace, sl.get("start_s"), sl.get("end_s"))
    if "skip_requests" in sl or "max_requests" in sl:
        trace = transforms.slice_count(trace, sl.get("skip_requests", 0), sl.get("max_requests"))
    if "rate_scale" in sl:
        trace = transforms.scale_rate(trace, sl["rate_scale"])
    return trace


def cmd_stats(args) -> int:
    from kvsim.trace.stats import format_stats, trace_stats

    if getattr(args, "block_size", None) is not None and args.block_size < 1:
        raise TraceError(f"--block-size: must be >= 1, got {args.block_size}")
    sl = _check_slicing(args)
    trace = _load(args)
    src = trace.source
    n_file = len(trace)
    trace = _apply_slicing(trace, sl)
    if len(trace) == 0:
        raise TraceError(f"{src['path']}: no requests left after the slicing "
                         + ", ".join(f"{k}={v:g}" for k, v in sl.items()))
    stats = trace_stats(trace, block_size=getattr(args, "block_size", None))
    if args.json:
        head = {"file": src["path"], "format": src["format"], "sha256": src["sha256"]}
        if sl:
            head.update(slicing=sl, requests_in_file=n_file)
        _out(json.dumps({**head, **stats}, indent=2))
    else:
        title = f"{src['path']}  ({src['format']}, {src['container']}{', gzip' if src['compressed'] else ''})"
        if sl:
            title += ("\nsliced as a scenario's trace: section would: " + ", ".join(f"{k}={v:g}" for k, v in sl.items())
                      + f" ({len(trace):,} of {n_file:,} requests)")
        _out(format_stats(stats, title))
    return 0


def cmd_convert(args) -> int:
    from kvsim.trace.write import TRACE_WRITER, container_of, write_trace

    from kvsim.outdir import check_out_file

    container_of(Path(args.output))  # reject a bad output name before reading the input
    check_out_file(Path(args.output), command=TRACE_WRITER, force=args.force, flag="OUT")
    trace = _load(args)
    write_trace(trace, args.output, force=args.force)
    _out(f"wrote {len(trace):,} requests ({trace.source['format']} -> generic) to {args.output}")
    return 0


def load_spec(path: str | Path):
    """Read a SyntheticTraceSpec YAML file; problems raise ConfigError naming file and key."""
    from pydantic import ValidationError

    from kvsim.trace.spec import SyntheticTraceSpec
    from kvsim.yamlio import load_yaml

    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; expected a spec file (YAML)")
    if not path.is_file():
        raise ConfigError(f"{path}: spec file does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    data = load_yaml(text, str(path))
    if isinstance(data, dict) and set(data) == {"trace"} and isinstance(data["trace"], dict) \
            and "synthetic" in data["trace"]:  # a scenario's trace: section, as docs/traces.md shows it
        others = sorted(set(data["trace"]) - {"synthetic"})
        if others:
            raise ConfigError(f"{path}: trace.{others[0]}: a scenario's trace key, not a generator setting; "
                              f"trace generate reads only trace.synthetic (or the generator keys at the top level)")
        data = data["trace"]
    if isinstance(data, dict) and set(data) == {"synthetic"}:
        data = data["synthetic"]  # accept a file holding just a scenario's synthetic: section
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of generator settings, got {type(data).__name__}")
    from kvsim.config_base import reject_non_finite

    reject_non_finite(data, str(path))
    try:
        return SyntheticTraceSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {validation_message(exc, SyntheticTraceSpec)}") from None


def validation_message(exc, model=None) -> str:
    """The first pydantic error as ``key.path: message`` (plus a count of any others); with ``model``
    (the validated class), an unknown key gets the valid keys there and a missing ``kind`` the valid kinds."""
    errors = exc.errors()
    first = errors[0]
    path = tuple(p for p in first["loc"] if not str(p).startswith("function-after"))
    loc = ".".join(str(p) for p in path)
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        keys = _members_at(model, path[:-1]) if model is not None else None
        msg = "unknown key" + (f"{did_you_mean(str(path[-1]), keys)}; valid keys: {format_choices(keys)}" if keys else "")
    elif first["type"] == "union_tag_not_found" and model is not None:
        kinds = _members_at(model, path, tags=True)
        msg = "key 'kind' is missing" + (f"; valid kinds: {format_choices(kinds)}" if kinds else "")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{loc or '(top level)'}: {msg}{more}"


def _members_at(model, path: tuple, tags: bool = False) -> list[str] | None:
    """The field names of the pydantic model that ``path`` leads to from ``model`` (``tags``: the ``kind``
    values of the discriminated union there), or None where the path leaves the models."""
    from typing import Annotated, Union, get_args, get_origin

    from pydantic import BaseModel

    def models(ann) -> list:
        if get_origin(ann) in (Annotated, Union):
            return [m for a in get_args(ann) for m in models(a)]
        return [ann] if isinstance(ann, type) and issubclass(ann, BaseModel) else []

    found = [model]
    for part in path:
        found = [m for c in found if str(part) in c.model_fields for m in models(c.model_fields[str(part)].annotation)]
    if tags:
        kinds = [get_args(m.model_fields["kind"].annotation) for m in found if "kind" in m.model_fields]
        return sorted({str(k) for ks in kinds for k in ks}) or None
    return sorted({f for m in found for f in m.model_fields}) if len(found) == 1 else None


def cmd_generate(args) -> int:
    from kvsim.trace.synthetic import generate_trace
    from kvsim.trace.write import TRACE_WRITER, container_of, write_trace

    from kvsim.outdir import check_out_file

    container_of(Path(args.output))
    check_out_file(Path(args.output), command=TRACE_WRITER, force=args.force, flag="OUT")
    spec = load_spec(args.spec)
    seed = args.seed if args.seed is not None else spec.seed
    trace = generate_trace(spec, seed=seed, base_dir=Path(args.spec).resolve().parent)
    write_trace(trace, args.output, force=args.force)
    _out(f"wrote {len(trace):,} synthetic requests (seed {trace.source['seed']}) to {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m kvsim.trace.cli {stats,convert,generate} ...``."""
    from kvsim.errors import one_line_warnings
    from kvsim.trace.load import TraceWarning

    parser = OneLineParser(prog="kvsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["trace", *(sys.argv[1:] if argv is None else argv)])
    with one_line_warnings():  # ``kvsim: warning: ...`` and ``kvsim: error: ...``, as ``kvsim trace`` prints them
        warnings.simplefilter("always", TraceWarning)
        try:
            code = args.func(args)
        except KvsimError as exc:
            sys.stderr.write(f"kvsim: error: {exc}\n")
            return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
