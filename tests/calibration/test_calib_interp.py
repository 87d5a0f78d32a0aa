"""Interpolation rules of the calibrated timing model (pure numpy; no torch)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvsim.calibration_data import interp
from kvsim.calibration_data import schema as S


def test_curve_exact_at_points_and_loglog_between():
    c = interp.Curve.fit([1, 4, 16], [1e-5, 2e-5, 8e-5])
    for x, y in [(1, 1e-5), (4, 2e-5), (16, 8e-5)]:
        assert c(x) == pytest.approx(y, rel=1e-12)
    # log-log midpoint between (4, 2e-5) and (16, 8e-5): x = 8 -> geometric mean
    assert c(8) == pytest.approx(math.sqrt(2e-5 * 8e-5), rel=1e-12)
    assert c(0.5) == 1e-5  # clamped below (launch floor)
    assert c(32) == pytest.approx(16e-5)  # proportional above


def test_curve_linear_mode_for_cached_context():
    c = interp.Curve.fit([0, 100], [1.0, 3.0], log_x=False)
    assert c(50) == pytest.approx(2.0)
    assert c(200) == pytest.approx(5.0)  # last segment's slope
    flat = interp.Curve.fit([0, 100], [3.0, 1.0], log_x=False)
    assert flat(200) == pytest.approx(1.0)  # never a negative slope above the range


def test_curve_merges_duplicates_geometrically():
    c = interp.Curve.fit([2, 2, 8], [1.0, 4.0, 8.0])
    assert c(2) == pytest.approx(2.0)


def test_curve_rejects_bad_times():
    with pytest.raises(ValueError):
        interp.Curve.fit([1, 2], [1.0, 0.0])


def _decode_df(block_sizes=(8, 32), batches=(1, 4), contexts=(128, 512)):
    rows = []
    for bs in block_sizes:
        for b in batches:
            for c in contexts:
                t = 1e-5 + 1e-9 * b * c * (1 + 8 / bs)  # smaller blocks cost a little more
                rows.append({"op": S.DECODE_PAGED, "impl": S.IMPL_TRITON, "dtype": "fp16", "block_size": bs,
                             "batch": b, "context_len": c, "new_tokens": 1, "cached_tokens": c - 1, "tokens": b,
                             "median_s": t})
                rows.append({**rows[-1], "impl": S.IMPL_TRITON_SPLITK, "median_s": t * (0.5 if b == 1 else 2)})
    return pd.DataFrame(rows)


def test_decode_tables_best_impl_exact_and_block_rule():
    df = _decode_df()
    best = interp.best_impl(df)
    assert len(best) == len(df) // 2
    t = interp.decode_tables(best)
    assert t.block_sizes == (8, 32)
    for r in best.itertuples():
        assert t(r.block_size, r.batch, r.context_len) == pytest.approx(r.median_s, rel=1e-12)
    # block 16 = log2-midpoint of 8 and 32: geometric mean of the neighbours
    a, b = t(8, 4, 512), t(32, 4, 512)
    assert t(16, 4, 512) == pytest.approx(math.sqrt(a * b), rel=1e-12)
    assert t(1, 4, 512) == a and t(512, 4, 512) == b  # nearest outside the measured range
    only_triton = interp.best_impl(df, S.IMPL_TRITON)
    assert (only_triton["impl"] == S.IMPL_TRITON).all()


def test_row_table_batch_interpolation_and_extrapolation():
    df = _decode_df(block_sizes=(16,), batches=(1, 4, 16))
    t = interp.decode_tables(interp.best_impl(df))
    t4, t16 = t(16, 4, 512), t(16, 16, 512)
    assert t(16, 8, 512) == pytest.approx(math.sqrt(t4 * t16), rel=1e-12)
    assert t(16, 32, 512) == pytest.approx(2 * t16, rel=1e-12)  # proportional above the largest batch


def test_ragged_rows_extrapolate_independently():
    """A pruned corner (largest batch lacks the longest context) still predicts sensibly."""
    df = _decode_df(block_sizes=(16,), batches=(1, 4), contexts=(128, 512))
    df = df[~((df["batch"] == 4) & (df["context_len"] == 512))]
    t = interp.decode_tables(interp.best_impl(df))
    assert t(16, 4, 512) == pytest.approx(4 * t(16, 4, 128), rel=1e-12)


def test_leave_one_out_on_linear_data_is_small():
    rows = [{"op": S.GEMM_QKV, "impl": "x", "dtype": "bf16", "block_size": 0, "batch": m, "context_len": 0,
             "new_tokens": 0, "cached_tokens": 0, "tokens": m, "median_s": 1e-6 * m} for m in (1, 2, 4, 8, 16)]
    loo = interp.leave_one_out(pd.DataFrame(rows))
    assert len(loo) == 5
    above = loo[loo["tokens"] > 1]
    assert above["ape"].max() < 1e-9  # proportional data: exact inside and extrapolated above
    bottom = loo[loo["tokens"] == 1]["ape"].iloc[0]
    assert bottom == pytest.approx(1.0)  # below the range the floor rule clamps to t(2) = 2 t(1)
