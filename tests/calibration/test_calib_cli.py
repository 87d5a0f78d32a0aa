"""End to end on the CPU: ``kvsim calibrate --device cpu --out DIR`` -> ``timing: calibrated`` ->
``kvsim calibrate report DIR`` and ``kvsim calibrate peer-check``.

Uses the real ``kvsim`` CLI in a subprocess when ``kvsim/cli.py`` registers the sub-command,
else the handler in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import vidur_dir as _vidur_dir
from calib_helpers import REPO, decode_shape, mixed_shape, prefill_shape, timing_context

VIDUR = _vidur_dir()
CLI_WIRED = (REPO / "kvsim" / "cli.py").exists() and "kvsim.calibration.cli" in (REPO / "kvsim" / "cli.py").read_text()


def kvsim(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``kvsim calibrate ARGS`` (the wired CLI, or ``python -m kvsim.calibration``)."""
    cmd = [sys.executable, "-m", "kvsim", "calibrate", *args] if CLI_WIRED else \
        [sys.executable, "-m", "kvsim.calibration", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("calib") / "cpu-llama3"
    # the default CPU grid, with fewer timed calls to keep CI fast (also exercises the grid overrides)
    r = kvsim("--device", "cpu", "--out", str(out), "--repeats", "2", "--warmup", "0")
    assert str(out) in r.stdout
    return out


def test_cpu_calibration_dir_is_complete_and_labelled(cpu_run):
    meta = json.loads((cpu_run / "meta.json").read_text())
    assert meta["device"] == "cpu" and meta["gpu_name"] == "cpu" and "NOT GPU" in meta["label"]
    assert meta["decode_impl"] == "torch_reference"
    assert meta["model"]["name"] == "Llama-3-8B" and meta["model"]["num_kv_heads"] == 8
    for key in ("torch", "triton", "kvsim_version", "date", "grid", "copy_bandwidth_bytes_per_s", "kv_dtypes"):
        assert meta.get(key) is not None, key
    assert meta["copy_bandwidth_bytes_per_s"] > 0
    assert not list(cpu_run.parent.glob(".*tmp-*")), "temporary directory left behind"
    import pandas as pd

    df = pd.read_csv(cpu_run / "measurements.csv")
    ops = set(df["op"])
    assert {"decode_paged", "prefill_paged", "decode_contiguous", "gemm_qkv", "gemm_out", "gemm_mlp_up",
            "gemm_mlp_down", "gemm_lm_head", "elementwise", "copy"} <= ops
    assert (df["median_s"] > 0).all() and (df["p10_s"] <= df["p90_s"]).all()
    dec = df[df["op"] == "decode_paged"]
    assert set(dec["block_size"]) == {1, 16, 64} and set(dec["dtype"]) == {"fp16", "fp8"}
    assert (dec["kv_bytes"] == dec["batch"] * dec["context_len"] * 2 * 8 * 128 * dec["dtype"].map(
        {"fp16": 2, "fp8": 1})).all()


def test_calibrated_timing_from_cpu_run(cpu_run):
    from kvsim.timing.calibrated import CalibratedTiming, CalibratedTimingConfig

    for bs in (16, 32, None):
        t = CalibratedTiming(CalibratedTimingConfig(file=str(cpu_run), allow_cpu_data=True),
                             timing_context(kv_dtype="fp16", block_size=bs))
        for shape in (decode_shape(1, 10), decode_shape(8, 3000), prefill_shape(512, 0), mixed_shape(32, 100, [5, 9])):
            st = t.step_time(shape)
            assert st.duration_s > 0 and st.breakdown_s["attention_s"] > 0
            assert set(st.breakdown_s) >= {"attention_s", "gemm_s", "overhead_s", "swap_s"}
    t8 = CalibratedTiming(CalibratedTimingConfig(file=str(cpu_run), allow_cpu_data=True),
                          timing_context(kv_dtype="fp8"))
    assert t8.step_time(decode_shape(4, 100)).breakdown_s["decode_attention_s"] > 0


def test_report_prints_mape_and_writes_plots(cpu_run):
    r = kvsim("report", str(cpu_run))
    assert "MAPE" in r.stdout and "decode_paged" in r.stdout and "gemm_qkv" in r.stdout
    assert "of copy" in r.stdout and "NOT GPU" in r.stdout
    for f in ("report_loo.csv", "report_loo.png", "report_bandwidth.csv", "report_bandwidth.png"):
        assert (cpu_run / f).stat().st_size > 0, f


def test_report_on_bad_dir_is_one_line_error(tmp_path):
    r = kvsim("report", str(tmp_path / "missing"), check=False)
    assert r.returncode == 2
    assert "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_refuses_to_replace_a_non_calibration_dir(tmp_path):
    pytest.importorskip("torch")
    from kvsim.calibration.runner import run_calibration
    from kvsim.errors import CalibrationError

    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(CalibrationError, match="not a calibration directory"):
        run_calibration(tmp_path, device="cpu", log=lambda m: None)
    assert (tmp_path / "precious.txt").exists()


def test_the_model_preset_is_read_as_a_scenario_reads_it():
    from kvsim.calibration.runner import resolve_model
    from kvsim.errors import CalibrationError

    assert resolve_model("qwen3-0.6b").name == "Qwen3-0.6B"
    with pytest.raises(CalibrationError, match=r"^--model: unknown model preset 'llama' \(did you mean"):
        resolve_model("llama")


def test_selfcheck_on_cuda_without_a_gpu_is_one_line():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    r = kvsim("selfcheck", "--device", "cuda", check=False)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == ["kvsim: error: --device cuda: torch sees no CUDA device "
                                             "(use --device cpu for a plumbing run)"]


def test_selfcheck_small_matrix_on_interpreter():
    pytest.importorskip("triton")
    import torch

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")
    from kvsim.calibration.selfcheck import run_selfcheck

    res = run_selfcheck(torch.device("cpu"), block_sizes=(16,), kv_dtypes=("fp16",), log=lambda m: None)
    assert res["ok"], res["failures"]
    assert res["max_rel_err"]["decode_fp16"] <= 1e-3


@pytest.mark.skipif(not VIDUR.is_dir(), reason="Vidur peer data not present")
def test_peer_check_prints_mape_per_gpu_and_model():
    r = kvsim("peer-check", "--vidur-dir", str(VIDUR))
    out = r.stdout
    for gpu in ("a100", "h100", "a40"):
        assert f"  {gpu}" in out
    for model in ("Llama-2-7b-hf", "Llama-2-70b-hf", "Meta-Llama-3-8B", "phi-2"):
        assert model in out
    assert "attn_decode" in out and "layer_gemms" in out and "MAPE" in out


@pytest.mark.skipif(not VIDUR.is_dir(), reason="Vidur peer data not present")
def test_peer_check_with_calibration_compares_its_model(cpu_run):
    from kvsim.calibration.peer import run_peer_check

    lines: list[str] = []
    table = run_peer_check(VIDUR, cpu_run, log=lines.append)
    llama3 = table[(table["model"] == "Meta-Llama-3-8B") & (table["op"] == "mlp_up_proj")]
    assert llama3["calibrated_mape_pct"].notna().all()
    assert table[table["model"] == "phi-2"]["calibrated_mape_pct"].isna().all()
    assert any("NOT GPU" in line for line in lines)
    # the analytical roofline is in the right ballpark for large GEMMs (sanity, not a target)
    assert table[table["op"] == "layer_gemms"]["analytical_mape_pct"].max() < 60


@pytest.mark.parametrize("args, flag", [
    (["--engine", "vllm", "--model", "config.json", "--warmup", "-1"], "--warmup"),
    (["--device", "cpu", "--warmup", "-1"], "--warmup"),
    (["--device", "cpu", "--time-budget-s", "-1"], "--time-budget-s"),
    (["--device", "cpu", "--time-budget-s", "nan"], "--time-budget-s"),
    (["--device", "cpu", "--seed", "-1"], "--seed"),
    (["--engine", "vllm", "--model", "config.json", "--cached", "-1", "0"], "--cached"),
])
def test_negative_counts_and_budgets_are_refused_in_one_line(args, flag, capsys, tmp_path):
    """--warmup -1, --time-budget-s -1 and --seed -1 were accepted."""
    from kvsim.cli import main

    with pytest.raises(SystemExit) as e:  # (--out: were it accepted, nothing lands in the checkout)
        main(["calibrate", *args, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvsim: error: argument {flag}: expected "), err
