"""GPUs without peer access (``parallel.gpu_p2p: false``): every all-reduce goes through host memory
at the host link's copy rate, and the engines' own all-reduce is off (docs/models.md#parallelism)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
    from kvsim.config.resolved import resolved_dict

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


def _host_timing(**parallel):
    from kvsim.build import build_timing, host_transfers

    scn = scenario(parallel={"tensor": 2, "gpu_p2p": False, **parallel})
    return scn.parallel_plan(), build_timing(scn, 16, Path("."), host_transfers(scn, "s"), "s")[0]


def test_small_allreduces_take_nccls_ll_protocol_large_ones_the_ring():
    from kvsim.hw import NCCL_LL

    p, t = _host_timing(host_allreduce_efficiency=0.2, host_allreduce_latency_s=60e-6)
    assert p.nccl_ll and not t.comm.linear
    A = p.allreduces_per_step
    ll_lat = NCCL_LL["base_latency_s"] + 2 * (2 - 1) * NCCL_LL["step_latency_s"]  # two ring steps at T = 2
    ring = lambda n: p.allreduce_s_per_step + p.allreduce_s_per_token * n  # noqa: E731
    ll = lambda n: A * ll_lat + p.allreduce_s_per_token * n / NCCL_LL["bandwidth_fraction"]  # noqa: E731
    assert ll(1) < ring(1) and ll(200) > ring(200)  # LL wins a one-token step, the ring a 200-token one
    for n in (1, 4, 200, 4096):
        assert t.comm.scalar_s(n) == pytest.approx(min(ll(n), ring(n)), rel=1e-12)
    n = np.array([1, 4, 9, 200, 4096], np.int64)
    assert [x.hex() for x in t.comm.array_s(n)] == [t.comm.scalar_s(int(k)).hex() for k in n]


def test_host_allreduce_ll_false_keeps_the_ring_model_bit_for_bit():
    p, t = _host_timing(host_allreduce_ll=False)
    assert not p.nccl_ll and t.comm.linear
    n = np.array([1, 17, 4096], np.int64)
    assert [x.hex() for x in t.comm.array_s(n)] == [(p.comm_s_per_step + p.comm_s_per_token * k).hex() for k in n]
    # and over a GPU preset's link nothing changes: its measured all-reduce times include small messages
    assert not scenario(parallel={"tensor": 2}).parallel_plan().nccl_ll


def test_host_allreduce_ll_with_p2p_is_refused_and_absent_from_the_resolved_form():
    from kvsim.config.resolved import resolved_dict

    with pytest.raises(ValueError, match="gpu_p2p: false"):
        scenario(parallel={"tensor": 2, "host_allreduce_ll": False})
    assert "host_allreduce_ll" not in resolved_dict(scenario(parallel={"tensor": 2, "gpu_p2p": False}))["parallel"]
    assert resolved_dict(scenario(parallel={"tensor": 2, "gpu_p2p": False, "host_allreduce_ll": False}))[
        "parallel"]["host_allreduce_ll"] is False


@pytest.mark.parametrize("gemm_model", ["fitted", "roofline"])
def test_step_time_and_decode_durations_agree_with_the_ll_protocol(gemm_model):
    from kvsim.build import build_timing, host_transfers
    from kvsim.timing.base import decode_shape

    scn = scenario(parallel={"tensor": 2, "gpu_p2p": False}, timing={"kind": "analytical", "gemm_model": gemm_model})
    t = build_timing(scn, 16, Path("."), host_transfers(scn, "s"), "s")[0]
    n = np.array([1, 3, 9, 64, 300, 1500], np.int64)
    T, P = n * 900, n * 57
    durations, _, _ = t.decode_durations(n, T, P)
    for j, k in enumerate(n):
        st = t.step_time(decode_shape(int(k), int(T[j]), int(P[j])))
        assert st.duration_s.hex() == durations[j].hex()
        assert st.breakdown_s["parallel_comm_s"] == t.comm.scalar_s(int(k))
