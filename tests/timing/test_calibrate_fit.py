"""`kvsim calibrate fit`: synthetic decode measurements from known kernel parameters are recovered."""

from __future__ import annotations

import json
from pathlib import Path
from dataclasses import replace

import pandas as pd
import pytest

from kvsim.calibration_data import schema as S
from kvsim.calibration.fit import run_fit
from kvsim.cli import main
from kvsim.hw import GPUS, MODELS
from kvsim.timing.kernel import KernelModel, KVLayout, load_backend, load_profile_file

MODEL = MODELS["Llama-3-8B"]
GPU = GPUS["A100-80GB"]
TRUE = replace(load_backend("vllm-paged-v1"), launch_overhead_s=5.1e-6, unit_overhead_s=2.2e-8,
               page_overhead_s=2.6e-9, max_bandwidth_utilisation=0.88, units_per_sm_to_saturate=3.3,
               overlap=0.0, bytes_in_flight_per_unit=0.0)  # the form calibrate fit writes: additive, sharp cap
FITTED = ("launch_overhead_s", "unit_overhead_s", "page_overhead_s", "max_bandwidth_utilisation",
          "units_per_sm_to_saturate")


def _calibration_dir(tmp_path, profile=TRUE, gpu_name="A100-80GB"):
    rows = []
    for contiguous in (False, True):
        for bs in ((None,) if contiguous else (1, 4, 16, 64, 256)):
            layout = KVLayout(1, MODEL.num_kv_heads, MODEL.num_attention_heads, MODEL.head_dim, "fp16",
                              float(MODEL.kv_bytes_per_token("fp16") / MODEL.num_layers), bs)
            km = KernelModel(profile, layout, GPU.hbm_bandwidth_bytes_per_s, GPU.num_sms)
            for batch in (1, 2, 4, 8, 16, 64, 128):
                for ctx in (64, 256, 1024, 4096):
                    pages = batch if bs is None else batch * -(-ctx // bs)
                    t = float(km.time_s(batch, batch * ctx, pages))
                    rows.append({"op": S.DECODE_CONTIGUOUS if contiguous else S.DECODE_PAGED, "impl": "triton",
                                 "device": "cuda", "dtype": "fp16", "block_size": bs or 0, "batch": batch,
                                 "context_len": ctx, "new_tokens": 1, "cached_tokens": ctx - 1, "tokens": batch,
                                 "median_s": t, "kv_bytes": batch * ctx * layout.kv_bytes_per_token_layer})
    d = tmp_path / "cal"
    d.mkdir()
    pd.DataFrame(rows).to_csv(d / S.CSV_FILE, index=False)
    model = {k: getattr(MODEL, k) for k in ("name", *S.MODEL_GEOMETRY_KEYS)}
    (d / S.META_FILE).write_text(json.dumps({
        "schema_version": 1, "device": "cuda", "gpu_name": gpu_name, "model": model,
        "copy_bandwidth_bytes_per_s": 1.8e12, "kv_dtypes": ["fp16"], "decode_impl": "triton"}))
    return d


def test_fit_recovers_known_parameters_within_2_percent(tmp_path):
    d = _calibration_dir(tmp_path)
    out = tmp_path / "fitted.yaml"
    stats = run_fit(str(d), str(out))
    prof = load_profile_file(out)  # the written file is a valid profile
    for key in FITTED:
        assert getattr(prof, key) == pytest.approx(getattr(TRUE, key), rel=0.02), key
    assert stats["mape"] < 0.01
    assert prof.reference_gpu == "A100-80GB"


def test_fit_cli_prints_json_replaces_its_own_fit_and_refuses_other_files(tmp_path, capsys):
    d = _calibration_dir(tmp_path)
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "fit", str(d), "--out", str(out)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["profile"] == str(out) and got["rows"] == 7 * 4 * 6
    # a rerun replaces the profile the first fit wrote (it said "not written by kvsim")
    assert main(["calibrate", "fit", str(d), "--name", "again", "--out", str(out)]) == 0
    capsys.readouterr()
    assert load_profile_file(out).name == "again" and sorted(p.name for p in tmp_path.iterdir()) == ["cal", "p.yaml"]
    mine = tmp_path / "mine.yaml"
    mine.write_text("name: my own profile\n")
    assert main(["calibrate", "fit", str(d), "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "file exists" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert mine.read_text() == "name: my own profile\n"
    assert main(["calibrate", "fit", str(d), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_fit_needs_a_known_gpu(tmp_path, capsys):
    d = _calibration_dir(tmp_path, gpu_name="mystery")
    assert main(["calibrate", "fit", str(d), "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "gpu_name" in err and "--gpu" in err


def test_fit_refuses_an_implementation_that_was_not_measured(tmp_path, capsys):
    """An --impl the calibration has no paged rows of left only the contiguous rows: a profile fitted on 4
    of them (it was written, exit 0). It is refused with the implementations measured."""
    d = _calibration_dir(tmp_path)
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "fit", str(d), "--impl", "nope", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--impl 'nope': no paged decode rows" in err[0] and "measured: triton" in err[0]
    assert not out.exists()
    assert main(["calibrate", "fit", str(d), "--impl", "triton", "--out", str(out)]) == 0


def test_fit_refuses_an_out_that_cannot_be_created_before_fitting(tmp_path, capsys, monkeypatch):
    """--out under a regular file, or on /proc, was an internal error (FileExistsError, FileNotFoundError)
    after the fit's work: now one line naming --out, exit 2, before any fitting."""
    import kvsim.calibration.fit as fit

    d = _calibration_dir(tmp_path)
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(fit, "fit_rows", lambda *a, **k: pytest.fail("fitted before checking --out"))
    outs = [tmp_path / "afile" / "x.yaml", tmp_path / "afile" / "sub" / "x.yaml"]
    if Path("/proc/self").is_dir():
        outs.append(Path("/proc/x.yaml"))
    for out in outs:
        assert main(["calibrate", "fit", str(d), "--gpu", "A100-80GB", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"kvsim: error: --out {out}: "), err
        assert "internal error" not in err[0]


def test_fit_refuses_an_engine_calibration_directory(tmp_path, capsys):
    """`calibrate --engine vllm` rows are whole engine steps: the fit gave a divide-by-zero warning and
    'max_bandwidth_utilisation inf ... wrong GPU or L2 cache'. Now one line saying what fit needs."""
    d = _calibration_dir(tmp_path)
    meta = json.loads((d / S.META_FILE).read_text())
    (d / S.META_FILE).write_text(json.dumps({**meta, "source": "engine"}))
    assert main(["calibrate", "fit", str(d), "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "field 'source' is 'engine'" in err[0] and "kvsim calibrate --device" in err[0]
    assert not (tmp_path / "p.yaml").exists()


def test_fit_on_flat_rows_is_one_line_naming_the_directory_and_op(tmp_path, capsys):
    import warnings

    d = _calibration_dir(tmp_path)
    df = pd.read_csv(d / S.CSV_FILE)
    df["median_s"] = 1e-7  # times that do not grow with the bytes read: no bandwidth term
    df[df["op"] == S.DECODE_PAGED].to_csv(d / S.CSV_FILE, index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: RuntimeWarning divide by zero, then 'inf exceeds 1'
        assert main(["calibrate", "fit", str(d), "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvsim: error: {d / S.CSV_FILE}: the decode_paged rows' times")
    assert "inf" not in err[0].replace("infinite", "")


def test_fit_blames_the_gpu_flag_not_meta_json(tmp_path, capsys):
    """--gpu B999 said "meta.json: field 'gpu_name' is 'B999'" though the value came from the flag."""
    d = _calibration_dir(tmp_path)
    assert main(["calibrate", "fit", str(d), "--gpu", "a100-80gb", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsim: error: --gpu 'a100-80gb': not a GPU preset; choose one of ")
    assert "meta.json" not in err[0] and "did you mean 'A100-80GB'" in err[0]


def test_a_corrupt_measurements_csv_is_one_line(tmp_path, capsys):
    """pandas' tokenizer error ends with a newline: the message's closing ')' was on a second line."""
    d = _calibration_dir(tmp_path)
    with (d / S.CSV_FILE).open("a") as f:
        f.write(",".join("x" * 40) + "\n")
    assert main(["calibrate", "fit", str(d), "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot parse CSV (Error tokenizing data" in err and err.endswith(")\n")
