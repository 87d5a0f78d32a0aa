"""Acceptance numbers of the shipped traces (cf. /work/shared/traces/README.md)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from kvsim.trace.stats import trace_stats

TRACES = Path(__file__).resolve().parents[2] / "traces"
AZURE_CONV = TRACES / "azure_conv_2023.csv.gz"
MOONCAKE_CONV = TRACES / "mooncake_conversation_0-40min.jsonl.gz"
MOONCAKE_SYNTH = TRACES / "mooncake_synthetic.jsonl.gz"

UPSTREAM_SHA256 = {
    AZURE_CONV: "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    MOONCAKE_CONV: "24d66442470b35d879d7ddd861640493065c862e15ef5e3efbc1a47b5326afea",
    MOONCAKE_SYNTH: "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
}


def test_mooncake_conversation_stats(mooncake_conv_trace):
    s = trace_stats(mooncake_conv_trace)
    assert s["requests"] == 7851
    assert s["duration_s"] == pytest.approx(2397.0)
    assert s["mean_rate_per_s"] == pytest.approx(3.28, abs=0.005)
    assert s["prompt_tokens"]["mean"] == pytest.approx(12428.0, abs=0.05)
    assert (s["prompt_tokens"]["p50"], s["prompt_tokens"]["p99"], s["prompt_tokens"]["max"]) == (7284, 89868, 124847)
    assert s["output_tokens"]["mean"] == pytest.approx(347.1, abs=0.05)
    p = s["prefix"]
    assert p["block_tokens"] == 512
    assert (p["blocks"], p["distinct_blocks"]) == (194_284, 126_103)
    assert round(p["ideal_hit_ratio_blocks"] * 100, 2) == 35.09
    assert round(p["ideal_hit_ratio_tokens"] * 100, 2) == 35.77
    assert s["distinct_arrival_times"] == 800  # Mooncake quantises arrivals to ~3 s


def test_mooncake_synthetic_stats(mooncake_synth_trace):
    s = trace_stats(mooncake_synth_trace)
    assert s["requests"] == 3993
    assert s["duration_s"] == pytest.approx(1022.025)
    assert s["prompt_tokens"]["mean"] == pytest.approx(15325.5, abs=0.05)
    assert s["output_tokens"]["mean"] == pytest.approx(149.1, abs=0.05)
    p = s["prefix"]
    assert (p["blocks"], p["distinct_blocks"]) == (121_877, 43_924)
    assert round(p["ideal_hit_ratio_blocks"] * 100, 2) == 63.96
    assert round(p["ideal_hit_ratio_tokens"] * 100, 2) == 65.12


def test_azure_conversation_stats(azure_trace):
    s = trace_stats(azure_trace)
    assert s["requests"] == 19_366
    assert round(s["prompt_tokens"]["mean"], 1) == 1154.7
    assert round(s["output_tokens"]["mean"], 1) == 211.1
    assert (s["prompt_tokens"]["p50"], s["prompt_tokens"]["p99"], s["prompt_tokens"]["max"]) == (1020, 4142, 14050)
    assert (s["output_tokens"]["p50"], s["output_tokens"]["p99"], s["output_tokens"]["max"]) == (129, 601, 1000)
    assert s["duration_s"] == pytest.approx(3501.7, abs=0.05)
    assert round(s["mean_rate_per_s"], 2) == 5.53
    assert s["prefix"] is None
    # Arrivals are seconds since the first TIMESTAMP (2023-11-16 18:15:46.6805900).
    assert azure_trace.arrival_s[0] == 0.0
    assert azure_trace.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900)


@pytest.mark.parametrize("path", [AZURE_CONV, MOONCAKE_CONV, MOONCAKE_SYNTH], ids=lambda p: p.name)
def test_shipped_file_is_upstream_bytes(path):
    """The .gz files decompress to the upstream bytes listed in traces/README.md."""
    from kvsim.trace.load import load_trace

    trace = load_trace(path)
    assert trace.source["content_sha256"] == UPSTREAM_SHA256[path]
    assert trace.source["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    readme = (TRACES / "README.md").read_text()
    assert UPSTREAM_SHA256[path] in readme
    assert trace.source["sha256"] in readme


def test_shipped_gzip_is_reproducible():
    """gzip -9n: no name or timestamp in the header (bytes 4-7 are the mtime)."""
    for path in (AZURE_CONV, MOONCAKE_CONV, MOONCAKE_SYNTH):
        head = path.read_bytes()[:10]
        assert head[:2] == b"\x1f\x8b" and head[3] & 0x08 == 0 and head[4:8] == b"\0\0\0\0"


def test_mooncake_hash_ids_are_chained_prefixes(mooncake_conv_trace):
    t = mooncake_conv_trace
    lens = np.array([len(k) for k in t.prefix_keys])
    assert np.array_equal(lens, -(-t.prompt_tokens // 512))
    assert all(k[0] == 0 for k in t.prefix_keys)


def test_readme_mentions_licenses_and_citations():
    text = (TRACES / "README.md").read_text()
    for needle in ("CC-BY 4.0", "Apache-2.0", "Splitwise", "ISCA 2024", "Mooncake", "FAST 2025"):
        assert needle in text
    assert len(re.findall(r"\b[0-9a-f]{64}\b", text)) >= 6
