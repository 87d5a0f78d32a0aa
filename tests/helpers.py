"""Shared test helpers: tiny traces and scenarios."""

from __future__ import annotations

import numpy as np

from kvsim.config import Scenario
from kvsim.trace.schema import Trace


def make_trace(rows):
    """rows: [(arrival_s, prompt_tokens, output_tokens), ...]"""
    a = np.array([r[0] for r in rows], dtype=np.float64)
    p = np.array([r[1] for r in rows], dtype=np.int64)
    o = np.array([r[2] for r in rows], dtype=np.int64)
    return Trace(arrival_s=a, prompt_tokens=p, output_tokens=o, source={"kind": "test"})


def make_scenario(**over):
    raw = {
        "trace": {"file": "unused.csv"},
        "model": "OPT-13B",
        "kv_budget": {"tokens": 64},
        "allocator": {"kind": "paged", "block_size": 4, "watermark": 0.0},
        "timing": {"kind": "constant", "step_s": 0.1},
    }
    for k, v in over.items():
        raw[k] = v
    return Scenario.model_validate(raw)


def vidur_dir():
    """Vidur's public profiling data (../shared/peer-data/vidur beside the checkout, as on the
    developers' machines and in CI), or $KVSIM_VIDUR_DIR."""
    import os
    from pathlib import Path

    env = os.environ.get("KVSIM_VIDUR_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "peer-data" / "vidur"
