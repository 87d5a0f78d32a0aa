"""The linear step-time fit of an engine calibration (``kvsim calibrate --engine vllm --fit linear``).

One engine step's wall time is fitted over every measured pure-decode and pure-prefill point as::

    t = a0 + g * seqs + beta * tokens + kd * decode_kv + kp * prefill_pairs

``seqs``: sequences in the step; ``tokens``: tokens computed; ``decode_kv``: KV tokens the decode
sequences read (sum of ``c_i + 1``); ``prefill_pairs``: causal (query, key) pairs of the prefill
chunks (sum of ``n c + n (n + 1) / 2``). The five terms are the ones the calibrated timing model
adds up (kvsim/timing/calibrated.py): ``gemm_lm_head(s) = a0 + g s`` (per step: fixed cost,
sampling, per-request bookkeeping), the four layer GEMMs ``beta * tokens`` (accounting buckets, as
in the exact decomposition), ``decode_paged = kd * batch * context / L`` and
``prefill_paged = kp * (n c + n (n + 1) / 2) / L``. The fit weighs every point by its own time
(least squares on relative error) and keeps every coefficient >= 0.

Why not the exact decomposition (kvsim.realengine.calibrate.decompose) on a CPU host: on a shared
machine a median of a few repeats is not monotone in batch or context (docs/studies.md (e) shows
decode at batch 8 faster than at batch 1), and interpolating between such points puts the noise
into every step between them. Five terms fitted over ~40 points average it out; the residual of each
fitted point and the error on the never-fitted mixed steps are in meta.json. The tables are written
on a dense grid from the fitted terms, so the calibrated model's interpolation reproduces the fit.
"""

from __future__ import annotations

import numpy as np

from kvsim.calibration_data import schema as S

MIN_TIME_S = 1e-7  # floor for a table entry (the log-log interpolation needs positive times)
TERMS = ("a0_s", "per_seq_s", "per_token_s", "per_decode_kv_token_s", "per_prefill_pair_s")


def table_row(op: str, *, dtype: str, block_size: int = 0, batch: int = 0, context_len: float = 0,
              new_tokens: int = 0, cached_tokens: int = 0, tokens: int = 0, median_s: float, repeats: int = 0,
              geometry=(0, 0, 0)) -> dict:
    """One measurements.csv row of an engine calibration (every time column holds ``median_s``)."""
    r = dict.fromkeys(S.COLUMNS, 0)
    t = max(median_s, MIN_TIME_S)
    r.update(op=op, impl="vllm_engine_step", device="", dtype=dtype, compute_dtype=dtype, block_size=block_size,
             batch=batch, context_len=context_len, new_tokens=new_tokens, cached_tokens=cached_tokens,
             tokens=tokens, median_s=t, p10_s=t, p90_s=t, mean_s=t, repeats=repeats, splits=1,
             heads=geometry[0], kv_heads=geometry[1], head_dim=geometry[2])
    return r


def features(p) -> list[float]:
    """The five terms' multipliers for one measured StepPoint (decode, prefill or mixed)."""
    b, n, k = p.decode_seqs, p.prefill_tokens, p.prefill_cached
    pre = 1 if n else 0
    return [1.0, float(b + pre), float(b + n), float(b * p.decode_context), float(n * k + n * (n + 1) / 2)]


def nnls_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of ``X c ~ y`` on relative error with ``c >= 0`` (active set: drop a negative term, refit)."""
    Xw, yw = X / y[:, None], np.ones_like(y)
    keep = list(range(X.shape[1]))
    while True:
        c, *_ = np.linalg.lstsq(Xw[:, keep], yw, rcond=None)
        if (c >= 0).all() or len(keep) == 1:
            out = np.zeros(X.shape[1])
            out[keep] = np.maximum(c, 0.0)
            return out
        keep.pop(int(np.argmin(c)))


def fit_linear(points: list) -> dict:
    """Fit the five terms over the decode and prefill points (medians); residuals per point."""
    fitted = [p for p in points if p.kind in ("decode", "prefill")]
    X = np.array([features(p) for p in fitted])
    y = np.array([p.median_s() for p in fitted])
    c = nnls_relative(X, y)
    res = X @ c / y - 1
    return {"model": "t = a0 + g*seqs + beta*tokens + kd*decode_kv + kp*prefill_pairs (relative least squares)",
            "terms": dict(zip(TERMS, (float(v) for v in c))),
            "fitted_points": len(fitted), "fit_mape": float(np.abs(res).mean()), "fit_max_ape": float(np.abs(res).max())}


def _grid(hi: int, ratio: float = 2 ** 0.5) -> list[int]:
    out, x = [1], 1.0
    while out[-1] < hi:
        x *= ratio
        out.append(max(out[-1] + 1, int(round(x))))
    return out


def linear_tables(points: list, num_layers: int, dtype: str, geometry: tuple[int, int, int],
                  max_model_len: int) -> tuple[list[dict], dict]:
    """Measured points -> measurements.csv rows written from the fitted terms, and the fit for meta.json."""
    fit = fit_linear(points)
    a0, g, beta, kd, kp = (fit["terms"][t] for t in TERMS)
    L = num_layers
    span = 2 * max_model_len
    rows: list[dict] = []
    for bs in sorted({p.block_size for p in points}):
        for b in _grid(1024, 2.0):
            for c in _grid(span, 2.0):
                rows.append(table_row(S.DECODE_PAGED, dtype=dtype, block_size=bs, batch=b, context_len=c,
                                      new_tokens=1, cached_tokens=c - 1, tokens=b, median_s=kd * b * c / L,
                                      geometry=geometry))
        for n in _grid(span):
            for k in (0, span):  # the model's prefill rows are linear in cached tokens: two points are exact
                rows.append(table_row(S.PREFILL_PAGED, dtype=dtype, block_size=bs, batch=1, context_len=n + k,
                                      new_tokens=n, cached_tokens=k, tokens=n,
                                      median_s=kp * (n * k + n * (n + 1) / 2) / L, geometry=geometry))
    for s in [*range(1, 257), *_grid(1 << 16, 2.0)[9:]]:
        rows.append(table_row(S.GEMM_LM_HEAD, dtype=dtype, batch=s, tokens=s, median_s=a0 + g * s))
    for op in S.LAYER_GEMMS:
        for t in _grid(1 << 16, 2.0):
            rows.append(table_row(op, dtype="bf16", batch=t, tokens=t, median_s=beta * t / (len(S.LAYER_GEMMS) * L)))
    return rows, fit
