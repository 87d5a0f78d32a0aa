"""``kvsim calibrate report DIR``: how good is the interpolation, and what does paging cost?

Prints, and writes into DIR:

* ``report_loo.csv`` / ``report_loo.png`` -- leave-one-out: every measured point predicted from the
  others with the timing model's interpolation rule; MAPE per op (printed), measured vs predicted
  scatter (log-log);
* ``report_bandwidth.csv`` / ``report_bandwidth.png`` -- KV bandwidth utilisation of paged decode
  (achieved KV bytes/s / measured copy bandwidth) per block size and KV dtype, at the largest
  measured batch x context of each block size (table), and across batch x context (plot), with the
  contiguous-KV baseline for reference.

numpy/pandas/matplotlib only (Agg backend); never torch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.calibration_data import interp
from kvsim.calibration_data import schema as S
from kvsim.calibration_data.loader import load_calibration_dir
from kvsim.errors import CalibrationError


def mape_table(loo: pd.DataFrame) -> pd.DataFrame:
    if loo.empty:
        return pd.DataFrame(columns=["op", "points", "mape_pct", "p90_ape_pct", "max_ape_pct"])
    g = loo.groupby("op")["ape"]
    t = pd.DataFrame({"points": g.size(), "mape_pct": 100 * g.mean(), "p90_ape_pct": 100 * g.quantile(0.9),
                      "max_ape_pct": 100 * g.max()}).reset_index()
    order = {op: i for i, op in enumerate(S.ALL_OPS)}
    return t.sort_values("op", key=lambda s: s.map(order)).reset_index(drop=True)


def bandwidth_table(df: pd.DataFrame, copy_bw: float) -> pd.DataFrame:
    """Per (dtype, block size): utilisation at that block size's largest measured batch x context."""
    recs = []
    dec = df[df["op"] == S.DECODE_PAGED]
    if len(dec):
        dec = interp.best_impl(dec)
    cont = df[df["op"] == S.DECODE_CONTIGUOUS]
    for (dt, bs), g in list(dec.groupby(["dtype", "block_size"])) + [((dt, 0), g) for dt, g in cont.groupby("dtype")]:
        work = g["batch"] * g["context_len"]
        r = g.loc[work.idxmax()]
        recs.append({"dtype": dt, "block_size": int(bs), "impl": r["impl"], "batch": int(r["batch"]),
                     "context_len": int(r["context_len"]), "median_s": float(r["median_s"]),
                     "kv_bandwidth_bytes_per_s": float(r["achieved_bandwidth_bytes_per_s"]),
                     "fraction_of_copy_bw": float(r["achieved_bandwidth_bytes_per_s"]) / copy_bw})
    return pd.DataFrame(recs, columns=["dtype", "block_size", "impl", "batch", "context_len", "median_s",
                                       "kv_bandwidth_bytes_per_s", "fraction_of_copy_bw"])


