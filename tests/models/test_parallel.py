"""Tensor/pipeline parallelism: per-GPU KV and weights (vLLM's rules), communication time in the
analytical timing, and the vLLM paper's Table 1 setups."""

from pathlib import Path

import numpy as np
import pytest

from kvsim.config import Scenario, load_scenario
from kvsim.errors import ConfigError
from kvsim.hw import GPUS, MODELS
from kvsim.models.geometry import KVGeometry
from kvsim.models.parallel import layers_per_stage, plan
from kvsim.build import build_allocator
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape
from kvsim.timing.context import TimingContext

ROOT = Path(__file__).resolve().parents[2]


def scenario(**over):
    return Scenario.model_validate({"trace": {"file": "unused.csv"}, "model": "Llama-3-70B", "gpu": "H100-SXM-80GB",
                                    **over})


def test_layers_per_stage_as_vllm_splits_them():
    assert layers_per_stage(80, 1) == (80,)
    assert layers_per_stage(80, 4) == (20, 20, 20, 20)
    assert layers_per_stage(61, 2) == (31, 30)  # the extra layer goes before the last stage
    assert layers_per_stage(80, 3) == (27, 27, 26)


def test_kv_heads_split_then_replicated_and_mla_latent_on_every_gpu():
    llama = MODELS["Llama-3-70B"]  # 8 KV heads
    assert [KVGeometry.for_gpu(llama, "fp16", t).num_kv_heads for t in (1, 2, 4, 8, 16, 32)] == [8, 4, 2, 1, 1, 1]
    assert [KVGeometry.for_gpu(llama, "fp16", t).num_query_heads for t in (1, 2, 4, 8)] == [64, 32, 16, 8]
    assert KVGeometry.for_gpu(MODELS["DeepSeek-V3"], "fp8", 8).num_kv_heads == 1


def test_tensor_parallel_divides_kv_and_weights_per_gpu():
    one = scenario().parallel_plan()
    for t in (2, 4, 8):
        p = scenario(parallel={"tensor": t}).parallel_plan()
        assert p.kv.bytes_per_token == one.kv.bytes_per_token // t == 80 * 2 * (8 // t) * 128 * 2
        assert p.weight_bytes_per_gpu == int(70.55e9 * 2 / t)
        assert p.kv.step_bytes_per_token == p.kv.bytes_per_token  # one stage
    # 16 GPUs, 8 KV heads: each GPU keeps a whole head, so per-GPU KV is twice 1/16th
    p16 = plan(MODELS["Llama-3-70B"], GPUS["H100-SXM-80GB"], "fp16", "fp16", tensor=16)
    assert p16.kv.bytes_per_token == 80 * 2 * 1 * 128 * 2 == 2 * one.kv.bytes_per_token // 16
    # MLA: the latent is not split
    ds = plan(MODELS["DeepSeek-V3"], GPUS["H200-141GB"], "fp8", "fp8", tensor=8)
    assert ds.kv.bytes_per_token == 61 * 576


def test_pipeline_stages_split_layers_and_the_biggest_stage_sizes_the_pool():
    p = scenario(parallel={"pipeline": 3}).parallel_plan()
    assert p.kv.layers_per_stage == (27, 27, 26)
    assert p.kv.bytes_per_token == 27 * 2 * 8 * 128 * 2
    assert p.kv.step_bytes_per_token == 80 * 2 * 8 * 128 * 2  # stages run one after another
    assert p.weight_bytes_per_gpu == int(70.55e9 * 2 / 3)


def test_communication_time_by_hand():
    gpu = GPUS["H100-SXM-80GB"]
    p = scenario(parallel={"tensor": 4}).parallel_plan()
    bw = 450e9 * 0.81
    # 80 layers x 2 all-reduces x ring factor 2(T-1)/T x hidden 8192 x 2 bytes per token
    assert p.comm_s_per_token == pytest.approx(160 * 1.5 * 8192 * 2 / bw, rel=1e-12)
    assert p.comm_s_per_step == pytest.approx(160 * gpu.allreduce_latency_s, rel=1e-12)
    pp = scenario(parallel={"tensor": 2, "pipeline": 2}).parallel_plan()
    assert pp.comm_s_per_token == pytest.approx((160 * 1.0 + 1) * 8192 * 2 / bw, rel=1e-12)
    assert pp.comm_s_per_step == pytest.approx(161 * gpu.allreduce_latency_s, rel=1e-12)
    assert scenario().parallel_plan().comm_s(1000) == 0.0


