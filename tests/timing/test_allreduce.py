"""The engine's tensor-parallel all-reduce (kvsim.timing.allreduce): measured custom all-reduce
curves, NCCL's ring model where none is measured, and one definition for every evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvsim.errors import ConfigError
from kvsim.hw import GPUS, MODELS
from kvsim.models.parallel import plan
from kvsim.timing.allreduce import StepComm, custom_curve, load_curves
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import decode_shape
from kvsim.timing.context import TimingContext


def _ctx(model="Llama-3-70B", gpu="H100-SXM-80GB", tp=4, pp=1):
    m, g = MODELS[model], GPUS[gpu]
    p = plan(m, g, "bf16", "bf16", tp, pp)
    return TimingContext(m, g, p.kv.with_block_size(16), p.weight_bytes_per_rank, Path("."), tensor_parallel=tp,
                         pipeline_parallel=pp, comm_s_per_step=p.comm_s_per_step,
                         comm_s_per_token=p.comm_s_per_token, allreduces_per_step=p.allreduces_per_step,
                         allreduce_bytes_per_token=p.allreduce_bytes_per_token,
                         allreduce_s_per_step=p.allreduce_s_per_step, allreduce_s_per_token=p.allreduce_s_per_token)


def test_curves_hold_the_printed_readings():
    c = custom_curve("vllm-custom", "NVLink 4", 4)
    assert c.time_s(32768) == pytest.approx(9.2e-6) and c.time_s(1048576) == pytest.approx(40.2e-6)
    assert c.time_s(100) == c.time_s(512)  # flat below the smallest printed message
    assert c.time_s((32768 + 262144) / 2) == pytest.approx((9.2e-6 + 20.6e-6) / 2)  # linear between
    assert custom_curve("sglang-custom", "NVLink 4", 8).time_s(32768) == pytest.approx(7.8e-6)
    assert custom_curve("nccl", "NVLink 4", 4) is None and custom_curve("vllm-custom", "NVLink 3", 4) is None
    assert all(c.source.startswith("sgl-project/sglang#2904") for c in load_curves().values())


def test_one_token_step_pays_the_custom_latency_per_allreduce():
    ctx = _ctx()
    comm = StepComm(ctx, "vllm-custom")
    per_call = float(custom_curve("vllm-custom", "NVLink 4", 4).time_s(8192 * 2))
    assert ctx.allreduces_per_step == 160 and comm.scalar_s(1) == pytest.approx(160 * per_call, rel=1e-12)
    # beyond the largest printed message (1 MiB: 64 tokens of Llama-3-70B) NCCL's bandwidth term
    # continues from the curve's last reading
    nccl = StepComm(ctx, "nccl")
    per_token_bw = ctx.allreduce_s_per_token  # NCCL's seconds per token of all 160 all-reduces
    assert comm.scalar_s(65) == pytest.approx(comm.scalar_s(64) + per_token_bw, rel=1e-12)
    assert comm.scalar_s(4096) - nccl.scalar_s(4096) == pytest.approx(comm.scalar_s(64) - nccl.scalar_s(64),
                                                                      rel=1e-9)
    assert comm.scalar_s(1) < nccl.scalar_s(1) / 3  # 8.6 us against NCCL's 35.5 us


def test_curves_are_non_decreasing_envelopes_of_the_readings():
    # TP 4: 9.1 us at 512 B, 8.5 us at 4 KiB in the PR; the smaller message is priced at 8.5
    c = custom_curve("vllm-custom", "NVLink 4", 4)
    assert c.time_s(512) == pytest.approx(8.5e-6) and c.time_s(100) == pytest.approx(8.5e-6)
    for curve in load_curves().values():
        assert all(a <= b for a, b in zip(curve.latency_s, curve.latency_s[1:]))


def _default_timing(gpu, tp):
    from kvsim.config import load_mapping
    from kvsim.build import build_timing, host_transfers
    scn = load_mapping({"model": "Llama-3-70B", "gpu": gpu, "parallel": {"tensor": tp},
                        "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 1,
                                                "arrival": {"process": "poisson", "rate_per_s": 1}}}}, Path(".")).base
    return build_timing(scn, 16, Path("."), host_transfers(scn), "x")[0]


@pytest.mark.parametrize("gpu", ["H100-SXM-80GB", "H200-141GB", "A100-80GB"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_step_time_and_comm_never_fall_as_tokens_grow(gpu, tp):
    # QA: at TP 8 a 65-sequence decode step was priced below a 64-sequence one (22.43 -> 21.78 ms):
    # the measured curve ended at 1 MiB and NCCL's ring model, which does not meet it, took over
    t = _default_timing(gpu, tp)
    n = np.arange(1, 16385, dtype=np.int64)
    durations, _, _ = t.decode_durations(n, n * 1024, n * 64)
    comm = t.comm.array_s(n)
    assert np.all(np.diff(comm) >= 0)
    # the step never gets cheaper with a token more, except where the decode-attention kernel model's
    # own split-KV / wave steps make attention cheaper (docs/kernel_model.md; not this term)
    attention_rises = np.diff(t._attention_s(n, n * 1024, n * 64)) >= 0
    assert np.all(np.diff(durations)[attention_rises] >= 0)
    assert attention_rises.mean() > 0.99
    for k in (1, 63, 64, 65, 66, 127, 128, 129, 511, 512, 513, 1000, 4096, 16384):
        st = t.step_time(decode_shape(k, k * 1024, k * 64))
        assert st.duration_s.hex() == durations[k - 1].hex()
        assert st.breakdown_s["parallel_comm_s"].hex() == comm[k - 1].hex()


def test_nccl_and_unmeasured_deployments_keep_the_linear_form_bit_for_bit():
    for ctx, kind in ((_ctx(), "nccl"), (_ctx(gpu="A100-80GB"), "vllm-custom"), (_ctx(tp=2, pp=2), "nccl")):
        comm = StepComm(ctx, kind)
        assert comm.linear and comm.kind == "nccl"
        n = np.array([1, 17, 4096], np.int64)
        assert [x.hex() for x in comm.array_s(n)] == \
            [(ctx.comm_s_per_step + ctx.comm_s_per_token * k).hex() for k in n]


def test_pipeline_stage_sends_stay_beside_the_custom_allreduce():
    ctx = _ctx(tp=2, pp=2)
    comm, nccl = StepComm(ctx, "vllm-custom"), StepComm(ctx, "nccl")
    stage = nccl.scalar_s(1) - (ctx.allreduce_s_per_step + ctx.allreduce_s_per_token)
    want = stage + ctx.allreduces_per_step * float(custom_curve("vllm-custom", "NVLink 4", 2).time_s(16384))
    assert stage > 0 and comm.scalar_s(1) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("gemm_model", ["fitted", "roofline"])
def test_step_time_decode_durations_and_pricer_agree_with_a_custom_allreduce(gemm_model):
    t = AnalyticalTiming(AnalyticalTimingConfig(allreduce="vllm-custom", gemm_model=gemm_model), _ctx())
    n = np.array([1, 3, 64, 65, 300, 1500], np.int64)
    T, P = n * 900, n * 57
    durations, parts, _ = t.decode_durations(n, T, P)
    pricer = t.decode_step_pricer()
    for j, k in enumerate(n):
        st = t.step_time(decode_shape(int(k), int(T[j]), int(P[j])))
        assert st.duration_s.hex() == durations[j].hex()
        assert st.breakdown_s["parallel_comm_s"] == t.comm.scalar_s(int(k))
        if pricer is not None:
            assert pricer.column(int(k), int(T[j]), int(P[j]))[0].hex() == durations[j].hex()


def test_a_bad_curve_row_is_one_line_naming_file_line_and_field(tmp_path):
    bad = tmp_path / "c.csv"
    bad.write_text("implementation,interconnect,gpu_measured,tensor_parallel,message_bytes,latency_us,cuda_graph,source\n"
                   "vllm-custom,NVLink 4,H100,4,512,,no,x\n")
    with pytest.raises(ConfigError, match=r"c\.csv: line 2: field 'latency_us' is missing"):
        load_curves(bad)
    bad.write_text(bad.read_text().replace(",,no", ",9,no").replace("vllm-custom", "mpi"))
    with pytest.raises(ConfigError, match="implementation 'mpi': valid: vllm-custom, sglang-custom"):
        load_curves(bad)
