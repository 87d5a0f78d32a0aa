"""``kvsim replay``: the argparse sub-command (vLLM is imported only when a replay runs).

Usage::

    kvsim replay --engine vllm SCENARIO [--out DIR] [--model CONFIG.json] [--device cpu|cuda]
                 [--threads N] [--eager] [--clock wall|cpu] [--set KEY=VALUE ...] [--no-plots] [--force]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from kvsim.cliargs import positive_int




def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="run a scenario's trace through a running serving engine (vLLM) and record it like a run",
        description="Replay the scenario's trace (arrival times, prompt/output lengths, prefix structure as token "
                    "ids) through an in-process vLLM engine in real time, built from the scenario's model "
                    "config.json (dummy weights) with its block size, KV size, max_num_seqs, "
                    "max_num_batched_tokens, chunked prefill and prefix caching. Writes requests.parquet, "
                    "steps.parquet and summary.json as `kvsim run` does, with measured TTFT/TPOT/ITL/E2E, "
                    "preemptions, KV usage and prefix hits, so `kvsim compare PRED MEASURED` shows both "
                    "(docs/replay.md).")
    p.add_argument("file", metavar="SCENARIO")
    p.add_argument("--engine", choices=["vllm"], required=True, help="the engine to run (vllm: vLLM's v1 engine)")
    p.add_argument("--out", metavar="DIR", help="output directory (default results/<name>-replay-vllm): new, empty "
                                                "or an earlier replay (docs/outputs.md)")
    p.add_argument("--model", metavar="CONFIG.json", help="the model's config.json when the scenario's model: is a "
                                                          "preset name")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=positive_int, default=1, help="CPU threads for the engine (OMP_NUM_THREADS)")
    p.add_argument("--eager", action="store_true", help="enforce_eager: no torch.compile (use what calibrate used)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: real time (default); cpu: each step lasts its process CPU time and idle gaps are "
                        "skipped, so a shared host's other processes are not in the timeline (docs/replay.md)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a scenario key (repeatable)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots and report.html")
    p.add_argument("--force", action="store_true", help="also replace another kvsim command's output at --out")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from kvsim.config import load_scenario
    from kvsim.realengine.replay import replay_to_dir

    loaded = load_scenario(args.file, args.set or [])
    out = replay_to_dir(loaded, Path(args.out) if args.out else None, model=args.model, threads=args.threads,
                        device=args.device, eager=args.eager, force=args.force, plots=not args.no_plots,
                        log=None if args.quiet else (lambda m: print(m, file=sys.stderr)), clock=args.clock)
    print(out)
    return 0
