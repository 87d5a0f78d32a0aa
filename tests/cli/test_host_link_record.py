"""summary.json records the GPU<->host link a run priced its copies on, and what chose it."""

from helpers import make_trace
from kvsim.config import Scenario
from kvsim.simulate import run

BASE = {"engine_profile": "kvsim", "trace": {"file": "unused.csv"}, "model": "Llama-2-7B", "gpu": "A100-80GB",
        "kv_budget": {"tokens": 4096}, "timing": {"kind": "analytical"}}


def _link(**over) -> dict:
    result = run(Scenario.model_validate({**BASE, **over}), trace=make_trace([(0.0, 32, 4)] * 3), trace_report={})
    return result.summary["host_link"]


def test_the_gpu_presets_link_the_scenarios_and_the_legacy_rate():
    gpu = _link()
    assert gpu["name"] == "pcie-gen4-x16" and gpu["chosen_by"] == "gpu"
    mine = _link(host_link="pcie-gen5-x16")
    assert mine["name"] == "pcie-gen5-x16" and mine["chosen_by"] == "scenario"
    legacy = _link(timing={"kind": "analytical", "host_link_bandwidth_bytes_per_s": 2.0e10})
    assert legacy["chosen_by"] == "legacy" and legacy["h2d_bandwidth_bytes_per_s"] == 2.0e10
    assert set(gpu) == {"name", "chosen_by", "h2d_bandwidth_bytes_per_s", "d2h_bandwidth_bytes_per_s",
                        "per_transfer_latency_s"}
