"""Swaps and CPU-tier loads priced with the host-link transfer model (docs/transfer_model.md)."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import make_scenario, make_trace
from kvsim.models.geometry import KVGeometry
from kvsim.errors import ConfigError
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.tiers import OffloadConfig, TierConfig
from kvsim.kv.protocol import allocator_capabilities
from kvsim.build import host_transfers
from kvsim.simulate import run
from kvsim.timing import transfer as T
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape
from kvsim.timing.context import TimingContext

ROWS = list(zip(np.cumsum(np.full(160, 0.02)), np.full(160, 200), np.full(160, 300)))


def swap_scenario(block, link=None, engine="fast", prefetch=False, legacy_bw=None, **link_over):
    timing = {"kind": "analytical"} if legacy_bw is None else {"kind": "analytical",
                                                               "host_link_bandwidth_bytes_per_s": legacy_bw}
    kw = dict(kv_budget={"tokens": 6144}, timing=timing, engine={"mode": engine},
              allocator={"kind": "paged", "block_size": block, "watermark": 0.0},
              scheduler={"preemption_mode": "swap", "swap_space_bytes": 8 * 10**9, "prefetch": prefetch})
    if link is not None:
        kw["host_link"] = {"preset": link, **link_over} if link_over else link
    return make_scenario(**kw)


def swap_s_per_byte(res):
    moved = int(res.steps["swap_in_bytes"].sum() + res.steps["swap_out_bytes"].sum())
    assert moved > 0 and res.summary["preemptions_by_mode"]["swap"] > 0
    return res.summary["step_time_breakdown_s"]["swap_s"] / moved


def test_small_blocks_pay_more_swap_time_per_byte_on_a_real_link():
    link = T.get_link("pcie-gen5-x16")
    per_byte = {bs: swap_s_per_byte(run(swap_scenario(bs, "pcie-gen5-x16"), trace=make_trace(ROWS),
                                        check_invariants=True)) for bs in (1, 16, 128)}
    assert per_byte[1] > per_byte[16] > per_byte[128], per_byte
    # even the largest blocks cannot beat the link's sustained rate (d2h and h2d are both priced)
    assert per_byte[128] >= 1 / max(link.h2d_bandwidth_bytes_per_s, link.d2h_bandwidth_bytes_per_s)
    # with OPT-13B's 40 layers, K and V per layer, a 1-token block is 80 copies of 10 KiB: mostly latency
    assert per_byte[1] > 5 * per_byte[128]


def test_legacy_link_has_no_per_copy_cost_whatever_the_block_size():
    """timing.host_link_bandwidth_bytes_per_s given: the old size-independent rate."""
    per_byte = [swap_s_per_byte(run(swap_scenario(bs, legacy_bw=64e9), trace=make_trace(ROWS))) for bs in (1, 128)]
    assert per_byte[0] == pytest.approx(1 / 64e9, rel=1e-9)
    assert per_byte[1] == pytest.approx(1 / 64e9, rel=1e-9)


def test_without_host_link_the_gpu_presets_link_prices_swaps():
    """No host_link: key: the GPU preset's link (A100-80GB: PCIe Gen4 x16), so block size matters."""
    scn = swap_scenario(16)
    assert scn.gpu.host_link == "pcie-gen4-x16" and not host_transfers(scn).legacy
    default = run(scn, trace=make_trace(ROWS))
    named = run(swap_scenario(16, "pcie-gen4-x16"), trace=make_trace(ROWS))
    pd.testing.assert_frame_equal(default.requests, named.requests, check_exact=True)
    assert swap_s_per_byte(run(swap_scenario(1), trace=make_trace(ROWS))) > 5 * swap_s_per_byte(default)
    custom = make_scenario(gpu={"name": "mine", "memory_bytes": 80 * 2**30, "hbm_bandwidth_bytes_per_s": 2e12,
                                "bf16_flops_per_s": 3e14})
    assert host_transfers(custom).legacy  # a GPU that names no link: the legacy default rate
    assert host_transfers(custom).link.h2d_bandwidth_bytes_per_s == T.DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S


