"""Fixtures of the report tests: a small rate x block-size sweep on synthetic ShareGPT-like
traffic, and a variants run directory (the quickstart's four allocators on a 60 s slice)."""

from __future__ import annotations

import pytest
from report_helpers import REPO, rate_sweep_spec


@pytest.fixture(scope="session")
def rate_sweep(tmp_path_factory):
    """A finished 6-point sweep directory (with compare/ and report.html)."""
    from kvsim.sweep import run_sweep

    out = tmp_path_factory.mktemp("rate_sweep") / "sweep"
    df = run_sweep(rate_sweep_spec(), out, jobs=2, plots=False)
    assert (df["status"] == "ok").all()
    return out


@pytest.fixture(scope="session")
def variants_dir(tmp_path_factory):
    """The quickstart scenario (4 variants) on the first 60 s of its trace, with plots."""
    if not (REPO / "traces" / "azure_conv_2023.csv.gz").exists():
        pytest.skip("the quickstart trace traces/azure_conv_2023.csv.gz is missing")
    from kvsim.api import run_to_dir
    from kvsim.config import load_scenario

    out = tmp_path_factory.mktemp("variants") / "qs"
    return run_to_dir(load_scenario(REPO / "scenarios" / "quickstart.yaml", ["trace.end_s=60"]), out,
                      progress=False)
