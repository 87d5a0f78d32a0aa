"""Committed calibration data carry no machine-specific absolute paths (a copy of the repository
elsewhere reads them the same), and kvsim calibrate --engine writes scenario_timing.file relative to
the directory it ran in (only the directory's name when outside it)."""

import json
from pathlib import Path

from kvsim.realengine.calibrate import portable_path

ROOT = Path(__file__).resolve().parents[2]


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_committed_meta_json_has_no_absolute_paths():
    metas = [*sorted((ROOT / "calibration").rglob("meta.json")),
             *sorted((ROOT / "kvsim" / "calibration_data").rglob("meta.json"))]
    assert metas
    for meta in metas:
        for s in _strings(json.loads(meta.read_text())):
            assert not s.startswith(("/tmp/", "/home/", "/work/", "/root/")), (meta, s)


def test_engine_calibration_writes_the_timing_file_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert portable_path(tmp_path / "calibration" / "cpu") == "calibration/cpu"
    assert portable_path(Path("calibration/cpu")) == "calibration/cpu"
    outside = tmp_path.parent / "elsewhere"
    assert portable_path(outside) == "elsewhere"  # outside: the directory's name only, never an absolute path
