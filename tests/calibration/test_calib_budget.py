"""The time budget of ``kvsim calibrate``: every op the calibrated timing model needs gets its point
before any extra point, time later phases leave unused flows back, and a budget too small for that
minimum fails (one line, exit 2) without writing a directory (issue: truncated calibration rc 0)."""

from __future__ import annotations

import pandas as pd
import pytest

from kvsim.calibration_data import schema as S
from kvsim.hw import ModelSpec

TINY = ModelSpec("tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=256, num_params=1e5, max_model_len_tokens=1024)


def _grid():
    from kvsim.calibration.grid import CPU_GRID, restrict

    return restrict(CPU_GRID, kv_dtypes=["fp16"], block_sizes=[16], repeats=1, warmup=0)


def test_missing_ops_is_the_loaders_definition():
    df = pd.DataFrame({"op": [S.DECODE_PAGED, S.PREFILL_PAGED, *S.LAYER_GEMMS],
                       "dtype": ["fp16", "fp16", *["bf16"] * len(S.LAYER_GEMMS)]})
    assert S.missing_ops(df, ("fp16",)) == []
    assert S.missing_ops(df, ("fp16", "fp8")) == ["decode_paged fp8", "prefill_paged fp8"]
    assert S.missing_ops(df, ("fp16",), S.DEFAULT_OPTIONAL_OPS) == [S.GEMM_LM_HEAD, S.ELEMENTWISE]
    assert S.missing_ops(df[df["op"] != S.GEMM_MLP_DOWN], ("fp16",)) == [S.GEMM_MLP_DOWN]


def test_phase_shares_never_starve_an_op_and_unused_time_flows_back(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from kvsim.calibration import runner

    # every phase's share is spent at once (the GEMM share too small, as QA saw on CPU)
    monkeypatch.setattr(runner._PhaseClock, "out_of_time_for", lambda self, *a, **k: (lambda: True))
    out = runner.run_calibration(tmp_path / "cal", device="cpu", model=TINY, grid=_grid(), time_budget_s=300,
                                 log=lambda m: None)
    df = pd.read_csv(out / S.CSV_FILE)
    assert S.missing_ops(df, ("fp16",), S.DEFAULT_OPTIONAL_OPS) == []
    g = _grid()
    # the budget left over after the phases measured the GEMM/elementwise points their share skipped
    for op in (*S.LAYER_GEMMS, S.ELEMENTWISE):
        assert sorted(df[df["op"] == op]["tokens"]) == sorted(g.gemm_tokens), op
    assert sorted(df[df["op"] == S.GEMM_LM_HEAD]["tokens"]) == sorted(g.lm_head_tokens)
    assert not any(k.split(" ", 1)[0] in S.TOKEN_OPS for k in __import__("json").loads(
        (out / S.META_FILE).read_text())["skipped"])


def test_a_budget_too_small_for_the_minimum_fails_and_writes_nothing(tmp_path):
    pytest.importorskip("torch")
    from kvsim.calibration.runner import run_calibration
    from kvsim.errors import CalibrationError

    with pytest.raises(CalibrationError, match=r"^--time-budget-s 1e-06 ran out: no rows for decode_paged fp16, .*"
                                               r"gemm_mlp_down.*; a budget of .* s would cover them; nothing written$"):
        run_calibration(tmp_path / "cal", device="cpu", model=TINY, grid=_grid(), time_budget_s=1e-6,
                        log=lambda m: None)
    assert not (tmp_path / "cal").exists()


def test_cli_exits_2_with_one_line_for_a_budget_too_small(tmp_path):
    pytest.importorskip("torch")
    from test_calib_cli import kvsim

    r = kvsim("--device", "cpu", "--out", str(tmp_path / "cal"), "--kv-dtypes", "fp16", "--block-sizes", "16",
              "--time-budget-s", "0.001", check=False)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "ran out: no rows for" in err[0] and "would cover them" in err[0], r.stderr
    assert not (tmp_path / "cal").exists()
