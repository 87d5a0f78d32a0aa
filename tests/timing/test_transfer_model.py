"""kvsim.timing.transfer: per-copy latency + size-dependent DMA rate, copy counting, link config."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.config import load_scenario
from kvsim.errors import ConfigError
from kvsim.hw import MODELS
from kvsim.timing import transfer as T

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
LINKS = ("pcie-gen4-x16", "pcie-gen5-x16", "nvlink-c2c")


def test_shipped_links_are_the_three_documented_ones_with_sources():
    presets = T.link_presets()
    assert set(presets) == set(LINKS)
    doc = (ROOT / "docs" / "transfer_model.md").read_text()
    for name, link in presets.items():
        assert link.source and name in doc
        # sustained copy rate below the link's signalling rate, both directions
        for d in ("h2d", "d2h"):
            assert 0 < link.bandwidth(d) < link.signalling_bandwidth_bytes_per_s
        assert link.per_transfer_latency_s > 0
    assert presets["pcie-gen4-x16"].h2d_bandwidth_bytes_per_s < presets["pcie-gen5-x16"].h2d_bandwidth_bytes_per_s \
        < presets["nvlink-c2c"].h2d_bandwidth_bytes_per_s


@pytest.mark.parametrize("name", LINKS)
def test_small_blocks_cost_more_per_byte_than_large_ones(name):
    """Swapping the same KV in 16-token blocks takes longer than in 256-token blocks: per-copy cost."""
    link = T.get_link(name)
    model = MODELS["Llama-2-7B"]
    per_token_layer = 2 * model.num_kv_heads * model.head_dim * 2  # K+V fp16 bytes per token per layer
    total_tokens = 4096
    times = {}
    for block in (1, 16, 256):
        nblocks = total_tokens // block
        block_bytes = block * per_token_layer * model.num_layers
        times[block] = T.blocks_transfer_time_s(np.arange(nblocks) * 7, block_bytes, link, "d2h",
                                                num_layers=model.num_layers)
    assert times[1] > times[16] > times[256]
    # the large-block cost approaches bytes / bandwidth from above
    floor = total_tokens * per_token_layer * model.num_layers / link.d2h_bandwidth_bytes_per_s
    assert floor < times[256] < 1.5 * floor


@settings(max_examples=60, deadline=None)
@given(st.floats(1, 1e10), st.floats(1, 1e10), st.sampled_from(LINKS), st.sampled_from(("h2d", "d2h")))
def test_achieved_bandwidth_rises_with_copy_size_and_stays_below_the_link_rate(s1, s2, name, direction):
    link = T.get_link(name)
    lo, hi = sorted((s1, s2))
    b_lo, b_hi = T.achieved_bandwidth_bytes_per_s(np.array([lo, hi]), link, direction)
    assert b_lo <= b_hi < link.bandwidth(direction)
    # one copy: time == latency + bytes / bandwidth == bytes / achieved bandwidth
    assert T.transfer_time_s(hi, 1, link, direction) == pytest.approx(hi / b_hi, rel=1e-9)


def test_half_bandwidth_size_is_where_a_copy_reaches_half_the_rate():
    link = T.get_link("pcie-gen5-x16")
    s_half = T.half_bandwidth_bytes(link)
    assert T.achieved_bandwidth_bytes_per_s(s_half, link) == pytest.approx(link.h2d_bandwidth_bytes_per_s / 2)


def test_transfer_time_is_vectorised_and_zero_bytes_cost_nothing():
    link = T.get_link("pcie-gen4-x16")
    b = np.array([0, 1 << 20, 1 << 30])
    n = np.array([5, 4, 1])
    t = T.transfer_time_s(b, n, link)
    assert t.shape == (3,) and t[0] == 0.0
    for i in (1, 2):
        assert t[i] == T.transfer_time_s(int(b[i]), int(n[i]), link)
    with pytest.raises(ValueError):
        T.transfer_time_s(-1, 1, link)


def test_legacy_link_reproduces_bytes_over_bandwidth_whatever_the_copy_count():
    link = T.legacy_link(64e9)
    for n in (1, 10, 10_000):
        assert T.transfer_time_s(64e9, n, link) == 1.0


def test_counting_copies_per_block_and_per_contiguous_run():
    ids = [4, 5, 6, 9, 10, 2]
    assert T.count_runs(ids) == 3
    assert T.count_runs([]) == 0 and T.count_runs([7]) == 1
    assert T.count_transfers(ids, "block", "contiguous") == 6
    assert T.count_transfers(ids, "run", "contiguous") == 3
    assert T.count_transfers(ids, "run", "per_layer", num_layers=32) == 3 * 32
    assert T.count_transfers(ids, "block", "per_layer_kv", num_layers=32) == 6 * 64
    # coalescing contiguous blocks makes the same bytes cheaper
    link = T.get_link("pcie-gen4-x16")
    scattered = T.blocks_transfer_time_s(np.arange(64) * 2, 1 << 16, link, granularity="run", layout="contiguous")
    contiguous = T.blocks_transfer_time_s(np.arange(64), 1 << 16, link, granularity="run", layout="contiguous")
    assert contiguous < scattered
    with pytest.raises(ValueError):
        T.count_transfers(ids, "page")


def test_host_link_preset_and_overrides_in_a_scenario():
    scn = load_scenario(QUICKSTART, ["host_link=pcie-gen5-x16", "host_link.granularity=run",
                                     "host_link.per_transfer_latency_s=2e-6"]).base
    link = scn.link_profile()
    assert link.name == "pcie-gen5-x16" and link.per_transfer_latency_s == 2e-6
    assert link.h2d_bandwidth_bytes_per_s == T.get_link("pcie-gen5-x16").h2d_bandwidth_bytes_per_s
    assert scn.host_link.granularity == "run" and scn.host_link.layout == "per_layer_kv"


def test_a_host_link_field_alone_overrides_the_gpu_presets_link():
    """`--set host_link.FIELD=V` on a scenario without host_link: was refused for the link's missing
    name and rates (naming the scenario file); it overrides the link the run uses anyway, the GPU
    preset's, as `--set gpu.FIELD` overrides the GPU (docs/transfer_model.md)."""
    plain = load_scenario(QUICKSTART).base
    scn = load_scenario(QUICKSTART, ["host_link.granularity=run"]).base
    assert plain.gpu.host_link and scn.host_link.granularity == "run"
    assert scn.link_profile() == plain.link_profile()  # the same link, one field changed


