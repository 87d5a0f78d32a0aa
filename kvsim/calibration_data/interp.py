"""Interpolation of calibration tables (numpy/pandas only; used by the timing model and the report).

Rules (every rule is exact at measured points):

* **Token ops** (GEMMs, elementwise): ``log(time)`` piecewise linear in ``log(tokens)``. Below the
  smallest measured count: the smallest count's time (launch-bound floor). Above the largest:
  proportional to tokens (compute-bound regime). Zero tokens cost zero.
* **Decode attention**, per block size: a table of rows keyed by batch size, each row a curve of
  time over context length with the token-op rule (log-log; floor below; proportional above).
  Between measured batch sizes, ``log(time)`` is linear in ``log(batch)``; above the largest batch,
  time is proportional to batch; below the smallest, the smallest row. Rows may have different
  context ranges (memory pruning drops large batch x context corners): each row extrapolates alone.
* **Prefill attention**, per block size: rows keyed by chunk length (new tokens, log-log between
  rows as for batch), each row a curve of time over the cached context that is *linear* in cached
  tokens (cost is affine in it: ``new * cached`` score pairs), extrapolated above with the last
  segment's slope (never negative), clamped below.
* **Block sizes**: a measured block size is used exactly. Between two measured block sizes,
  ``log(time)`` is linear in ``log2(block size)`` (both neighbours evaluated at the same batch and
  context). Outside the measured range: the nearest measured block size.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd

from kvsim.calibration_data import schema as S


@dataclass(frozen=True)
class Curve:
    """One-variable interpolant over sorted unique ``xs`` (> 0 for ``log_x``) with positive ``ys``."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    log_x: bool = True

    @classmethod
    def fit(cls, xs, ys, log_x: bool = True) -> Curve:
        """Sort, and merge duplicate x by the geometric mean of their times."""
        xs = np.asarray(xs, dtype=float)
        ys = np.asarray(ys, dtype=float)
        if len(xs) == 0:
            raise ValueError("empty curve")
        if np.any(ys <= 0) or not np.all(np.isfinite(ys)):
            raise ValueError("times must be positive and finite")
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
        ux, inv = np.unique(xs, return_inverse=True)
        counts = np.bincount(inv)
        if counts.max() == 1:  # no duplicates: keep measured values bit-exact
            return cls(tuple(xs.tolist()), tuple(ys.tolist()), log_x)
        uy = np.exp(np.bincount(inv, weights=np.log(ys)) / counts)
        return cls(tuple(ux.tolist()), tuple(uy.tolist()), log_x)

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            if self.log_x or len(xs) == 1:
                return ys[-1] * (x / xs[-1]) if self.log_x else ys[-1]
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            return ys[-1] + slope * (x - xs[-1])
        j = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[j - 1], xs[j], ys[j - 1], ys[j]
        if self.log_x:
            w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
        w = (x - x0) / (x1 - x0)
        return y0 + w * (y1 - y0)


def _geo_lerp(y0: float, y1: float, w: float) -> float:
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


@dataclass(frozen=True)
class RowTable:
    """Rows keyed by a positive count (batch, chunk length), each a :class:`Curve` over x."""

    keys: tuple[float, ...]
    rows: tuple[Curve, ...]

    def __call__(self, r: float, x: float) -> float:
        keys = self.keys
        if r <= keys[0]:
            return self.rows[0](x)
        if r >= keys[-1]:
            return self.rows[-1](x) * (r / keys[-1])
        j = bisect.bisect_right(keys, r)
        w = (math.log(r) - math.log(keys[j - 1])) / (math.log(keys[j]) - math.log(keys[j - 1]))
        return _geo_lerp(self.rows[j - 1](x), self.rows[j](x), w)


@dataclass(frozen=True)
class BlockTables:
    """One :class:`RowTable` per measured block size, with the block-size rule of the module doc."""

    block_sizes: tuple[int, ...]
    tables: tuple[RowTable, ...]

    def __call__(self, block_size: float, r: float, x: float) -> float:
        bs = self.block_sizes
        if block_size <= bs[0]:
            return self.tables[0](r, x)
        if block_size >= bs[-1]:
            return self.tables[-1](r, x)
        j = bisect.bisect_left(bs, block_size)
        if bs[j] == block_size:
            return self.tables[j](r, x)
        w = (math.log2(block_size) - math.log2(bs[j - 1])) / (math.log2(bs[j]) - math.log2(bs[j - 1]))
        return _geo_lerp(self.tables[j - 1](r, x), self.tables[j](r, x), w)


# -- builders from measurements.csv rows -----------------------------------------------------------------
def token_curve(df: pd.DataFrame) -> Curve:
    """Rows of one token op -> Curve over ``tokens``."""
    return Curve.fit(df["tokens"].to_numpy(), df["median_s"].to_numpy(), log_x=True)


