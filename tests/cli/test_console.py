"""What the console says: progress over the whole run, one line per variant, where to look at the
end; the right command for a sweep or scenario file; valid eviction kinds; trace stats slicing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kvsim.cli import main

REPO = Path(__file__).resolve().parents[2]
AZURE = REPO / "traces" / "azure_conv_2023.csv.gz"

SCENARIO = {
    "name": "tiny",
    "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 40,
                            "arrival": {"process": "poisson", "rate_per_s": 4.0}}, "length_policy": "cap"},
    "model": "OPT-13B", "gpu": "A100-40GB",
    "variants": {"paged-16": {"allocator": {"kind": "paged", "block_size": 16}},
                 "contiguous-max": {"allocator": {"kind": "contiguous", "reservation": "max"}}},
}


def _write(tmp_path: Path, doc: dict, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_run_prints_a_line_per_variant_and_where_to_look(tmp_path, capsys):
    scn = _write(tmp_path, SCENARIO)
    out = tmp_path / "out"
    assert main(["run", str(scn), "--out", str(out)]) == 0
    cap = capsys.readouterr()
    assert cap.out.strip() == str(out)
    lines = cap.err.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines[:2]] == ["paged-16", "contiguous-max"]
    assert all("finished" in ln for ln in lines[:2])
    assert lines[-1] == f"done: open {out / 'report.html'}  (plots: {out}/*.png; compare: kvsim compare {out})"
    assert (out / "report.html").is_file()


def test_progress_bar_covers_plots_and_report_and_log_lines_stay_whole(tmp_path, capsys):
    from kvsim.api import run_to_dir
    from kvsim.config import load_scenario

    lines: list[str] = []

    def log(m: str) -> None:
        import sys

        lines.append(m)
        print(m, file=sys.stderr)

    run_to_dir(load_scenario(_write(tmp_path, SCENARIO)), tmp_path / "out", progress=True, log=log)
    err = capsys.readouterr().err
    assert "writing report.html" in err and "plotting paged-16" in err and "plotting the comparison" in err
    assert re.findall(r"(\d+)%\|", err)[-1] == "100"  # the bar ends full, after the report
    for m in lines:  # each variant's line is printed whole, then a newline (the bar is redrawn below it)
        assert m + "\n" in err


@pytest.mark.parametrize("cmd", ["run", "validate", "capacity"])
def test_scenario_commands_on_a_sweep_file_name_kvsim_sweep(tmp_path, capsys, cmd):
    sweep = _write(tmp_path, {"name": "sw", "base": SCENARIO, "grid": {"allocator.block_size": [16, 32]}})
    argv = [cmd, str(sweep)] + (["--slo", "ttft_ms=500"] if cmd == "capacity" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is a sweep file" in err and f"kvsim sweep {sweep}" in err


@pytest.mark.parametrize("cmd", ["run", "validate", "capacity", "sweep"])
def test_commands_on_kvsims_resolved_output_ask_for_the_scenario(tmp_path, capsys, cmd):
    """QA: validate on a results directory's scenario.resolved.yaml printed a ~1,000-character line
    repeating the valid keys three times (kvsim_version, scenario_file, runs: unknown keys)."""
    resolved = _write(tmp_path, {"kvsim_version": "0.1.0", "scenario_file": "s.yaml", "name": "tiny",
                                 "runs": {"paged-16": {"scenario": SCENARIO}}}, "scenario.resolved.yaml")
    argv = [cmd, str(resolved)] + (["--slo", "ttft_ms=500"] if cmd == "capacity" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"kvsim: error: {resolved} is kvsim's resolved output of a run (top-level runs:), not a "
                   "scenario: pass the original scenario (its scenario_file: line names it)")


def test_validate_does_not_say_ok_when_no_request_is_admissible(tmp_path, capsys):
    """A scenario that serves nothing is valid (run would finish, every request rejected), so exit 0,
    but its line does not say "ok"."""
    scn = _write(tmp_path, {**SCENARIO, "kv_budget": {"tokens": 16}})
    assert main(["validate", str(scn)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in out if not line.startswith(" ")] == \
        ["paged-16: no request admissible", "contiguous-max: no request admissible"]
    assert main(["validate", str(_write(tmp_path, SCENARIO))]) == 0
    assert capsys.readouterr().out.startswith("paged-16: ok (")


def test_sweep_on_a_scenario_names_kvsim_run(tmp_path, capsys):
    scn = _write(tmp_path, SCENARIO)
    assert main(["sweep", str(scn), "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"kvsim run {scn}" in err
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("eviction, expected", [
    ({"kind": "lfru"}, "allocator.eviction: unknown eviction kind 'lfru' (did you mean 'lru'?); "
                       "valid kinds: fifo, lfu, lru, lru-k, priority"),
    ("lfru", "allocator.eviction: unknown eviction kind 'lfru' (did you mean 'lru'?); "
             "valid kinds: fifo, lfu, lru, lru-k, priority"),  # the bare-kind shorthand
    (5, "allocator.eviction: expected an eviction kind name or a mapping with 'kind' (got 5); "
        "valid kinds: fifo, lfu, lru, lru-k, priority"),
    ({"kind": "lfu", "k": 2}, "allocator.eviction.k: unknown key 'k'; valid keys: kind"),
])
def test_eviction_kind_errors_list_valid_kinds(tmp_path, capsys, eviction, expected):
    doc = {**SCENARIO, "allocator": {"kind": "paged", "prefix_caching": True, "eviction": eviction}}
    doc.pop("variants")
    scn = _write(tmp_path, doc)
    assert main(["validate", str(scn)]) == 2
    assert capsys.readouterr().err.strip() == f"kvsim: error: {scn}: {expected}"


@pytest.mark.skipif(not AZURE.exists(), reason="shipped Azure trace missing")
def test_trace_stats_takes_the_scenarios_slicing(capsys):
    from kvsim.trace.load import load_trace

    a = load_trace(AZURE, "auto").arrival_s
    assert main(["trace", "stats", str(AZURE), "--json", "--start-s", "60", "--end-s", "600",
                 "--rate-scale", "0.2"]) == 0
    got = json.loads(capsys.readouterr().out)
    kept = a[(a >= 60) & (a < 600)]
    assert got["requests"] == len(kept) and got["requests_in_file"] == len(a)
    assert got["slicing"] == {"start_s": 60, "end_s": 600, "rate_scale": 0.2}
    assert got["duration_s"] == pytest.approx((kept[-1] - kept[0]) / 0.2)
    assert main(["trace", "stats", str(AZURE), "--start-s", "600", "--end-s", "60"]) == 2
    assert "--end-s (60) must be greater than --start-s (600)" in capsys.readouterr().err
    assert main(["trace", "stats", str(AZURE), "--rate-scale", "0"]) == 2
    assert main(["trace", "stats", str(AZURE), "--start-s", "1e9"]) == 2
    assert "no requests left" in capsys.readouterr().err


def test_no_default_path_exists_only_on_a_build_machine():
    """Command defaults must not point at this project's build machines (/work/..., ../shared)."""
    hits = []
    for p in (REPO / "kvsim").rglob("*.py"):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"""["'](/work/|/tmp/|\.\./shared)""", code) and "help=" not in code:
                hits.append(f"{p.relative_to(REPO)}:{i}: {line.strip()}")
    assert not hits, hits
