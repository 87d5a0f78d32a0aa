"""The constants ``bench/validate_serving.py --fit`` fits: per engine profile, on that profile's fit
cases only, the timing constants that have no public figure (docs/validation.md, "The fit")."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

# --fit: the constants fitted per engine profile on that profile's fit cases (every other timing
# term keeps its sourced value); a profile not named here fits nothing. docs/validation.md, "The fit".
FIT_PARAMS = {"vllm-v1": ("step_overhead_s", "moe_layer_s", "per_prefill_seq_s"),
              "vllm-v0.6": ("step_overhead_s", "per_arrival_s")}  # V0 takes requests in on its engine loop
# sglang: nothing left to fit -- its MoE layers are the fitted MoE kernel (kvsim/timing/moe_kernel.py,
# fitted to kernel readings, not to serving runs); moe_layer_s prices only MoE layers without a kernel profile
FIT_STEP = {"step_overhead_s": 1e-3, "moe_layer_s": 5e-5, "per_prefill_seq_s": 5e-3,
            "per_arrival_s": 5e-3}  # finite differences
OVERHEAD_PARAMS = ("per_prefill_seq_s", "per_arrival_s")  # terms of timing.overhead
FIT_METRICS = ("request_throughput", "tpot_ms", "ttft_ms")


def param_overrides(values: dict[str, float], profile: str | None = None) -> list[str]:
    """``--set`` overrides that give a case these fitted constants. ``timing.overhead`` is set as a
    whole, so the other overhead terms of ``profile`` (its ``per_seq_s``, fitted on engine-log windows
    by bench/engine_windows.py, not here) are written beside the fitted ones (:data:`OVERHEAD_PARAMS`)."""
    out = []
    if "step_overhead_s" in values:
        out.append(f"timing.step_overhead_s={values['step_overhead_s']!r}")
    if "moe_layer_s" in values:
        out.append(f"timing.moe_layer_s={values['moe_layer_s']!r}")
    fitted = {k: values[k] for k in OVERHEAD_PARAMS if k in values}
    if fitted:
        terms = {**_profile_overhead(profile), **fitted}
        out.append("timing.overhead={" + ", ".join(f"{k}: {v!r}" for k, v in terms.items()) + "}")
    return out


def _profile_overhead(profile: str | None) -> dict[str, float]:
    from kvsim.config.profiles import profile_fills

    if profile is None:
        return {}
    fill = profile_fills(profile).get("timing[analytical].overhead")
    return dict(fill.value) if fill is not None and fill.value else {}


def zero_values(row: dict) -> dict[str, float]:
    return {p: 0.0 for p in FIT_PARAMS.get(row["engine_profile"], ())}


def nnls(a: list[list[float]], y: list[float]) -> list[float]:
    """Least squares ``min |A x - y|`` with ``x >= 0`` for a few unknowns: the best unconstrained
    solution over every subset of free unknowns that is non-negative (the others 0)."""
    A, Y = np.asarray(a, dtype=float), np.asarray(y, dtype=float)
    k = A.shape[1]
    best, best_r = [0.0] * k, float(Y @ Y)
    for size in range(1, k + 1):
        for free in itertools.combinations(range(k), size):
            sub = A[:, free]
            x, *_ = np.linalg.lstsq(sub, Y, rcond=None)
            if (x < 0).any():
                continue
            r = float(((sub @ x - Y) ** 2).sum())
            if r < best_r - 1e-15:
                full = [0.0] * k
                for i, v in zip(free, x):
                    full[i] = float(v)
                best, best_r = full, r
    return best


def robust_fit(a: list[list[float]], y: list[float], iterations: int = 500) -> list[float]:
    """``min sum |A x - y|`` with ``x >= 0`` (least absolute deviations, by iteratively reweighted
    :func:`nnls`, weights ``1 / max(|residual|, 1e-6)``): a case that misses for a reason these
    constants do not stand for moves the fit by its sign, not by its size. Deterministic."""
    A, Y = np.asarray(a, dtype=float), np.asarray(y, dtype=float)
    x = np.asarray(nnls(a, y))
    for _ in range(iterations):
        w = np.sqrt(1.0 / np.maximum(np.abs(A @ x - Y), 1e-6))
        new = np.asarray(nnls((A * w[:, None]).tolist(), (Y * w).tolist()))
        if np.allclose(new, x, rtol=1e-10, atol=1e-13):
            break
        x = new
    return [float(v) for v in x]


def fit_constants(rows: list[dict], zero: dict[str, dict], bumped: dict[str, dict[str, dict]],
                  targets: dict[str, float], published: Callable[[dict, str], float]) -> dict:
    """Per engine profile, the constants of :data:`FIT_PARAMS` fitted on its fit cases: the least
    absolute sum (:func:`robust_fit`), every constant >= 0, of each published target metric's error
    relative to its bound (``(published - kvsim) / (bound x published)``: 1 is a case at the edge
    of its target), the metrics linearised around the run without the fitted constants (``zero``)
    by finite differences (``bumped[param]``: the fit cases run with that constant at
    :data:`FIT_STEP` and the others 0). Held-out cases never enter."""
    out = {}
    for profile, params in FIT_PARAMS.items():
        a, y, used = [], [], []
        for row in rows:
            if row["split"] != "fit" or row["engine_profile"] != profile:
                continue
            cid = row["case_id"]
            for m in FIT_METRICS:
                pub = published(row, m)
                if pub != pub or pub == 0:
                    continue
                w = 1.0 / (targets[m] * pub)
                y.append((pub - zero[cid][m]) * w)
                a.append([(bumped[p][cid][m] - zero[cid][m]) / FIT_STEP[p] * w for p in params])
                used.append(f"{cid}:{m}")
        if not a:
            continue
        x = robust_fit(a, y)
        out[profile] = {"values": {p: round(v, 6 if p == "step_overhead_s" else 7) for p, v in zip(params, x)},
                        "observations": used}
    return out


# --fit: the all-reduce through host memory (parallel.gpu_p2p: false) has no public figure for its
# efficiency and per-all-reduce latency; they are fitted on the fit cases whose server log says the
# GPUs had no peer access, by a grid (the efficiency enters the step time as 1/x, not linearly).
HOST_GRID = {"efficiency": (0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.4),
             "latency_s": (0.0, 10e-6, 20e-6, 40e-6, 60e-6, 80e-6, 120e-6, 160e-6)}
HOST_SOURCED = {"efficiency": 1.0, "latency_s": 0.0}  # the host link's copy rate alone, no fixed cost


def host_overrides(values: dict[str, float]) -> list[str]:
    """``--set`` overrides that give a no-peer-access case these host-path constants."""
    return [f"parallel.host_allreduce_efficiency={values['efficiency']!r}",
            f"parallel.host_allreduce_latency_s={values['latency_s']!r}"]


def target_error(row: dict, pred: dict, targets: dict[str, float], published: Callable[[dict, str], float]) -> float:
    """The fit's objective on one case: over :data:`FIT_METRICS` with a published value, the sum of
    ``|kvsim - published| / (bound x published)`` (1: a metric at the edge of its target)."""
    total = 0.0
    for m in FIT_METRICS:
        pub = published(row, m)
        if pub == pub and pub != 0:
            total += abs(pred[m] - pub) / (targets[m] * pub)
    return total


def fit_host_path(rows: list[dict], predict: Callable[[dict, dict], dict], targets: dict[str, float],
                  published: Callable[[dict, str], float]) -> dict:
    """The :data:`HOST_GRID` point with the least summed :func:`target_error` over ``rows`` (the fit
    cases without peer access; ``predict(row, values)``: their metrics with these constants). Ties
    go to the first point in grid order, so the fit is deterministic."""
    best, best_err, used = None, math.inf, [r["case_id"] for r in rows]
    for eff, lat in itertools.product(HOST_GRID["efficiency"], HOST_GRID["latency_s"]):
        values = {"efficiency": eff, "latency_s": lat}
        err = sum(target_error(r, predict(r, values), targets, published) for r in rows)
        if err < best_err - 1e-12:
            best, best_err = values, err
    return {"values": best, "objective": round(best_err, 6), "cases": used}
