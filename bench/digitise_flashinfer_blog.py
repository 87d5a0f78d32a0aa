"""Digitise the decode-attention figures of FlashInfer's launch post into kernel-corpus rows.

The post ("Accelerating Self-Attentions for LLM Serving with FlashInfer", flashinfer.ai, 2024-02-02)
plots bandwidth utilisation, not times, and prints none of its points as text. Its figures are PNGs in
the public repository flashinfer-ai/flashinfer-ai.github.io:

    assets/imgs/batch-decode-benchmark.png  (Figure 6; last changed in commit 1543b2e, 2024-02-05)
    assets/imgs/batch-gqa-benchmark.png     (Figure 9; commit 1205f4e, 2024-02-03)

Fetch that repository, write the two files out (`git show HEAD:assets/imgs/...`) and run

    python bench/digitise_flashinfer_blog.py DECODE.png GQA.png > rows.csv

Method: the axes are calibrated on the plot's own gridlines (pixel rows of 0-100 %, pixel columns of
the x ticks), each series' markers are found by their colour in a narrow column at each benchmarked
sequence length, and a marker's utilisation is the centre of its pixel run. Where the two series of
one colour overlap into one run, the two centres are the run's ends moved in by half a marker: the
reading error is then 2 points of utilisation, else 1. A time is derived from the utilisation as the
post defines it (bytes read / latency / the GPU's bandwidth in the post's table): (KV + query bytes) /
(utilisation x bandwidth). docs/kernel_model.md, "Whole sources held out", says what the rows are.
"""

from __future__ import annotations

import csv
import math
import sys

import numpy as np

SOURCE_URL = "https://flashinfer.ai/2024/02/02/introduce-flashinfer.html"
REPO = "flashinfer-ai/flashinfer-ai.github.io"
BW = {"H100 SXM 80GB": 3352e9, "A100 PCIe 80GB": 1935e9}  # the post's "Memory bandwidth (GB/s)" row
PRESET = {"H100 SXM 80GB": "H100-SXM-80GB", "A100 PCIe 80GB": "A100-PCIe-80GB"}
RED, BLUE, GREEN = (228, 26, 28), (55, 126, 184), (77, 175, 74)
COLUMNS = ("source_id", "source", "source_url", "source_commit", "source_date", "gpu", "gpu_preset", "backend",
           "backend_version", "batch", "context", "query_heads", "kv_heads", "head_dim", "attention", "dtype",
           "page_size", "layers", "time_us", "bandwidth_util", "l2", "reading", "reading_error", "split", "note",
           "timing")


def _runs(mask_col: np.ndarray, min_width: int) -> list[tuple[int, int]]:
    """(first, last) rows of the runs where at least ``min_width`` pixels of the column window match."""
    rows = np.where(mask_col >= min_width)[0]
    runs: list[list[int]] = []
    for r in rows:
        if runs and r - runs[-1][-1] <= 2:
            runs[-1].append(r)
        else:
            runs.append([r])
    return [(r[0], r[-1]) for r in runs if len(r) >= 5]


def _series(img, colour, cols: dict, pct, half: int, min_width: int):
    """{x: [(first, last) pixel runs]} of one colour's markers at the given x columns."""
    mask = np.abs(img - np.array(colour)).sum(axis=2) < 60
    return {x: _runs(mask[:, c - half:c + half + 1].sum(axis=1), min_width) for x, c in cols.items()}


def _pairs(runs: dict, pct):
    """Two overlapping series of one colour (upper, lower, reading error in points) per x."""
    singles = [b - a + 1 for v in runs.values() if len(v) == 2 for a, b in v]
    height = float(np.median(singles))
    r = (height - 1) / 2
    out = {}
    for x, v in runs.items():
        if len(v) == 2:
            out[x] = (pct((v[0][0] + v[0][1]) / 2), pct((v[1][0] + v[1][1]) / 2), 1.0)
        elif len(v) == 1 and v[0][1] - v[0][0] + 1 <= height + 3:
            out[x] = (pct((v[0][0] + v[0][1]) / 2),) * 2 + (1.0,)
        elif len(v) == 1:
            out[x] = (pct(v[0][0] + r), pct(v[0][1] - r), 2.0)
    return out


def decode_figure(path: str):
    """Figure 6 (Llama-2-7B heads, 32/32 x 128): (gpu, batch, context, FlashInfer %, vLLM v2 %, error)."""
    from PIL import Image

    img = np.array(Image.open(path).convert("RGB")).astype(int)
    out = []
    # panel origin, pixel column of 100 tokens (one decade = 343.5 px); rows: 0 % at 645, 20 % per 105 px
    for gpu, (x0, x100) in {"H100 SXM 80GB": (0, 448.0), "A100 PCIe 80GB": (1500, 421.0)}.items():
        panel = img[0:900, x0:x0 + 1500]
        pct = lambda row: (645 - row) / 5.25  # noqa: E731
        for colour, batch, top in ((RED, 64, 1024), (BLUE, 16, 4096), (GREEN, 1, 65536)):
            lengths = [2 ** k for k in range(5, int(math.log2(top)) + 1)]
            cols = {L: int(round(x100 + 343.5 * math.log10(L / 100))) for L in lengths}
            for L, (fi, vl, err) in sorted(_pairs(_series(panel, colour, cols, pct, 12, 13), pct).items()):
                out.append((gpu, batch, L, round(fi, 1), round(vl, 1), err))
    return out