def timing_ctx(scn, block_size=16):
    p = scn.parallel_plan()
    return TimingContext(model=scn.model.spec(), gpu=scn.gpu.spec(), kv=p.kv.with_block_size(block_size),
                         weight_bytes=p.weight_bytes_per_rank, base_dir=Path("."), tensor_parallel=p.tensor,
                         pipeline_parallel=p.pipeline, comm_s_per_step=p.comm_s_per_step,
                         comm_s_per_token=p.comm_s_per_token)


def _timing(scn):
    return AnalyticalTiming(AnalyticalTimingConfig(), timing_ctx(scn)), scn.parallel_plan()


def test_analytical_step_adds_the_communication_and_decode_durations_match_bit_for_bit():
    t1, _ = _timing(scenario())
    t4, p4 = _timing(scenario(parallel={"tensor": 4}))
    shape = BatchShape(num_seqs=32, num_prefill_seqs=0, num_decode_seqs=32, num_prefill_tokens=0, num_decode_tokens=32,
                       kv_tokens_read=32 * 2000,
                       attention_pairs=32 * 2000)
    s1, s4 = t1.step_time(shape), t4.step_time(shape)
    assert s4.breakdown_s["parallel_comm_s"] == p4.comm_s(32) > 0
    assert s1.breakdown_s["parallel_comm_s"] == 0.0
    # memory-bound decode: a quarter of the bytes per GPU, plus the all-reduces
    assert s4.breakdown_s["weights_read_s"] == pytest.approx(s1.breakdown_s["weights_read_s"] / 4, rel=1e-9)
    assert s4.duration_s < s1.duration_s
    seqs = np.array([1, 7, 32, 255], dtype=np.int64)
    kv = np.array([100, 7000, 64000, 900000], dtype=np.int64)
    for timing in (t1, t4):
        durations, _, _ = timing.decode_durations(seqs, kv)
        for j in range(len(seqs)):
            one = BatchShape(num_seqs=int(seqs[j]), num_prefill_seqs=0, num_decode_seqs=int(seqs[j]), num_prefill_tokens=0,
                             num_decode_tokens=int(seqs[j]),
                             kv_tokens_read=int(kv[j]), attention_pairs=int(kv[j]))
            assert durations[j] == timing.step_time(one).duration_s  # bit for bit


@pytest.mark.parametrize("over,words", [
    ({"parallel": {"tensor": 3}}, ["parallel.tensor", "3", "64 attention heads"]),
    ({"model": "Qwen2.5-7B", "parallel": {"tensor": 8}}, ["parallel.tensor", "28 attention heads"]),
    ({"parallel": {"pipeline": 81}}, ["parallel.pipeline", "81 stages", "80 layers"]),
    ({"parallel": {"tensor": 0}}, ["parallel.tensor", "greater than or equal to 1"]),
    ({"gpu": {"name": "mine", "memory_bytes": 80 << 30, "hbm_bandwidth_bytes_per_s": 2e12, "bf16_flops_per_s": 3e14},
      "parallel": {"tensor": 2}}, ["gpu.interconnect_bandwidth_bytes_per_s", "mine"]),
])
def test_impossible_splits_are_refused_in_one_line(tmp_path, over, words):
    import yaml
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"trace": {"file": "t.csv"}, "model": "Llama-3-70B", "gpu": "H100-SXM-80GB", **over}))
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    msg = str(e.value)
    assert msg.startswith(str(f)) and "\n" not in msg
    for w in words:
        assert w in msg, msg


# The vLLM paper (Kwon et al., SOSP 2023), Table 1: KV slots 15.7K / 9.7K / 60.1K.
PAPER_SLOTS = {"opt-13b-paper": 15_700, "opt-66b-tp4-paper": 9_700, "opt-175b-tp8-paper": 60_100}


