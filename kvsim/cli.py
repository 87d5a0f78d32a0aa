"""Command line: ``kvsim run | validate | models | trace | calibrate | conformance``. Thin: parse, call, report.

User errors print one line on stderr (``kvsim: error: ...``) and exit 2; ``--debug`` shows the
traceback instead. Ctrl-C stops cleanly with exit 130 and leaves partial output marked INCOMPLETE.
Where output may go (never over files kvsim did not write): kvsim.outdir, docs/outputs.md.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import sys
from pathlib import Path

from kvsim.version import __version__
from kvsim.errors import Interrupted, KvsimError, one_line_warnings
from kvsim.units import SET_HELP_UNITS


SWEEP_KEYS = ("grid", "points", "base", "base_file")
SCENARIO_KEYS = ("trace", "model", "gpu", "allocator", "variants", "scheduler", "kv_budget")


def file_kind(path: str | Path) -> str | None:
    """"sweep" for a YAML mapping with a top-level ``grid:``/``points:``/``base:``/``base_file:`` and
    no scenario keys, "scenario" for one with scenario keys and none of those, "resolved" for kvsim's
    own ``scenario.resolved.yaml`` (top-level ``runs:`` and ``kvsim_version:``); None otherwise
    (unreadable files are left to the loaders, which say what is wrong)."""
    from kvsim.yamlio import load_yaml

    try:
        doc = load_yaml(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, KvsimError):
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("runs"), dict) and "kvsim_version" in doc:
        return "resolved"  # scenario.resolved.yaml, as kvsim run writes it into a results directory
    sweep = any(k in doc for k in SWEEP_KEYS)
    scenario = any(k in doc for k in SCENARIO_KEYS)
    if sweep and not scenario:
        return "sweep"
    if scenario and not sweep:
        return "scenario"
    return None


def check_command_fits_file(command: str, path: str) -> None:
    """``kvsim run`` on a sweep file, ``kvsim sweep`` on a scenario, either on kvsim's own
    scenario.resolved.yaml: one line naming the command or file to use."""
    kind = file_kind(path)
    if kind == "resolved":
        raise KvsimError(f"{path} is kvsim's resolved output of a run (top-level runs:), not a scenario: "
                         "pass the original scenario (its scenario_file: line names it)")
    if command == "run" and kind == "sweep":
        raise KvsimError(f"{path} is a sweep file (top-level grid:/points:/base:), not a scenario: "
                         f"run it with `kvsim sweep {path}`")
    if command in ("validate", "capacity") and kind == "sweep":
        raise KvsimError(f"{path} is a sweep file (top-level grid:/points:/base:), not a scenario: "
                         f"check its points with `kvsim sweep {path} --dry-run`")
    if command == "sweep" and kind == "scenario":
        raise KvsimError(f"{path} is a scenario file (no top-level grid:/points:), not a sweep: "
                         f"run it with `kvsim run {path}` (or make it a sweep's base_file:, docs/sweeps.md)")


def _cmd_run(args) -> int:
    from kvsim.api import run_to_dir
    from kvsim.config import load_scenario

    check_command_fits_file("run", args.file)
    loaded = load_scenario(args.file, args.set or [])
    out = run_to_dir(loaded, Path(args.out) if args.out else None, check_invariants=args.check_invariants,
                     progress=None if not args.quiet else False, plots=not args.no_plots, force=args.force,
                     log=None if args.quiet else (lambda m: print(m, file=sys.stderr)),
                     warn=lambda m: print(m, file=sys.stderr))
    print(out)
    if not args.quiet:
        print(where_to_look(out, plots=not args.no_plots), file=sys.stderr)
    return 0


def where_to_look(out: Path, plots: bool = True) -> str:
    """The last console line of ``kvsim run``: what to open."""
    out = Path(out)
    if plots and (out / "report.html").exists():
        return f"done: open {out / 'report.html'}  (plots: {out}/*.png; compare: kvsim compare {out})"
    return f"done: results in {out} (summary.json, requests.parquet; report: kvsim report {out})"


def _cmd_validate(args) -> int:
    from kvsim.api import TraceCache
    from kvsim.config import load_scenario
    from kvsim.dropped import Dropped, predict_rejections, warnings_for
    from kvsim.build import build_allocator, build_timing, check_token_budget, check_trace_supported, host_transfers

    check_command_fits_file("validate", args.file)
    loaded = load_scenario(args.file, args.set or [])
    traces = TraceCache(loaded.path.parent, str(loaded.path))
    dropped = {}
    for name, scn in loaded.runs.items():
        try:  # a refused setting names the variant and the --set argument (LoadedScenario.run_error)
            check_token_budget(scn, str(loaded.path))
            alloc, budget = build_allocator(scn, str(loaded.path))
            # the timing model as a run builds it: a calibration directory or a backend profile file is read
            build_timing(scn, alloc.block_size, loaded.path.parent, host_transfers(scn, str(loaded.path)),
                         str(loaded.path))
            trace, report = traces.get(scn)
            check_trace_supported(scn, trace, str(loaded.path))
            rejected = predict_rejections(scn, trace, str(loaded.path))
        except KvsimError as e:
            raise loaded.run_error(name, e) from None
        d = Dropped(trace_requests=len(trace) + int(report.get("dropped", 0) or 0), simulated=len(trace),
                    finished=len(trace) - sum(rejected.values()), rejected_by_reason=rejected,
                    dropped_by_length_policy=int(report.get("dropped", 0) or 0),
                    capped_by_length_policy=int(report.get("capped", 0) or 0))
        served = f"{d.finished}/{d.trace_requests} requests admissible" + "".join(f"; {p}" for p in d.parts())
        par = scn.parallel_plan()
        many = par.tensor * par.pipeline > 1
        gpus = (f"{par.tensor * par.pipeline} x {scn.gpu.name}, tensor {par.tensor} x pipeline {par.pipeline}"
                if many else scn.gpu.name)
        verdict = "ok" if d.finished > 0 else "no request admissible"  # valid, but it would serve nothing
        print(f"{name}: {verdict} ({scn.model.name} on {gpus}, {scn.kv_dtype} KV, allocator {scn.allocator.kind}, "
              f"KV capacity {alloc.capacity_tokens} tokens x {par.kv.bytes_per_token:,} bytes/token{' per GPU' * many} "
              f"<= {budget / 2**30:.2f} GiB{' per GPU' * many}; {served})")
        for note in scn.notes():
            print(f"  {note}")
        dropped[name] = d
    for w in warnings_for(dropped):
        print(w, file=sys.stderr)
    return 0


def _cmd_models(args) -> int:
    from kvsim.hw import ModelSpec, presets_table
    from kvsim.models.hf import load_model_file

    models = None
    if args.config:  # Hugging Face config.json files instead of the presets
        specs = [ModelSpec(**load_model_file(f, None)) for f in args.config]
        models = {m.name: m for m in specs}
    table = presets_table(models)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    dtypes = list(table["kv_dtypes"])
    print(f"{'model':<16}{'attn':>5}{'layers':>7}{'heads':>6}{'kv':>4}{'hd':>5}{'params':>9}{'max len':>9}"
          f"{'window':>8}  KV bytes/token " + " ".join(f"{d:>8}" for d in dtypes))
    for name, m in table["models"].items():
        window = f"{m['sliding_window_tokens']}x{m['sliding_window_layers']}" if m["sliding_window_layers"] else "-"
        print(f"{name:<16}{m['attention']:>5}{m['num_layers']:>7}{m['num_attention_heads']:>6}{m['num_kv_heads']:>4}"
              f"{m['head_dim']:>5}{m['num_params'] / 1e9:>8.2f}B{m['max_model_len_tokens']:>9}{window:>8}  {'':14}"
              + " ".join(f"{'n/a' if m['kv_bytes_per_token'][d] is None else m['kv_bytes_per_token'][d]:>8}"
                         for d in dtypes))
    print("(window: tokens x layers with a sliding window; MoE params are the total, see --json for active)")
    if any(v is None for m in table["models"].values() for v in m["kv_bytes_per_token"].values()):
        print("(n/a: the KV dtype cannot store the model's head_dim in whole bytes, e.g. int4 with an odd head_dim)")
    print()
    print(f"{'gpu':<16}{'memory GiB':>11}{'HBM TB/s':>10}{'bf16 TFLOP/s':>14}  {'host link':<16}"
          f"{'GPU-GPU link (GB/s one way)'}")
    for name, g in table["gpus"].items():
        print(f"{name:<16}{g['memory_bytes'] / 2**30:>11.0f}{g['hbm_bandwidth_bytes_per_s'] / 1e12:>10.3f}"
              f"{g['bf16_flops_per_s'] / 1e12:>14.1f}  {g['host_link'] or '-':<16}{g['interconnect']} "
              f"{g['interconnect_bandwidth_bytes_per_s'] / 1e9:.0f}")
    print("(host link: the CPU-GPU link preset swaps and offloads are priced on; its rates: docs/transfer_model.md)")
    return 0


# Sub-commands contributed by sub-packages: (module, function adding the sub-parser).
PLUGIN_COMMANDS = [("kvsim.trace.cli", "register"), ("kvsim.sweep.cli", "register"), ("kvsim.report.cli", "register"),
                   ("kvsim.calibration.cli", "register"), ("kvsim.capacity", "register"),
                   ("kvsim.kernel_cli", "register"), ("kvsim.memory_cli", "register"), ("kvsim.conformance.cli", "register"),
                   ("kvsim.realengine.cli", "register"), ("kvsim.servebench.cli", "register")]


def build_parser() -> argparse.ArgumentParser:
    from kvsim.cliargs import OneLineParser

    p = OneLineParser(prog="kvsim", description="Trace-driven simulator of KV-cache memory in LLM serving.")
    p.add_argument("--version", action="version", version=f"kvsim {__version__}")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    r = sub.add_parser("run", help="simulate a scenario YAML (all its variants) into a result directory")
    r.add_argument("file", help="scenario YAML")
    r.add_argument("--out", help="result directory (default results/<name>-<hash of resolved config>); a new or "
                                 "empty directory or an earlier `kvsim run` output, which is replaced keeping "
                                 "files kvsim did not write (docs/outputs.md)")
    r.add_argument("--force", action="store_true",
                   help="also replace the output of another kvsim command at --out (never a directory kvsim "
                        "did not write)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key, e.g. --set allocator.block_size=32 (repeatable; applies to every variant); "
                        + SET_HELP_UNITS)
    r.add_argument("--check-invariants", action="store_true", help="check allocator/scheduler invariants every step")
    r.add_argument("--no-plots", action="store_true", help="skip PNG plots")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar or per-variant lines")
    r.set_defaults(func=_cmd_run)

    v = sub.add_parser("validate", help="check a scenario YAML without running it",
                       description="Check a scenario YAML and its trace without simulating: per variant, the KV "
                                   "capacity and how many requests the simulator will reject and why (with the fix); "
                                   "'ok', or 'no request admissible' when it would serve none (exit 0 either way).")
    v.add_argument("file")
    v.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key, as for run (repeatable); " + SET_HELP_UNITS)
    v.set_defaults(func=_cmd_validate)

    m = sub.add_parser("models", help="list model and GPU presets with KV bytes per token",
                       description="Model presets (any case in a scenario; or model: path/to/config.json for a "
                                   "Hugging Face config) and GPU presets with their interconnect. See docs/models.md.")
    m.add_argument("--json", action="store_true", help="print the tables as one JSON object (every field)")
    m.add_argument("--config", action="append", metavar="CONFIG_JSON",
                   help="show a Hugging Face config.json (repeatable) instead of the model presets (the GPU "
                        "presets are listed as always)")
    m.set_defaults(func=_cmd_models)

    for module, fn in PLUGIN_COMMANDS:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        getattr(mod, fn)(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status. ``argv`` None: this process's own command line (the
    ``kvsim`` script, ``python -m kvsim``), which exits right after: see :func:`freeze_for_exit`."""
    if argv is not None:
        return _main(argv)
    try:
        return _main(sys.argv[1:])
    finally:
        freeze_for_exit()