def gqa_figure(path: str):
    """Figure 9 (Llama-2-70B TP2 heads, 32/4 x 128, batch 64): (gpu, series, context, %), 512-8,192 tokens
    (below 512 the linear axis packs the markers too close to separate)."""
    from PIL import Image

    img = np.array(Image.open(path).convert("RGB")).astype(int)
    out = []
    for gpu, (x0, zero, per_k) in {"H100 SXM 80GB": (0, 257.0, 142.375), "A100 PCIe 80GB": (1500, 239.0, 142.25)}.items():
        panel = img[:, x0:x0 + 1500]
        pct = lambda row: (636 - row) / 5.34  # noqa: E731
        cols = {L: int(round(zero + per_k * L / 1000)) for L in (512, 1024, 2048, 4096, 8192)}
        for name, colour in (("vllm-v2", GREEN), ("fi-cuda-cores", BLUE), ("fi-tensor-cores", RED)):
            for L, runs in sorted(_series(panel, colour, cols, pct, 8, 9).items()):
                inside = [(a, b) for a, b in runs if 0 <= pct((a + b) / 2) <= 100]
                if len(inside) == 1:
                    out.append((gpu, name, L, round(pct((inside[0][0] + inside[0][1]) / 2), 1)))
    return out


def _row(source_id, figure, commit, gpu, backend, version, batch, ctx, qh, kvh, util, err, note):
    kv = batch * ctx * 2 * kvh * 128 * 2
    q = batch * qh * 128 * 2
    t_us = (kv + q) / (util / 100 * BW[gpu]) * 1e6
    return {"source_id": source_id,
            "source": f"FlashInfer launch post 'Accelerating Self-Attentions for LLM Serving with FlashInfer' "
                      f"(Ye et al.), {figure}, digitised from its PNG (bench/digitise_flashinfer_blog.py); nvbench "
                      f"cold GPU time",
            "source_url": SOURCE_URL, "source_commit": f"{REPO}@{commit}", "source_date": "2024-02-02",
            "gpu": gpu, "gpu_preset": PRESET[gpu], "backend": backend, "backend_version": version,
            "batch": batch, "context": ctx, "query_heads": qh, "kv_heads": kvh, "head_dim": 128, "attention": "gqa",
            "dtype": "fp16", "page_size": 16, "layers": 1, "time_us": f"{t_us:.2f}", "bandwidth_util": f"{util / 100:.3f}",
            "l2": "cold", "reading": "figure",
            "reading_error": f"{err:.0f} pt of utilisation (pixel digitisation; {err / util:.1%} of the time)",
            "split": "holdout",
            "note": (f"read {util:.1f} % utilisation; time = (KV + query bytes) / (utilisation x "
                     f"{BW[gpu] / 1e9:,.0f} GB/s, the post's bandwidth for this GPU); page size not printed: 16 "
                     f"assumed (vLLM 0.2.6's default block size; the post's Figure 12 finds FlashInfer's "
                     f"utilisation nearly independent of it); {note}"),
            "timing": "kernel"}


def rows(decode_png: str, gqa_png: str) -> list[dict]:
    out = []
    for gpu, batch, ctx, fi, vl, err in decode_figure(decode_png):
        for backend, version, util in (("flashinfer-paged", "FlashInfer 0.0.1 batch decode", fi),
                                       ("vllm-paged-v2", "vLLM 0.2.6 PagedAttention v2 (forced)", vl)):
            out.append(_row("flashinfer-blog-2024-batch-decode", "Figure 6 (batch decode, Llama-2-7B heads)",
                            "1543b2e4914b60ab5ed28dd3a54c681c99b731a4", gpu, backend, version, batch, ctx, 32, 32,
                            util, err, "MHA: 32 query and 32 KV heads of 128"))
    for gpu, series, ctx, util in gqa_figure(gqa_png):
        backend, version, note = {
            "vllm-v2": ("vllm-paged-v2", "vLLM 0.2.6 PagedAttention v2 (forced)", "the v2 kernel, one work unit per "
                        "query head"),
            "fi-tensor-cores": ("flashinfer-paged", "FlashInfer 0.0.1 batch decode, tensor cores",
                                "the tensor-core path, which vLLM's and SGLang's FlashInfer backends choose above 4 "
                                "query heads per KV head"),
            "fi-cuda-cores": ("flashinfer-paged-cuda-cores", "FlashInfer 0.0.1 batch decode, CUDA cores",
                              "the CUDA-core path at 8 query heads per KV head, which the engines do not choose: "
                              "not a kvsim backend, listed only"),
        }[series]
        out.append(_row("flashinfer-blog-2024-batch-gqa", "Figure 9 (batch GQA decode, Llama-2-70B TP2 heads)",
                        "1205f4e93c629e63a9e6f7de662252a08f50d00e", gpu, backend, version, 64, ctx, 32, 4, util, 1.0,
                        f"32 query and 4 KV heads of 128, batch 64; {note}"))
    return out


def assign_splits(out: list[dict]) -> list[dict]:
    """The corpus' split rule (docs/kernel_model.md, "Measurement corpus"), in place: per (source, backend),
    rows sorted by (batch, context, page size, dtype), each third one (index 2, 5, ...) ``holdout``."""
    groups: dict = {}
    for r in out:
        groups.setdefault((r["source_id"], r["backend"]), []).append(r)
    for group in groups.values():
        group.sort(key=lambda r: (int(r["batch"]), int(r["context"]), int(r["page_size"]), r["dtype"]))
        for i, r in enumerate(group):
            r["split"] = "holdout" if i % 3 == 2 else "fit"
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python bench/digitise_flashinfer_blog.py BATCH_DECODE.png BATCH_GQA.png", file=sys.stderr)
        return 2
    w = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in assign_splits(rows(*argv)):
        w.writerow(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