def test_every_gpu_preset_names_a_shipped_link():
    from kvsim.hw import GPUS

    for g in GPUS.values():
        assert g.host_link in T.link_presets(), g.name


def test_an_unknown_gpu_host_link_is_one_line():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="unknown host link 'pcie-gen9'"):
        make_scenario(gpu={"preset": "A100-80GB", "host_link": "pcie-gen9"})


@pytest.mark.parametrize("prefetch", [False, True])
def test_step_and_fast_engines_agree_with_link_priced_swaps(prefetch):
    out = {mode: run(swap_scenario(16, "pcie-gen4-x16", engine=mode, prefetch=prefetch), trace=make_trace(ROWS),
                     check_invariants=True) for mode in ("step", "fast")}
    pd.testing.assert_frame_equal(out["step"].requests, out["fast"].requests, check_exact=True)
    assert out["step"].summary["preemptions_by_mode"]["swap"] > 0
    if prefetch:
        assert out["step"].summary["transfer"]["hidden_by_prefetch_s"] > 0


@pytest.mark.parametrize("link", ["pcie-gen4-x16", None])
def test_swap_in_bytes_count_what_prefetch_hid(link):
    """Swap-in bytes are the KV moved back, counted in the step that swaps the request in, whether
    prefetch hid the copies or not (the hidden time is transfer.hidden_by_prefetch_s): with every
    request finished and no prefix cache, all that went out came back; both engines agree."""
    legacy = None if link else 64e9
    out = {mode: run(swap_scenario(16, link, engine=mode, prefetch=True, legacy_bw=legacy), trace=make_trace(ROWS),
                     check_invariants=True) for mode in ("step", "fast")}
    for res in out.values():
        s = res.summary
        assert s["preemptions_by_mode"]["swap"] > 0 and s["transfer"]["hidden_by_prefetch_s"] > 0
        assert res.requests["finish_s"].notna().all()
        assert s["swapped_in_bytes"] == s["swapped_out_bytes"] == s["transfer"]["swap_in_bytes"] > 0
        assert int(res.steps["swap_in_bytes"].sum()) == s["swapped_in_bytes"]
    assert out["step"].summary["swapped_in_bytes"] == out["fast"].summary["swapped_in_bytes"]
    pd.testing.assert_frame_equal(out["step"].requests, out["fast"].requests, check_exact=True)


def test_contiguous_layout_takes_fewer_copies_so_swaps_cost_less():
    """Same link, 1-token blocks: one copy per block instead of 2 x 40 layers."""
    split = swap_s_per_byte(run(swap_scenario(1, "pcie-gen5-x16"), trace=make_trace(ROWS)))
    whole = swap_s_per_byte(run(swap_scenario(1, "pcie-gen5-x16", layout="contiguous"), trace=make_trace(ROWS)))
    assert whole < split / 5, (whole, split)


def _ctx(scn, transfers=None):
    return TimingContext(model=scn.model.spec(), gpu=scn.gpu.spec(), kv=scn.kv_geometry().with_block_size(16),
                         weight_bytes=scn.weight_bytes, base_dir=Path("."), host_transfers=transfers)


def _shape(in_b, in_c, out_b, out_c, tier_s=0.0):
    return BatchShape(num_seqs=1, num_prefill_seqs=0, num_decode_seqs=1, num_prefill_tokens=0,
                      num_decode_tokens=1, kv_tokens_read=100, attention_pairs=100, kv_pages_read=7,
                      swap_in_bytes=in_b, swap_out_bytes=out_b, swap_in_copies=in_c, swap_out_copies=out_c,
                      tier_load_s=tier_s)


