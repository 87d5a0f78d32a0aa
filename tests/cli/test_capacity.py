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
    # a range whose ratio is not a floating-point number (the step count would overflow), a repeated objective
    assert main(["capacity", str(scn), "--slo", "ttft_ms=1", "--lo", "1e-300", "--hi", "1e300"]) == 2
    assert "--hi 1e+300 / --lo 1e-300 is beyond a floating-point number" in capsys.readouterr().err
    assert main(["capacity", str(scn), "--slo", "ttft_ms=500,ttft_ms=600"]) == 2
    assert "--slo: ttft_ms is given twice (500 and 600 ms)" in capsys.readouterr().err
    assert main(["capacity", str(scn), "--slo", "ttft_ms=1", "--variant", "paged16"]) == 2
    assert "did you mean 'paged-16'" in capsys.readouterr().err
    # one objective in two spellings (QA, twenty-ninth session: both were kept, as two columns)
    assert main(["capacity", str(scn), "--slo", "p90_ttft_ms=500,p90.0_ttft_ms=400"]) == 2
    assert "--slo: p90_ttft_ms is given twice (500 and 400 ms)" in capsys.readouterr().err
    # the search sets the rate scale at every evaluation: a --set of it would be silently replaced
    assert main(["capacity", str(scn), "--slo", "ttft_ms=500", "--set", "trace.rate_scale=3"]) == 2
    err = capsys.readouterr().err
    assert "--set trace.rate_scale=3: kvsim capacity searches trace.rate_scale" in err and err.count("\n") == 1


def test_percentile_objectives_have_one_spelling():
    from kvsim.capacity.rate_search import parse_slo

    assert parse_slo("p090_ttft_ms=5,p99.0_tpot_ms=6,p99.9_e2e_ms=7,ttft_ms=8") == {
        "p90_ttft_ms": 5.0, "p99_tpot_ms": 6.0, "p99.9_e2e_ms": 7.0, "ttft_ms": 8.0}


def test_scenario_baseline_must_name_a_variant(tmp_path, capsys):
    scn = tmp_path / "b.yaml"
    scn.write_text(SCENARIO + "baseline: contiguous-mx\n")
    assert main(["validate", str(scn)]) == 2
    err = capsys.readouterr().err
    assert "baseline: 'contiguous-mx' is not a variant (did you mean 'contiguous-max'?)" in err
    assert len(err.strip().splitlines()) == 1


