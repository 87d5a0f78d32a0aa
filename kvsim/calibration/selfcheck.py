"""Correctness of the attention paths on the device that will be timed, before timing it.

Checks the Triton decode kernel (single pass and split-K, MHA and GQA, ragged lengths, every
block size asked for, fp16/bf16 and fp8 with per-tensor and per-head scales where supported) and
the torch prefill path against the fp32 references, with the output poisoned with NaN before each
launch (an unwritten element fails the check).

Error metric: ``||out - ref|| / ||ref||``. Tolerances: 1e-3 when the kernel's output is fp32 (the
interpreter runs, and :mod:`tests.calibration`); on a GPU the output is in the query dtype, whose
rounding alone is ~2e-4 (fp16) / ~2e-3 (bf16), and the P.V product uses 16-bit operands as in
FlashAttention, hence 2e-3 (fp16) and 1e-2 (bf16, fp8).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kvsim.calibration.cases import make_decode_case, rel_err
from kvsim.calibration.reference import paged_decode_reference, paged_prefill, paged_prefill_reference

GPU_TOL = {"fp16": 2e-3, "bf16": 1e-2, "fp8": 1e-2}
FP32_TOL = 1e-3


def fp8_supported(device: torch.device) -> tuple[bool, str]:
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap < (8, 9):
            return False, f"compute capability {cap} < (8, 9): no e4m3 conversion"
        return True, ""
    try:
        torch.zeros(4).to(torch.float8_e4m3fn).float()
    except (RuntimeError, TypeError) as e:
        return False, f"torch on CPU cannot cast to float8_e4m3fn: {e}"
    return True, ""


def decode_cases(device: torch.device, block_sizes, kv_dtypes, geometry: tuple[int, int, int]) -> list[dict]:
    """The check matrix. ``geometry`` = (q heads, kv heads, head_dim) of the model being calibrated;
    a tiny MHA/GQA pair is always added so both code paths (broadcast and tl.dot) are covered."""
    hq, hkv, d = geometry
    # Both code paths: broadcast (MHA) and tl.dot (GQA). Each distinct geometry is a separate
    # compilation per dtype and block-size class on a GPU, so add only what the model lacks.
    geoms = [(hq, hkv, d), (4, 4, 32)] if hq != hkv else [(hq, hkv, d), (8, 2, 32)]
    if device.type != "cuda":
        geoms = [(4, 4, 32), (8, 2, 32)] + ([] if (hq, hkv, d) in ((4, 4, 32), (8, 2, 32)) else [(hq, hkv, d)])
    lens_small = [1, 37, 130, 64]
    cases = []
    for bs in block_sizes:
        for dt in kv_dtypes:
            for gi, (gq, gkv, gd) in enumerate(geoms):
                for splits in (1, 3):
                    cases.append(dict(block_size=bs, kv_dtype=dt, num_q_heads=gq, num_kv_heads=gkv, head_dim=gd,
                                      context_lens=lens_small, num_splits=splits,
                                      per_head_scale=(dt == "fp8" and splits == 3), use_dot=None))
    if device.type == "cuda":  # long contexts: the split-K heuristic and many tiles per program
        for dt in kv_dtypes:
            cases.append(dict(block_size=16, kv_dtype=dt, num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                              context_lens=[3000, 17, 2048], num_splits=None, per_head_scale=False, use_dot=None))
    return cases


def run_selfcheck(device: torch.device, *, block_sizes=(1, 8, 16, 64, 128), kv_dtypes=("fp16", "bf16", "fp8"),
                  geometry=(8, 2, 32), check_triton: bool = True, log: Callable[[str], None] = print) -> dict:
    """Run the checks; returns a JSON-able summary with ``ok`` and the worst error per dtype."""
    t0 = time.perf_counter()
    fp8_ok, fp8_why = fp8_supported(device)
    dtypes = [d for d in kv_dtypes if d != "fp8" or fp8_ok]
    skipped = [] if fp8_ok or "fp8" not in kv_dtypes else [f"fp8: {fp8_why}"]
    worst: dict[str, float] = {}
    failures: list[str] = []
    n = 0
    on_gpu = device.type == "cuda"
    if check_triton:
        from kvsim.calibration.kernels import paged_decode

        for i, case in enumerate(decode_cases(device, block_sizes, dtypes, geometry)):
            c = make_decode_case(context_lens=case["context_lens"], num_q_heads=case["num_q_heads"],
                                 num_kv_heads=case["num_kv_heads"], head_dim=case["head_dim"],
                                 block_size=case["block_size"], kv_dtype=case["kv_dtype"],
                                 per_head_scale=case["per_head_scale"], seed=1000 + i, device=device)
            out_dtype = c.q.dtype if on_gpu else torch.float32
            out = torch.full(c.q.shape, float("nan"), dtype=out_dtype, device=device)
            paged_decode(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens, out=out,
                         num_splits=case["num_splits"], use_dot=case["use_dot"], **c.kwargs())
            ref = paged_decode_reference(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens, **c.kwargs())
            err = rel_err(out, ref)
            tol = GPU_TOL[case["kv_dtype"]] if on_gpu else FP32_TOL
            key = f"decode_{case['kv_dtype']}"
            worst[key] = max(worst.get(key, 0.0), err if err == err else float("inf"))
            if not err <= tol:  # NaN fails too
                failures.append(f"decode {case}: rel err {err:.3g} > {tol}")
            n += 1
    for i, (dt, bs, new, cached) in enumerate([(d, b, nw, cc) for d in dtypes for b in (1, 16)
                                               for nw, cc in ((5, 0), (7, 40), (16, 100))]):
        hq, hkv, d = geometry
        c = make_decode_case(context_lens=[cached + new], num_q_heads=hq, num_kv_heads=hkv, head_dim=d,
                             block_size=bs, kv_dtype=dt, seed=2000 + i, device=device)
        q = torch.randn((new, hq, d), generator=torch.Generator().manual_seed(i)).to(c.q.dtype).to(device)
        cdt = c.q.dtype if on_gpu else torch.float32
        out = paged_prefill(q, c.k_cache, c.v_cache, c.block_table[0], cached, compute_dtype=cdt, **c.kwargs())
        ref = paged_prefill_reference(q, c.k_cache, c.v_cache, c.block_table[0], cached, **c.kwargs())
        err = rel_err(out, ref)
        tol = GPU_TOL[dt] if on_gpu else FP32_TOL
        key = f"prefill_{dt}"
        worst[key] = max(worst.get(key, 0.0), err if err == err else float("inf"))
        if not err <= tol:
            failures.append(f"prefill {dt} block={bs} new={new} cached={cached}: rel err {err:.3g} > {tol}")
        n += 1
    summary = {"ok": not failures, "cases": n, "max_rel_err": worst, "failures": failures[:20],
               "skipped": skipped, "device": str(device), "triton_checked": check_triton,
               "wall_s": round(time.perf_counter() - t0, 2)}
    log(f"selfcheck: {n} cases, {'OK' if not failures else f'{len(failures)} FAILED'}; worst rel err "
        + ", ".join(f"{k} {v:.2e}" for k, v in sorted(worst.items())) + (f"; skipped {skipped}" if skipped else ""))
    for f in failures[:5]:
        log(f"  FAIL {f}")
    return summary
