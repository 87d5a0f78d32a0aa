"""The fused MoE kernel model (kvsim.timing.moe_kernel) and its corpus fit (kvsim.calibration.moe_fit)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kvsim.calibration import moe_fit
from kvsim.errors import ConfigError
from kvsim.hw import GPUS, MODELS
from kvsim.models.parallel import plan
from kvsim.timing import moe_kernel
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape, decode_shape
from kvsim.timing.context import TimingContext
from kvsim.timing.moe import routed_expert_params


def _ctx(model: str, tp: int = 1, weight_dtype: str = "bf16", gpu: str = "H100-SXM-80GB") -> TimingContext:
    m = MODELS[model]
    p = plan(m, GPUS[gpu], "bf16", weight_dtype, tensor=tp)
    return TimingContext(m, GPUS[gpu], p.kv.with_block_size(16), p.weight_bytes_per_rank, Path("."),
                         weight_dtype=weight_dtype, tensor_parallel=tp, comm_s_per_step=p.comm_s_per_step,
                         comm_s_per_token=p.comm_s_per_token)


def test_layer_time_grows_with_tokens_and_zero_tokens_cost_nothing():
    prof = moe_kernel.load_profiles()["vllm-fused-moe-triton"]
    shape = moe_kernel.MoeShape(8, 2, 4096, 7168, 2.0, False)
    t = moe_kernel.layer_time_s(np.array([0, 1, 2, 8, 64, 512, 4096]), shape, GPUS["H100-SXM-80GB"], prof)
    assert t[0] == 0.0 and np.all(np.diff(t) > 0)
    # one token reads its k experts' weights at least once: no faster than that stream at the datasheet peak
    two_experts = 2 * 3 * 4096 * 7168 * 2.0
    assert t[1] >= two_experts / GPUS["H100-SXM-80GB"].hbm_bandwidth_bytes_per_s
    assert moe_kernel.layer_time_s(64, shape, GPUS["H100-SXM-80GB"], prof) == t[4]  # scalar = array element


def test_fp8_runs_at_twice_the_bf16_peak_only_on_fp8_tensor_core_gpus():
    assert moe_kernel.peak_flops_s(GPUS["H100-SXM-80GB"], True) == 2 * GPUS["H100-SXM-80GB"].bf16_flops_per_s
    assert moe_kernel.peak_flops_s(GPUS["A100-80GB"], True) == GPUS["A100-80GB"].bf16_flops_per_s
    assert moe_kernel.resolve_kernel("auto", "bf16", GPUS["A100-80GB"]) == "vllm-fused-moe-triton"
    assert moe_kernel.resolve_kernel("vllm-fused-moe-triton", "int4", GPUS["A100-80GB"]) == "vllm-fused-moe-triton"
    if "vllm-marlin-moe" not in moe_kernel.load_profiles():  # no per-layer reading of a weight-only kernel
        assert moe_kernel.resolve_kernel("auto", "int4", GPUS["H100-SXM-80GB"]) == "none"
        assert moe_kernel.resolve_kernel("auto", "fp8", GPUS["A100-80GB"]) == "none"
        assert moe_kernel.resolve_kernel("auto", "fp8", GPUS["H100-SXM-80GB"]) == "vllm-fused-moe-triton"


def test_model_shape_splits_each_expert_across_tensor_ranks():
    one = moe_kernel.model_shape(MODELS["Mixtral-8x7B"], 1, "bf16")
    two = moe_kernel.model_shape(MODELS["Mixtral-8x7B"], 2, "bf16")
    # Mixtral's config: intermediate 14,336 (the totals give it to within 2 %)
    assert one.shard_intermediate_size == pytest.approx(14336, rel=0.02)
    assert two.shard_intermediate_size == pytest.approx(one.shard_intermediate_size / 2, abs=1)
    assert (one.num_experts, one.top_k, one.hidden_size) == (8, 2, 4096)
    assert moe_kernel.model_shape(MODELS["Llama-3-8B"], 1, "bf16") is None
    # the dense part leaves out exactly the k routed experts a token goes through
    m = MODELS["Mixtral-8x7B"]
    assert moe_kernel.dense_active_params(m) == pytest.approx(m.active_params - 2 * routed_expert_params(m))


def test_kernel_mode_prices_experts_apart_and_scalar_equals_array():
    ctx = _ctx("Mixtral-8x7B", tp=2)
    t = AnalyticalTiming(AnalyticalTimingConfig(moe_kernel="auto", moe_layer_s=1e-6, moe_align_kernel="vllm"), ctx)
    base = AnalyticalTiming(AnalyticalTimingConfig(), ctx)
    assert t.moe_kernel == "vllm-fused-moe-triton" and base.experts is None
    assert not t.weights.moe and t.weights.constant_s < base.weights.constant_s  # dense weights only
    n = np.array([1, 8, 64, 1023, 1024, 3000], np.int64)  # past the first table: it grows
    d, parts, _ = t.decode_durations(n, n * 700, None)
    for j, k in enumerate(n):
        st = t.step_time(decode_shape(int(k), int(k) * 700, 0))
        assert d[j].hex() == st.duration_s.hex()
        assert float(parts["moe_experts_s"][j]).hex() == float(st.breakdown_s["moe_experts_s"]).hex()
    per_layer = moe_kernel.layer_time_s(64, moe_kernel.model_shape(ctx.model, 2, "bf16"), ctx.gpu,
                                        moe_kernel.load_profiles()["vllm-fused-moe-triton"])
    assert t.experts.scalar_s(64) == pytest.approx(32 * per_layer, rel=1e-12)  # no moe_layer_s, no alignment
    # a prefill step pays the kernel at its token count
    pre = t.step_time(BatchShape(num_seqs=1, num_prefill_seqs=1, num_decode_seqs=0, num_prefill_tokens=2048,
                                 num_decode_tokens=0, kv_tokens_read=2048, attention_pairs=2048 * 2049 // 2,
                                 kv_pages_read=128))
    assert pre.breakdown_s["moe_experts_s"] == t.experts.scalar_s(2048)


def test_dense_models_ignore_the_moe_kernel():
    ctx = _ctx("Llama-3-8B")
    a = AnalyticalTiming(AnalyticalTimingConfig(moe_kernel="auto"), ctx)
    b = AnalyticalTiming(AnalyticalTimingConfig(), ctx)
    shape = decode_shape(16, 16 * 500, 0)
    assert a.experts is None and a.step_time(shape).duration_s == b.step_time(shape).duration_s


def test_unknown_moe_kernel_names_the_choices():
    with pytest.raises(ValueError, match="unknown MoE kernel 'triton'.*vllm-fused-moe-triton"):
        AnalyticalTimingConfig(moe_kernel="triton")


def test_the_shipped_fit_reproduces_its_recorded_error():
    """The fit file records its error table; the corpus and the shipped profiles give it again (a data
    edit without a refit fails here)."""
    import yaml

    df = moe_fit.load_corpus()
    profiles = moe_kernel.load_profiles()
    df = df[df["profile"].isin(profiles)]
    table = moe_fit.report(df, profiles)
    recorded = yaml.safe_load(moe_kernel.FIT_FILE.read_text())["provenance"]["error"]
    assert table.to_dict(orient="records") == recorded
    assert set(df["split"]) == {"fit", "holdout", "check"}


def test_corpus_split_is_by_source_and_each_source_has_one_split():
    """CUDA-graph-timed sources in URL order, every third held out; other harnesses only checked."""
    df = moe_fit.load_corpus()
    assert (df.groupby("source_url")["split"].nunique() == 1).all()
    graph = df["method"].isin(moe_fit.GRAPH_METHODS)
    assert set(df.loc[~graph, "split"]) == {"check"}
    urls = sorted(df.loc[graph, "source_url"].unique())
    want = {u: ("holdout" if i % 3 == 1 else "fit") for i, u in enumerate(urls)}
    assert all(df.loc[graph, "split"] == df.loc[graph, "source_url"].map(want))


def test_bad_corpus_rows_are_one_line_errors(tmp_path):
    import pandas as pd

    df = pd.read_csv(moe_kernel.CORPUS_FILE, dtype=str, keep_default_na=False)
    cols = list(df.columns)
    bad = tmp_path / "bad.csv"
    df.iloc[:1].assign(implementation="cutlass").to_csv(bad, index=False)
    with pytest.raises(ConfigError, match=r"bad.csv: line 2: implementation 'cutlass': valid:"):
        moe_fit.load_corpus(bad)
    short = tmp_path / "short.csv"
    short.write_text(",".join(c for c in cols if c != "latency_us") + "\n")
    with pytest.raises(ConfigError, match=r"short.csv: column 'latency_us' is missing"):
        moe_fit.load_corpus(short)
    assert moe_fit.main(["--corpus", str(bad), "--check"]) == 2


def test_fit_refuses_to_replace_a_file_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "user.yaml"
    mine.write_text("params: {}\n")
    assert moe_fit.main(["--out", str(mine)]) == 2
    assert mine.read_text() == "params: {}\n"
    assert "not written by moe_fit; not replaced" in capsys.readouterr().out


def test_calibrate_moe_check_prints_the_shipped_error(tmp_path, capsys):
    from kvsim.cli import main

    assert main(["calibrate", "moe-check"]) == 0
    out = capsys.readouterr().out
    assert "vllm-fused-moe-triton" in out and "holdout" in out and "check" in out
    assert main(["calibrate", "moe-check", "--corpus", str(tmp_path / "none.csv")]) == 2
    assert capsys.readouterr().err.startswith("kvsim: error: ")  # the CLI's one line, on stderr
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    for bad, why in ((tmp_path / "none.csv", "cannot read the MoE kernel corpus (No such file"),
                     (binary, "not UTF-8 text")):
        assert main(["calibrate", "moe-check", "--corpus", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"kvsim: error: {bad}: ") and why in err[0]


def test_corpus_counts_are_integers_top_k_at_most_num_experts_and_rows_present(tmp_path):
    """moe-check accepted top_k > num_experts, num_tokens 1.5, and a header-only corpus ('Empty DataFrame')."""
    import pandas as pd

    df = pd.read_csv(moe_kernel.CORPUS_FILE, dtype=str, keep_default_na=False)
    f = tmp_path / "c.csv"
    for edit, expect in (({"num_tokens": "1.5"}, "field 'num_tokens' must be a positive integer, got '1.5'"),
                         ({"top_k": "999"}, "field 'top_k' is 999, more than num_experts"),
                         ({"latency_us": "inf"}, "field 'latency_us' must be a positive number, got 'inf'")):
        df.iloc[:3].assign(**{k: [df.iloc[0][k], df.iloc[1][k], v] for k, v in edit.items()}).to_csv(f, index=False)
        with pytest.raises(ConfigError, match=rf"^{f}: line 4: {re.escape(expect)}"):
            moe_fit.load_corpus(f)
    df.iloc[:0].to_csv(f, index=False)
    with pytest.raises(ConfigError, match=rf"^{f}: no rows \(only the header\)"):
        moe_fit.load_corpus(f)
