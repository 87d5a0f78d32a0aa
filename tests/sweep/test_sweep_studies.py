"""The shipped study scenarios (scenarios/studies/): every file validates, and every plain
scenario runs on a tiny slice of its traffic (so the studies never rot)."""

from __future__ import annotations

import pytest
from sweep_helpers import REPO

from kvsim.api import run
from kvsim.config import load_scenario
from kvsim.build import build_allocator
from kvsim.sweep import load_sweep

STUDIES = REPO / "scenarios" / "studies"
SCENARIOS = sorted(p for p in STUDIES.glob("*.yaml") if "sweep" not in p.stem)
SWEEPS = sorted(p for p in STUDIES.glob("*.yaml") if "sweep" in p.stem)


def test_the_studies_are_there():
    names = {p.stem for p in SCENARIOS} | {p.stem for p in SWEEPS}
    assert {"vllm_sharegpt", "vllm_alpaca", "vllm_sharegpt_rate_sweep", "vllm_alpaca_rate_sweep",
            "block_size_sweep", "kv_dtype_sweep", "recompute_vs_swap", "prefix_caching_mooncake",
            "prefix_caching_capacity_sweep", "seed_table", "fp8_dequant",
            "recompute_vs_swap_block_size_sweep"} <= names


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_study_sweep_validates(path):
    sweep = load_sweep(path)
    assert len(sweep.points) >= 4
    assert sweep.spec.description


def _tiny(path) -> list[str]:
    raw = load_scenario(path).base
    if raw.trace.synthetic is not None:
        return ["trace.synthetic.num_requests=40"]
    return ["trace.end_s=15"]


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_study_scenario_validates_and_runs_on_a_slice(path):
    loaded = load_scenario(path, _tiny(path))
    assert loaded.variants, "the studies compare variants"
    for name, scn in loaded.runs.items():
        build_allocator(scn, str(path))
    results = run(loaded)
    assert set(results) == set(loaded.variants)
    for name, r in results.items():
        assert r.summary["requests_finished"] > 0, name
