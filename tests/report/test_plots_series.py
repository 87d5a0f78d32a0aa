"""Comparison plots split series by every scenario key that differs, label them from those keys,
never drop runs silently, and the figures carry what they promise (allocated-share panel,
cached-prefix band, labelled TPOT ticks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import kvsim.plots as plots
from kvsim.report.comparison import Run, comparison_frame, series_of, short_keys
from kvsim.report.findings import key_findings


def _summary(name, *, conc=10, ttft=1.0, thr=1.0, frag=0.1, hit=None, cap=1000, cached=0.0):
    kv = {"token_states_frac": 0.6, "reservation_frac": 0.05, "internal_frag_frac": 0.04,
          "external_frag_frac": 0.01, "free_frac": 0.3, "fragmentation_frac": frag, "capacity_tokens": cap}
    s = {"name": name, "requests_total": 10, "requests_finished": 10, "concurrency": {"max": conc, "mean": conc / 2},
         "ttft_s": {"p50": ttft}, "throughput_requests_per_s": thr, "kv": kv}
    if hit is not None:
        s["prefix_cache"] = {"hit_ratio_tokens": hit, "cached_free_frac_mean": cached}
    return s


def _run(label, params, **kw):
    base = {"allocator.kind": "paged", "allocator.block_size": 16, "allocator.eviction.kind": "lru",
            "allocator.eviction.k": None, "kv_dtype": "fp16", "kv_budget.tokens": 1000}
    return Run(label=label, path=None, summary=_summary(label, **kw), params={**base, **params})


def issue_runs():
    """The issue's case: LRU, LRU-2 and fp8 at block 16, LRU at block 32."""
    return [_run("lru", {}, hit=0.3), _run("lru-2", {"allocator.eviction.kind": "lru-k", "allocator.eviction.k": 2},
                                          hit=0.35),
            _run("fp8", {"kv_dtype": "fp8"}, hit=0.3), _run("lru-b32", {"allocator.block_size": 32}, hit=0.28)]


def test_short_keys_are_unambiguous_and_not_bare_kind():
    names = short_keys(["allocator.kind", "allocator.eviction.kind", "allocator.eviction.k", "kv_dtype",
                        "allocator.block_size"])
    assert names == {"allocator.kind": "allocator.kind", "allocator.eviction.kind": "eviction.kind",
                     "allocator.eviction.k": "eviction.k", "kv_dtype": "kv_dtype",
                     "allocator.block_size": "block_size"}


def test_block_size_series_split_by_every_differing_key():
    groups = series_of(issue_runs(), ("allocator.block_size",), x=lambda r: r.params["allocator.block_size"])
    members = {g: [r.label for r in rs] for g, rs in groups.items()}
    assert len(groups) == 3  # lru at 16 and 32 is one line; lru-2 and fp8 are their own series
    line = next(g for g, rs in members.items() if rs == ["lru", "lru-b32"])
    assert line == "eviction.kind=lru, kv_dtype=fp16"  # keys in the scenario's order
    assert any("eviction.kind=lru-k" in g and "eviction.k=2" in g and g.startswith("lru-2: ") for g in members)
    assert any("kv_dtype=fp8" in g and g.startswith("fp8: ") for g in members)


def test_capacity_series_never_stack_two_runs_at_one_x():
    runs = issue_runs()  # every run has the same capacity: kv_dtype alone would merge lru and fp8
    groups = series_of(runs, ("kv_budget", "gpu", "kv_dtype"), x=lambda r: r.summary["kv"]["capacity_tokens"])
    assert sorted(len(rs) for rs in groups.values()) == [1, 1, 1, 1]
    assert all(g != "all runs" for g in groups)


def test_one_series_when_nothing_else_differs():
    runs = [_run(f"b{b}", {"allocator.block_size": b}) for b in (8, 16, 32)]
    groups = series_of(runs, ("allocator.block_size",), x=lambda r: r.params["allocator.block_size"])
    assert list(groups) == ["all runs"] and len(groups["all runs"]) == 3


@pytest.fixture
def captured(monkeypatch):
    """The figures the plot functions draw (captured instead of closed)."""
    figs = []
    monkeypatch.setattr(plots.plt, "close", lambda fig=None: figs.append(fig))
    return figs


