"""``kvsim calibrate fit DIR --out PROFILE.yaml``: fit the decode-attention kernel model
(:mod:`kvsim.timing.kernel`) to measured decode rows, giving a backend profile.

What is fitted, per layer (rows are one layer each)::

    time = launch_overhead_s + unit_overhead_s * units + page_overhead_s * fetches
           + stream_bytes / (peak * max_bandwidth_utilisation * parallelism * dram_eff)

For a fixed ``units_per_sm_to_saturate`` the model is linear in (launch_overhead_s, unit_overhead_s,
page_overhead_s, 1 / max_bandwidth_utilisation) -- the additive form, so the written profile has
``overlap: 0`` and the sharp saturation cap (``bytes_in_flight_per_unit: 0``) whatever the template's
(the corpus fit, kvsim.calibration.kernel_corpus_fit, fits both) -- those are solved by least squares on relative error
(each row divided by its measured time, so short and long launches weigh alike), constrained >= 0.
``units_per_sm_to_saturate`` is found by a log-grid search refined by golden section on the
relative residual. The flags (split_kv, gqa_grouped, whole_page_reads), ``min_split_tokens`` and
``dram_chunk_half_bytes`` are taken from a template profile (``--template``): the DRAM efficiency of
short runs and the per-fetch indirection cost are both costs per page fetch and cannot be told apart
from one GPU's rows (they differ only in how they scale with bandwidth), so the fit puts the whole
per-page cost into ``page_overhead_s`` on top of the template's ``dram_chunk_half_bytes``.

Rows used: ``op == decode_paged`` (paged layout at the row's ``block_size``) and
``decode_contiguous`` (contiguous layout), of one KV dtype (``--kv-dtype``, default the first fp16 /
bf16 dtype measured), and one ``impl`` (``--impl``; default: the fastest per point, as the
calibrated timing model does). Each row is a uniform batch: ``batch`` sequences of ``context_len``.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.calibration_data import schema as S
from kvsim.errors import CalibrationError, did_you_mean


def _layout(geom: dict, kv_dtype: str, block_size: int | None):
    from kvsim.hw import KV_DTYPES
    from kvsim.timing.kernel import KVLayout

    bpt = 2 * geom["num_kv_heads"] * KV_DTYPES[kv_dtype].head_bytes(geom["head_dim"])
    return KVLayout(1, geom["num_kv_heads"], geom["num_attention_heads"], geom["head_dim"], kv_dtype, float(bpt),
                    block_size)


def _design(profile, rows: pd.DataFrame, geom: dict, kv_dtype: str, peak_bw: float, num_sms: int | None,
            units_per_sm: float) -> tuple[np.ndarray, np.ndarray]:
    """Columns (1, units, fetches, stream_bytes / (peak * par * eff)) per row, and measured times."""
    from kvsim.timing.kernel import KernelModel

    prof = replace(profile, units_per_sm_to_saturate=units_per_sm, launch_overhead_s=0.0, unit_overhead_s=0.0,
                   page_overhead_s=0.0, max_bandwidth_utilisation=1.0, overlap=0.0,
                   bytes_in_flight_per_unit=0.0)
    cols = []
    for (bs, contiguous), grp in rows.groupby(["block_size", "contiguous"], sort=True):
        lay = _layout(geom, kv_dtype, None if contiguous else int(bs))
        km = KernelModel(prof, lay, peak_bw, num_sms)
        n = grp["batch"].to_numpy(np.int64)
        c = grp["context_len"].to_numpy(np.int64)
        T = n * c
        P = n if lay.block_size is None else n * (-(-c // lay.block_size))
        stream = km.time_s(n, T, P)  # only the stream term is left (overheads zeroed, u = 1)
        # units and fetches as the model computes them
        n1 = np.maximum(n, 1)
        base = n1 * km.heads_par
        if prof.split_kv and km.units_sat is not None:
            splits = np.minimum(np.maximum(np.ceil(km.units_sat / base), 1.0),
                                np.maximum(np.ceil((T / n1) / prof.min_split_tokens), 1.0))
        else:
            splits = np.ones(len(n))
        units = base * splits
        fetches = P * lay.num_kv_heads
        cols.append(pd.DataFrame({"i": grp.index, "one": 1.0, "units": units, "fetches": fetches.astype(float),
                                  "stream": stream}))
    d = pd.concat(cols).set_index("i").loc[rows.index]
    return d[["one", "units", "fetches", "stream"]].to_numpy(float), rows["median_s"].to_numpy(float)


def _nnls_rel(A: np.ndarray, y: np.ndarray, fixed_zero: list[int]) -> tuple[np.ndarray, float]:
    """Least squares of A x ~ y on relative error with x >= 0 (active-set by dropping negatives)."""
    W = A / y[:, None]
    active = [j for j in range(A.shape[1]) if j not in fixed_zero]
    while True:
        x = np.zeros(A.shape[1])
        if active:
            sol, *_ = np.linalg.lstsq(W[:, active], np.ones(len(y)), rcond=None)
            x[active] = sol
        neg = [j for j in active if x[j] < 0]
        if not neg:
            break
        active.remove(min(neg, key=lambda j: x[j]))
    r = W @ x - 1.0
    return x, float(np.sqrt(np.mean(r * r)))


def fit_rows(rows: pd.DataFrame, geom: dict, kv_dtype: str, template, peak_bw: float, num_sms: int | None,
             name: str, reference_gpu: str, where: str = "the decode rows"):
    """A fitted :class:`~kvsim.timing.kernel.BackendProfile` and fit statistics. ``where`` names the rows'
    source (the calibration directory) in errors."""
    if len(rows) < 4:
        raise CalibrationError(f"only {len(rows)} usable decode rows: the kernel fit needs at least 4")
    has_pages = bool((~rows["contiguous"]).any())
    fixed_zero = [] if has_pages else [2]  # without paged rows the per-page cost is not measurable

    def solve(u):
        A, y = _design(template, rows, geom, kv_dtype, peak_bw, num_sms, u)
        x, err = _nnls_rel(A, y, fixed_zero)
        if x[3] <= 0:
            return x, err + 1e9  # no bandwidth term: not a usable fit
        return x, err

    if num_sms is None:
        best_u = template.units_per_sm_to_saturate
    else:
        grid = np.exp(np.linspace(math.log(0.125), math.log(256.0), 23))
        errs = [solve(u)[1] for u in grid]
        k = int(np.argmin(errs))
        lo, hi = math.log(grid[max(k - 1, 0)]), math.log(grid[min(k + 1, len(grid) - 1)])
        g = (math.sqrt(5) - 1) / 2
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        fa, fb = solve(math.exp(a))[1], solve(math.exp(b))[1]
        for _ in range(36):
            if fa < fb:
                hi, b, fb = b, a, fa
                a = hi - g * (hi - lo)
                fa = solve(math.exp(a))[1]
            else:
                lo, a, fa = a, b, fb
                b = lo + g * (hi - lo)
                fb = solve(math.exp(b))[1]
        best_u = math.exp((lo + hi) / 2)
        if errs[k] < min(fa, fb):
            best_u = float(grid[k])
    x, err = solve(best_u)
    if not x[3] > 0:  # degenerate rows (flat times): no bandwidth term, 1 / x[3] would be inf
        ops = "/".join(sorted(set(np.where(rows["contiguous"], S.DECODE_CONTIGUOUS, S.DECODE_PAGED))))
        raise CalibrationError(f"{where}: the {ops} rows' times do not grow with the KV bytes read, so no "
                               f"bandwidth term fits (max_bandwidth_utilisation would be infinite); calibrate fit "
                               f"needs kernel timings from `kvsim calibrate --device ...`")
    umax = 1.0 / x[3]
    if umax > 1.0:
        raise CalibrationError(f"fitted max_bandwidth_utilisation {umax:.3f} exceeds 1 (faster than peak HBM "
                               f"bandwidth {peak_bw:.3g} B/s): wrong GPU (--gpu) or rows that hit the L2 cache")
    prof = replace(template, name=name, reference_gpu=reference_gpu, overlap=0.0, bytes_in_flight_per_unit=0.0,
                   launch_overhead_s=float(x[0]),
                   unit_overhead_s=float(x[1]), page_overhead_s=float(x[2]), max_bandwidth_utilisation=float(umax),
                   units_per_sm_to_saturate=float(best_u),
                   description=f"fitted by kvsim calibrate fit from {len(rows)} decode rows "
                               f"(template {template.name}, KV dtype {kv_dtype})", source="")
    A, y = _design(prof, rows, geom, kv_dtype, peak_bw, num_sms, best_u)
    pred = A @ x
    mape = float(np.mean(np.abs(pred - y) / y))
    return prof, {"rows": int(len(rows)), "rms_rel_error": err, "mape": mape}


def decode_rows(df: pd.DataFrame, kv_dtype: str, impl: str | None) -> pd.DataFrame:
    sel = df[df["op"].isin([S.DECODE_PAGED, S.DECODE_CONTIGUOUS]) & (df["dtype"] == kv_dtype)].copy()
    if impl is not None:
        paged = sorted(set(sel.loc[sel["op"] == S.DECODE_PAGED, "impl"].astype(str)))
        if impl not in paged:
            raise CalibrationError(f"--impl {impl!r}: no paged decode rows of that implementation "
                                   f"({kv_dtype}); measured: {', '.join(paged) or 'none'}")
        sel = sel[(sel["impl"] == impl) | (sel["op"] == S.DECODE_CONTIGUOUS)]
    sel["contiguous"] = sel["op"] == S.DECODE_CONTIGUOUS
    # fastest implementation per point (what an engine would launch)
    sel = sel.sort_values("median_s").drop_duplicates(["contiguous", "block_size", "batch", "context_len"])
    return sel.sort_values(["contiguous", "block_size", "batch", "context_len"]).reset_index(drop=True)


FIT_HEADER = "# kvsim backend profile fitted by `kvsim calibrate fit "


def _fitted_here(path: Path) -> bool:
    """Whether ``path`` is a profile an earlier ``kvsim calibrate fit`` wrote (its first line)."""
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().startswith(FIT_HEADER)
    except (OSError, UnicodeDecodeError):
        return False


def _check_out(outp: Path, force: bool) -> None:
    """May the fit write its profile to ``outp``? One line (exit 2) when not: a directory, a file the fit did
    not write (without ``--force``), or a path that cannot be created (a parent that is a file, /proc)."""
    from kvsim.errors import ConfigError
    from kvsim.outdir import check_creatable

    if outp.is_dir():
        raise CalibrationError(f"--out {outp}: is a directory; give the profile's file name (e.g. {outp / 'fitted.yaml'})")
    if outp.exists() and not force and not _fitted_here(outp):
        raise CalibrationError(f"--out {outp}: file exists and is not a profile `kvsim calibrate fit` wrote "
                               f"(kvsim does not overwrite files it did not write; pass --force to replace it)")
    try:
        check_creatable(outp, "--out")  # probes where outp goes: a read-only or virtual folder (/proc) fails
    except ConfigError as e:
        raise CalibrationError(str(e)) from None


def run_fit(dir_: str, out: str, *, template: str = "vllm-paged-v1", gpu: str | None = None,
            kv_dtype: str | None = None, impl: str | None = None, name: str | None = None,
            force: bool = False) -> dict:
    """Fit, write the profile YAML to ``out``; returns the stats (printed by the CLI)."""
    import yaml

    from kvsim.calibration_data.loader import load_calibration_dir
    from kvsim.hw import GPUS
    from kvsim.timing.kernel import load_backend

    outp = Path(out)
    _check_out(outp, force)  # before any work: one line, exit 2
    data = load_calibration_dir(dir_)
    meta = data.meta
    if meta.get("source") == "engine":
        raise CalibrationError(f"{data.meta_path}: field 'source' is 'engine': an engine calibration (`kvsim calibrate "
                               f"--engine ...`) whose decode rows are whole engine steps, not kernel timings; "
                               f"calibrate fit needs a kernel calibration from `kvsim calibrate --device ...`")
    gpu_name = gpu or meta.get("gpu_name")
    if gpu is not None and gpu not in GPUS:
        raise CalibrationError(f"--gpu {gpu!r}: not a GPU preset; choose one of {', '.join(sorted(GPUS))} "
                               f"(for its peak bandwidth and SM count){did_you_mean(gpu, GPUS)}")
    if gpu_name not in GPUS:
        raise CalibrationError(f"{data.meta_path}: field 'gpu_name' is {gpu_name!r}, not a GPU preset; give --gpu "
                               f"(one of {', '.join(sorted(GPUS))}) for its peak bandwidth and SM count")
    spec = GPUS[gpu_name]
    if meta.get("device") == "cpu":  # a warning, not an error: plumbing data can still test the fit
        print(f"kvsim calibrate fit: warning: {data.meta_path} records device 'cpu' (plumbing data, not GPU "
              f"timings): the profile fitted for {gpu_name} will not describe that GPU", file=sys.stderr)
    if kv_dtype is None:
        kv_dtype = next((d for d in meta["kv_dtypes"] if d in ("fp16", "bf16")), None)
        if kv_dtype is None:
            raise CalibrationError(f"{data.meta_path}: field 'kv_dtypes' has no fp16/bf16; give --kv-dtype")
    elif kv_dtype not in meta["kv_dtypes"]:
        raise CalibrationError(f"{data.meta_path}: field 'kv_dtypes' is {meta['kv_dtypes']}: no {kv_dtype!r} rows")
    tmpl = load_backend(template, where="--template")
    rows = decode_rows(data.df, kv_dtype, impl)
    if rows.empty:
        raise CalibrationError(f"{data.csv_path}: no decode_paged/decode_contiguous rows with dtype={kv_dtype!r}")
    _check_out(outp, force)  # again: it may have changed while loading
    prof, stats = fit_rows(rows, meta["model"], kv_dtype, tmpl, spec.hbm_bandwidth_bytes_per_s, spec.num_sms,
                           name or f"fitted-{gpu_name}", gpu_name, where=str(data.csv_path))
    header = (f"{FIT_HEADER}{dir_}` (device {meta['device']}, "
              f"GPU {gpu_name}, KV dtype {kv_dtype}).\n# {stats['rows']} rows; MAPE {stats['mape']:.4f}; "
              f"RMS relative error {stats['rms_rel_error']:.4f}. Use it as timing.attention_backend: {outp.name}\n")
    if meta["device"] == "cpu":
        header += f"# {S.CPU_LABEL}\n"
    outp.parent.mkdir(parents=True, exist_ok=True)
    tmp = outp.with_name(f".{outp.name}.tmp-{os.getpid()}")
    tmp.write_text(header + yaml.safe_dump(prof.to_yaml_dict(), sort_keys=False))
    os.replace(tmp, outp)  # a rerun replaces the earlier fit at once; never a half-written profile
    return {"profile": str(outp), "gpu": gpu_name, "kv_dtype": kv_dtype, **stats, **prof.to_yaml_dict()}