def test_rerun_reuses_every_step_and_writes_the_same_bytes(tmp_path, capsys):
    """A second run into the same --out simulates nothing (every step's key is in capacity.json) and
    writes byte-identical capacity.csv / capacity.json, the same as a --fresh run elsewhere."""
    scn = tmp_path / "cap.yaml"
    scn.write_text(SCENARIO)
    argv = ["capacity", str(scn), "--slo", "ttft_ms=500,p90_tpot_ms=100", "--lo", "0.25", "--hi", "64",
            "--tol", "1.0", "--variant", "paged-16"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(argv + ["--out", str(a)]) == 0
    first = {f: (a / f).read_bytes() for f in ("capacity.csv", "capacity.json")}
    capsys.readouterr()
    assert main(argv + ["--out", str(a)]) == 0
    err = capsys.readouterr().err
    steps = [line for line in err.splitlines() if " step " in line]
    assert steps and all("reused from capacity.json" in line for line in steps)
    assert {f: (a / f).read_bytes() for f in first} == first
    assert main(argv + ["--out", str(b), "--fresh", "-q"]) == 0
    assert {f: (b / f).read_bytes() for f in first} == first
    # another objective is another simulation: nothing is reused
    assert main([*argv[:3], "ttft_ms=400,p90_tpot_ms=100", *argv[4:], "--out", str(a)]) == 0
    assert "reused from" not in capsys.readouterr().err


def test_interrupted_steps_are_kept_and_reused(tmp_path, capsys, monkeypatch):
    """Ctrl-C after two steps: capacity.json keeps them (complete: false), the message says so, and
    the rerun reuses them and ends with what an uninterrupted run gives."""
    from kvsim.capacity import rate_search as rs

    scn = tmp_path / "cap.yaml"
    scn.write_text(SCENARIO)
    out = tmp_path / "out"
    argv = ["capacity", str(scn), "--slo", "ttft_ms=500", "--lo", "0.25", "--hi", "64", "--tol", "1.0",
            "--variant", "paged-16", "--out", str(out)]
    real, calls = rs.search, []

    def interrupting(evaluate, *a, **kw):
        def ev(scale):
            if len(calls) == 2:
                raise KeyboardInterrupt
            calls.append(scale)
            return evaluate(scale)
        return real(ev, *a, **kw)

    monkeypatch.setattr(rs, "search", interrupting)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "2 step(s) of this run" in err and str(out / "capacity.json") in err
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["complete"] is False and len(doc["evaluations_unfinished"]) == 2
    assert not (out / "capacity.csv").exists()
    monkeypatch.setattr(rs, "search", real)
    assert main(argv) == 0
    assert capsys.readouterr().err.count("reused from capacity.json") == 2
    assert main(argv[:-1] + [str(tmp_path / "fresh"), "--fresh", "-q"]) == 0
    assert (out / "capacity.csv").read_bytes() == (tmp_path / "fresh" / "capacity.csv").read_bytes()


def test_unserved_percentile_is_null_in_json(tmp_path):
    """A percentile that lands on a rejected request is infinite: capacity.json says null (JSON has no
    infinity) and the evaluation still loads for reuse."""
    from kvsim.capacity import VariantCapacity, known_evaluations

    e = Evaluation(1.0, 2.0, 0.5, 1.0, 1.0, 10, 3, False, {"p99_ttft_ms": float("inf")}, key="k")
    write_outputs(tmp_path, [VariantCapacity("v", "below_range", None, 1.0, None, None, None, (e,))], {})
    doc = json.loads((tmp_path / "capacity.json").read_text())
    assert doc["variants"][0]["evaluations"][0]["percentiles_ms"] == {"p99_ttft_ms": None}
    assert known_evaluations(tmp_path)["k"].percentiles_ms == {"p99_ttft_ms": float("inf")}


def test_below_range_says_when_rejections_alone_block_the_objective():
    """3 of 100 requests rejected at the lowest scale: p99 (at most 1 may miss) and attainment 0.99 can
    never be met, and the line says so; p95 (5 may miss) is a plain miss that a lower --lo may fix."""
    from kvsim.capacity import VariantCapacity, why_below_range

    def below(slo, pct):
        e = Evaluation(0.25, 0.5, 0.97, 0.1, 0.1, 100, 3, False, pct, rejected_by_reason={"exceeds_max_model_len": 3})
        return VariantCapacity("v", "below_range", None, 0.25, None, None, None, (e,), slo)

    blocked = why_below_range(below({"p99_ttft_ms": 2000.0}, {"p99_ttft_ms": float("inf")}), 0.9)
    assert "3 of 100 requests are rejected" in blocked and "p99_ttft_ms lets at most 1 miss" in blocked
    assert "no rate meets" in blocked and "exceeds_max_model_len: 3" in blocked
    joint = why_below_range(below({"ttft_ms": 500.0}, {}), 0.99)
    assert "attainment 0.99 lets at most 1 miss" in joint
    plain = why_below_range(below({"p95_ttft_ms": 2000.0}, {"p95_ttft_ms": 2500.0}), 0.9)
    assert "no rate meets" not in plain and "try a lower --lo" in plain and "p95_ttft_ms 2500 ms" in plain
    ok = VariantCapacity("v", "ok", 1.0, 1.1, 2.0, 0.95, 1.0, (), {"ttft_ms": 500.0})
    assert why_below_range(ok, 0.9) is None


def test_an_out_capacity_cannot_write_is_refused_before_the_search(tmp_path, capsys, monkeypatch):
    """Under a file or on /proc, capacity simulated every step and then failed (exit 1)."""
    import kvsim.capacity.rate_search as rs

    scn = tmp_path / "cap.yaml"
    scn.write_text(SCENARIO)
    (tmp_path / "afile").write_text("mine\n")
    monkeypatch.setattr(rs, "search", lambda *a, **k: pytest.fail("searched before checking --out"))
    for out, why in ((tmp_path / "afile" / "sub", "is a file, not a folder"), ("/proc/kvsim-qa", "cannot be created")):
        assert main(["capacity", str(scn), "--slo", "ttft_ms=500", "--out", str(out), "-q"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--out {out}" in err[0] and why in err[0], err
    assert (tmp_path / "afile").read_text() == "mine\n"


@pytest.mark.parametrize("doc", [{"variants": "garbage"}, {"variants": [3, {"evaluations": "x"}]},
                                 {"variants": [{"evaluations": [{"rate_scale": "high"}]}]},
                                 {"evaluations_unfinished": 7}])
def test_a_damaged_capacity_json_of_kvsim_is_simulated_again(tmp_path, doc):
    """Was an internal error (AttributeError, exit 1) on a capacity.json with kvsim's marker."""
    from kvsim.capacity.rate_search import MARKER
    from kvsim.capacity.store import known_evaluations

    (tmp_path / "capacity.json").write_text(json.dumps({"kind": MARKER, **doc}))
    assert known_evaluations(tmp_path) == {}
