"""The fast engine under vLLM V1's async scheduling (the ``vllm-0.32`` profile): the lazy decode group
(its bulk growth registering blocks once their tokens are known, the held finishes paused in the
ledger), decode windows and the async overlap of the CPU terms, against the step-by-step engine on
random configurations: identical request tables and summaries, invariants checked every step."""

import logging

import numpy as np
import pytest

from engine.test_fast_engine import assert_same, random_rows
from helpers import make_scenario, make_trace
from kvsim.simulate import run


def _config(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(60, 200))
    rows = random_rows(n, seed=seed, rate=float(rng.choice([5, 20, 60])), prompt=(1, int(rng.choice([200, 1500]))),
                       output=(1, int(rng.choice([30, 300]))))
    cp = bool(rng.integers(0, 2))
    kw = dict(engine_profile="vllm-0.32", model="Llama-3-8B", gpu="H100-SXM-80GB",
              kv_budget={"tokens": int(rng.choice([1500, 4000, 20000]))},
              allocator={"kind": "paged", "block_size": int(rng.choice([1, 8, 16, 32])),
                         "prefix_caching": bool(rng.integers(0, 2))},
              scheduler={"chunked_prefill": cp, "max_num_seqs": int(rng.choice([4, 16, 256])),
                         "max_num_batched_tokens": 2048 if cp else 8192},
              timing={"kind": "analytical"})
    samples = np.resize(np.array([1, 2, 3], np.int64), n) if rng.integers(0, 4) == 0 else None
    return rows, kw, samples


@pytest.mark.parametrize("seed", [0, 1, 4, 7, 19, 23])
def test_fast_equals_step_under_async_scheduling(seed, caplog, monkeypatch):
    import kvsim.engine as E

    group_windows = []
    apply = E.apply_group_window

    def counted(*a, **k):
        out = apply(*a, **k)
        group_windows.append(out[0])
        return out

    monkeypatch.setattr(E, "apply_group_window", counted)
    rows, kw, samples = _config(seed)
    out = {}
    for mode in ("step", "fast"):
        trace = make_trace(rows)
        if samples is not None:
            object.__setattr__(trace, "num_samples", samples)
        with caplog.at_level(logging.INFO, logger="kvsim.engine"):
            out[mode] = run(make_scenario(engine={"mode": mode}, **kw), trace=trace, check_invariants=True)
    assert_same(out["step"], out["fast"], fast_has_windows=True)
    if samples is None:
        assert "decode group on" in caplog.text  # the group runs under async scheduling
        assert max(group_windows) > 1  # and so do its decode windows, their finishes held a step


def _family_keys(rows, seed: int) -> list:
    """Chained prefix keys (16-token source blocks) for 1-5 request families sharing prefixes of up to
    80 blocks, the rest of each prompt the request's own."""
    rng = np.random.default_rng(1000 + seed)
    families = int(rng.integers(1, 6))
    shared = rng.integers(1, 80, families)
    keys = []
    for i, (_, p, _) in enumerate(rows):
        f = i % families
        nb = int(p) // 16
        sh = min(nb, int(shared[f]))
        keys.append(np.array([1000 * f + j for j in range(sh)] + [10**7 + i * 10**4 + j for j in range(sh, nb)],
                             dtype=np.int64))
    return keys


@pytest.mark.parametrize("seed", [2, 19, 33, 43])
def test_fast_equals_step_under_async_scheduling_with_shared_prefixes(seed):
    """Prefix-cache hits across requests (known-token block registration, held finishes' blocks cached
    at their release) inside the decode group's windows."""
    rows, kw, samples = _config(seed)
    kw = dict(kw, allocator=dict(kw["allocator"], prefix_caching=True))
    keys = _family_keys(rows, seed)
    out = {}
    for mode in ("step", "fast"):
        trace = make_trace(rows)
        object.__setattr__(trace, "prefix_keys", keys)
        object.__setattr__(trace, "prefix_block_tokens", 16)
        if samples is not None:
            object.__setattr__(trace, "num_samples", samples)
        out[mode] = run(make_scenario(engine={"mode": mode}, **kw), trace=trace, check_invariants=True)
    assert_same(out["step"], out["fast"], fast_has_windows=True)
    assert out["step"].summary["prefix_cache"]["hit_ratio_tokens"] > 0.5
