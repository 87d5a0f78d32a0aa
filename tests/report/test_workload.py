"""Runs that do not share one workload and setup (trace, model, GPU, engine profile): ``kvsim
compare`` names what differs (a ``kvsim: note:`` line) and the key findings say so first and make
no causal reading; a rate sweep (one trace at several loads) is one workload."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_helpers import REPO, kvsim_main

TINY = REPO / "tests" / "reliability" / "corpus" / "tiny.yaml"


def _run(tmp_path: Path, name: str, *sets: str) -> Path:
    out = tmp_path / name
    argv = ["run", str(TINY), "--out", str(out), "--no-plots", "-q"]
    for s in sets:
        argv += ["--set", s]
    assert kvsim_main(argv) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workload")
    return {"a": _run(tmp, "a"), "rate": _run(tmp, "rate", "trace.synthetic.arrival.rate_per_s=50"),
            "trace": _run(tmp, "trace", "trace.synthetic.num_requests=30", "kv_budget.tokens=512"),
            "gpu": _run(tmp, "gpu", "gpu=H100-SXM-80GB", "kv_budget.tokens=512")}


def _compare(paths: list[Path], tmp_path: Path, capsys) -> tuple[str, str]:
    capsys.readouterr()
    assert kvsim_main(["compare", *map(str, paths), "--out", str(tmp_path / "cmp")]) == 0
    cap = capsys.readouterr()
    return cap.out, cap.err


def test_a_different_trace_is_named_and_findings_make_no_causal_reading(runs, tmp_path, capsys):
    out, err = _compare([runs["a"], runs["trace"]], tmp_path, capsys)
    notes = [line for line in err.splitlines() if "differ in" in line]
    assert len(notes) == 1 and notes[0].startswith("kvsim: note: compare: the runs differ in trace, so ")
    assert "num_requests" not in notes[0] and "(a/tiny)" in notes[0] and "(trace/tiny)" in notes[0]
    assert "- Not like for like: the runs differ in trace, so the changes below" in out
    assert "served more slowly" not in out


def test_a_different_gpu_is_named(runs, tmp_path, capsys):
    _, err = _compare([runs["a"], runs["gpu"]], tmp_path, capsys)
    assert "kvsim: note: compare: the runs differ in gpu," in err
    assert "gpu: A100-40GB (a/tiny); H100-SXM-80GB (gpu/tiny)" in err


def test_another_request_rate_is_the_same_workload(runs, tmp_path, capsys):
    out, err = _compare([runs["a"], runs["rate"]], tmp_path, capsys)
    assert "differ in" not in err and "like for like" not in out


def test_the_report_of_a_variants_dir_says_it_too(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text(TINY.read_text() + "variants:\n  a100: {}\n  h100: {gpu: H100-SXM-80GB}\n")
    assert kvsim_main(["run", str(scn), "--out", str(tmp_path / "v"), "--no-plots", "-q"]) == 0
    assert kvsim_main(["report", str(tmp_path / "v"), "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "Not like for like: the runs differ in gpu" in html


def test_findings_without_differences_keep_the_causal_reading():
    from kvsim.report.findings import key_findings

    base = {"concurrency": {"max": 4}, "throughput_requests_per_s": 2.0}
    more = {"concurrency": {"max": 8}, "throughput_requests_per_s": 1.0}
    same = key_findings({"a": base, "b": more}, "a")
    assert any("served more slowly" in f for f in same)
    other = key_findings({"a": base, "b": more}, "a", ["trace"])
    assert other[0].startswith("Not like for like: the runs differ in trace")
    assert not any("served more slowly" in f for f in other) and any("but no gain" in f for f in other)
