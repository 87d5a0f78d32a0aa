"""``kvsim compare``: tables and plots over sweep, variants and run directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from report_helpers import BLOCKS, RATES, kvsim_main

from kvsim.errors import KvsimError
from kvsim.report import compare
from kvsim.report.runs import collect_runs
from kvsim.report.series import KNEE_FACTOR, knee_of

ALWAYS = ["fragmentation_breakdown.png", "concurrency_comparison.png", "memory_over_time.png", "latency_cdf.png"]


def assert_real_png(path: Path, min_bytes: int = 8_000) -> None:
    """A PNG of some size whose pixels are not all one colour."""
    import matplotlib.image as mpimg

    assert path.exists(), path
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > min_bytes, (path, len(data))
    img = mpimg.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 300
    assert float(np.std(img[..., :3])) > 0.02, f"{path} looks blank"


def test_sweep_compare_writes_every_applicable_plot(rate_sweep, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert kvsim_main(["compare", str(rate_sweep), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    for name in ALWAYS + ["concurrency_vs_block_size.png", "throughput_vs_rate.png",
                          "normalized_latency_vs_rate.png", "bandwidth_vs_block_size.png",
                          "latency_vs_block_size.png", "step_time_breakdown.png"]:
        assert_real_png(out / name)
        assert str(out / name) in printed
    assert not (out / "prefix_hit_ratio_vs_capacity.png").exists()  # no prefix caching in these runs
    table = pd.read_csv(out / "comparison.csv")
    assert len(table) == len(RATES) * len(BLOCKS)
    assert {"label", "point_id", "allocator.block_size", "trace.synthetic.arrival.rate_per_s",
            "offered_rate_req_per_s", "throughput_requests_per_s", "normalized_latency_s_per_token",
            "kv_internal_frag_frac"} <= set(table.columns)
    knees = pd.read_csv(out / "knees.csv")
    assert sorted(knees["series"]) == [f"block_size={b}" for b in sorted(BLOCKS)]
    assert (knees["points"] == len(RATES)).all()
    for _, k in knees.iterrows():
        assert k["knee_trace.synthetic.arrival.rate_per_s"] in RATES
        assert k["normalized_latency_at_knee"] <= KNEE_FACTOR * k["normalized_latency_at_lowest_rate"]


def test_sweep_run_wrote_compare_dir(rate_sweep):
    for name in ALWAYS + ["concurrency_vs_block_size.png", "throughput_vs_rate.png", "comparison.csv"]:
        assert (rate_sweep / "compare" / name).exists()


def test_variants_dir_and_default_out(variants_dir):
    written = compare([variants_dir])
    out = variants_dir / "compare"
    for name in ALWAYS:
        assert written[name] == out / name
        assert_real_png(out / name)
    assert "concurrency_vs_block_size.png" not in written  # one paged block size only
    assert "throughput_vs_rate.png" not in written
    table = pd.read_csv(out / "comparison.csv")
    # scenario order (the variants as scenarios/quickstart.yaml lists them), as in every table and plot
    assert table["label"].tolist() == ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"]
    assert "allocator.kind" in table.columns  # the scenario keys that differ between the runs
    # what priced each run, as it resolved them, and the headline's KV access columns, from each summary
    for _, row in table.iterrows():
        summary = json.loads((variants_dir / row["label"] / "summary.json").read_text())
        access = summary["kv_access"]
        assert row["attention_backend"] == access["attention_backend"]
        assert row["engine_profile"] == summary["engine_profile"]["name"]
        for key in ("kv_load_latency_ns", "hbm_bandwidth_utilisation", "page_fetch_time_ns", "attention_kernel_s"):
            assert row[f"kv_access_{key}"] == pytest.approx(access[key], rel=1e-12)
    assert "kv_access_mean_access_latency_ns" not in table.columns  # the deprecated name stays in summary.json only


def test_several_run_dirs_need_out_and_get_qualified_labels(variants_dir, tmp_path):
    a = variants_dir / "paged-16"
    with pytest.raises(KvsimError, match="give --out"):
        compare([a, variants_dir / "contiguous-max"])
    copy = tmp_path / "again"
    shutil.copytree(variants_dir, copy)
    runs, meta = collect_runs([variants_dir, copy])
    labels = [r.label for r in runs]
    assert len(set(labels)) == 8 and f"{variants_dir.name}/paged-16" in labels and "again/paged-16" in labels
    written = compare([a, variants_dir / "contiguous-max"], tmp_path / "two")
    assert_real_png(written["memory_over_time.png"])


TINY_VARIANTS = """\
name: tiny
seed: 0
trace:
  synthetic:
    num_requests: 10
    arrival: {process: poisson, rate_per_s: 20}
    prompt_tokens: {kind: uniform, low: 10, high: 100}
    output_tokens: {kind: uniform, low: 5, high: 30}
