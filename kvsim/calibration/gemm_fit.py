"""Fit :mod:`kvsim.timing.gemm` profiles to Microsoft Vidur's GPU profiles (MIT).

Data: ``<vidur>/data/profiling/compute/<gpu>/<org>/<model>/mlp.csv`` (the four GEMMs per layer, TP=1
rows: one shard per GPU, so TP>1 rows are other matrix shapes, used here only as an extra held-out
check) and, for prefill attention, the hand-transcribed
``a100/meta-llama/Llama-2-7b-hf/attention_sampled_rows.csv`` (TP=1 prefill rows).

The fit minimises the mean absolute percentage error (MAPE) the way ``kvsim calibrate peer-check``
reports it: every (model, op) group weighs the same. It is a Levenberg-Marquardt fit of log(pred /
meas) with iteratively reweighted least squares (weights 1/|r|, which turns squares into absolute
values), plain numpy. The tile sizes are chosen from {64, 128, 256}^2 by in-sample MAPE; the SM
count (wave quantisation) is the GPU's, from NVIDIA's datasheets.

Held-out numbers, two of them:

* **leave-one-model-out** (LOMO): for each model, fit on the other models of that GPU and predict it;
  the MAPE averaged over models is what a model kvsim has never seen would get;
* **even/odd token split**: fit on rows with an even row index, score the odd ones.

Regenerate the shipped profiles with ``python -m kvsim.calibration.gemm_fit --out kvsim/timing/data/gemm``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from kvsim.errors import CalibrationError
from kvsim.hw import GPUSpec, MODELS
from kvsim.timing.gemm import INT_PARAMS, GemmProfile, gemm_shapes, linear_time_s, prefill_attention_time_s

VIDUR_OPS = {"attn_pre_proj": "qkv", "attn_post_proj": "attn_out", "mlp_up_proj": "mlp_up",
             "mlp_down_proj": "mlp_down"}
COLUMN_PARALLEL = ("attn_pre_proj", "mlp_up_proj")  # TP splits n; the others (row parallel) split k
TILES = (64, 128, 256)
# Streaming multiprocessors per GPU, from NVIDIA's architecture whitepapers / datasheets (A100: 108;
# H100 SXM5: 132; A40: 84) -- the wave-quantisation term's unit.
NUM_SMS = {"a100": 108, "h100": 132, "a40": 84}
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"


def load_gemm_rows(vidur_dir: str | Path, gpu_key: str, tp1_only: bool = True) -> pd.DataFrame:
    """One row per (model, op, TP, num_tokens): columns model, op, tp, m, n, k, t_s, file."""
    from kvsim.calibration.peer import model_from_csv

    root = Path(vidur_dir) / "data" / "profiling" / "compute" / gpu_key
    parts = []
    for csv in sorted(root.glob("*/*/mlp.csv")):
        df = pd.read_csv(csv)
        model = model_from_csv(csv.parent.name, df.iloc[0])
        shapes = gemm_shapes(model)
        for tp in sorted(df["num_tensor_parallel_workers"].unique()):
            if tp1_only and tp != 1:
                continue
            d = df[df["num_tensor_parallel_workers"] == tp]
            for vop, op in VIDUR_OPS.items():
                n, k = shapes[op]
                if vop in COLUMN_PARALLEL:
                    n //= int(tp)
                else:
                    k //= int(tp)
                parts.append(pd.DataFrame({
                    "model": csv.parent.name, "op": vop, "tp": int(tp), "m": d["num_tokens"].to_numpy(),
                    "n": n, "k": k, "t_s": d[f"time_stats.{vop}.median"].to_numpy() * 1e-3,
                    "file": str(csv.relative_to(Path(vidur_dir)))}))
    if not parts:
        raise CalibrationError(f"{root}: no mlp.csv files")
    return pd.concat(parts, ignore_index=True)


def load_prefill_rows(vidur_dir: str | Path) -> tuple[pd.DataFrame, str]:
    rel = "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention_sampled_rows.csv"
    df = pd.read_csv(Path(vidur_dir) / rel)
    df = df[(df["num_tensor_parallel_workers"] == 1) & df["is_prefill"].astype(str).str.lower().eq("true")]
    out = pd.DataFrame({"c": df["prefill_chunk_size"].to_numpy(float), "p": df["kv_cache_size"].to_numpy(float),
                        "t_s": df["attn_prefill_median_ms"].astype(float).to_numpy() * 1e-3})
    return out.reset_index(drop=True), rel


def _lm(residual: Callable[[np.ndarray], np.ndarray], p0, iters: int = 100) -> np.ndarray:
    """Levenberg-Marquardt with a forward-difference Jacobian (a handful of parameters)."""
    p = np.asarray(p0, dtype=float)
    r = residual(p)
    cost = r @ r
    lam = 1e-3
    for _ in range(iters):
        jac = np.empty((len(r), len(p)))
        for i in range(len(p)):
            dp = np.zeros_like(p)
            dp[i] = 1e-6 * max(1.0, abs(p[i]))
            jac[:, i] = (residual(p + dp) - r) / dp[i]
        a, g = jac.T @ jac, jac.T @ r
        while True:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            pn = p + step
            with np.errstate(all="ignore"):
                rn = residual(pn)
            cn = rn @ rn
            if np.isfinite(cn) and cn < cost:
                p, r, cost, lam = pn, rn, cn, max(lam / 3, 1e-9)
                break
            lam *= 4
            if lam > 1e9:
                return p
        if np.abs(step).max() < 1e-7:
            break
    return p


def _irls(residual: Callable[[np.ndarray], np.ndarray], weights: np.ndarray, p0, rounds: int = 4) -> np.ndarray:
    """Minimise sum(weights * |residual|) by reweighted least squares."""
    p = np.asarray(p0, dtype=float)
    w = np.sqrt(weights)
    for _ in range(rounds):
        p = _lm(lambda q: w * residual(q), p)
        with np.errstate(all="ignore"):
            w = np.sqrt(weights / np.maximum(np.abs(residual(p)), 1e-3))
    return p


def _gemm_profile(base: GemmProfile, x: np.ndarray, tm: int, tn: int) -> GemmProfile:
    return replace(base, launch_s=float(np.exp(x[0])), bandwidth_efficiency=_unit(x[1]),
                   compute_efficiency=_unit(x[2]), overlap_q=float(1.0 + np.exp(np.clip(x[3], -20, 20))),
                   tile_m_tokens=tm, tile_n=tn, wave_weight=_unit(x[4]))


def _unit(v: float) -> float:
    """(0, 1): efficiencies are fractions of the datasheet peak."""
    return float(1.0 / (1.0 + np.exp(-np.clip(v, -30, 30))))


def predict_gemm(rows: pd.DataFrame, gpu: GPUSpec, prof: GemmProfile) -> np.ndarray:
    out = np.empty(len(rows))
    for (n, k), idx in rows.groupby(["n", "k"]).indices.items():
        out[idx] = linear_time_s(rows["m"].to_numpy()[idx], int(n), int(k), gpu, prof)
    return out


def group_mape_pct(rows: pd.DataFrame, pred: np.ndarray) -> float:
    """Mean over (model, op) groups of each group's MAPE, in % (peer-check's convention)."""
    ape = np.abs(pred - rows["t_s"].to_numpy()) / rows["t_s"].to_numpy()
    return 100.0 * float(pd.Series(ape).groupby([rows["model"].to_numpy(), rows["op"].to_numpy()]).mean().mean())


def fit_gemm(rows: pd.DataFrame, gpu: GPUSpec, base: GemmProfile, tiles: tuple[int, int] | None = None) -> GemmProfile:
    """Fit launch, efficiencies and overlap on ``rows``; tiles from the grid unless given."""
    t = rows["t_s"].to_numpy()
    sizes = rows.groupby(["model", "op"])["t_s"].transform("size").to_numpy()
    weights = 1.0 / sizes
    best = None
    for tm, tn in ([tiles] if tiles else [(a, b) for a in TILES for b in TILES]):
        def resid(x, tm=tm, tn=tn):
            return np.log(predict_gemm(rows, gpu, _gemm_profile(base, x, tm, tn)) / t)

        x = _irls(resid, weights, [np.log(5e-6), 1.4, 0.85, np.log(1.0), 0.0])
        prof = _gemm_profile(base, x, tm, tn)
        score = group_mape_pct(rows, predict_gemm(rows, gpu, prof))
        if best is None or score < best[0]:
            best = (score, prof)
    return best[1]


def fit_prefill(rows: pd.DataFrame, gpu: GPUSpec, base: GemmProfile) -> GemmProfile:
    model = MODELS["Llama-2-7B"]
    t = rows["t_s"].to_numpy()

    def prof_of(x):
        return replace(base, attn_launch_s=float(np.exp(x[0])), attn_compute_efficiency=_unit(x[1]),
                       attn_causal_factor=float(np.exp(x[2])), attn_half_tokens=float(np.exp(x[3])))

    def resid(x):
        return np.log(prefill_attention_time_s(rows["c"].to_numpy(), rows["p"].to_numpy(), model, gpu, prof_of(x)) / t)

    x = _irls(resid, np.ones(len(t)), [np.log(3e-5), -0.4, np.log(1.5), np.log(64.0)])
    return prof_of(x)


def prefill_mape_pct(rows: pd.DataFrame, gpu: GPUSpec, prof: GemmProfile) -> float:
    pred = prefill_attention_time_s(rows["c"].to_numpy(), rows["p"].to_numpy(), MODELS["Llama-2-7B"], gpu, prof)
    return 100.0 * float(np.mean(np.abs(pred - rows["t_s"].to_numpy()) / rows["t_s"].to_numpy()))


def held_out(rows: pd.DataFrame, gpu: GPUSpec, prof: GemmProfile) -> dict:
    """LOMO and even/odd held-out MAPE (%) with the profile's tiles fixed."""
    tiles = (prof.tile_m_tokens, prof.tile_n)
    lomo = {}
    for model in sorted(rows["model"].unique()):
        test = rows["model"] == model
        fitted = fit_gemm(rows[~test].reset_index(drop=True), gpu, prof, tiles)
        sub = rows[test].reset_index(drop=True)
        lomo[model] = round(group_mape_pct(sub, predict_gemm(sub, gpu, fitted)), 2)
    even = (np.arange(len(rows)) % 2) == 0
    fitted = fit_gemm(rows[even].reset_index(drop=True), gpu, prof, tiles)
    odd = rows[~even].reset_index(drop=True)
    return {"leave_one_model_out_mape_pct": round(float(np.mean(list(lomo.values()))), 2),
            "leave_one_model_out_per_model_pct": lomo,
            "even_odd_split_mape_pct": round(group_mape_pct(odd, predict_gemm(odd, gpu, fitted)), 2)}


