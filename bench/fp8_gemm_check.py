"""Check of the fitted GEMM model on FP8 weights against public block-FP8 GEMM readings on an H100
(docs/gemm_model.md, "Weight dtype"; data: ``kvsim/timing/data/gemm/fp8_block_h100.csv``, one
printed reading a row, with its source). Nothing is fitted on these rows.

    .venv/bin/python bench/fp8_gemm_check.py

kvsim prices a GEMM over FP8 weights with the H100 profile fitted on Vidur's BF16 profiles: one byte
per element in the memory term, the fitted BF16 compute efficiency at the BF16 peak. The other rule
this prints beside it is the one the fused MoE kernel model uses for FP8 (twice the BF16 peak, the
datasheet's FP8 tensor-core rate). Per implementation: the model's relative error on each reading,
its median and range, for both rules.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "kvsim" / "timing" / "data" / "gemm" / "fp8_block_h100.csv"
RULES = ("bf16-peak", "fp8-peak")


def readings(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as f:
        return [dict(r, m=int(r["m"]), n=int(r["n"]), k=int(r["k"]), time_s=float(r["time_us"]) * 1e-6)
                for r in csv.DictReader(f)]


def row_errors(path: Path = DATA) -> list[tuple[dict, dict[str, float]]]:
    """Each reading with the model's relative error on it under each rule (model / measured - 1)."""
    from kvsim.hw import GPUS
    from kvsim.timing import gemm

    out = []
    for r in readings(path):
        gpu = GPUS[r["gpu_preset"]]
        prof = gemm.profile_for(gpu)
        err = {}
        for rule in RULES:
            g = gpu if rule == "bf16-peak" else replace(gpu, bf16_flops_per_s=2.0 * gpu.bf16_flops_per_s)
            err[rule] = gemm.linear_time_s(r["m"], r["n"], r["k"], g, prof, 1) / r["time_s"] - 1.0
        out.append((r, err))
    return out


def errors(path: Path = DATA) -> dict[tuple[str, str], list[float]]:
    """``(implementation, rule) -> [relative error per reading]`` in file order."""
    out: dict[tuple[str, str], list[float]] = {}
    for r, err in row_errors(path):
        for rule, e in err.items():
            out.setdefault((r["implementation"], rule), []).append(e)
    return out


def main() -> None:
    per_row = row_errors()
    errs = errors()
    print(f"{DATA.relative_to(ROOT)}: {len(per_row)} readings")
    print(f"{'implementation':15s} {'rule':10s} {'n':>3s} {'median':>8s} {'min':>7s} {'max':>7s}")
    for (impl, rule), e in errs.items():
        print(f"{impl:15s} {rule:10s} {len(e):3d} {median(e):+8.1%} {min(e):+7.1%} {max(e):+7.1%}")
    print("\nper reading (model error, bf16-peak / fp8-peak rule):")
    for r, err in per_row:
        print(f"  {r['implementation']:12s} m={r['m']:5d} n={r['n']:6d} k={r['k']:6d} "
              f"measured {r['time_s'] * 1e6:7.1f} us  model {err['bf16-peak']:+.0%} / {err['fp8-peak']:+.0%}")


if __name__ == "__main__":
    main()