model: OPT-13B
gpu: A100-40GB
kv_budget: {tokens: 8192}
timing: {kind: constant, step_s: 0.01}
variants:
  a: {allocator: {kind: paged, block_size: 16}}
  b: {allocator: {kind: paged, block_size: 32}}
"""


def test_a_run_given_twice_is_refused(tmp_path, capsys):
    """``compare R R --out X`` labelled the same runs twice with one label each (``R/a`` twice); a run
    given twice, also as a variants directory and one of its variants, is refused in one line."""
    from kvsim.api import run_to_dir
    from kvsim.config import load_scenario

    scn = tmp_path / "tiny.yaml"
    scn.write_text(TINY_VARIANTS)
    r = run_to_dir(load_scenario(scn), tmp_path / "r", plots=False, progress=False, warn=lambda m: None)
    out = tmp_path / "X"
    for inputs, how in ([[r, r], f"({r} twice)"], [[r, r / "b"], f"(as {r} and as {r / 'b'})"],
                        [[r, f"{r}/"], f"(as {r} and as {r}/)"]):
        assert kvsim_main(["compare", *map(str, inputs), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is given twice" in err and how in err, err
        assert not out.exists()
    assert [x.label for x in collect_runs([r])[0]] == ["a", "b"]


def test_not_a_run_dir(tmp_path, capsys):
    assert kvsim_main(["compare", str(tmp_path)]) == 2
    assert "not a kvsim run, variants or sweep directory" in capsys.readouterr().err


def _fabricate(src_points: list[Path], dst: Path, extra) -> list[Path]:
    """Copy run dirs and add keys to their summaries (features other engineers are adding)."""
    out = []
    for i, p in enumerate(src_points):
        d = dst / f"run{i}"
        shutil.copytree(p, d)
        s = json.loads((d / "summary.json").read_text())
        s.update(extra(i, s))
        (d / "summary.json").write_text(json.dumps(s))
        out.append(d)
    return out


def test_prefix_hit_ratio_plot_is_conditional(rate_sweep, tmp_path):
    points = sorted((rate_sweep / "points").iterdir())[:3]
    runs = _fabricate(points, tmp_path / "pc", lambda i, s: {
        "prefix_cache": {"hit_ratio_tokens": 0.1 + 0.1 * i, "hit_ratio_blocks": 0.1 * i, "evictions": 10 - i},
        "kv": {**s["kv"], "capacity_tokens": 10_000 * 2 ** i}})
    written = compare(runs, tmp_path / "out")
    assert_real_png(written["prefix_hit_ratio_vs_capacity.png"], min_bytes=5_000)
    table = pd.read_csv(tmp_path / "out" / "comparison.csv")
    assert table["prefix_cache_hit_ratio_tokens"].round(3).tolist() == [0.1, 0.2, 0.3]
    plain = compare(points, tmp_path / "plain")
    assert "prefix_hit_ratio_vs_capacity.png" not in plain


def test_bandwidth_plot_is_conditional(rate_sweep, tmp_path):
    points = sorted((rate_sweep / "points").iterdir())
    runs = _fabricate(points, tmp_path / "bw", lambda i, s: {"kv_bandwidth_utilisation": 0.5 + 0.01 * i})
    written = compare(runs, tmp_path / "out")
    assert_real_png(written["bandwidth_vs_block_size.png"], min_bytes=5_000)
    nested = _fabricate([points[0], points[-1]], tmp_path / "bw2",
                        lambda i, s: {"kv_bandwidth_utilisation": {"mean": 0.4}})
    assert "bandwidth_vs_block_size.png" in compare(nested, tmp_path / "out2")


def test_access_plots_under_analytical_timing(rate_sweep, tmp_path):
    """The access side is drawn without calibrated timing: the step-time breakdown, bandwidth
    utilisation (kv_access.hbm_bandwidth_utilisation) and latency / bandwidth vs block size."""
    points = sorted((rate_sweep / "points").iterdir())
    summaries = [json.loads((p / "summary.json").read_text()) for p in points]
    assert all("kv_bandwidth_utilisation" not in s or s["kv_bandwidth_utilisation"] is None for s in summaries)
    written = compare([rate_sweep], tmp_path / "out")
    for name in ("step_time_breakdown.png", "bandwidth_utilisation.png", "latency_vs_block_size.png",
                 "bandwidth_vs_block_size.png"):
        assert_real_png(written[name], min_bytes=5_000)
    one_block = [p for p in points if json.loads((p / "summary.json").read_text())["kv"]["block_size"]
                 == summaries[0]["kv"]["block_size"]]
    alone = compare(one_block, tmp_path / "one")
    assert "latency_vs_block_size.png" not in alone and "bandwidth_vs_block_size.png" not in alone
    assert "step_time_breakdown.png" in alone


def test_step_time_shares_by_hand():
    from kvsim.report.access import step_time_shares

    s = {"busy_time_s": 10.0, "step_time_breakdown_s": {"attention_s": 3.0, "linear_compute_s": 5.0, "compute_s": 0.5,
                                                         "overhead_s": 1.0, "swap_s": 0.25}}
    none = {"moe": 0.0, "kv_write": 0.0, "comm": 0.0}  # an older summary without these parts
    assert step_time_shares(s) == pytest.approx({"attention": 0.3, "gemm": 0.55, "overhead": 0.1, "swap": 0.025,
                                                 "rest": 0.025, **none})
    over = {"busy_time_s": 4.0, "step_time_breakdown_s": {"attention_s": 3.0, "linear_compute_s": 3.0}}
    got = step_time_shares(over)  # overlapping terms (a roofline max): scaled to the busy time, no rest
    assert got == pytest.approx({"attention": 0.5, "gemm": 0.5, "overhead": 0.0, "swap": 0.0, "rest": 0.0, **none})
    # the MoE experts, KV writes and communication are parts of their own: a whole step, no rest
    full = {"busy_time_s": 10.0, "step_time_breakdown_s": {"attention_s": 2.0, "linear_compute_s": 3.0,
                                                            "moe_experts_s": 2.5, "kv_write_s": 0.5,
                                                            "parallel_comm_s": 1.0, "overhead_s": 1.0}}
    assert step_time_shares(full) == pytest.approx({"attention": 0.2, "gemm": 0.3, "moe": 0.25, "kv_write": 0.05,
                                                    "comm": 0.1, "overhead": 0.1, "swap": 0.0, "rest": 0.0})
    assert step_time_shares({"busy_time_s": 0.0, "step_time_breakdown_s": {}}) is None
    assert step_time_shares({}) is None


@pytest.mark.parametrize("points, throughputs, expected", [
    ([(1, 0.02), (2, 0.03), (3, 0.039), (4, 0.05), (5, 0.5)], None, 2),
    ([(1, 0.02), (2, 0.021)], None, 1),                      # never crosses: the highest rate
    ([(1, 0.02), (2, 0.5), (3, 0.03)], None, 0),             # only the first crossing counts
    ([(1, 1.0), (2, 1.5), (3, 1.9)], [0.5, 0.6, 0.6], None),  # already saturated at the lowest rate
    ([(1, 0.02), (2, 0.03)], [0.99, 1.9], 1),
    ([], None, None),
])
def test_knee_rule(points, throughputs, expected):
    assert knee_of(points, throughputs=throughputs) == expected


def test_a_plot_that_fails_is_one_warning_line(rate_sweep, tmp_path, capsys, monkeypatch):
    """QA (twenty-ninth session): a damaged steps table made the warning print Arrow's whole schema."""
    import kvsim.report.comparison as comparison

    def broken(*a, **k):
        raise ValueError("schema mismatch:\nstep: int64\nreplica: int64\n-- schema metadata --")

    monkeypatch.setattr(comparison, "plot_fragmentation_bars", broken)
    assert kvsim_main(["compare", str(rate_sweep), "--out", str(tmp_path / "cmp")]) == 0
    got = capsys.readouterr()
    lines = [ln for ln in (got.out + got.err).splitlines() if "could not write fragmentation_breakdown.png" in ln]
    assert lines == ["compare: could not write fragmentation_breakdown.png: ValueError: schema mismatch:"]
    assert "step: int64" not in got.out + got.err


def test_two_single_runs_of_one_scenario_keep_two_labels(tmp_path):
    """QA (twenty-ninth session): `compare runs/a runs/b` of one scenario without variants labelled both
    `runs/<name>`, so the headline showed one column (the second run's) as the first run."""
    scn = tmp_path / "one.yaml"
    scn.write_text(TINY_VARIANTS.split("variants:")[0] + "allocator: {kind: paged, block_size: 16}\n")
    runs_dir = tmp_path / "runs"
    assert kvsim_main(["run", str(scn), "--out", str(runs_dir / "a"), "--no-plots", "-q"]) == 0
    assert kvsim_main(["run", str(scn), "--out", str(runs_dir / "b"), "--no-plots", "-q",
                       "--set", "allocator.block_size=32"]) == 0
    runs, _ = collect_runs([runs_dir / "a", runs_dir / "b"])
    assert [r.label for r in runs] == ["a/tiny", "b/tiny"]
    table = pd.read_csv(compare([runs_dir / "a", runs_dir / "b"], tmp_path / "cmp")["comparison.csv"])
    assert list(table["label"]) == ["a/tiny", "b/tiny"]