def row_table(df: pd.DataFrame, row_col: str, x_col: str, log_x: bool) -> RowTable:
    keys, rows = [], []
    for key, g in sorted(df.groupby(row_col), key=lambda kv: kv[0]):
        keys.append(float(key))
        rows.append(Curve.fit(g[x_col].to_numpy(), g["median_s"].to_numpy(), log_x=log_x))
    if not keys:
        raise ValueError("empty table")
    return RowTable(tuple(keys), tuple(rows))


def best_impl(df: pd.DataFrame, impl: str | None = None) -> pd.DataFrame:
    """decode_paged rows reduced to one per (dtype, block, batch, context): the given ``impl``'s, or
    the fastest measured implementation (``impl=None``: e.g. split-K where it wins)."""
    if impl is not None:
        return df[df["impl"] == impl]
    idx = df.groupby(["dtype", "block_size", "batch", "context_len"])["median_s"].idxmin()
    return df.loc[idx.to_numpy()]


def decode_tables(df: pd.DataFrame) -> BlockTables:
    """decode_paged rows of ONE dtype (already reduced by :func:`best_impl`) -> BlockTables."""
    return _block_tables(df, "batch", "context_len", log_x=True, what="decode")


def prefill_tables(df: pd.DataFrame) -> BlockTables:
    """prefill_paged rows of ONE dtype -> BlockTables (rows: new tokens; x: cached tokens, linear)."""
    return _block_tables(df, "new_tokens", "cached_tokens", log_x=False, what="prefill")


def _block_tables(df: pd.DataFrame, row_col: str, x_col: str, log_x: bool, what: str) -> BlockTables:
    """One :func:`row_table` per block size, in block-size order."""
    sizes, tables = [], []
    for bs, g in sorted(df.groupby("block_size"), key=lambda kv: kv[0]):
        sizes.append(int(bs))
        tables.append(row_table(g, row_col, x_col, log_x=log_x))
    if not sizes:
        raise ValueError(f"no {what} rows")
    return BlockTables(tuple(sizes), tuple(tables))


# -- leave-one-out ---------------------------------------------------------------------------------------
def _loo_groups(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(op label, rows) groups that are interpolated together: token ops per op; attention per
    (op, dtype, block size) with decode reduced to the best implementation."""
    out = []
    for op in S.TOKEN_OPS:
        g = df[df["op"] == op]
        if len(g):
            out.append((op, g))
    dec = df[df["op"] == S.DECODE_PAGED]
    if len(dec):
        dec = best_impl(dec)
        for (dt, bs), g in dec.groupby(["dtype", "block_size"]):
            out.append((f"{S.DECODE_PAGED}", g))
    for op, rcol in ((S.PREFILL_PAGED, "new_tokens"), (S.DECODE_CONTIGUOUS, "batch")):
        sub = df[df["op"] == op]
        keys = ["dtype", "block_size"] if op == S.PREFILL_PAGED else ["dtype"]
        for _, g in sub.groupby(keys):
            out.append((op, g))
    return out


def _predict(op: str, train: pd.DataFrame, row: pd.Series) -> float:
    if op in S.TOKEN_OPS:
        return token_curve(train)(float(row["tokens"]))
    if op == S.PREFILL_PAGED:
        return row_table(train, "new_tokens", "cached_tokens", log_x=False)(float(row["new_tokens"]),
                                                                            float(row["cached_tokens"]))
    return row_table(train, "batch", "context_len", log_x=True)(float(row["batch"]), float(row["context_len"]))


def leave_one_out(df: pd.DataFrame) -> pd.DataFrame:
    """For every measured point of every interpolated table: predict it from the others.

    Returns rows (op, dtype, block_size, batch, context_len, new_tokens, tokens, measured_s,
    predicted_s, ape) where ``ape = |predicted - measured| / measured``. Points whose table has a
    single point are skipped (nothing to predict from).
    """
    import pandas as pd

    recs = []
    for op, g in _loo_groups(df):
        if len(g) < 2:
            continue
        for idx in g.index:
            train = g.drop(index=idx)
            row = g.loc[idx]
            pred = _predict(op, train, row)
            meas = float(row["median_s"])
            recs.append({"op": op, "dtype": row["dtype"], "block_size": int(row["block_size"]),
                         "batch": int(row["batch"]), "context_len": int(row["context_len"]),
                         "new_tokens": int(row["new_tokens"]), "tokens": int(row["tokens"]),
                         "measured_s": meas, "predicted_s": pred, "ape": abs(pred - meas) / meas})
    return pd.DataFrame(recs, columns=["op", "dtype", "block_size", "batch", "context_len", "new_tokens", "tokens",
                                       "measured_s", "predicted_s", "ape"])
