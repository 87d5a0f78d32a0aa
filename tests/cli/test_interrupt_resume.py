"""Ctrl-C during ``kvsim run`` of a multi-variant scenario: the finished variants are kept in the
temporary directory the message names, and a rerun skips them (unless the scenario changed).

Deterministic: the run sends itself SIGINT as its third variant starts (a wrapper around
``kvsim.api.run_scenario`` in a subprocess), never after a timed wait."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from helpers import kvsim_with_sigint

SCENARIO = {
    "name": "four",
    "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 30,
                            "arrival": {"process": "poisson", "rate_per_s": 4.0}}, "length_policy": "cap"},
    "model": "OPT-13B", "gpu": "A100-40GB",
    "variants": {"paged-16": {"allocator": {"kind": "paged", "block_size": 16}},
                 "paged-32": {"allocator": {"kind": "paged", "block_size": 32}},
                 "contiguous-max": {"allocator": {"kind": "contiguous", "reservation": "max"}},
                 "contiguous-pow2": {"allocator": {"kind": "contiguous", "reservation": "pow2"}}},
}


def _stamp(d: Path) -> dict:
    return {f.relative_to(d).as_posix(): (f.stat().st_ino, f.stat().st_mtime_ns) for f in sorted(d.rglob("*"))
            if f.is_file()}


def test_ctrl_c_keeps_finished_variants_and_rerun_skips_them(tmp_path):
    scn = tmp_path / "four.yaml"
    scn.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    run = ["run", str(scn), "--out", "out", "--no-plots"]
    res = kvsim_with_sigint(tmp_path, run, sigint_at=3)
    assert res.returncode == 130, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    tmps = sorted(tmp_path.glob(".out.tmp-*"))
    assert len(tmps) == 1 and not (tmp_path / "out").exists()
    tmp = tmps[0]
    assert last == (f"kvsim: interrupted; kept the 2 of 4 variants that had finished (paged-16, paged-32) in "
                    f"{tmp.resolve()}; rerun the same command to resume: they are skipped unless the scenario "
                    "changed")
    assert sorted(p.name for p in tmp.iterdir() if p.is_dir()) == ["contiguous-max", "paged-16", "paged-32"]
    kept = {n: _stamp(tmp / n) for n in ("paged-16", "paged-32")}

    rerun = kvsim_with_sigint(tmp_path, run)
    assert rerun.returncode == 0, rerun.stderr
    err = rerun.stderr.splitlines()
    assert "resuming an interrupted run: 2 finished variant(s) kept (paged-16, paged-32)" in err
    assert sum("(kept from the interrupted run)" in ln for ln in err) == 2
    out = tmp_path / "out"
    for n, stamp in kept.items():  # the same files, not rewritten
        assert _stamp(out / n) == stamp, n
    assert list(tmp_path.glob(".out.tmp-*")) == []
    assert not (out / ".kvsim-resume.json").exists() and not (out / "INCOMPLETE").exists()
    # byte-identical to an uninterrupted run
    fresh = kvsim_with_sigint(tmp_path, ["run", str(scn), "--out", "fresh", "--no-plots"])
    assert fresh.returncode == 0, fresh.stderr
    for n in SCENARIO["variants"]:
        for f in ("summary.json", "requests.parquet", "steps.parquet"):
            assert (out / n / f).read_bytes() == (tmp_path / "fresh" / n / f).read_bytes(), (n, f)
    assert (out / "comparison.csv").read_bytes() == (tmp_path / "fresh" / "comparison.csv").read_bytes()


def test_rerun_with_a_changed_scenario_reuses_nothing(tmp_path):
    scn = tmp_path / "four.yaml"
    scn.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    res = kvsim_with_sigint(tmp_path, ["run", str(scn), "--out", "out", "--no-plots"], sigint_at=3)
    assert res.returncode == 130 and "kept the 2 of 4 variants" in res.stderr
    changed = kvsim_with_sigint(tmp_path, ["run", str(scn), "--out", "out", "--no-plots", "--set", "seed=7"])
    assert changed.returncode == 0, changed.stderr
    assert "resuming" not in changed.stderr and "kept from the interrupted run" not in changed.stderr
    assert list(tmp_path.glob(".out.tmp-*")) == []
    assert json.loads((tmp_path / "out" / "paged-16" / "summary.json").read_text())["requests_total"] == 30


def test_ctrl_c_before_any_variant_finished_removes_the_temp_dir(tmp_path):
    scn = tmp_path / "four.yaml"
    scn.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    res = kvsim_with_sigint(tmp_path, ["run", str(scn), "--out", "out", "--no-plots"], sigint_at=1)
    assert res.returncode == 130
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("kvsim: interrupted before any variant was finished (kvsim removed its temporary "
                           "directory .out.tmp-") and last.endswith("; no result directory was written")
    assert list(tmp_path.glob(".out.tmp-*")) == [] and not (tmp_path / "out").exists()
