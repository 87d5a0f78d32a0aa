"""Transforms and the TraceConfig -> build_trace path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from kvsim.errors import TraceError
from kvsim.trace.config import TraceConfig, build_trace
from kvsim.trace.schema import Trace
from kvsim.trace.transforms import limit_lengths, scale_rate, slice_count, slice_time

TRACES = Path(__file__).resolve().parents[2] / "traces"


def small(n=10, prompt=None, output=None, keys=False) -> Trace:
    prompt = np.full(n, 100, np.int64) if prompt is None else np.asarray(prompt, np.int64)
    output = np.full(n, 10, np.int64) if output is None else np.asarray(output, np.int64)
    return Trace(
        arrival_s=np.arange(n, dtype=np.float64),
        prompt_tokens=prompt,
        output_tokens=output,
        prefix_keys=[np.arange(-(-p // 16), dtype=np.int64) for p in prompt] if keys else None,
        prefix_block_tokens=16 if keys else None,
    )


def test_rate_scale_divides_times():
    t = scale_rate(small(), 2.0)
    assert t.arrival_s.tolist() == [i / 2 for i in range(10)]
    with pytest.raises(ValueError):
        scale_rate(small(), 0)


def test_time_slice_rebases_to_start():
    t = slice_time(small(), 2.5, 6.0)
    assert t.arrival_s.tolist() == [0.5, 1.5, 2.5]  # requests at 3, 4, 5
    assert slice_time(small(), None, 3).arrival_s.tolist() == [0, 1, 2]


def test_count_slice():
    t = slice_count(small(), 3, 4)
    assert t.arrival_s.tolist() == [0, 1, 2, 3]  # 3..6 rebased
    assert len(slice_count(small(), 0, 4)) == 4 and slice_count(small(), 0, 4).arrival_s[0] == 0
    assert len(slice_count(small(), 20, None)) == 0


def test_length_policies():
    t = small(4, prompt=[100, 500, 990, 50], output=[10, 10, 20, 2000], keys=True)
    same, rep = limit_lengths(t, 1000, "reject")
    assert same is t and rep["over_long"] == 2 and rep["dropped"] == rep["capped"] == 0
    dropped, rep = limit_lengths(t, 1000, "drop")
    assert dropped.prompt_tokens.tolist() == [100, 500] and rep["dropped"] == 2
    capped, rep = limit_lengths(t, 1000, "cap")
    assert rep["capped"] == 2
    assert capped.prompt_tokens.tolist() == [100, 500, 980, 1]
    assert capped.output_tokens.tolist() == [10, 10, 20, 999]
    assert (capped.prompt_tokens + capped.output_tokens <= 1000).all()
    # Keys cut to the kept prompt; the now-partial last block gets a fresh key.
    assert len(capped.prefix_keys[2]) == 62 and capped.prefix_keys[2][:61].tolist() == list(range(61))
    assert capped.prefix_keys[2][61] != 61
    capped.validate()
    assert t.prompt_tokens.tolist() == [100, 500, 990, 50]  # input untouched


def test_config_exactly_one_source():
    with pytest.raises(ValidationError, match="exactly one"):
        TraceConfig()
    with pytest.raises(ValidationError, match="exactly one"):
        TraceConfig(file="a.csv", synthetic={"num_requests": 1, "preset": "alpaca", "arrival": {"rate_per_s": 1}})
    with pytest.raises(ValidationError, match="apply only to 'file'"):
        TraceConfig(format="azure", synthetic={"num_requests": 1, "preset": "alpaca", "arrival": {"rate_per_s": 1}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        TraceConfig(file="a.csv", rate=2)
    with pytest.raises(ValidationError):
        TraceConfig(file="a.csv", rate_scale=0)
    with pytest.raises(ValidationError, match="greater than start_s"):
        TraceConfig(file="a.csv", start_s=5, end_s=5)
    with pytest.raises(ValidationError):
        TraceConfig(file="a.csv", length_policy="truncate")


def test_build_trace_from_file_resolves_against_base_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = TraceConfig(file="mooncake_synthetic.jsonl.gz", start_s=100, end_s=400, max_requests=500,
                      rate_scale=2.0, length_policy="drop")
    trace, report = build_trace(cfg, TRACES, seed=0, max_model_len_tokens=32_768)
    assert report["source"] == "file" and report["format"] == "mooncake"
    assert report["file"] == str(TRACES / "mooncake_synthetic.jsonl.gz")
    assert report["content_sha256"] == "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131"
    assert report["requests_loaded"] == 3993
    assert report["requests_after_time_slice"] < 3993
    # counted in the span the 500 requests came from, not over the whole slice
    assert 0 < report["dropped"] == report["over_long"] <= (report["requests_after_time_slice"]
                                                            - report["requests_after_length_policy"])
    assert report["requests"] == len(trace) == 500
    assert trace.arrival_s.max() < 150  # (400 - 100) / 2
    assert (trace.prompt_tokens + trace.output_tokens <= 32_768).all()
    json.dumps(report)  # JSON-able


def test_build_trace_falls_back_to_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(TRACES.parent)
    trace, report = build_trace(TraceConfig(file="traces/azure_conv_2023.csv.gz"), tmp_path, 0, None)
    assert len(trace) == 19_366 and report["over_long"] == 0


def test_build_trace_missing_file_names_places(tmp_path):
    with pytest.raises(TraceError, match="does not exist") as info:
        build_trace(TraceConfig(file="nope.csv"), tmp_path, 0, 4096)
    assert str(tmp_path / "nope.csv") in str(info.value)


def test_build_trace_synthetic_seed_and_report(tmp_path):
    cfg = TraceConfig(synthetic={"num_requests": 300, "preset": "alpaca", "arrival": {"rate_per_s": 3}})
    a, ra = build_trace(cfg, tmp_path, seed=1, max_model_len_tokens=2048)
    b, _ = build_trace(cfg, tmp_path, seed=1, max_model_len_tokens=2048)
    c, _ = build_trace(cfg, tmp_path, seed=2, max_model_len_tokens=2048)
    assert np.array_equal(a.arrival_s, b.arrival_s) and not np.array_equal(a.arrival_s, c.arrival_s)
    assert ra["source"] == "synthetic" and ra["seed"] == 1 and len(ra["spec_sha256"]) == 64
    json.dumps(ra)
    pinned = TraceConfig(synthetic={"num_requests": 300, "preset": "alpaca", "arrival": {"rate_per_s": 3}, "seed": 9})
    d, rd = build_trace(pinned, tmp_path, seed=1, max_model_len_tokens=None)
    assert rd["seed"] == 9


def test_build_trace_empty_after_slicing(tmp_path):
    cfg = TraceConfig(file=str(TRACES / "azure_conv_2023.csv.gz"), start_s=1e6)
    with pytest.raises(TraceError, match="no requests left"):
        build_trace(cfg, tmp_path, 0, None)


def test_on_unsorted_via_config(tmp_path):
    path = tmp_path / "u.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n2,5,5\n1,5,5\n")
    with pytest.raises(TraceError, match="line 3"):
        build_trace(TraceConfig(file="u.csv"), tmp_path, 0, None)
    with pytest.warns(UserWarning):
        trace, report = build_trace(TraceConfig(file="u.csv", on_unsorted="sort"), tmp_path, 0, None)
    assert trace.arrival_s.tolist() == [1.0, 2.0] and len(report["repairs"]) == 1


@pytest.mark.parametrize("policy", ["cap", "drop"])
def test_length_policy_does_not_overflow_on_huge_counts(policy):
    """prompt + output would wrap negative in int64 and hide the over-long request."""
    huge = np.iinfo(np.int64).max
    t, report = limit_lengths(small(2, prompt=[huge, 100], output=[44, 10]), 2048, policy)
    assert report["over_long"] == 1
    if policy == "cap":
        assert t.prompt_tokens.tolist() == [2048 - 44, 100] and t.output_tokens.tolist() == [44, 10]
    else:
        assert len(t) == 1 and t.prompt_tokens.tolist() == [100]


@pytest.mark.parametrize("policy, skip, most, expect", [
    ("drop", 0, 4, 0),      # the first 4 requests are short: the 16 long ones after them are not the slice's
    ("cap", 0, 4, 0),
    ("reject", 0, 4, 0),
    ("drop", 0, 6, 2),      # the slice lacks 2 requests: 2 of the later long ones would have been in it
    ("cap", 0, 6, 2),       # requests 4 and 5, capped, are in it
    ("drop", 0, None, 16),
    ("drop", 2, 2, 0),
    ("drop", 2, 5, 3),
])
def test_length_policy_counts_only_what_the_count_slice_reaches(tmp_path, policy, skip, most, expect):
    """A run of max_requests: 4 over a file of 20 requests, 16 of them over-long, warned that 80 %
    of the trace was not served (16 dropped) although it asked for 4 and got 4 (QA report)."""
    rows = ["arrival_s,prompt_tokens,output_tokens"] + [f"{i * 0.5},{100 if i < 4 else 3000},20" for i in range(20)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    cfg = TraceConfig(file="t.csv", length_policy=policy, skip_requests=skip, max_requests=most)
    trace, report = build_trace(cfg, tmp_path, seed=0, max_model_len_tokens=2048)
    assert report["over_long"] == expect
    assert report["dropped"] == (expect if policy == "drop" else 0)
    assert report["capped"] == (expect if policy == "cap" else 0)