def fit_gpu(vidur_dir: str | Path, gpu_key: str, *, with_held_out: bool = True,
            attention_from: GemmProfile | None = None) -> GemmProfile:
    """A complete profile for one Vidur GPU folder, provenance included."""
    from kvsim.calibration.peer import GPU_MAP

    gpu = GPU_MAP[gpu_key]
    rows = load_gemm_rows(vidur_dir, gpu_key)
    base = GemmProfile(name=gpu_key, launch_s=0.0, bandwidth_efficiency=1.0, compute_efficiency=1.0, overlap_q=2.0,
                       tile_m_tokens=64, tile_n=64, num_sms=NUM_SMS[gpu_key], wave_weight=0.0, attn_launch_s=0.0,
                       attn_compute_efficiency=1.0,
                       attn_causal_factor=1.0, attn_half_tokens=0.0)
    prof = fit_gemm(rows, gpu, base)
    prov: dict = {
        "data": f"Microsoft Vidur (MIT), github.com/microsoft/vidur @ {VIDUR_COMMIT}",
        "gemm_files": sorted(rows["file"].unique().tolist()),
        "gemm_rows": int(len(rows)), "tensor_parallel": 1,
        "fitted_on": _dt.date.today().isoformat(),
        "gemm_in_sample_mape_pct": round(group_mape_pct(rows, predict_gemm(rows, gpu, prof)), 2),
        "peaks": {"hbm_bandwidth_bytes_per_s": gpu.hbm_bandwidth_bytes_per_s, "bf16_flops_per_s": gpu.bf16_flops_per_s},
    }
    if with_held_out:
        prov.update(held_out(rows, gpu, prof))
        tp = load_gemm_rows(vidur_dir, gpu_key, tp1_only=False)
        tp = tp[tp["tp"] > 1].reset_index(drop=True)
        if len(tp):
            prov["tp_shards_held_out_mape_pct"] = round(group_mape_pct(tp, predict_gemm(tp, gpu, prof)), 2)
    pre_path = Path(vidur_dir) / "data/profiling/compute" / gpu_key / "meta-llama/Llama-2-7b-hf/attention_sampled_rows.csv"
    if pre_path.exists():
        pre, rel = load_prefill_rows(vidur_dir)
        prof = fit_prefill(pre, gpu, prof)
        even = (np.arange(len(pre)) % 2) == 0
        half = fit_prefill(pre[even].reset_index(drop=True), gpu, prof)
        prov.update({"attention_file": rel, "attention_rows": int(len(pre)),
                     "attention_in_sample_mape_pct": round(prefill_mape_pct(pre, gpu, prof), 2),
                     "attention_even_odd_split_mape_pct": round(
                         prefill_mape_pct(pre[~even].reset_index(drop=True), gpu, half), 2)})
    elif attention_from is not None:
        prof = replace(prof, attn_launch_s=attention_from.attn_launch_s,
                       attn_compute_efficiency=attention_from.attn_compute_efficiency,
                       attn_causal_factor=attention_from.attn_causal_factor,
                       attn_half_tokens=attention_from.attn_half_tokens)
        prov["attention"] = (f"no prefill-attention profile for {gpu_key} in the shipped Vidur data: attention "
                             f"parameters copied from the {attention_from.name} fit (efficiencies relative to this "
                             "GPU's own peak)")
    return replace(prof, provenance=prov,
                   source=f"fitted to Vidur {gpu_key} profiles (MIT, Microsoft); see docs/gemm_model.md")


