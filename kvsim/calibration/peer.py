"""``kvsim calibrate peer-check``: our timing models against Microsoft Vidur's published GPU profiles.

Data: ``<vidur-dir>/data/profiling/compute/<gpu>/<org>/<model>/mlp.csv`` (per-layer op medians in
ms, fp16, rows per token count and TP degree) and the hand-transcribed
``a100/meta-llama/Llama-2-7b-hf/attention_sampled_rows.csv`` (paged FlashAttention decode and
prefill, block 16). Only tensor-parallel degree 1 rows are compared. See the README in that folder.

Predictions, all per layer:

* ``analytical`` -- a per-op roofline with the constants of ``timing: analytical`` (its default
  efficiencies and the GPU preset's peak numbers)::

      t = max(flops / (peak_flops * compute_efficiency), bytes / (hbm_bandwidth * bandwidth_efficiency))

  GEMM bytes = weights + input + output activations (2 bytes each); attention bytes = the KV read,
  flops = 4 * heads * head_dim * (query, key) pairs. ``layer_gemms`` (the four GEMMs summed) is
  also priced by :class:`~kvsim.timing.analytical.AnalyticalTiming` itself for a pure-prefill step of
  that many tokens, less its fixed step overhead, divided by the layer count (``analytical_step``
  column): what the simulator charges (its default ``gemm_model: fitted``, docs/gemm_model.md).
* ``gemm`` -- :mod:`kvsim.timing.gemm` with the GPU's fitted profile (token-count-dependent
  efficiency fitted to these same files, see docs/gemm_model.md) for the GEMMs, their per-layer sum
  and prefill attention; a per-GPU summary gives its MAPE next to the roofline's and the held-out
  (leave-one-model-out) MAPE stored in the profile.
* ``calibrated`` -- with ``--calibration DIR`` for the same model: the calibration's interpolated
  tables (fp16 KV when measured, else the first dtype; block 16 for attention, Vidur's block).
  A calibration from another GPU (or a CPU plumbing run) is compared all the same and labelled.

Models without a kvsim preset get a :class:`ModelSpec` built from the CSV's shape columns
(``n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size, use_gated_mlp``) plus the layer count
from their published configs. ``a40`` has no preset: :data:`A40` is defined here from its datasheet.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.calibration_data import interp
from kvsim.calibration_data import schema as S
from kvsim.calibration.grid import gemm_shapes
from kvsim.errors import CalibrationError
from kvsim.hw import GPUS, GiB, GPUSpec, MODELS, ModelSpec
from kvsim.timing import gemm

VIDUR_DIR_ENV = "KVSIM_VIDUR_DIR"  # where Vidur's data folder is, when --vidur-dir is not given


def default_vidur_dir() -> Path:
    """``$KVSIM_VIDUR_DIR``; no built-in path (a checkout of github.com/microsoft/vidur lives
    wherever its user put it)."""
    import os

    v = os.environ.get(VIDUR_DIR_ENV)
    if not v:
        raise CalibrationError(f"give --vidur-dir DIR (a checkout of github.com/microsoft/vidur, which holds "
                               f"data/profiling/compute) or set {VIDUR_DIR_ENV}")
    return Path(v)
# not a scenario preset, but the part the a40 GEMM profile was measured on (kvsim.timing.gemm looks it up by preset)
A40 = GPUSpec("A40", 48 * GiB, 696e9, 149.7e12, source="NVIDIA A40 datasheet (GDDR6 696 GB/s, 149.7 TFLOPS bf16 dense)",
              preset="A40")
GPU_MAP = {"a100": GPUS["A100-80GB"], "h100": GPUS["H100-SXM-80GB"], "a40": A40}
PRESET_MAP = {"Llama-2-7b-hf": "Llama-2-7B", "Meta-Llama-3-8B": "Llama-3-8B", "Meta-Llama-3-70B": "Llama-3-70B"}
# num_hidden_layers from each model's published config.json (not in Vidur's CSVs).
LAYERS = {"Llama-2-70b-hf": 80, "CodeLlama-34b-Instruct-hf": 48, "internlm-20b": 60, "Qwen-72B": 80, "phi-2": 32,
          "Llama-2-7b-hf": 32, "Meta-Llama-3-8B": 32, "Meta-Llama-3-70B": 80}
VIDUR_GEMMS = {"attn_pre_proj": S.GEMM_QKV, "attn_post_proj": S.GEMM_OUT, "mlp_up_proj": S.GEMM_MLP_UP,
               "mlp_down_proj": S.GEMM_MLP_DOWN}
ELEMENT_BYTES = 2  # Vidur profiles fp16


def model_from_csv(name: str, row: pd.Series) -> ModelSpec:
    """A ModelSpec from Vidur's shape columns (num_params counts layers + untied embeddings)."""
    if name in PRESET_MAP:
        return MODELS[PRESET_MAP[name]]
    heads, kv_heads, hidden = int(row["n_head"]), int(row["n_kv_head"]), int(row["n_embd"])
    inter, vocab, gated = int(row["n_expanded_embd"]), int(row["vocab_size"]), bool(row["use_gated_mlp"])
    head_dim = hidden // heads
    layers = LAYERS.get(name)
    if layers is None:
        raise CalibrationError(f"peer data model {name!r}: layer count unknown (add it to kvsim.calibration.peer.LAYERS)")
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + (3 if gated else 2) * hidden * inter
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, inter, vocab,
                     float(layers * per_layer + 2 * vocab * hidden), 4096, gated_mlp=gated,
                     source=f"Vidur mlp.csv shape columns; layers from config.json ({layers})")


