"""Bad input to ``kvsim compare`` and ``kvsim report``: one ``kvsim: error:`` line on stderr naming
the file and what was expected, exit status 2, nothing written; a variant left out is named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from report_helpers import kvsim_main

VARIANTS = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"]


@pytest.fixture
def run_copy(variants_dir, tmp_path) -> Path:
    """A copy of the quickstart variants directory (data only: no plots, reports or compare/)."""
    return Path(shutil.copytree(variants_dir, tmp_path / "qs",
                                ignore=shutil.ignore_patterns("*.png", "*.html", "compare")))


def command(name: str, src: Path, tmp_path: Path) -> list[str]:
    out = tmp_path / ("cmp" if name == "compare" else "r.html")
    return [name, str(src), "--out", str(out), *(["-q"] if name == "compare" else [])]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), err
    return lines[0]


def assert_nothing_written(tmp_path: Path) -> None:
    assert not (tmp_path / "cmp").exists() and not (tmp_path / "r.html").exists()
    assert not list(tmp_path.glob(".cmp.*")) and not list(tmp_path.glob(".r.html.*"))


def test_report_out_into_a_missing_folder(run_copy, tmp_path, capsys):
    target = tmp_path / "missing" / "x.html"
    assert kvsim_main(["report", str(run_copy), "--out", str(target)]) == 2
    line = one_error_line(capsys)
    assert f"the output folder {tmp_path / 'missing'} does not exist" in line
    assert not (tmp_path / "missing").exists()
    (tmp_path / "afile").write_text("mine")
    assert kvsim_main(["report", str(run_copy), "--out", str(tmp_path / "afile" / "x.html")]) == 2
    assert f"the output folder {tmp_path / 'afile'} is not a folder" in one_error_line(capsys)
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("cmd", ["compare", "report"])
@pytest.mark.parametrize("text, expected", [
    ("garbage{", "summary.json: not valid JSON (line 1 col 1"),
    ("[1]", "summary.json: expected a JSON object"),
    ('{"name": "paged-16", "kv": [], "concurrency": {}}', "summary.json: kv: expected an object, got a list"),
])
def test_broken_summary_json_is_named(run_copy, tmp_path, capsys, cmd, text, expected):
    bad = run_copy / "paged-16" / "summary.json"
    bad.write_text(text)
    assert kvsim_main(command(cmd, run_copy, tmp_path)) == 2
    line = one_error_line(capsys)
    assert f"{run_copy / 'paged-16'}/{expected}" in line
    assert_nothing_written(tmp_path)
    # a single run directory: its own summary.json
    single = run_copy / "contiguous-max"
    (single / "summary.json").write_text(text)
    assert kvsim_main(command(cmd, single, tmp_path)) == 2
    assert str(single / "summary.json") in one_error_line(capsys)


@pytest.mark.parametrize("cmd", ["compare", "report"])
@pytest.mark.parametrize("table", ["requests.parquet", "steps.parquet"])
def test_corrupt_table_is_an_error_in_compare_and_report(run_copy, tmp_path, capsys, cmd, table):
    path = run_copy / "paged-16" / table
    path.write_bytes(path.read_bytes()[:100])  # truncated: no Parquet footer
    assert kvsim_main(command(cmd, run_copy, tmp_path)) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"kvsim: error: {path}: cannot read the parquet file: ")
    assert "magic bytes" in line
    assert_nothing_written(tmp_path)


def _drop_token_states(s: dict) -> None:
    del s["kv"]["token_states_frac"]


@pytest.mark.parametrize("cmd", ["compare", "report"])
@pytest.mark.parametrize("edit, expected", [
    (lambda s: s["concurrency"].update(max="lots"), "concurrency.max: expected a number, got text"),
    (_drop_token_states, "kv.token_states_frac: missing (every kvsim run summary has it)"),
    (lambda s: s.update(ttft_s="x"), "ttft_s: expected an object, got text"),
    (lambda s: s.update(throughput_requests_per_s="NaN"), "throughput_requests_per_s: expected a number, got text"),
])
def test_summary_with_a_wrong_metric_names_the_key(run_copy, tmp_path, capsys, cmd, edit, expected):
    """A hand-edited summary.json: one line naming the file and the key, not an exception text from
    a plot ("could not write fragmentation_breakdown.png: KeyError: 'token_states_frac'")."""
    import json

    path = run_copy / "paged-16" / "summary.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    assert kvsim_main(command(cmd, run_copy, tmp_path)) == 2
    assert one_error_line(capsys) == f"kvsim: error: {path}: {expected}"
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize("cmd", ["compare", "report"])
@pytest.mark.parametrize("table", ["requests.parquet", "steps.parquet"])
def test_missing_table_is_an_error_not_a_run_left_out(run_copy, tmp_path, capsys, cmd, table):
    """kvsim writes both tables for every run (with or without plots): one missing is damage, named,
    not a run silently dropped from the plots (whose caption then claimed "evenly chosen")."""
    path = run_copy / "paged-16" / table
    path.unlink()
    assert kvsim_main(command(cmd, run_copy, tmp_path)) == 2
    assert one_error_line(capsys) == (f"kvsim: error: {path}: missing (a kvsim run directory has summary.json, "
                                      "requests.parquet and steps.parquet)")
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize("cmd", ["compare", "report"])
@pytest.mark.parametrize("text, expected", [
    ("runs: [\n", "scenario.resolved.yaml:2:1: YAML syntax error: "),
    ("runs: [1]\n", "scenario.resolved.yaml: damaged: runs: expected a mapping of run name -> its resolved scenario"),
    ("", "scenario.resolved.yaml: damaged: expected the mapping kvsim writes, got an empty file"),
])
def test_damaged_resolved_scenario_is_an_error(run_copy, tmp_path, capsys, cmd, text, expected):
    """A truncated or edited scenario.resolved.yaml would silently change which runs are compared,
    their order and their baseline: one line naming it, exit 2. (Without the file, the variants are
    the subdirectories with a summary.json, by name: a directory from an older kvsim.)"""
    (run_copy / "scenario.resolved.yaml").write_text(text)
    assert kvsim_main(command(cmd, run_copy, tmp_path)) == 2
    assert one_error_line(capsys).startswith(f"kvsim: error: {run_copy}/{expected}")
    assert_nothing_written(tmp_path)


def test_damaged_sweep_resolved_is_named(tmp_path):
    from kvsim.errors import ConfigError
    from kvsim.report.tables import read_resolved

    path = tmp_path / "sweep.resolved.yaml"
    assert read_resolved(path) is None
    path.write_text("- a\n")
    with pytest.raises(ConfigError, match=f"^{path}: damaged: expected the mapping kvsim writes, got list"):
        read_resolved(path)


@pytest.mark.parametrize("cmd", ["compare", "report"])
def test_a_folder_with_someone_elses_summary_is_not_a_run(tmp_path, capsys, cmd):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    (mine / "summary.json").write_text('{"mine": 1}')
    assert kvsim_main(command(cmd, mine, tmp_path)) == 2
    line = one_error_line(capsys)
    assert line == (f"kvsim: error: {mine}: not a kvsim run directory "
                    "(its summary.json has no name, kv, concurrency keys)")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "summary.json"]
    assert_nothing_written(tmp_path)


def test_compare_names_a_variant_without_summary(run_copy, tmp_path, capsys):
    (run_copy / "paged-16" / "summary.json").unlink()
    out = tmp_path / "cmp"
    assert kvsim_main(["compare", str(run_copy), "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [e for e in err if "left out" in e]
    assert notes == [f"compare: left out 1 variant(s) without a summary.json: {run_copy / 'paged-16'}"]
    assert pd.read_csv(out / "comparison.csv")["label"].tolist() == VARIANTS[:3]
    # the report of the same directory says so too
    assert kvsim_main(["report", str(run_copy), "--out", str(tmp_path / "r.html")]) == 0
    assert "Left out 1 variant(s) without a summary.json: paged-16." in (tmp_path / "r.html").read_text()


def test_a_folder_the_run_does_not_list_is_not_a_variant(run_copy, tmp_path, capsys):
    """A copy of a variant left in the variants directory (not in scenario.resolved.yaml) is not
    compared, reported or loaded as another variant; compare and report name it once."""
    from kvsim.api import load_results

    shutil.copytree(run_copy / "paged-16", run_copy / "paged-16-backup")
    out = tmp_path / "cmp"
    assert kvsim_main(["compare", str(run_copy), "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    notes = [e for e in err if "backup" in e]
    assert notes == [f"kvsim: note: compare: ignored 1 folder(s) that the run's scenario.resolved.yaml does not "
                     f"list as variants: {run_copy / 'paged-16-backup'}"]
    assert sorted(pd.read_csv(out / "comparison.csv")["label"]) == sorted(VARIANTS)
    assert kvsim_main(["report", str(run_copy), "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "Ignored 1 folder(s) that scenario.resolved.yaml does not list as variants: paged-16-backup." in html
    assert sorted(load_results(run_copy)) == sorted(VARIANTS)