def test_vllm_paper_table1_setups_hold_the_papers_kv_slots():
    loaded = load_scenario(ROOT / "scenarios" / "studies" / "vllm_table1_parallel.yaml")
    caps = {}
    for name, scn in loaded.runs.items():
        alloc, budget = build_allocator(scn, name)
        caps[name] = alloc.capacity_tokens
    for name, slots in PAPER_SLOTS.items():
        assert caps[name] == pytest.approx(slots, rel=0.02), (name, caps[name])
    # Derived budgets (GPU memory x 0.9 - weights - 1 GiB per GPU) are smaller than the paper's.
    assert caps["opt-66b-tp4-derived"] < caps["opt-66b-tp4-paper"]
    assert caps["opt-175b-tp8-derived"] < caps["opt-175b-tp8-paper"]
    assert loaded.runs["opt-66b-tp4-paper"].parallel_plan().kv.num_kv_heads == 18  # 72 heads / 4
    assert loaded.runs["opt-175b-tp8-paper"].parallel_plan().kv.bytes_per_token == 96 * 2 * 12 * 128 * 2


def test_calibrated_timing_is_single_gpu_and_refuses_parallel(tmp_path):
    import yaml
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"trace": {"file": "t.csv"}, "model": "Llama-3-70B", "gpu": "H100-SXM-80GB",
                                 "parallel": {"tensor": 4}, "timing": {"kind": "calibrated", "file": "calib"}}))
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    assert "parallel: timing kind 'calibrated'" in str(e.value) and "analytical" in str(e.value)


# -- one KV geometry per GPU (issue 23) ------------------------------------------------------------

def test_capacity_of_a_tensor_parallel_gqa_replica_by_hand():
    # Llama-3-70B (80 layers, 8 KV heads of 128, fp16) on 4 x H100-SXM-80GB, paged blocks of 16.
    # Per GPU: 2 KV heads; 80 x 2 (K, V) x 2 heads x 128 x 2 bytes = 81,920 bytes per token;
    # weights 70.55e9 x 2 / 4 = 35,275,000,000 bytes; budget 80 GiB x 0.9 - weights - 1 GiB reserve
    # = 77,309,411,328 - 35,275,000,000 - 1,073,741,824 = 40,960,669,504 bytes = 500,008.2 tokens
    # -> 31,250 whole blocks of 16 = 500,000 tokens.
    # (the fixed reserve, as written; vLLM's memory profile, the vllm-v1 default: tests/models/test_memory.py)
    scn = scenario(parallel={"tensor": 4}, allocator={"kind": "paged", "block_size": 16},
                   kv_budget={"activation_reserve_bytes": "1 GiB"})
    alloc, got_budget = build_allocator(scn, "s")
    assert got_budget == 40_960_669_504
    assert alloc.capacity_tokens == 500_000
    g = scn.kv_geometry()
    assert (g.num_kv_heads, g.num_query_heads, g.bytes_per_token, g.fetches_per_page) == (2, 16, 81_920, 160)
    # 16 GPUs, 8 KV heads: vLLM replicates each head on 2 GPUs, so one GPU holds one whole head
    g16 = KVGeometry.for_gpu(MODELS["Llama-3-70B"], "fp16", 16)
    assert g16.num_kv_heads == 1 and g16.bytes_per_token == 80 * 2 * 1 * 128 * 2


