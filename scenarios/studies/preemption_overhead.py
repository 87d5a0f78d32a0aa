"""Overhead of one preemption, swap vs recompute, across block sizes (the vLLM paper's Fig. 19a
microbenchmark, with kvsim's models instead of a GPU): docs/studies.md, study (c).

    python scenarios/studies/preemption_overhead.py [--model OPT-13B] [--gpu A100-40GB]
        [--link LINK] [--tokens 1024]        (default link: the GPU preset's host_link)

Swap: the victim's KV goes out to host memory and comes back, one copy per block per layer per K/V
tensor as vLLM's swap_blocks issues them (kvsim/timing/transfer.py, layout per_layer_kv). Recompute:
the dropped context is prefilled again in one step (analytical timing, fitted GEMMs, the allocator's
default attention kernel, the step's fixed overhead included). Prints one row per block size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvsim.hw import GPUS, MODELS
from kvsim.models.geometry import KVGeometry
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape
from kvsim.timing.context import TimingContext
from kvsim.timing.transfer import copies_per_unit, get_link, transfer_time_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="OPT-13B")
    ap.add_argument("--gpu", default="A100-40GB")
    ap.add_argument("--link", default=None, help="host link preset (default: the GPU preset's host_link)")
    ap.add_argument("--tokens", type=int, default=1024, help="the preempted sequence's context (tokens)")
    args = ap.parse_args()
    model, gpu = MODELS[args.model], GPUS[args.gpu]
    args.link = args.link or gpu.host_link or "pcie-gen4-x16"
    link = get_link(args.link)
    bpt = model.kv_bytes_per_token("fp16")
    n = args.tokens
    print(f"{args.model} on {args.gpu}, {args.link}, one sequence of {n} tokens ({n * bpt / 2**20:.0f} MiB of KV)")
    print("block_size  copies  swap_out_ms  swap_in_ms  swap_total_ms  recompute_ms  swap/recompute")
    for block in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        blocks = -(-n // block)
        copies = blocks * copies_per_unit("per_layer_kv", model.num_layers)
        out_s = transfer_time_s(n * bpt, copies, link, "d2h")
        in_s = transfer_time_s(n * bpt, copies, link, "h2d")
        ctx = TimingContext(model, gpu, KVGeometry.from_model(model, "fp16", block), model.weight_bytes(), Path("."))
        t = AnalyticalTiming(AnalyticalTimingConfig(), ctx)
        prefill = t.step_time(BatchShape(num_seqs=1, num_prefill_seqs=1, num_decode_seqs=0, num_prefill_tokens=n,
                                         num_decode_tokens=0, kv_tokens_read=n, attention_pairs=n * (n + 1) // 2,
                                         kv_pages_read=blocks)).duration_s
        recompute = prefill
        print(f"{block:>10}  {copies:>6}  {1e3 * out_s:>11.2f}  {1e3 * in_s:>10.2f}  {1e3 * (out_s + in_s):>13.2f}"
              f"  {1e3 * recompute:>12.2f}  {(out_s + in_s) / recompute:>14.2f}")


if __name__ == "__main__":
    main()