def profile_yaml(prof: GemmProfile) -> str:
    doc = {"name": prof.name, "source": prof.source,
           "params": {k: (int(getattr(prof, k)) if k in INT_PARAMS else float(f"{getattr(prof, k):.6g}"))
                      for k in GemmProfile.PARAMS},
           "provenance": prof.provenance}
    return ("# GEMM / prefill-attention efficiency profile for kvsim.timing.gemm.\n"
            "# Generated by `python -m kvsim.calibration.gemm_fit`; do not edit by hand.\n"
            + yaml.safe_dump(doc, sort_keys=False, width=110))


def main(argv: list[str] | None = None) -> int:
    import os

    from kvsim.calibration.peer import VIDUR_DIR_ENV

    ap = argparse.ArgumentParser(prog="python -m kvsim.calibration.gemm_fit", description=__doc__.split("\n")[0])
    ap.add_argument("--vidur-dir", default=os.environ.get(VIDUR_DIR_ENV), required=not os.environ.get(VIDUR_DIR_ENV),
                    help=f"Vidur's repository (holding data/profiling/compute; default ${VIDUR_DIR_ENV})")
    ap.add_argument("--out", required=True, help="folder for <gpu>.yaml profiles")
    ap.add_argument("--gpus", default="a100,h100,a40")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    first = None
    for key in ["a100"] + [g for g in args.gpus.split(",") if g != "a100"]:
        if key not in args.gpus.split(","):
            continue
        prof = fit_gpu(args.vidur_dir, key, attention_from=first)
        first = first or prof
        (out / f"{key}.yaml").write_text(profile_yaml(prof))
        pv = prof.provenance
        print(f"{key}: in-sample {pv['gemm_in_sample_mape_pct']} %, LOMO {pv.get('leave_one_model_out_mape_pct')} %, "
              f"even/odd {pv.get('even_odd_split_mape_pct')} %, TP>1 shards {pv.get('tp_shards_held_out_mape_pct')} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