def test_old_scenarios_keep_the_legacy_link():
    scn = load_scenario(QUICKSTART, ["timing.host_link_bandwidth_bytes_per_s=32e9"]).base
    assert scn.host_link is None
    link = scn.link_profile()
    assert link.per_transfer_latency_s == 0.0 and link.h2d_bandwidth_bytes_per_s == 32e9


def test_host_link_and_legacy_bandwidth_together_are_refused():
    with pytest.raises(ConfigError, match="not both"):
        load_scenario(QUICKSTART, ["host_link=pcie-gen4-x16", "timing.host_link_bandwidth_bytes_per_s=1e9"])


def test_bad_link_name_is_one_line_exit_2_naming_file_key_and_choices():
    out = subprocess.run([sys.executable, "-m", "kvsim", "validate", str(QUICKSTART), "--set", "host_link=pcie-gen6"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert "quickstart.yaml" in lines[0] and "host_link" in lines[0] and "pcie-gen6" in lines[0]
    for name in LINKS:
        assert name in lines[0]


def test_bad_link_profile_file_names_file_and_key(tmp_path):
    p = tmp_path / "my-link.yaml"
    p.write_text("name: x\nparams:\n  h2d_bandwidth_bytes_per_s: 1.0e+9\n  d2h_bandwidth_bytes_per_s: -1.0\n"
                 "  per_transfer_latency_s: 1.0e-6\n")
    with pytest.raises(ConfigError, match=r"my-link.yaml: params.d2h_bandwidth_bytes_per_s"):
        T.load_link(p)
    p.write_text("name: x\nparams:\n  h2d_bandwidth_bytes_per_s: 1.0e+9\n")
    with pytest.raises(ConfigError, match=r"params.d2h_bandwidth_bytes_per_s: missing"):
        T.load_link(p)


def test_absent_host_link_leaves_the_resolved_scenario_as_before():
    from kvsim.config.resolved import resolved_dict

    plain = load_scenario(QUICKSTART).base
    assert "host_link" not in resolved_dict(plain)
    linked = load_scenario(QUICKSTART, ["host_link=nvlink-c2c"]).base
    assert resolved_dict(linked)["host_link"]["name"] == "nvlink-c2c"


def test_swap_in_charge_splits_a_partly_prefetched_swap_by_whole_copies():
    link = T.get_link("pcie-gen4-x16")
    tr = T.HostTransfers(link, num_layers=40, legacy=False)
    nbytes, copies, tier_s = 80 * 10**6, 800, 0.002
    swap_s = T.transfer_time_s(nbytes, copies, link, "h2d")
    off = tr.swap_in_charge(nbytes, copies, tier_s, None)  # prefetch off: everything is paid
    assert (off.need_s, off.hidden_s, off.swap_in_bytes, off.swap_in_copies) == (swap_s + tier_s, 0.0, nbytes, copies)
    assert off.tier_load_s == pytest.approx(tier_s, rel=1e-12)
    full = tr.swap_in_charge(nbytes, copies, tier_s, 10.0)  # prefetch hid it all
    assert full.hidden_s == full.need_s and full.swap_in_bytes == full.swap_in_copies == 0 and full.tier_load_s == 0
    half = tr.swap_in_charge(nbytes, copies, tier_s, tier_s + swap_s / 2)
    assert 0 < half.swap_in_copies < copies and half.tier_load_s == 0.0
    assert half.swap_in_bytes == nbytes * half.swap_in_copies // copies
    # the copies left are paid whole: at least the unhidden time
    assert T.transfer_time_s(half.swap_in_bytes, half.swap_in_copies, link, "h2d") >= swap_s / 2 - 1e-12


def test_legacy_swap_in_charge_turns_unhidden_seconds_back_into_bytes():
    tr = T.legacy_transfers(10e9)
    c = tr.swap_in_charge(10**9, 0, 0.05, 0.03)  # need 0.1 + 0.05 s, 0.03 s hidden
    assert c.need_s == 10**9 / 10e9 + 0.05 and c.hidden_s == 0.03 and c.swap_in_copies == 0
    assert c.swap_in_bytes == min(10**9, int((c.need_s - 0.03) * 10e9))
    assert c.tier_load_s == max(0.0, (c.need_s - 0.03) - 10**9 / 10e9)
    load = tr.load_charge(0.05, 0.02)
    assert (load.need_s, load.hidden_s, load.swap_in_bytes, load.tier_load_s) == (0.05, 0.02, 0, 0.05 - 0.02)
