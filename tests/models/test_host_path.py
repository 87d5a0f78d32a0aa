"""GPUs without peer access (``parallel.gpu_p2p: false``): every all-reduce goes through host memory
at the host link's copy rate, and the engines' own all-reduce is off (docs/models.md#parallelism)."""

from __future__ import annotations

import pytest

from kvsim.config import Scenario, load_scenario
from kvsim.errors import ConfigError
from kvsim.hw import HOST_PATH, HOST_PATH_ALLREDUCE
from kvsim.timing.allreduce import custom_curve
from kvsim.timing.transfer import get_link


def scenario(**over):
    return Scenario.model_validate({"trace": {"file": "unused.csv"}, "model": "Qwen2.5-7B", "gpu": "A100-80GB",
                                    **over})


def test_without_p2p_the_interconnect_is_the_host_links_copy_rate():
    scn = scenario(parallel={"tensor": 2, "gpu_p2p": False})
    gpu, link = scn.gpu_spec(), get_link("pcie-gen4-x16")
    assert gpu.interconnect == HOST_PATH
    assert gpu.interconnect_bandwidth_bytes_per_s == min(link.h2d_bandwidth_bytes_per_s, link.d2h_bandwidth_bytes_per_s)
    assert (gpu.allreduce_efficiency, gpu.allreduce_latency_s) == (HOST_PATH_ALLREDUCE["efficiency"],
                                                                   HOST_PATH_ALLREDUCE["latency_s"])
    # no engine measured its own all-reduce on this path: NCCL's ring model prices it
    assert custom_curve("vllm-custom", gpu.interconnect, 2) is None


def test_ring_model_by_hand_with_the_scenarios_constants():
    p2p = scenario(parallel={"tensor": 2}).parallel_plan()
    host = scenario(parallel={"tensor": 2, "gpu_p2p": False, "host_allreduce_efficiency": 0.25,
                              "host_allreduce_latency_s": 50e-6}).parallel_plan()
    layers, act = 28, 3584 * 2  # Qwen2.5-7B: 2 all-reduces a layer of hidden x 2 bytes per token
    rate = min(26.2e9, 26.8e9) * 0.25
    assert host.comm_s_per_token == pytest.approx(2 * layers * 1.0 * act / rate, rel=1e-12)  # 2 (T-1)/T = 1
    assert host.comm_s_per_step == pytest.approx(2 * layers * 50e-6, rel=1e-12)
    assert host.comm_s_per_token > 10 * p2p.comm_s_per_token  # NVLink 3 is far faster than host memory
    assert host.kv == p2p.kv and host.weight_bytes_per_gpu == p2p.weight_bytes_per_gpu  # capacity unchanged


def test_one_gpu_or_p2p_keeps_the_preset():
    assert scenario(parallel={"gpu_p2p": False}).gpu_spec() == scenario().gpu_spec()
    assert scenario(parallel={"tensor": 2}).gpu_spec().interconnect == "NVLink 3"


def test_a_scenarios_host_link_sets_the_rate():
    scn = scenario(parallel={"tensor": 2, "gpu_p2p": False}, host_link="pcie-gen5-x16")
    link = get_link("pcie-gen5-x16")
    assert scn.gpu_spec().interconnect_bandwidth_bytes_per_s == min(link.h2d_bandwidth_bytes_per_s,
                                                                    link.d2h_bandwidth_bytes_per_s)


def test_host_keys_without_no_p2p_are_refused_in_one_line(tmp_path):
    import yaml
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"trace": {"file": "t.csv"}, "model": "Qwen2.5-7B", "gpu": "A100-80GB",
                                 "parallel": {"tensor": 2, "host_allreduce_efficiency": 0.3}}))
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    msg = str(e.value)
    assert msg.startswith(str(f)) and "\n" not in msg and "gpu_p2p: false" in msg, msg


def test_the_default_resolved_form_has_no_new_keys():
    from kvsim.simulate import resolved_dict

    assert "gpu_p2p" not in resolved_dict(scenario(parallel={"tensor": 2}))["parallel"]
    assert resolved_dict(scenario(parallel={"tensor": 2, "gpu_p2p": False}))["parallel"]["gpu_p2p"] is False


def test_a_run_without_p2p_is_slower_and_deterministic(tmp_path):
    from kvsim.api import run

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"0,{512 + i},{64}\n" for i in range(24)))
    runs = {}
    for p2p in (True, False, False):
        scn = Scenario.model_validate({"trace": {"file": str(trace)}, "model": "Qwen2.5-7B", "gpu": "A100-80GB",
                                       "parallel": {"tensor": 2, "gpu_p2p": p2p}})
        runs.setdefault(p2p, []).append(run(scn).requests)
    assert runs[False][0].equals(runs[False][1])
    assert runs[False][0]["finish_s"].max() > runs[True][0]["finish_s"].max()
