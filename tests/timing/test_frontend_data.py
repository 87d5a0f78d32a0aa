"""The measured API-server CPU file (bench/frontend_measure.py) is well formed and agrees with the
table docs/engine_overhead.md prints from it ("The API server, measured")."""

import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "kvsim/timing/data/frontend/vllm_api_server_cpu.csv"


def test_rows_have_their_source_and_consistent_per_request_cpu():
    df = pd.read_csv(DATA)
    for col in ("source", "cpu", "date", "vllm_version"):
        assert df[col].notna().all() and (df[col].astype(str).str.len() > 0).all(), col
    assert ((df["api_cpu_s"] / df["num_prompts"] - df["api_cpu_s_per_request"]).abs() < 1e-5).all()
    # longer prompts and longer outputs cost the front end more (tokenisation, output processing)
    short = df.set_index(["input_len", "output_len"])["api_cpu_s_per_request"]
    assert short[(128, 4)] < short[(1024, 4)] < short[(2048, 4)] and short[(128, 4)] < short[(128, 64)]


def test_docs_table_is_the_file():
    text = (ROOT / "docs/engine_overhead.md").read_text()
    section = text[text.index("### The API server, measured"):]
    rows = re.findall(r"^\| ([\d,]+) / (\d+) \| ([\d.]+) ms \| (\d+) req/s \|$", section, re.M)
    df = pd.read_csv(DATA).set_index(["input_len", "output_len"])
    assert len(rows) == len(df)
    for inp, out, ms, rps in rows:
        r = df.loc[(int(inp.replace(",", "")), int(out))]
        assert f"{r.api_cpu_s_per_request * 1e3:.1f}" == ms
        assert f"{r.request_throughput:.0f}" == rps