def test_latency_cdfs_many_runs_say_what_is_shown_and_tpot_has_ticks(tmp_path, captured):
    rng = np.random.default_rng(0)
    reqs = {f"run{i:02d}": pd.DataFrame({"status": "finished", "ttft_s": rng.uniform(0.01, 5, 50),
                                         "tpot_s": rng.uniform(0.02, 0.05, 50), "e2e_s": rng.uniform(1, 9, 50)})
            for i in range(45)}
    plots.plot_latency_cdfs(reqs, tmp_path / "cdf.png")
    fig = captured[-1]
    axes = fig.axes
    assert len(axes[0].get_lines()) == plots.MAX_LINES  # 40 distinct styles drawn, evenly chosen
    styles = {(ln.get_color(), ln.get_linestyle()) for ln in axes[0].get_lines()}
    assert len(styles) == plots.MAX_LINES
    notes = [t.get_text() for t in fig.texts]
    assert any("showing 40 of 45 runs" in t for t in notes)
    fig.canvas.draw()
    tpot_ticks = [t.get_text() for t in axes[1].get_xticklabels() if t.get_text()]
    assert len(tpot_ticks) >= 2, "the TPOT axis (a range within one decade) must have labelled ticks"
    few = {k: reqs[k] for k in list(reqs)[:3]}
    plots.plot_latency_cdfs(few, tmp_path / "cdf3.png")
    assert not [t for t in captured[-1].texts if "showing" in t.get_text()]  # nothing left out, no note


def test_fragmentation_figure_allocated_view_and_cached_band(tmp_path, captured):
    s = {"a": _summary("a", frag=0.1, hit=0.2, cached=0.12), "b": _summary("b", frag=0.2)}
    s["b"]["kv"].update(token_states_frac=0.4, reservation_frac=0.05, internal_frag_frac=0.04,
                        external_frag_frac=0.01, free_frac=0.5)
    plots.plot_fragmentation_bars(s, tmp_path / "frag.png")
    fig = captured[-1]
    left, right = fig.axes[:2]
    labels = [h.get_label() for h in left.containers]
    assert plots.CACHED_LABEL in labels and "free (empty)" in labels
    cached = left.containers[labels.index(plots.CACHED_LABEL)]
    assert [round(p.get_height(), 6) for p in cached] == [12.0, 0.0]
    empty = left.containers[labels.index("free (empty)")]
    assert [round(p.get_height(), 6) for p in empty] == [18.0, 50.0]  # free minus the cached band
    # right panel: shares of allocated memory; the token-states bar of b is 0.4 / 0.5 of it
    heights = [[round(p.get_height(), 6) for p in c] for c in right.containers]
    assert heights[0] == [round(100 * 0.6 / 0.7, 6), 80.0]
    assert sum(h[1] for h in heights) == pytest.approx(100.0)
    texts = [t.get_text() for t in right.texts]
    assert "waste 10.0%" in texts and "waste 20.0%" in texts  # kv.fragmentation_frac as given


def test_comparison_frame_in_memory_has_prefix_hit_ratio_and_differing_keys():
    df = comparison_frame(issue_runs())
    assert df["label"].tolist() == ["lru", "lru-2", "fp8", "lru-b32"]
    assert {"kv_dtype", "allocator.block_size", "allocator.eviction.kind", "allocator.eviction.k"} <= set(df.columns)
    assert "allocator.kind" not in df.columns  # the same in every run
    assert df["prefix_cache_hit_ratio_tokens"].tolist() == [0.3, 0.35, 0.3, 0.28]
    assert df["kv_fragmentation_frac"].tolist() == [0.1] * 4


def test_key_findings_sentences():
    s = {"contiguous": _summary("contiguous", conc=7, ttft=66.0, thr=0.8, frag=0.45),
         "paged-16": _summary("paged-16", conc=15, ttft=0.15, thr=1.1, frag=0.04),
         "paged-256": _summary("paged-256", conc=12, ttft=0.5, thr=1.0, frag=0.2)}
    s["contiguous"]["requests_finished"] = 8
    got = key_findings(s, "contiguous")
    assert got[0].startswith("Not every request was served") and "contiguous 8/10" in got[0]
    assert "Most requests at once: 15 with paged-16 (baseline contiguous: 7, +114.3 %)." in got
    assert "Lowest median TTFT: 150 ms with paged-16 (baseline contiguous: 66.00 s, -99.8 %)." in got
    assert ("KV fragmentation (share of allocated KV): baseline contiguous 45.0 %; paged-16 4.0 % (-41.0 points)."
            in got)
    same = key_findings({"a": _summary("a"), "b": _summary("b")}, "a")
    assert "Maximum concurrent requests: 10 in every run." in same


