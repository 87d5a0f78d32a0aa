"""What ``kvsim calibrate report``, ``calibrate --report`` and ``calibrate peer-check --csv`` may overwrite:
only files kvsim wrote (kvsim.outdir's markers; docs/outputs.md), checked before the work."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.cli import main
from kvsim.outdir import MARKER, Marker, read_marker, write_marker


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), lines
    return lines[0]


def _marked(d, written=("meta.json", "measurements.csv")):
    """``d`` as a fresh `kvsim calibrate` output: its marker lists no report file yet."""
    for f in d.glob("report_*"):
        f.unlink()
    write_marker(d, Marker("calibrate", True, tuple(sorted(written))))
    return d


def test_report_refuses_a_report_file_kvsim_did_not_write(example_copy, capsys):
    d = _marked(example_copy)
    (d / "report_loo.csv").write_text("MY OWN DATA\n")
    assert main(["calibrate", "report", str(d), "--no-plots"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{d / 'report_loo.csv'}: file exists and kvsim did not write it" in err and "--force" in err
    assert (d / "report_loo.csv").read_text() == "MY OWN DATA\n"
    assert not (d / "report_bandwidth.csv").exists()  # refused before writing anything
    assert main(["calibrate", "report", str(d), "--no-plots", "--force"]) == 0
    assert (d / "report_loo.csv").read_text().startswith("op,")
    assert "report_loo.csv" in read_marker(d).written
    capsys.readouterr()
    assert main(["calibrate", "report", str(d), "--no-plots"]) == 0  # now kvsim's: a rerun rewrites it


def test_report_rewrites_its_files_in_an_older_calibration_directory(example_copy, capsys):
    """calibration/cpu-example has no marker: its report files are recognised as kvsim's (outdir legacy)."""
    assert not (example_copy / MARKER).exists() and (example_copy / "report_loo.csv").exists()
    assert main(["calibrate", "report", str(example_copy), "--no-plots"]) == 0
    (example_copy / "notes.txt").write_text("mine")  # no longer only calibration files: not recognised
    assert main(["calibrate", "report", str(example_copy), "--no-plots"]) == 2
    assert "kvsim did not write it" in _one_line(capsys.readouterr().err)


def test_calibrate_report_refuses_a_users_report_file_before_measuring(example_copy, capsys, monkeypatch):
    pytest.importorskip("torch")
    import kvsim.calibration.runner as runner

    d = _marked(example_copy)
    (d / "report_loo.png").write_text("MY OWN PLOT")
    monkeypatch.setattr(runner, "_prepare_out", lambda *a, **k: pytest.fail("measuring started"))
    assert main(["calibrate", "--device", "cpu", "--out", str(d), "--report"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert f"{d / 'report_loo.png'}: file exists and kvsim did not write it" in err and "--report" in err
    assert (d / "report_loo.png").read_text() == "MY OWN PLOT"


@pytest.fixture
def fake_peer(monkeypatch):
    import kvsim.calibration.peer as peer

    calls = []

    def run(vidur_dir=None, calibration=None, **kw):
        calls.append(vidur_dir)
        return pd.DataFrame({"gpu": ["a100"], "model": ["m"], "op": ["layer_gemms"], "analytical_mape_pct": [6.3]})

    monkeypatch.setattr(peer, "run_peer_check", run)
    return calls


def test_peer_check_csv_is_checked_before_the_work_and_never_replaces_a_users_file(tmp_path, capsys, fake_peer):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "somedir").mkdir()
    mine = tmp_path / "mine.csv"
    mine.write_text("MY OWN DATA\n")
    for csv, why in ((mine, "file exists"), (tmp_path / "afile" / "x.csv", "is a file, not a folder"),
                     (tmp_path / "somedir", "is a directory")):
        assert main(["calibrate", "peer-check", "--vidur-dir", str(tmp_path), "--csv", str(csv)]) == 2
        err = _one_line(capsys.readouterr().err)
        assert err.startswith(f"kvsim: error: --csv {csv}: ") and why in err, err
    assert fake_peer == [] and mine.read_text() == "MY OWN DATA\n"
    assert main(["calibrate", "peer-check", "--vidur-dir", str(tmp_path), "--csv", str(mine), "--force"]) == 0
    assert pd.read_csv(mine)["analytical_mape_pct"].tolist() == [6.3]


def test_peer_check_csv_in_a_kvsim_folder_is_rewritten_by_a_rerun(example_copy, fake_peer):
    d = _marked(example_copy)
    csv = d / "peer.csv"
    assert main(["calibrate", "peer-check", "--vidur-dir", str(d), "--csv", str(csv)]) == 0
    assert json.loads((d / MARKER).read_text())["by"] == {"peer.csv": "calibrate peer-check"}
    assert main(["calibrate", "peer-check", "--vidur-dir", str(d), "--csv", str(csv)]) == 0
    assert len(fake_peer) == 2