def _plot_loo(loo: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 6))
    for op, g in loo.groupby("op"):
        ax.scatter(g["measured_s"] * 1e3, g["predicted_s"] * 1e3, s=10, alpha=0.7, label=op)
    if len(loo):
        lo = float(min(loo["measured_s"].min(), loo["predicted_s"].min())) * 1e3
        hi = float(max(loo["measured_s"].max(), loo["predicted_s"].max())) * 1e3
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms, one layer)")
    ax.set_ylabel("leave-one-out prediction (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_bandwidth(df: pd.DataFrame, copy_bw: float, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dec = df[df["op"] == S.DECODE_PAGED]
    dec = interp.best_impl(dec) if len(dec) else dec
    dtypes = sorted(dec["dtype"].unique()) if len(dec) else []
    fig, axes = plt.subplots(1, max(1, len(dtypes)), figsize=(4.5 * max(1, len(dtypes)), 4), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        g = dec[dec["dtype"] == dt]
        batches = sorted(g["batch"].unique())
        ctxs = sorted(g["context_len"].unique())
        # a few representative (batch, context) lines: corners and middle of the grid
        picks = {(batches[0], ctxs[-1]), (batches[-1], ctxs[-1]), (batches[len(batches) // 2], ctxs[len(ctxs) // 2]),
                 (batches[-1], ctxs[0])}
        for b, c in sorted(picks):
            line = g[(g["batch"] == b) & (g["context_len"] == c)].sort_values("block_size")
            if len(line):
                ax.plot(line["block_size"], line["achieved_bandwidth_bytes_per_s"] / copy_bw, "o-", ms=3,
                        label=f"batch {b}, ctx {c}")
        cont = df[(df["op"] == S.DECODE_CONTIGUOUS) & (df["dtype"] == dt)]
        if len(cont):
            r = cont.loc[(cont["batch"] * cont["context_len"]).idxmax()]
            ax.axhline(r["achieved_bandwidth_bytes_per_s"] / copy_bw, color="k", ls=":", lw=1,
                       label=f"contiguous SDPA (b {int(r['batch'])}, ctx {int(r['context_len'])})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel("KV bandwidth / copy bandwidth")
        ax.set_title(f"{dt} KV", fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_report(path: str | Path, *, log: Callable[[str], None] = print, plots: bool = True,
               force: bool = False) -> dict:
    """Compute, print and write the report; returns ``{"mape": DataFrame, "bandwidth": DataFrame, ...}``.
    A report file kvsim did not write is never overwritten without ``force`` (:func:`check_report_files`)."""
    from kvsim.calibration.runner import check_report_files

    data = load_calibration_dir(path)
    check_report_files(path, plots=plots, force=force)
    meta, df = data.meta, data.df
    copy_bw = float(meta["copy_bandwidth_bytes_per_s"])
    title = f"{meta['model']['name']} on {meta['gpu_name']} ({meta['device']}, decode {meta['decode_impl']})"
    out = Path(path)
    if meta["device"] == "cpu":
        log(f"NOTE: {meta.get('label', S.CPU_LABEL)}")
    log(f"calibration {out}: {title}; {len(df)} rows; copy bandwidth {copy_bw / 1e9:.1f} GB/s"
        + (f"; TRUNCATED ({meta.get('num_skipped', '?')} points skipped)" if meta.get("truncated") else ""))

    loo = interp.leave_one_out(df)
    mape = mape_table(loo)
    loo.to_csv(out / "report_loo.csv", index=False)
    log("leave-one-out interpolation error (each point predicted from the others):")
    log(f"  {'op':<18}{'points':>7}{'MAPE %':>9}{'p90 %':>9}{'max %':>9}")
    for r in mape.itertuples():
        log(f"  {r.op:<18}{r.points:>7}{r.mape_pct:>9.2f}{r.p90_ape_pct:>9.2f}{r.max_ape_pct:>9.2f}")
    if len(loo):
        log(f"  {'all':<18}{len(loo):>7}{100 * loo['ape'].mean():>9.2f}")

    bw = bandwidth_table(df, copy_bw)
    bw.to_csv(out / "report_bandwidth.csv", index=False)
    log("KV bandwidth utilisation of decode at the largest batch x context per block size "
        "(achieved KV bytes/s / copy bandwidth; block 0 = contiguous SDPA baseline):")
    log(f"  {'dtype':<6}{'block':>6}{'batch':>7}{'context':>9}{'ms':>10}{'GB/s':>10}{'of copy':>9}  impl")
    for r in bw.itertuples():
        log(f"  {r.dtype:<6}{r.block_size:>6}{r.batch:>7}{r.context_len:>9}{r.median_s * 1e3:>10.4f}"
            f"{r.kv_bandwidth_bytes_per_s / 1e9:>10.1f}{r.fraction_of_copy_bw:>9.3f}  {r.impl}")
    files = ["report_loo.csv", "report_bandwidth.csv"]
    if plots:
        _plot_loo(loo, out / "report_loo.png", "leave-one-out: " + title)
        _plot_bandwidth(df, copy_bw, out / "report_bandwidth.png", "KV bandwidth utilisation: " + title)
        files += ["report_loo.png", "report_bandwidth.png"]
    log("wrote " + ", ".join(str(out / f) for f in files))
    overall = float(loo["ape"].mean()) if len(loo) else float(np.nan)
    from kvsim.outdir import record_written

    record_written(out, files)  # the calibration directory's marker lists the report files too
    return {"mape": mape, "bandwidth": bw, "loo": loo, "overall_mape": overall, "files": files}