def test_legacy_swap_price_is_exactly_bytes_over_bandwidth():
    scn = swap_scenario(16, legacy_bw=48e9)
    bw = 48e9
    rng = np.random.default_rng(2)
    for transfers in (None, host_transfers(scn), T.legacy_transfers(12e9)):
        model = AnalyticalTiming(AnalyticalTimingConfig(host_link_bandwidth_bytes_per_s=bw), _ctx(scn, transfers))
        for in_b, out_b, copies, tier in zip(rng.integers(0, 10**9, 20), rng.integers(0, 10**9, 20),
                                             rng.integers(0, 5000, 20), rng.random(20)):
            got = model.step_time(_shape(int(in_b), int(copies), int(out_b), int(copies), float(tier)))
            # the old expression, operation for operation (copies ignored on the legacy link)
            assert got.breakdown_s["swap_s"] == (int(in_b) + int(out_b)) / bw + float(tier)


def test_link_swap_price_is_the_transfer_model_in_each_direction():
    scn = swap_scenario(16, "pcie-gen5-x16")
    tr = host_transfers(scn)
    assert not tr.legacy and tr.copies_per_unit == 2 * scn.model.spec().num_layers
    model = AnalyticalTiming(AnalyticalTimingConfig(), _ctx(scn, tr))
    got = model.step_time(_shape(10**8, 800, 3 * 10**7, 240, tier_s=0.25)).breakdown_s["swap_s"]
    want = (T.transfer_time_s(10**8, 800, tr.link, "h2d") + T.transfer_time_s(3 * 10**7, 240, tr.link, "d2h") + 0.25)
    assert got == pytest.approx(want, rel=1e-12)
    assert got > (10**8 + 3 * 10**7) / tr.link.h2d_bandwidth_bytes_per_s + 0.25


def test_paged_allocator_counts_runs_of_consecutive_blocks():
    from kvsim.kv.base import KVRequest

    alloc = PagedAllocator(num_blocks=64, block_size=4)
    assert allocator_capabilities(alloc).block_runs
    for rid in (1, 2, 3):
        assert alloc.allocate(KVRequest(rid, prompt_tokens=16, output_tokens=1, max_model_len_tokens=64), 16)
    alloc.free(2)
    alloc.free(1)  # the next request gets the freed blocks of 1 and 2 in free-queue order
    assert alloc.allocate(KVRequest(4, prompt_tokens=32, output_tokens=1, max_model_len_tokens=64), 32)
    table = alloc.block_table(4)
    assert len(table) == 8
    assert alloc.block_runs(4, 0, 8) == T.count_runs(table)
    assert 1 <= alloc.block_runs(4, 0, 8) <= 8
    assert alloc.block_runs(4, 2, 3) == 1 and alloc.block_runs(4, 3, 3) == 0


def test_cpu_tier_loads_are_priced_per_block_by_the_link_ssd_keeps_its_bandwidth():
    bpt, bs = 1000, 16
    offload = OffloadConfig(cpu=TierConfig(capacity_bytes=10**9),
                            ssd=TierConfig(capacity_bytes=10**10, bandwidth_bytes_per_s=3e9))
    alloc = PagedAllocator(num_blocks=64, block_size=bs, prefix_caching=True, offload=offload, bytes_per_token=bpt)
    cpu, ssd = alloc.tiers
    assert cpu.block_load_s is None  # legacy: block bytes / the default rate
    assert cpu.bandwidth_bytes_per_s == T.DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S
    tr = T.HostTransfers(T.get_link("pcie-gen4-x16"), layout="per_layer", num_layers=32, legacy=False)
    alloc.use_host_link(tr)
    assert cpu.block_load_s == T.transfer_time_s(bpt * bs, 32, tr.link, "h2d")
    assert cpu.block_load_s > bpt * bs / tr.link.h2d_bandwidth_bytes_per_s
    assert ssd.block_load_s is None
    # a CPU tier bandwidth the scenario gave (no host_link: key) is kept
    own = PagedAllocator(num_blocks=64, block_size=bs, prefix_caching=True, bytes_per_token=bpt,
                         offload=OffloadConfig(cpu=TierConfig(capacity_bytes=10**9, bandwidth_bytes_per_s=1e10)))
    own.use_host_link(tr)
    assert own.tiers[0].block_load_s is None and own.tiers[0].bandwidth_bytes_per_s == 1e10