def test_run_and_compare_write_one_comparison_layout(variants_dir, tmp_path):
    from kvsim.report import compare

    ran = pd.read_csv(Path(variants_dir) / "comparison.csv")
    compare([variants_dir], tmp_path / "cmp")
    compared = pd.read_csv(tmp_path / "cmp" / "comparison.csv")
    assert ran.columns.tolist() == compared.columns.tolist()
    assert ran["source"].tolist() == ran["label"].tolist()  # relative to the run directory
    pd.testing.assert_frame_equal(ran.drop(columns="source"), compared.drop(columns="source"))
    assert ran["label"].tolist() == ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"]


def test_concurrency_that_is_queueing_is_no_win():
    """An fp8 variant with the most requests at once (+120 %) but the slowest service: the findings
    lead with throughput and latency, and the concurrency sentence says it is no gain."""
    s = {"fp16": _summary("fp16", conc=10, ttft=0.5, thr=2.0),
         "fp8": _summary("fp8", conc=22, ttft=2.0, thr=1.5),
         "paged": _summary("paged", conc=14, ttft=0.4, thr=2.1)}
    s["fp16"]["normalized_latency_s_per_token"] = 0.1
    s["fp8"]["normalized_latency_s_per_token"] = 0.3
    got = key_findings(s, "fp16")
    assert got[0].startswith("Highest throughput: 2.1 req/s with paged")
    assert got[1].startswith("Lowest median TTFT: 400 ms with paged")
    conc = next(g for g in got if g.startswith("Most requests at once"))
    assert "22 with fp8" in conc and "+120.0 %" in conc and "but no gain" in conc
    assert "throughput -25.0 %" in conc and "median TTFT +300.0 %" in conc and "normalized latency +200.0 %" in conc
    assert got.index(conc) > 1
    # with equal (within 1 %) or better service, more concurrency is a plain gain
    s["fp8"].update(throughput_requests_per_s=1.99, normalized_latency_s_per_token=0.1)
    s["fp8"]["ttft_s"]["p50"] = 0.45
    conc = next(g for g in key_findings(s, "fp16") if g.startswith("Most requests at once"))
    assert conc == "Most requests at once: 22 with fp8 (baseline fp16: 10, +120.0 %)."


def test_prefix_hit_plot_capacities_that_differ_only_by_block_rounding(tmp_path, captured):
    from kvsim.report.comparison import capacity_levels, plot_prefix_hit_vs_capacity

    runs = issue_runs()
    for r, cap in zip(runs, (14496, 14496, 14480, 14464)):  # one budget, rounded to blocks of 16 / 32
        r.summary["kv"].update(capacity_tokens=cap, block_size=32 if "b32" in r.label else 16)
    assert set(capacity_levels(runs).values()) == {14464.0}
    plot_prefix_hit_vs_capacity(runs, tmp_path / "p.png")
    ax = captured[-1].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["lru", "lru-2", "fp8", "lru-b32"]  # a bar per run
    assert [round(p.get_height(), 6) for p in ax.patches] == [30.0, 35.0, 30.0, 28.0]
    assert "14,464 tokens in every run" in ax.get_xlabel()
    # capacities that really differ: one x tick per capacity level, labelled
    for r, cap in zip(runs, (10_000, 20_000, 40_000, 40_016)):
        r.summary["kv"]["capacity_tokens"] = cap
    assert capacity_levels(runs) == {"lru": 10_000, "lru-2": 20_000, "fp8": 40_000, "lru-b32": 40_000}
    plot_prefix_hit_vs_capacity(runs, tmp_path / "q.png")
    ax = captured[-1].axes[0]
    assert list(ax.get_xticks()) == [10_000, 20_000, 40_000]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10,000", "20,000", "40,000"]


def test_prefix_hit_ratio_beside_the_traces_ideal():
    s = {"lru": _summary("lru", hit=0.041), "big": _summary("big", hit=0.25)}
    for lab in s:
        s[lab]["prefix_cache"]["ideal_hit_ratio_tokens"] = 0.289
    got = key_findings(s, "lru")
    best = next(g for g in got if g.startswith("Highest prefix-cache hit ratio"))
    assert best.endswith("; the trace's ideal (an unbounded cache): 28.9 %.")
    far = [g for g in got if g.startswith("Far below")]
    assert far == ["Far below the trace's ideal prefix hit ratio: lru 4.1 % vs 28.9 %. The KV cache is too small "
                   "to keep shared prefixes until they are reused; a larger KV budget (kv_budget) or offload tiers "
                   "(allocator.offload) would raise it."]
    s["lru"]["prefix_cache"]["hit_ratio_tokens"] = 0.2  # within half of the ideal: no explanation
    assert not [g for g in key_findings(s, "lru") if g.startswith("Far below")]