def _gemm_nk(model: ModelSpec, op: str) -> tuple[int, int]:
    return gemm_shapes(model)[op]


class Roofline:
    """Per-op roofline with the analytical model's default efficiencies."""

    def __init__(self, gpu: GPUSpec):
        from kvsim.timing.analytical import AnalyticalTimingConfig

        cfg = AnalyticalTimingConfig()
        self.flops_per_s = gpu.bf16_flops_per_s * cfg.compute_efficiency
        self.bytes_per_s = gpu.hbm_bandwidth_bytes_per_s * cfg.bandwidth_efficiency

    def __call__(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s)

    def gemm(self, m: int, n: int, k: int) -> float:
        return self(2.0 * m * n * k, (m * k + n * k + m * n) * ELEMENT_BYTES)

    def attention(self, model: ModelSpec, kv_tokens: float, pairs: float) -> float:
        kv_bytes = kv_tokens * 2 * model.num_kv_heads * model.head_dim * ELEMENT_BYTES
        return self(4.0 * model.num_attention_heads * model.head_dim * pairs, kv_bytes)


def analytical_step_per_layer(model: ModelSpec, gpu: GPUSpec, tokens: int) -> float:
    """AnalyticalTiming's linear part for a pure-prefill step of ``tokens`` tokens, per layer
    (no attention, no step overhead)."""
    from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
    from kvsim.timing.base import BatchShape
    from kvsim.models.geometry import KVGeometry
    from kvsim.timing.context import TimingContext

    ctx = TimingContext(model=model, gpu=gpu, kv=KVGeometry.for_gpu(model, "fp16", block_size=16),
                        weight_bytes=model.weight_bytes("fp16"), base_dir=Path("."))
    t = AnalyticalTiming(AnalyticalTimingConfig(step_overhead_s=0.0), ctx)
    shape = BatchShape(num_seqs=1, num_prefill_seqs=1, num_decode_seqs=0, num_prefill_tokens=tokens,
                       num_decode_tokens=0, kv_tokens_read=0, attention_pairs=0)
    st = t.step_time(shape)
    return (st.duration_s - st.breakdown_s["overhead_s"]) / model.num_layers


class CalibratedTables:
    """Per-layer predictions from a calibration directory (for its own model only)."""

    def __init__(self, path: str | Path):
        from kvsim.calibration_data.loader import load_calibration_dir

        data = load_calibration_dir(path)
        self.meta, df = data.meta, data.df
        self.model_name = self.meta["model"]["name"]
        self.label = f"{self.meta['gpu_name']} ({self.meta['device']})"
        self.gemms = {op: interp.token_curve(df[df["op"] == op]) for op in S.LAYER_GEMMS if (df["op"] == op).any()}
        dtypes = self.meta["kv_dtypes"]
        dt = "fp16" if "fp16" in dtypes else dtypes[0]
        self.kv_dtype = dt
        dec = df[(df["op"] == S.DECODE_PAGED) & (df["dtype"] == dt)]
        pre = df[(df["op"] == S.PREFILL_PAGED) & (df["dtype"] == dt)]
        self.decode = interp.decode_tables(interp.best_impl(dec)) if len(dec) else None
        self.prefill = interp.prefill_tables(pre) if len(pre) else None


def _ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    return np.abs(pred - meas) / meas