def test_host_link_with_default_offload_tiers_is_accepted():
    """``offload: {}`` fills no CPU bandwidth, so it combines with host_link: (it used to be refused)."""
    scn = make_scenario(host_link="nvlink-c2c", allocator={"kind": "paged", "block_size": 16,
                                                          "prefix_caching": True, "offload": {}})
    assert scn.allocator.offload.cpu.bandwidth_bytes_per_s is None
    assert host_transfers(scn).link.name == "nvlink-c2c"


def test_an_ssd_tier_without_bandwidth_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="ssd.bandwidth_bytes_per_s"):
        OffloadConfig(ssd=TierConfig(capacity_bytes=10**10))


def test_host_link_and_a_cpu_tier_bandwidth_together_are_refused():
    scn = make_scenario(host_link="pcie-gen5-x16", allocator={
        "kind": "paged", "block_size": 16, "prefix_caching": True,
        "offload": {"cpu": {"capacity_bytes": 10**9, "bandwidth_bytes_per_s": 2e10}}})
    with pytest.raises(ConfigError, match="offload.cpu.bandwidth_bytes_per_s"):
        host_transfers(scn)


def test_swaps_move_and_hold_whole_blocks():
    """QA (thirtieth session): swapped_out_bytes / block bytes read 3547.5 and a 64 MiB swap space held
    63.75 MiB. vLLM V0 swaps whole blocks (swap space = swap_space_bytes // block bytes CPU blocks;
    swap_blocks copies each block whole), so kvsim's swap space and swap bytes are whole blocks too."""
    from kvsim.kv.base import Allocation
    from kvsim.sched.config import SchedulerConfig
    from kvsim.sched.request import Request
    from kvsim.sched.shape import StepDraft
    from kvsim.sched.swap import HostSwap

    bpt, block = 1000, 16
    alloc = PagedAllocator(100, block)
    cfg = SchedulerConfig(preemption_mode="swap", swap_space_bytes=int(2.5 * block * bpt))  # 2 whole blocks
    host = HostSwap(cfg, alloc, allocator_capabilities(alloc), bpt, T.HostTransfers(T.legacy_link(64e9)))
    assert host.capacity_tokens == 2 * block

    def victim(rid, computed):
        r = Request(rid, 0.0, computed, 10, 4096)
        r.num_computed_tokens, r.admit_seq = computed, rid
        return r

    def out(r):  # a swap of r's blocks (the slots and copies HostSwap.held counts before its KV is freed)
        return host.swap_out(r, host.held(r), step)

    step = StepDraft(budget=0)
    a = victim(0, 17)  # 17 tokens: 2 blocks
    assert out(a)
    assert step.swap_out_bytes == host.swapped_out_bytes == 2 * block * bpt and host.used_tokens == 2 * block
    assert not out(victim(1, 1))  # per token, 17 + 1 <= 40 fitted; no block is left
    host.check()
    back = StepDraft(budget=0)
    assert host.swap_in(a, Allocation(0), back) == 17
    assert back.swapped_in_bytes == host.swapped_in_bytes == 2 * block * bpt and host.used_tokens == 0
    # a prefix-cache hit (whole blocks) leaves the blocks after it to move
    b = victim(2, 40)
    assert out(b) is False  # 3 blocks > 2
    host.capacity_tokens = 3 * block
    assert out(b)
    back = StepDraft(budget=0)
    assert host.swap_in(b, Allocation(block), back) == 40
    assert back.swapped_in_bytes == 2 * block * bpt


def test_swap_bytes_of_a_run_are_whole_blocks():
    res = run(swap_scenario(16, "pcie-gen5-x16"), trace=make_trace(ROWS), check_invariants=True)
    s = res.summary
    block_bytes = 16 * res.summary["kv"]["geometry"]["bytes_per_token"]
    assert s["preemptions_by_mode"]["swap"] > 0
    assert s["swapped_out_bytes"] % block_bytes == 0 and s["swapped_in_bytes"] % block_bytes == 0
    assert (res.steps["swap_out_bytes"] % block_bytes == 0).all()
