"""Shared fixtures for the trace tests (paths of the shipped traces, small helpers)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "traces"
AZURE_CONV = TRACES / "azure_conv_2023.csv.gz"
MOONCAKE_CONV = TRACES / "mooncake_conversation_0-40min.jsonl.gz"
MOONCAKE_SYNTH = TRACES / "mooncake_synthetic.jsonl.gz"


@pytest.fixture(scope="session")
def azure_trace():
    from kvsim.trace.load import load_trace

    return load_trace(AZURE_CONV)


@pytest.fixture(scope="session")
def mooncake_conv_trace():
    from kvsim.trace.load import load_trace

    return load_trace(MOONCAKE_CONV)


@pytest.fixture(scope="session")
def mooncake_synth_trace():
    from kvsim.trace.load import load_trace

    return load_trace(MOONCAKE_SYNTH)


@pytest.fixture
def write_text(tmp_path):
    """write_text(name, text) -> path; a name ending in .gz is gzip-compressed."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        data = text.encode()
        path.write_bytes(gzip.compress(data, mtime=0) if name.endswith(".gz") else data)
        return path

    return _write