def _records(gpu_key: str, model_name: str, op: str, meas_s: np.ndarray, analytical_s: np.ndarray,
             calibrated_s: np.ndarray | None, step_s: np.ndarray | None = None,
             gemm_s: np.ndarray | None = None) -> dict:
    rec = {"gpu": gpu_key, "model": model_name, "op": op, "rows": len(meas_s),
           "analytical_mape_pct": 100 * float(_ape(analytical_s, meas_s).mean()),
           "analytical_bias_pct": 100 * float(np.median(analytical_s / meas_s - 1)),
           "analytical_step_mape_pct": np.nan, "calibrated_mape_pct": np.nan,
           "gemm_model_mape_pct": np.nan if gemm_s is None else 100 * float(_ape(gemm_s, meas_s).mean())}
    if step_s is not None:
        rec["analytical_step_mape_pct"] = 100 * float(_ape(step_s, meas_s).mean())
    if calibrated_s is not None:
        rec["calibrated_mape_pct"] = 100 * float(_ape(calibrated_s, meas_s).mean())
    return rec


def _compare_mlp(csv: Path, gpu_key: str, model_name: str, cal: CalibratedTables | None) -> list[dict]:
    df = pd.read_csv(csv)
    df = df[df["num_tensor_parallel_workers"] == 1]
    if df.empty:
        return []
    model = model_from_csv(model_name, df.iloc[0])
    roof = Roofline(GPU_MAP[gpu_key])
    tokens = df["num_tokens"].to_numpy()
    use_cal = cal is not None and cal.model_name == model.name
    recs = []
    total_meas = np.zeros(len(df))
    total_an = np.zeros(len(df))
    total_cal = np.zeros(len(df))
    total_fit = np.zeros(len(df))
    for vop, op in VIDUR_GEMMS.items():
        meas = df[f"time_stats.{vop}.median"].to_numpy() * 1e-3
        n, k = _gemm_nk(model, op)
        an = np.array([roof.gemm(int(m), n, k) for m in tokens])
        fit = gemm.linear_time_s(tokens, n, k, GPU_MAP[gpu_key])
        calp = np.array([cal.gemms[op](float(m)) for m in tokens]) if use_cal and op in cal.gemms else None
        recs.append(_records(gpu_key, model_name, vop, meas, an, calp, gemm_s=fit))
        total_meas += meas
        total_an += an
        total_fit += fit
        if calp is not None:
            total_cal += calp
    step = np.array([analytical_step_per_layer(model, GPU_MAP[gpu_key], int(m)) for m in tokens])
    recs.append(_records(gpu_key, model_name, "layer_gemms", total_meas, total_an,
                         total_cal if use_cal and len(cal.gemms) == 4 else None, step, total_fit))
    return recs


def _compare_attention(csv: Path, gpu_key: str, model_name: str, cal: CalibratedTables | None) -> list[dict]:
    df = pd.read_csv(csv)
    df = df[df["num_tensor_parallel_workers"] == 1]
    model = MODELS[PRESET_MAP[model_name]] if model_name in PRESET_MAP else None
    if model is None or df.empty:
        return []
    roof = Roofline(GPU_MAP[gpu_key])
    use_cal = cal is not None and cal.model_name == model.name
    recs = []
    dec = df[~df["is_prefill"].astype(str).str.lower().eq("true")]
    if len(dec):
        meas = dec["attn_decode_median_ms"].astype(float).to_numpy() * 1e-3
        b = dec["batch_size"].to_numpy()
        ctx = dec["kv_cache_size"].to_numpy() + 1  # the new token attends to the cache and itself
        an = np.array([roof.attention(model, bi * ci, bi * ci) for bi, ci in zip(b, ctx)])
        calp = (np.array([cal.decode(16, float(bi), float(ci)) for bi, ci in zip(b, ctx)])
                if use_cal and cal.decode is not None else None)
        recs.append(_records(gpu_key, model_name, "attn_decode", meas, an, calp))
    pre = df[df["is_prefill"].astype(str).str.lower().eq("true")]
    if len(pre):
        meas = pre["attn_prefill_median_ms"].astype(float).to_numpy() * 1e-3
        n = pre["prefill_chunk_size"].to_numpy()
        c = pre["kv_cache_size"].to_numpy()
        an = np.array([roof.attention(model, ni + ci, ni * ci + ni * (ni + 1) / 2) for ni, ci in zip(n, c)])
        calp = (np.array([cal.prefill(16, float(ni), float(ci)) for ni, ci in zip(n, c)])
                if use_cal and cal.prefill is not None else None)
        fit = gemm.prefill_attention_time_s(n, c, model, GPU_MAP[gpu_key])
        recs.append(_records(gpu_key, model_name, "attn_prefill", meas, an, calp, gemm_s=fit))
    return recs


