"""``kvsim kernel``: what-if for one decode-attention launch under the kernel model.

    kvsim kernel --gpu A100-80GB --model Llama-2-13B --batch 32 --context 1024 --block-size 16 --json
"""

from __future__ import annotations

import argparse
import json

from kvsim.errors import ConfigError, did_you_mean, format_choices

JSON_KEYS = ("backend", "gpu", "model", "kv_dtype", "batch", "context_tokens", "block_size", "time_s",
             "time_per_layer_s", "bytes_read", "kv_bytes", "pages_fetched", "bandwidth_utilisation",
             "time_per_page_s")

DESCRIPTION = f"""Predict one decode-attention launch per layer (all layers summed) with the kernel model of
docs/kernel_model.md: BATCH sequences of CONTEXT KV tokens each. JSON keys: {', '.join(JSON_KEYS)}.
time_s: all layers' kernel time (s); bytes_read: HBM bytes the kernel reads (whole last pages where the backend
reads them; plus the dequantisation pass of an unfused quantised KV); kv_bytes: the KV bytes of the tokens
attended (useful bytes); pages_fetched: (page, KV head, layer) fetches -- contiguous KV counts one run per
(sequence, KV head, layer); bandwidth_utilisation: kv_bytes / time_s / peak HBM bandwidth; time_per_page_s:
time_s / pages_fetched (the mean KV access latency of docs/metrics.md)."""


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return v


def register(subparsers) -> None:
    from kvsim.hw import KV_DTYPES

    p = subparsers.add_parser("kernel", help="predict one decode-attention launch (time, bytes, bandwidth, "
                                             "time per page)", description=DESCRIPTION)
    p.add_argument("--gpu", required=True, help="GPU preset (kvsim models)")
    p.add_argument("--model", required=True, help="model preset (kvsim models)")
    p.add_argument("--batch", type=_positive_int, required=True, help="sequences in the launch")
    p.add_argument("--context", type=_positive_int, required=True, help="KV tokens per sequence")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--block-size", type=_positive_int, help="page size in tokens (default 16)")
    g.add_argument("--contiguous", action="store_true", help="contiguous KV (no page table)")
    p.add_argument("--backend", default="auto", help="built-in backend (contiguous, flashinfer-paged, "
                                                    "vllm-2023-paged) or a profile .yaml; auto: vllm-2023-paged "
                                                    "for pages, contiguous for --contiguous")
    p.add_argument("--kv-dtype", default="fp16", choices=sorted(KV_DTYPES))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=handle)


def predict(gpu: str, model: str, batch: int, context: int, block_size: int | None, backend: str = "auto",
            kv_dtype: str = "fp16") -> dict:
    from pathlib import Path

    from kvsim.hw import GPUS, MODELS
    from kvsim.timing.kernel import KernelModel, KVLayout, default_backend, load_backend

    if gpu not in GPUS:
        raise ConfigError(f"--gpu: unknown GPU {gpu!r}{did_you_mean(gpu, GPUS)}; valid: {format_choices(GPUS)}")
    if model not in MODELS:
        raise ConfigError(f"--model: unknown model {model!r}{did_you_mean(model, MODELS)}; "
                          f"valid: {format_choices(MODELS)}")
    g, m = GPUS[gpu], MODELS[model]
    name = default_backend(block_size) if backend == "auto" else backend
    prof = load_backend(name, Path.cwd(), where="--backend")
    layout = KVLayout.from_model(m, kv_dtype, block_size)
    km = KernelModel(prof, layout, g.hbm_bandwidth_bytes_per_s, g.num_sms)
    pages = batch * -(-context // block_size) if block_size else batch
    r = km.result(batch, batch * context, pages)
    return {
        "backend": prof.name, "gpu": gpu, "model": model, "kv_dtype": kv_dtype, "batch": batch,
        "context_tokens": context, "block_size": block_size, "time_s": float(r.time_s),
        "time_per_layer_s": float(r.time_s) / m.num_layers, "bytes_read": float(r.bytes_read),
        "kv_bytes": int(batch * context * m.kv_bytes_per_token(kv_dtype)), "pages_fetched": int(r.pages_fetched),
        "bandwidth_utilisation": float(r.bandwidth_utilisation),
        "time_per_page_s": float(r.time_s) / int(r.pages_fetched),
    }


def handle(args: argparse.Namespace) -> int:
    block = None if args.contiguous else (args.block_size or 16)
    out = predict(args.gpu, args.model, args.batch, args.context, block, args.backend, args.kv_dtype)
    if args.json:
        print(json.dumps(out))
        return 0
    layout = "contiguous" if block is None else f"{block}-token pages"
    print(f"{out['backend']} on {out['gpu']}, {out['model']} ({out['kv_dtype']} KV, {layout}): "
          f"batch {out['batch']} x {out['context_tokens']} tokens")
    print(f"  time             {out['time_s'] * 1e6:,.1f} us ({out['time_per_layer_s'] * 1e6:,.2f} us per layer)")
    print(f"  bytes read       {out['bytes_read'] / 2**20:,.1f} MiB (KV attended {out['kv_bytes'] / 2**20:,.1f} MiB)")
    print(f"  bandwidth        {out['bandwidth_utilisation']:.1%} of peak HBM")
    print(f"  pages fetched    {out['pages_fetched']:,} ({out['time_per_page_s'] * 1e9:,.2f} ns per page)")
    return 0
