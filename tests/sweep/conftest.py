"""Fixtures of the sweep tests: the acceptance sweep (10 block sizes on the quickstart trace,
sliced to its first 60 s) is run once per session and shared."""

from __future__ import annotations

import contextlib
import io
import shutil

import pandas as pd
import pytest
from sweep_helpers import REPO, SHORT, STUDY_SWEEP, kvsim_main


@pytest.fixture(scope="session")
def block_sweep(tmp_path_factory):
    """(sweep dir, index DataFrame, stderr) of the 10-point block-size sweep, run with --jobs 2."""
    if not (REPO / "traces" / "azure_conv_2023.csv.gz").exists():
        pytest.skip("the quickstart trace traces/azure_conv_2023.csv.gz is missing")
    out = tmp_path_factory.mktemp("block_sweep") / "sweep"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = kvsim_main(["sweep", str(STUDY_SWEEP), *SHORT, "--out", str(out), "--jobs", "2", "--no-plots"])
    assert rc == 0, err.getvalue()
    return out, pd.read_parquet(out / "index.parquet"), err.getvalue()


@pytest.fixture
def block_sweep_copy(block_sweep, tmp_path):
    """A private copy of the block-size sweep directory (tests may damage it)."""
    src, df, _ = block_sweep
    dst = tmp_path / "sweep"
    shutil.copytree(src, dst, copy_function=shutil.copy2)
    return dst, df
