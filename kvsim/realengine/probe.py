"""A fixed reference engine step, timed to see how fast the host is right now (host-drift probe).

On a shared or virtualised CPU host the process CPU time of the same engine step drifts by tens of
percent over minutes (docs/studies.md (e)): neighbours take shared caches, memory bandwidth and
turbo headroom, none of which a process's CPU clock excludes. A calibration and a replay measured
minutes apart then disagree by the host's drift, not by the model's error. This module times one
fixed shape (by default 8 sequences decoding at 512 tokens of context) on a fresh engine, so a study
can time it before and after every calibration and replay and say how much of an error is drift::

    python -m kvsim.realengine.probe --model CONFIG.json [--batch 8] [--context 512] [--rounds 3]
        [--repeats 10] [--num-blocks N] [--max-num-seqs S] [--max-model-len L] [--threads T] [--eager]

prints one JSON line: the median CPU and wall time of the step (median across rounds of each
round's median; every round re-creates its decoders), the per-round medians, the share of the CPU
time spent in Python's garbage collector and kvsim's schedule probe, and the engine settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

REFERENCE = {"batch": 8, "context": 512}


def reference_step(model: str, *, batch: int = 8, context: int = 512, rounds: int = 3, repeats: int = 10,
                   warmup: int = 2, num_blocks: int | None = None, max_num_seqs: int = 64,
                   max_model_len: int | None = None, block_size: int = 32, threads: int = 1, eager: bool = True,
                   prefix_caching: bool = True) -> dict:
    """Time the reference decode step on a fresh engine (see the module docstring)."""
    from kvsim.realengine.measure import Measurer
    from kvsim.realengine.vllm_engine import Engine, EngineSettings, read_model_config

    path, cfg = read_model_config(model)
    seq = context + warmup + repeats + 8  # one decoder's prompt and outputs
    max_model_len = max_model_len or seq + block_size
    blocks = num_blocks if num_blocks is not None else max(batch * seq, max_model_len) // block_size + 16
    settings = EngineSettings(model_config=path, block_size=block_size, num_blocks=blocks, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=2048, max_model_len=max_model_len, chunked_prefill=True,
                              prefix_caching=prefix_caching, threads=threads, enforce_eager=eager)
    t0 = time.monotonic()
    eng = Engine(settings)
    up = time.monotonic() - t0
    try:
        m = Measurer(eng, int(cfg.get("vocab_size", 32000)), warmup, repeats)
        pt = m.decode(batch, context)
        pt.rounds = [0] * len(pt.durations_s)
        for r in range(1, rounds):
            pt.merge(m.decode(batch, context), r)
    finally:
        eng.close()
    row = pt.row()
    return {"batch": batch, "context": context, "rounds": rounds, "kept_steps": len(pt.cpu_s),
            "cpu_median_s": row["cpu_median_s"], "wall_median_s": row["median_s"],
            "cpu_round_medians_s": pt.round_medians(pt.cpu_s), "gc_share": row["gc_share"],
            "probe_share": float(sum(pt.probe_s) / sum(pt.cpu_s)) if pt.cpu_s else float("nan"),
            # the stepping thread's CPU time over the process's: below 1, other threads ran during the steps
            "thread_share": float(sum(pt.thread_s) / sum(pt.cpu_s)) if pt.cpu_s else float("nan"),
            "thread_median_s": float(np.median(pt.round_medians(pt.thread_s))) if pt.thread_s else float("nan"),
            "mismatched_steps": m.mismatched, "engine_up_s": round(up, 1), "settings": settings.provenance(),
            "date_unix": round(time.time(), 1)}


def main(argv: list[str] | None = None) -> int:
    from kvsim.cliargs import positive_int
    from kvsim.errors import KvsimError

    ap = argparse.ArgumentParser(prog="python -m kvsim.realengine.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, metavar="CONFIG.json")
    ap.add_argument("--batch", type=positive_int, default=REFERENCE["batch"])
    ap.add_argument("--context", type=positive_int, default=REFERENCE["context"])
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--repeats", type=positive_int, default=10)
    ap.add_argument("--num-blocks", type=positive_int, help="KV blocks (default: just what the step needs)")
    ap.add_argument("--max-num-seqs", type=positive_int, default=64)
    ap.add_argument("--max-model-len", type=positive_int, help="(default: what one decoder needs)")
    ap.add_argument("--no-prefix-caching", action="store_true")
    ap.add_argument("--threads", type=positive_int, default=1)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (what the study's engines use)")
    a = ap.parse_args(argv)
    try:
        out = reference_step(a.model, batch=a.batch, context=a.context, rounds=a.rounds, repeats=a.repeats,
                             num_blocks=a.num_blocks, max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len,
                             threads=a.threads, eager=a.eager, prefix_caching=not a.no_prefix_caching)
    except KvsimError as e:
        print(f"kvsim probe: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