@pytest.mark.parametrize("backend", ["auto", "vllm-2023-paged", "contiguous"])
def test_attention_time_of_the_same_schedule_falls_about_as_one_over_t(backend):
    """Llama-3-70B on H100, 64 sequences x 4,000 tokens: each GPU reads 1/T of the KV heads, so the
    kernel's streaming time is exactly 1/T; its fixed launch costs and the SMs left idle by fewer
    heads keep the whole a little above 1/T (the issue's figure was 1.00 for every T)."""
    n, ctx = 64, 4000
    shape = BatchShape(num_seqs=n, num_prefill_seqs=0, num_decode_seqs=n, num_prefill_tokens=0, num_decode_tokens=n,
                       kv_tokens_read=n * ctx, attention_pairs=n * ctx, kv_pages_read=n * -(-ctx // 16))
    cfg = AnalyticalTimingConfig(attention_backend=backend)
    att = {}
    for t in (1, 2, 4, 8):
        timing = AnalyticalTiming(cfg, timing_ctx(scenario(parallel={"tensor": t})))
        att[t] = timing.step_time(shape).breakdown_s["attention_s"]
        assert timing.step_time(shape).kv_bytes_read * t == n * ctx * 80 * 2 * 8 * 128 * 2
    # the unsplit 2023 kernel has one work unit per (query head, sequence): 64 x 8 = 512 at T = 8 keep
    # fewer bytes in flight than 64 x 64 (Little's-law saturation, docs/kernel_model.md), so its
    # time falls a little slower than a split-KV kernel's
    # the split-KV kernels pay a fitted per-work-unit cost (flashinfer-paged's 1.29e-8 s, fitted on the
    # public corpus, docs/kernel_model.md) over the many KV splits one KV head per GPU makes at T = 8:
    # 1.36 / T there, where the streaming alone is exactly 1 / T
    slack = 1.6 if backend == "vllm-2023-paged" else 1.4
    for t in (2, 4, 8):
        assert 1 / t < att[t] / att[1] < slack / t, (t, att[t] / att[1])


def test_pcie_presets_price_all_reduces_with_nccls_pci_model():
    """QA (twenty-ninth session): the PCIe presets had 0 latency per all-reduce, so tensor parallelism over
    PCIe cost 14 us a step at TP 8 and an H100 PCIe beat an H100 SXM. Now NCCL's tuning model: ring
    latency 8.4 + 2 (T-1) x 5.7 us, and the LL protocol beside it (kvsim.hw.NCCL_PCI_RING, NCCL_LL)."""
    m = MODELS["Llama-3-8B"]
    for gpu in ("A100-PCIe-80GB", "H100-PCIe-80GB", "L40S"):
        for t in (2, 4, 8):
            p = plan(m, GPUS[gpu], "fp16", "fp16", tensor=t)
            assert p.allreduce_s_per_step == pytest.approx(2 * m.num_layers * (8.4e-6 + 2 * (t - 1) * 5.7e-6))
            assert p.nccl_ll
    sxm = plan(m, GPUS["H100-SXM-80GB"], "fp16", "fp16", tensor=8)  # NVLink: the measured time, no LL beside it
    assert sxm.allreduce_s_per_step == pytest.approx(2 * m.num_layers * 35.5e-6) and not sxm.nccl_ll


def test_tensor_parallel_over_pcie_is_not_faster_than_over_nvlink_under_the_default_profile():
    from kvsim.simulate import run
    from kvsim.timing.gemm import profile_for

    assert profile_for(GPUS["H100-PCIe-80GB"]).name == profile_for(GPUS["H100-SXM-80GB"]).name  # not generic
    tpot = {}
    for gpu in ("H100-SXM-80GB", "H100-PCIe-80GB"):
        scn = Scenario.model_validate({
            "model": "Llama-3-8B", "gpu": gpu, "parallel": {"tensor": 8},
            "trace": {"synthetic": {"num_requests": 1, "seed": 1, "preset": "sharegpt",
                                    "arrival": {"process": "poisson", "rate_per_s": 1},
                                    "prompt_tokens": {"kind": "fixed", "value": 1000},
                                    "output_tokens": {"kind": "fixed", "value": 30}}}})
        tpot[gpu] = run(scn).summary["tpot_s"]["mean"]
    assert tpot["H100-PCIe-80GB"] > tpot["H100-SXM-80GB"]


def test_a_tensor_degree_past_one_node_gets_a_note():
    """tensor 16 on an NVLink preset is priced as one node's NVLink (docs/models.md, 'Tensor parallel
    above 8'): validate and run say so; 8 and below say nothing of it."""
    base = {"model": "Llama-3.1-405B", "gpu": "H100-SXM-80GB", "weight_dtype": "fp8",
            "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 1,
                                    "arrival": {"process": "poisson", "rate_per_s": 1}}}}
    notes = Scenario.model_validate({**base, "parallel": {"tensor": 16}}).notes()
    assert any("parallel.tensor 16 spans more than one 8-GPU node" in n and "NVLink 4" in n for n in notes), notes
    assert not any("8-GPU node" in n for n in Scenario.model_validate({**base, "parallel": {"tensor": 8}}).notes())