def freeze_for_exit() -> None:
    """The process exits next: move every object alive now into the collector's permanent
    generation (``gc.freeze``), so the interpreter's shutdown does not traverse and tear down the
    object graphs of pandas, pyarrow and matplotlib object by object (the larger part of a
    ``kvsim run`` process's exit: measured in bench/README.md). Every output is written and closed
    by now; atexit handlers and the flushing of stdout/stderr still run. Only finalizers of objects
    in reference cycles are skipped, which Python does not promise to run at exit anyway. Not for
    callers that go on running (``main(argv)`` with a list never freezes)."""
    gc.freeze()


def _main(argv: list[str]) -> int:
    with one_line_warnings():
        return _run_command(argv)


def _run_command(argv: list[str]) -> int:
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if args.command in ("sweep", "capacity") and isinstance(getattr(args, "file", None), str):
            check_command_fits_file(args.command, args.file)
        return int(args.func(args) or 0)
    except KvsimError as e:
        if debug:
            raise
        print(f"kvsim: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # says what was kept (kvsim run, kvsim sweep)
        print(f"kvsim: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("kvsim: interrupted; no complete result directory was written "
              "(partial output, if any, is marked INCOMPLETE)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug: say so in one line unless --debug
        if debug:
            raise
        print(f"kvsim: internal error: {type(e).__name__}: {e} (rerun as kvsim --debug COMMAND ... for the traceback)",
              file=sys.stderr)
        return 1
