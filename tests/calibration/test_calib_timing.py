"""``timing: {kind: calibrated}`` on the committed CPU example directory, and its validation errors.

No torch needed: the timing model reads CSV/JSON with numpy/pandas only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from calib_helpers import CPU_EXAMPLE, REPO, decode_shape, edit_meta, mixed_shape, prefill_shape, timing_context
from kvsim.calibration_data import schema as S
from kvsim.errors import CalibrationError, KvsimError
from kvsim.registry import TIMING_MODELS
from kvsim.timing.base import BatchShape
from kvsim.timing.calibrated import CalibratedTiming, CalibratedTimingConfig, split_kv_tokens


def build(path=CPU_EXAMPLE, **ctx_kw):
    cfg_kw = {k: ctx_kw.pop(k) for k in list(ctx_kw) if k in CalibratedTimingConfig.model_fields}
    cfg = CalibratedTimingConfig(file=str(path), allow_cpu_data=True, **cfg_kw)
    return CalibratedTiming(cfg, timing_context(**ctx_kw))


def test_registered_and_builds_via_registry():
    assert "calibrated" in TIMING_MODELS.kinds
    cfg = CalibratedTimingConfig(file="calibration/cpu-example", allow_cpu_data=True)
    model = TIMING_MODELS.build(cfg, timing_context(base_dir=REPO))
    assert isinstance(model, CalibratedTiming)
    assert model.copy_bandwidth_bytes_per_s > 0
    assert model.needs_context_lens is False


def test_step_time_components_and_monotonicity():
    t = build()
    a = t.step_time(decode_shape(2, 100))
    b = t.step_time(decode_shape(2, 200))
    assert a.breakdown_s["attention_s"] > 0
    assert b.breakdown_s["decode_attention_s"] >= a.breakdown_s["decode_attention_s"]
    assert a.kv_bytes_read == 2 * 100 * t.kv_bytes_per_token
    for st in (a, b):
        subtotals = ("decode_attention_s", "prefill_attention_s", "compute_s")
        parts = sum(v for k, v in st.breakdown_s.items() if k not in subtotals)
        assert st.breakdown_s["compute_s"] == pytest.approx(
            st.breakdown_s["gemm_s"] + st.breakdown_s["lm_head_s"] + st.breakdown_s["elementwise_s"])
        assert st.duration_s == pytest.approx(parts)
    p = t.step_time(prefill_shape(64, 64))
    assert p.breakdown_s["prefill_attention_s"] > 0 and p.breakdown_s["decode_attention_s"] == 0
    m = t.step_time(mixed_shape(16, 64, [20, 30]))
    assert m.breakdown_s["prefill_attention_s"] > 0 and m.breakdown_s["decode_attention_s"] > 0
    assert t.step_time(decode_shape(1, 1)).duration_s > t.cfg.step_overhead_s


def test_decode_exact_at_measured_points():
    t = build()
    df = pd.read_csv(CPU_EXAMPLE / S.CSV_FILE)
    dec = df[(df["op"] == S.DECODE_PAGED) & (df["dtype"] == "fp16") & (df["block_size"] == 16)]
    for r in dec.itertuples():
        want = t.num_layers * r.median_s
        assert t.decode_attention_s(r.batch, r.context_len) == pytest.approx(want, rel=1e-9)


def test_block_size_rules():
    assert build(block_size=16).block_size_rule == "exact (16)"
    assert build(block_size=32).block_size_rule.startswith("interpolated")
    assert build(block_size=512).block_size_rule.startswith("nearest")
    assert "contiguous" in build(block_size=None).block_size_rule


def test_swap_and_overhead_config():
    t = build(step_overhead_s=0.0, host_link_bandwidth_bytes_per_s=1e9)
    shape = BatchShape(1, 0, 1, 0, 1, 10, 10, swap_in_bytes=10**9)
    st = t.step_time(shape)
    assert st.breakdown_s["swap_s"] == pytest.approx(1.0)
    assert st.breakdown_s["overhead_s"] == 0.0


def test_engine_overhead_terms():
    """timing.overhead (kvsim.timing.overhead): per scheduled sequence and per prompt token computed,
    on top of step_overhead_s; everything else in the step unchanged."""
    base = build(step_overhead_s=0.001)
    loaded = build(step_overhead_s=0.001, overhead={"per_seq_s": 2e-5, "per_prefill_token_s": 1e-7})
    shape = mixed_shape(64, 32, [100, 200, 300])
    a, b = base.step_time(shape), loaded.step_time(shape)
    want = 0.001 + 2e-5 * (shape.num_prefill_seqs + shape.num_decode_seqs) + 1e-7 * shape.num_prefill_tokens
    assert a.breakdown_s["overhead_s"] == 0.001 and b.breakdown_s["overhead_s"] == want
    assert {k: v for k, v in a.breakdown_s.items() if k != "overhead_s"} == \
           {k: v for k, v in b.breakdown_s.items() if k != "overhead_s"}
    assert b.duration_s - a.duration_s == pytest.approx(want - 0.001, rel=1e-9)


def test_async_scheduling_overlaps_the_engine_loop():
    """Async scheduling (kvsim.timing.overhead, StepOverhead.step_s): max(kernels, engine loop) plus the
    per-request term; async_overlap false prices as without async."""
    shape = mixed_shape(64, 32, [100, 200, 300])
    seqs = shape.num_prefill_seqs + shape.num_decode_seqs
    for step_s in (0.001, 60.0):  # a loop shorter than the CPU example's kernels (seconds), then longer
        kw = dict(step_overhead_s=step_s, overhead={"per_seq_s": 2e-5, "per_prefill_seq_s": 0.01})
        sync, asy = build(**kw), build(async_scheduling=True, **kw)
        off = build(async_scheduling=True, async_overlap=False, **kw)
        s, a = sync.step_time(shape), asy.step_time(shape)
        loop = step_s + 2e-5 * seqs
        kernels = s.duration_s - s.breakdown_s["overhead_s"]
        assert a.duration_s == pytest.approx(max(kernels, loop) + 0.01, rel=1e-12)
        assert a.breakdown_s["overhead_s"] == pytest.approx(max(0.0, loop - kernels) + 0.01, rel=1e-6)
        assert off.step_time(shape).duration_s == s.duration_s


def test_split_kv_tokens_exact_for_one_prefill_chunk():
    pre, dec = split_kv_tokens(mixed_shape(new=50, cached=200, decode_contexts=[10, 20, 30]))
    assert (pre, dec) == (250, 60)
    assert split_kv_tokens(decode_shape(3, 40)) == (0.0, 120.0)
    assert split_kv_tokens(prefill_shape(10, 5)) == (15.0, 0.0)


# -- validation: CalibrationError naming the file and the field ---------------------------------------
def expect_error(match, path, **kw):
    with pytest.raises(CalibrationError, match=match) as info:
        build(path, **kw)
    assert isinstance(info.value, KvsimError)
    return str(info.value)


def test_missing_directory(tmp_path):
    expect_error("does not exist", tmp_path / "nope")


def test_relative_path_not_found_names_both_places(tmp_path):
    with pytest.raises(CalibrationError, match="timing.file"):
        CalibratedTiming(CalibratedTimingConfig(file="no/such/dir", allow_cpu_data=True),
                         timing_context(base_dir=tmp_path))


def test_missing_meta(example_copy):
    (example_copy / "meta.json").unlink()
    expect_error(r"meta\.json: missing", example_copy)


def test_unparseable_meta(example_copy):
    (example_copy / "meta.json").write_text("{not json")
    expect_error(r"meta\.json: cannot parse JSON", example_copy)


def test_meta_missing_field(example_copy):
    edit_meta(example_copy, lambda m: m.pop("copy_bandwidth_bytes_per_s"))
    expect_error(r"meta\.json: field 'copy_bandwidth_bytes_per_s' missing", example_copy)


def test_meta_for_another_model(example_copy):
    msg = expect_error(r"meta\.json: field 'model.name' is 'Llama-3-8B'", example_copy, model_name="Llama-2-7B")
    assert "Llama-2-7B" in msg


def test_meta_geometry_mismatch(example_copy):
    edit_meta(example_copy, lambda m: m["model"].update(num_kv_heads=32))
    expect_error(r"meta\.json: field 'model.num_kv_heads' is 32", example_copy)


def test_meta_for_another_gpu(example_copy):
    edit_meta(example_copy, lambda m: m.update(gpu_name="A100-80GB"))
    expect_error(r"field 'gpu_name' is 'A100-80GB'", example_copy)


def test_meta_gpu_is_matched_by_preset_not_name(example_copy):
    """A calibration of H200-141GB serves a renamed H200 (gpu.preset), not another part given its name."""
    import dataclasses

    from kvsim.hw import GPUS

    edit_meta(example_copy, lambda m: m.update(gpu_name="H200-141GB"))
    cfg = CalibratedTimingConfig(file=str(example_copy), allow_cpu_data=True)
    ctx = timing_context(gpu="H200-141GB")
    CalibratedTiming(cfg, dataclasses.replace(ctx, gpu=dataclasses.replace(ctx.gpu, name="rack2")))
    lookalike = dataclasses.replace(ctx, gpu=dataclasses.replace(GPUS["A100-80GB"], name="H200-141GB"))
    with pytest.raises(CalibrationError, match=r"GPU is 'H200-141GB' \(preset 'A100-80GB'\)"):
        CalibratedTiming(cfg, lookalike)


def test_csv_missing_columns(example_copy):
    df = pd.read_csv(example_copy / S.CSV_FILE).drop(columns=["median_s", "kv_bytes"])
    df.to_csv(example_copy / S.CSV_FILE, index=False)
    expect_error(r"measurements\.csv: missing column\(s\) median_s, kv_bytes", example_copy)


def test_csv_bad_time(example_copy):
    df = pd.read_csv(example_copy / S.CSV_FILE)
    df.loc[3, "median_s"] = -1.0
    df.to_csv(example_copy / S.CSV_FILE, index=False)
    expect_error(r"measurements\.csv: row 5: field 'median_s'", example_copy)
    df = df.astype({"median_s": object})
    df.loc[3, "median_s"] = "abc"  # text in the column (it was an internal error: a str has no .item())
    df.to_csv(example_copy / S.CSV_FILE, index=False)
    expect_error(r"measurements\.csv: row 5: field 'median_s' must be a positive number, got 'abc'", example_copy)


def test_kv_dtype_not_measured(example_copy):
    expect_error(r"meta\.json: field 'kv_dtypes' .*'int8' was not measured", example_copy, kv_dtype="int8")


def test_op_missing_for_dtype(example_copy):
    df = pd.read_csv(example_copy / S.CSV_FILE)
    df[df["op"] != S.PREFILL_PAGED].to_csv(example_copy / S.CSV_FILE, index=False)
    expect_error(r"measurements\.csv: no rows with op='prefill_paged'", example_copy)


def test_cpu_data_refused_by_default():
    with pytest.raises(CalibrationError, match="field 'device' is 'cpu'"):
        CalibratedTiming(CalibratedTimingConfig(file=str(CPU_EXAMPLE)), timing_context())


def test_example_is_labelled_cpu():
    meta = json.loads((CPU_EXAMPLE / S.META_FILE).read_text())
    assert meta["device"] == "cpu" and "NOT GPU" in meta["label"]
    assert meta["decode_impl"] == S.IMPL_TORCH_REFERENCE


def test_simulator_side_never_imports_torch():
    code = ("import sys, kvsim.timing.calibrated, kvsim.calibration.cli, kvsim.calibration.report, "
            "kvsim.calibration.peer; bad = [m for m in ('torch', 'triton') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(REPO))


def test_gpu_side_needs_no_simulator_dependencies():
    """bench/gpu_calibrate.sh runs `python3 -m kvsim.calibration` on a GPU image that has torch,
    numpy, pandas and matplotlib but not pydantic/simpy/pyyaml: the measuring and report code must
    import without them."""
    pytest.importorskip("torch")
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('pydantic', 'simpy', 'yaml', 'tqdm'):\n"
            "            raise ImportError('blocked ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import kvsim.calibration.cli, kvsim.calibration.runner, kvsim.calibration.report\n"
            "import kvsim.calibration.selfcheck, kvsim.calibration.bench_ops\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(REPO))