def run_peer_check(vidur_dir: str | Path | None = None, calibration: str | Path | None = None, *,
                   log: Callable[[str], None] = print) -> pd.DataFrame:
    """Compare and print MAPE per GPU, model and op; returns the table."""
    root = Path(vidur_dir) if vidur_dir is not None else default_vidur_dir()
    compute = root / "data" / "profiling" / "compute"
    if not compute.is_dir():
        raise CalibrationError(f"--vidur-dir {root}: no data/profiling/compute folder (expected Vidur's profiling data)")
    cal = CalibratedTables(calibration) if calibration is not None else None
    recs: list[dict] = []
    for gpu_dir in sorted(p for p in compute.iterdir() if p.is_dir()):
        if gpu_dir.name not in GPU_MAP:
            continue
        for mlp in sorted(gpu_dir.glob("*/*/mlp.csv")):
            recs += _compare_mlp(mlp, gpu_dir.name, mlp.parent.name, cal)
        for att in sorted(gpu_dir.glob("*/*/attention_sampled_rows.csv")):
            recs += _compare_attention(att, gpu_dir.name, att.parent.name, cal)
    table = pd.DataFrame(recs)
    if table.empty:
        raise CalibrationError(f"--vidur-dir {root}: no mlp.csv files for GPUs {', '.join(GPU_MAP)}")
    log(f"peer check against Vidur profiles in {root} (TP=1; per-layer medians; MAPE = mean |pred - meas| / meas)")
    log("analytical = per-op roofline with timing.analytical's constants; step = AnalyticalTiming per layer"
        + (f"; calibrated = {calibration} [{cal.model_name} on {cal.label}, {cal.kv_dtype} KV]" if cal else ""))
    if cal is not None and cal.meta["device"] == "cpu":
        log(f"NOTE: {S.CPU_LABEL} -- calibrated column is meaningless against GPU data")
    log("gemm = kvsim.timing.gemm with the GPU's fitted profile (kvsim/timing/data/gemm/<gpu>.yaml)")
    log(f"  {'gpu':<5}{'model':<28}{'op':<16}{'rows':>5}{'analytical %':>14}{'bias %':>8}{'step %':>8}"
        f"{'calibrated %':>14}{'gemm %':>8}")
    def num(v: float, width: int) -> str:
        return f"{v:>{width}.1f}" if v == v else f"{'-':>{width}}"  # NaN: not compared

    for r in table.itertuples():
        log(f"  {r.gpu:<5}{r.model:<28}{r.op:<16}{r.rows:>5}{num(r.analytical_mape_pct, 14)}"
            f"{num(r.analytical_bias_pct, 8)}{num(r.analytical_step_mape_pct, 8)}{num(r.calibrated_mape_pct, 14)}"
            f"{num(r.gemm_model_mape_pct, 8)}")
    summary = table.groupby(["gpu", "model"])["analytical_mape_pct"].mean()
    log("mean analytical MAPE over ops, per GPU and model:")
    for (g, m), v in summary.items():
        log(f"  {g:<5}{m:<28}{v:>8.1f} %")
    log("GEMM MAPE per GPU (mean over models x the four layer GEMMs; held-out = leave-one-model-out refit, "
        "from the profile's provenance):")
    ops = table[table["op"].isin(list(VIDUR_GEMMS))]
    for g, sub in ops.groupby("gpu"):
        prov = gemm.profile_for(GPU_MAP[g]).provenance
        held = prov.get("leave_one_model_out_mape_pct")
        held_s = f"{held:.1f} %" if held is not None else "-"
        every = table[(table["gpu"] == g) & table["gemm_model_mape_pct"].notna()]
        log(f"  {g:<5} analytical {sub['analytical_mape_pct'].mean():5.1f} %   "
            f"gemm model {sub['gemm_model_mape_pct'].mean():5.1f} %"
            f"   gemm held-out {held_s}   (every op the gemm model prices, layer sums and prefill attention "
            f"included: analytical {every['analytical_mape_pct'].mean():.1f} %, gemm model "
            f"{every['gemm_model_mape_pct'].mean():.1f} %)")
    return table
