"""Bad-input corpus through the real CLI: one line on stderr, exit 2, no traceback, no result dir.

The cases live in ``cases.py`` (a table). Each case is one test id; the subprocesses of all
selected cases run in a small thread pool up front (``corpus_results``), so the corpus takes a
fraction of its serial time on a multi-core machine while failures still point at one case.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ._cli import (
    TRACEBACK,
    Result,
    assert_no_complete_dir,
    assert_one_line_error,
    run_kvsim,
)
from .cases import CASES, Case, scenario

_BY_NAME = {c.name: c for c in CASES}


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.name, marks=marks)


def _materialise(case: Case, cwd: Path) -> None:
    for name, content in case.files.items():
        path = cwd / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


# Every bad input must be rejected within this much address space (kvsim itself needs ~1.5 GiB of
# virtual memory for its imports): an input that makes it allocate without bound fails the case
# instead of taking the machine down.
MEMORY_LIMIT_BYTES = 4 << 30


def _run_case(case: Case, cwd: Path) -> Result:
    _materialise(case, cwd)
    return run_kvsim(list(case.argv), cwd, timeout=60, memory_limit_bytes=MEMORY_LIMIT_BYTES)


@pytest.fixture(scope="session")
def corpus_results(request, tmp_path_factory) -> dict[str, Result]:
    """Run every selected corpus case once, several at a time."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_bad_input" and hasattr(item, "callspec")]
    dirs = {c.name: tmp_path_factory.mktemp(c.name, numbered=True) for c in selected}
    workers = max(2, min(8, (os.cpu_count() or 2)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {c.name: pool.submit(_run_case, c, dirs[c.name]) for c in selected}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case: Case, corpus_results):
    res = corpus_results[case.name]
    assert_one_line_error(res, list(case.expect))
    assert "internal error" not in res.stderr
    if case.runs:
        out = res.cwd / "out"
        assert not out.is_dir(), f"a failed run created {out}"
        assert_no_complete_dir(out)


def test_corpus_is_large_enough():
    assert len(CASES) >= 40
    tags = {t for c in CASES for t in c.tags}
    assert {"config", "trace", "calibration"} <= tags


def test_debug_shows_the_traceback(tmp_path):
    """``--debug`` trades the one-line message for the full traceback of the same error."""
    (tmp_path / "s.yaml").write_text(scenario({"allocator.blocksize": 8}))
    plain = run_kvsim(["validate", "s.yaml"], tmp_path)
    line = assert_one_line_error(plain, ["allocator.blocksize"])
    debug = run_kvsim(["--debug", "validate", "s.yaml"], tmp_path)
    assert debug.returncode != 0
    assert TRACEBACK in debug.stderr, debug.describe()
    assert "ConfigError" in debug.stderr
    assert line.removeprefix("kvsim: error: ") in debug.stderr


def test_valid_base_scenario_passes(tmp_path):
    """Guard for the corpus: the scenario every case breaks is itself valid."""
    (tmp_path / "s.yaml").write_text(scenario())
    res = run_kvsim(["validate", "s.yaml"], tmp_path)
    assert res.returncode == 0, res.describe()
    assert res.stderr == ""
