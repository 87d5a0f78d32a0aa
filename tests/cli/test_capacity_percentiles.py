"""`kvsim capacity` with percentile SLOs (p99_ttft_ms=..), the exact reuse of the trace between
bisection steps, and the progress lines (kvsim/capacity/)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvsim.capacity import TraceCache, capacity, parse_slo, percentile_values
from kvsim.cli import main
from kvsim.config import load_scenario
from kvsim.errors import ConfigError
from kvsim.simulate import build_trace
from test_capacity import SCENARIO  # the small synthetic two-variant scenario



def test_parse_percentile_objectives():
    assert parse_slo("p99_ttft_ms=2000, p50_tpot_ms=100,e2e_ms=9e3") == {
        "p99_ttft_ms": 2000.0, "p50_tpot_ms": 100.0, "e2e_ms": 9000.0}
    assert parse_slo("p99.9_e2e_ms=5") == {"p99.9_e2e_ms": 5.0}
    for bad, msg in (("p100_ttft_ms=5", "between 0 and 100"), ("p0_tpot_ms=5", "between 0 and 100"),
                     ("p99_ttft=5", "did you mean 'p99_ttft_ms'"), ("p99_ttft_ms=-3", "positive"),
                     ("p99_latency_ms=5", "pQ_ttft_ms")):
        with pytest.raises(ConfigError, match=msg):
            parse_slo(bad)


def test_percentiles_are_nearest_rank_over_every_request():
    reqs = pd.DataFrame({
        "status": ["finished"] * 8 + ["rejected", "finished"],
        "ttft_s": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, np.nan, 0.9],
        "tpot_s": [0.01] * 9 + [np.nan],
        "e2e_s": [1.0] * 10,
        "output_tokens": [10] * 9 + [1],  # the last one has a single output token: TPOT 0
    })
    got = percentile_values(reqs, {"p50_ttft_ms": 1, "p90_ttft_ms": 1, "p95_ttft_ms": 1, "p10_tpot_ms": 1})
    assert got["p50_ttft_ms"] == pytest.approx(500.0)  # 5th of 10
    assert got["p90_ttft_ms"] == pytest.approx(900.0)  # 9th of 10: the rejected request is the 10th
    assert math.isinf(got["p95_ttft_ms"])  # the 10th: unserved
    assert got["p10_tpot_ms"] == 0.0


def test_trace_reuse_is_exact(tmp_path):
    scn_file = tmp_path / "c.yaml"
    scn_file.write_text(SCENARIO)
    scn = load_scenario(scn_file).runs["paged-16"]
    cache = TraceCache(tmp_path)
    for scale in (0.25, 1.7, 3.0):
        s = scn.model_copy(update={"trace": scn.trace.model_copy(update={"rate_scale": scale})})
        want, want_report = build_trace(s, tmp_path)
        got, got_report = cache.get(s, scale)
        assert got_report == want_report
        for col in ("arrival_s", "prompt_tokens", "output_tokens"):
            assert np.array_equal(getattr(got, col), getattr(want, col)), col
            assert getattr(got, col).tobytes() == getattr(want, col).tobytes()
    assert len(cache._unscaled) == 1


def test_p90_equals_joint_attainment_090(tmp_path):
    """p90_ttft_ms=T holds exactly when 90 % of the requests have TTFT <= T: the same search as the
    joint objective ttft_ms=T with attainment 0.9."""
    scn_file = tmp_path / "c.yaml"
    scn_file.write_text(SCENARIO)
    loaded = load_scenario(scn_file)
    joint = capacity(loaded, {"ttft_ms": 500.0}, attainment=0.9, lo=0.25, hi=64, tol=0.5)
    pct = capacity(loaded, {"p90_ttft_ms": 500.0}, attainment=0.3, lo=0.25, hi=64, tol=0.5)  # attainment unused
    for a, b in zip(joint, pct):
        assert (a.status, a.capacity_rate_scale, a.first_failing_rate_scale) == \
               (b.status, b.capacity_rate_scale, b.first_failing_rate_scale)
        for e in b.evaluations:
            assert e.meets == (e.percentiles_ms["p90_ttft_ms"] <= 500.0)
    assert any(r.status == "ok" for r in pct)


def test_command_with_percentiles_and_progress(tmp_path, capsys):
    scn_file = tmp_path / "c.yaml"
    scn_file.write_text(SCENARIO)
    out = tmp_path / "out"
    argv = ["capacity", str(scn_file), "--slo", "p99_ttft_ms=2000,p50_tpot_ms=100", "--lo", "0.25", "--hi", "64",
            "--tol", "1.0", "--out", str(out), "--variant", "paged-16"]
    assert main(argv) == 0
    cap = capsys.readouterr()
    steps = [ln for ln in cap.err.splitlines() if ln.startswith("capacity paged-16 step ")]
    assert steps and all("p99_ttft_ms" in ln and "p50_tpot_ms" in ln and ln.endswith(" s]") for ln in steps)
    df = pd.read_csv(out / "capacity.csv").set_index("variant")
    row = df.loc["paged-16"]
    assert row["p99_ttft_ms"] == 2000 and row["p50_tpot_ms"] == 100
    assert row["p99_ttft_ms_at_capacity"] <= 2000 and row["p50_tpot_ms_at_capacity"] <= 100
    assert len(steps) == row["evaluations"]
    assert main(argv + ["-q"]) == 0
    assert "step" not in capsys.readouterr().err
