"""`kvsim capacity`: the bisection on a known attainment curve, the SLO parser, and the command on a
small synthetic scenario (paged KV serves a higher rate than contiguous max-reservation)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.capacity import Evaluation, parse_slo, search, write_outputs
from kvsim.cli import main
from kvsim.errors import ConfigError


def curve(threshold):
    """Attainment 1 up to ``threshold``, then 0.5: a step the bisection must bracket."""
    calls = []

    def evaluate(scale):
        calls.append(scale)
        att = 1.0 if scale <= threshold else 0.5
        return Evaluation(scale, scale * 2.0, att, att * scale, scale, 100, 0, att >= 0.9)

    return evaluate, calls


@pytest.mark.parametrize("threshold", [0.3, 1.0, 3.7, 7.9])
def test_bisection_brackets_the_threshold(threshold):
    ev, calls = curve(threshold)
    r = search(ev, 0.25, 8.0, 0.01, name="v")
    assert r.status == "ok"
    assert r.capacity_rate_scale <= threshold < r.first_failing_rate_scale
    assert r.first_failing_rate_scale / r.capacity_rate_scale <= 1.01
    assert r.capacity_offered_rate_req_per_s == pytest.approx(2 * r.capacity_rate_scale)
    assert len(calls) == len(set(calls)) <= 2 + 12  # each scale once; log2(ln 32 / ln 1.01) ~ 8.5 halvings
    assert [e.rate_scale for e in r.evaluations] == sorted(calls)


def test_out_of_range():
    ev, _ = curve(0.1)
    r = search(ev, 0.25, 8.0, 0.05)
    assert r.status == "below_range" and r.capacity_rate_scale is None and r.first_failing_rate_scale == 0.25
    ev, calls = curve(100.0)
    r = search(ev, 0.25, 8.0, 0.05)
    assert r.status == "above_range" and r.capacity_rate_scale == 8.0 and len(calls) == 2


def test_parse_slo():
    assert parse_slo("ttft_ms=500, tpot_ms=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    for bad, msg in (("ttft=5", "did you mean 'ttft_ms'"), ("ttft_ms", "KEY=MS"), ("tpot_ms=-1", "positive"),
                     ("e2e_ms=inf", "finite"), ("", "at least one"), ("ttft_ms=abc", "not a number")):
        with pytest.raises(ConfigError, match=msg):
            parse_slo(bad)


SCENARIO = """
name: cap-test
trace:
  synthetic: {preset: sharegpt, num_requests: 60, arrival: {process: poisson, rate_per_s: 2.0}}
  length_policy: cap
model: OPT-13B
gpu: A100-40GB
variants:
  paged-16: {allocator: {kind: paged, block_size: 16}}
  contiguous-max: {allocator: {kind: contiguous, reservation: max}}
"""


def test_capacity_command(tmp_path, capsys):
    scn = tmp_path / "cap.yaml"
    scn.write_text(SCENARIO)
    out = tmp_path / "out"
    argv = ["capacity", str(scn), "--slo", "ttft_ms=500,tpot_ms=100", "--lo", "0.25", "--hi", "64",
            "--tol", "1.0", "--out", str(out), "-q"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "paged-16" in printed and str(out / "capacity.csv") in printed
    df = pd.read_csv(out / "capacity.csv").set_index("variant")
    assert list(df.index) == ["paged-16", "contiguous-max"]
    assert (df["status"] == "ok").all()
    # KV paging admits more requests at once: it sustains a clearly higher rate within the SLOs
    assert df.loc["paged-16", "capacity_rate_scale"] > 2 * df.loc["contiguous-max", "capacity_rate_scale"]
    assert (df["attainment_at_capacity"] >= 0.9).all() and (df["ttft_ms"] == 500).all()
    doc = json.loads((out / "capacity.json").read_text())
    for v in doc["variants"]:
        meets = {e["rate_scale"]: e["meets"] for e in v["evaluations"]}
        assert meets[v["capacity_rate_scale"]] and not meets[v["first_failing_rate_scale"]]
    # kvsim replaces its own files; files of those names that kvsim did not write are refused
    write_outputs(out, [], {})
    assert json.loads((out / "capacity.json").read_text())["variants"] == []
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "capacity.csv").write_text("my notes\n")
    assert main(argv[:-3] + ["--out", str(foreign), "-q"]) == 2
    assert (foreign / "capacity.csv").read_text() == "my notes\n"
    assert "did not write" in capsys.readouterr().err


def test_capacity_needs_an_slo(tmp_path, capsys):
    scn = tmp_path / "cap.yaml"
    scn.write_text(SCENARIO)
    assert main(["capacity", str(scn), "--out", str(tmp_path / "o")]) == 2
    assert "capacity needs SLOs" in capsys.readouterr().err
    assert main(["capacity", str(scn), "--slo", "ttft_ms=1", "--lo", "2", "--hi", "1"]) == 2
    assert "--lo 2.0 must be below --hi 1.0" in capsys.readouterr().err
    assert main(["capacity", str(scn), "--slo", "ttft_ms=1", "--variant", "paged16"]) == 2
    assert "did you mean 'paged-16'" in capsys.readouterr().err


def test_scenario_baseline_must_name_a_variant(tmp_path, capsys):
    scn = tmp_path / "b.yaml"
    scn.write_text(SCENARIO + "baseline: contiguous-mx\n")
    assert main(["validate", str(scn)]) == 2
    err = capsys.readouterr().err
    assert "baseline: 'contiguous-mx' is not a variant (did you mean 'contiguous-max'?)" in err
    assert len(err.strip().splitlines()) == 1
