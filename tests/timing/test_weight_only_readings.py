"""The weight-only MoE readings that docs/engine_overhead.md quotes ("MoE layers"): what the file
holds is what the text says, and none of it is on a kvsim GPU preset (else it belongs in the fit)."""

from pathlib import Path

import pandas as pd

from kvsim.hw import GPUS

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "kvsim" / "timing" / "data" / "moe" / "weight_only_readings.csv"
H20_BANDWIDTH_TB_S = 4.0  # the secondary spec page the doc names


def _readings() -> pd.DataFrame:
    return pd.read_csv(DATA)


def test_every_reading_names_its_thread_and_is_a_positive_time():
    df = _readings()
    assert len(df) == 90
    assert df["source_url"].str.startswith("https://github.com/").all()
    assert (df["latency_us"] > 0).all() and (df["num_tokens"] >= 1).all()
    assert set(df["weight_dtype"]) == {"int4", "int8", "fp8"}


def test_no_reading_is_on_a_kvsim_gpu_preset():
    assert not set(_readings()["gpu"]) & set(GPUS)


def test_the_one_token_figures_the_doc_quotes():
    df = _readings()
    one = df[(df["num_tokens"] == 1) & (df["weight_dtype"] == "int4")]
    assert (round(one["latency_us"].min()), round(one["latency_us"].max())) == (84, 149)
    touched = one["top_k"].clip(upper=one["num_experts"])
    mb = touched * 3 * one["hidden_size"] * one["shard_intermediate_size"] * 0.5 / 1e6
    read_us = mb / H20_BANDWIDTH_TB_S
    assert (round(read_us.min()), round(read_us.max())) == (16, 44)
    h20 = one["gpu"] == "H20"
    fixed = (one["latency_us"] - read_us)[h20]
    assert (round(fixed.min()), round(fixed.max())) == (68, 111)
    text = (ROOT / "docs" / "engine_overhead.md").read_text()
    for quoted in ("84-149 us", "16-44 us", "68-111 us", "weight_only_readings.csv"):
        assert quoted in text
