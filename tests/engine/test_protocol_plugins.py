"""Plugins written against the declared protocols alone run in the default (fast) engine mode.

A minimal allocator exposes only :class:`kvsim.kv.protocol.KVAllocator` (it delegates to a private
real allocator through those calls and nothing else); a minimal timing model exposes only
``step_time``. Run through ``kvsim.simulate.run`` in the default mode they produce the same request
tables as the full plugins (and as step mode): the allocator runs at step speed (no decode
windows), the timing model gets a decode-window pricing derived from ``step_time``.
"""

import logging

import numpy as np
import pandas as pd
import pytest

from helpers import make_scenario, make_trace
from kvsim.models.geometry import KVGeometry
from kvsim.kv.paged import CountingPagedAllocator, PagedAllocator, PagedAllocatorConfig
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.protocol import (
    BulkDecodeGrowth,
    KVAllocator,
    LazyLedger,
    PrefixCachePeek,
    WindowAllocator,
    allocator_capabilities,
)
from kvsim.registry import ALLOCATORS, TIMING_MODELS
from kvsim.simulate import run
from kvsim.timing.analytical import AnalyticalTimingConfig
from kvsim.timing.base import StepTimeVectorisation, VectorisedDecodeTiming, decode_pricer, decode_shape


class MinimalAllocator:
    """Only the required protocol, delegating to a real allocator kept private."""

    def __init__(self, inner):
        self._inner = inner
        self.capacity_tokens = inner.capacity_tokens
        self.block_size = inner.block_size

    def max_footprint_fits(self, req):
        return self._inner.max_footprint_fits(req)

    def allocate(self, req, hold_tokens):
        return self._inner.allocate(req, hold_tokens)

    def ensure_slots(self, request_id, num_tokens):
        return self._inner.ensure_slots(request_id, num_tokens)

    def free(self, request_id):
        self._inner.free(request_id)

    def held_tokens(self, request_id):
        return self._inner.held_tokens(request_id)

    def usage(self, head=None, head_hold_tokens=0):
        return self._inner.usage(head, head_hold_tokens)

    def check_invariants(self):
        self._inner.check_invariants()


class StepOnlyTiming:
    """Only ``step_time``."""

    def __init__(self, inner):
        self._inner = inner

    def step_time(self, shape):
        return self._inner.step_time(shape)


def _wrap(registry, kind, wrapper, monkeypatch):
    """Make ``kind`` build ``wrapper(the real plugin)`` (same config class, same YAML)."""
    cfg_cls, factory = registry._entries[kind]
    monkeypatch.setitem(registry._entries, kind, (cfg_cls, lambda *a, **k: wrapper(factory(*a, **k))))


def rows(n=70, seed=3):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 30.0, n))
    return list(zip(arrivals, rng.integers(1, 200, n), rng.integers(1, 90, n)))


SCN = dict(kv_budget={"tokens": 2048}, allocator={"kind": "paged", "block_size": 16},
           timing={"kind": "analytical", "step_overhead_s": 0.001})


def simulate(mode, **over):
    return run(make_scenario(engine={"mode": mode}, **{**SCN, **over}), trace=make_trace(rows()),
               check_invariants=True)


def non_idle_rows(res):
    return res.steps[~res.steps["idle"]]


def test_minimal_plugins_satisfy_the_protocol_and_nothing_more():
    inner = CountingPagedAllocator(8, 4)
    alloc = MinimalAllocator(inner)
    assert isinstance(alloc, KVAllocator)
    for cap in (WindowAllocator, BulkDecodeGrowth, LazyLedger, PrefixCachePeek):
        assert not isinstance(alloc, cap)
    caps = allocator_capabilities(alloc)
    assert not (caps.windows or caps.decode_group or caps.bulk_slots or caps.prefix_peek or caps.eviction_counter)
    full = allocator_capabilities(inner)
    assert full.windows and full.decode_group and full.bulk_slots and not full.prefix_peek
    assert allocator_capabilities(PagedAllocator(8, 4, prefix_caching=True)).prefix_peek
    ext = allocator_capabilities(ContiguousAllocator(64))
    assert ext.windows and ext.decode_group and not ext.bulk_slots
    with pytest.raises(TypeError, match="missing .*ensure_slots"):
        allocator_capabilities(object())


def test_minimal_allocator_runs_in_default_mode_at_step_speed(monkeypatch, caplog):
    full_step = simulate("step")
    full_fast = simulate("fast")
    _wrap(ALLOCATORS, "paged", MinimalAllocator, monkeypatch)
    with caplog.at_level(logging.INFO, logger="kvsim.engine"):
        minimal = simulate("fast")
    assert "decode windows off" in caplog.text and "WindowAllocator" in caplog.text
    pd.testing.assert_frame_equal(minimal.requests, full_step.requests, check_exact=True)
    pd.testing.assert_frame_equal(minimal.requests, full_fast.requests, check_exact=True)
    # step speed: one row per step, exactly the step engine's rows
    assert (non_idle_rows(minimal)["num_steps"] == 1).all()
    pd.testing.assert_frame_equal(minimal.steps, full_step.steps, check_exact=True)
    assert len(non_idle_rows(full_fast)) < len(non_idle_rows(minimal))  # the full plugin does take windows


@pytest.mark.parametrize("allocator", [{"kind": "paged", "block_size": 16},
                                       {"kind": "paged", "block_size": 16, "prefix_caching": True},
                                       {"kind": "contiguous"}])
def test_step_time_only_timing_gets_windows_priced_through_step_time(monkeypatch, caplog, allocator):
    full_step = simulate("step", allocator=allocator)
    _wrap(TIMING_MODELS, "analytical", StepOnlyTiming, monkeypatch)
    with caplog.at_level(logging.INFO, logger="kvsim.engine"):
        minimal = simulate("fast", allocator=allocator)
    assert "derived from step_time" in caplog.text
    pd.testing.assert_frame_equal(minimal.requests, full_step.requests, check_exact=True)
    assert len(non_idle_rows(minimal)) < len(non_idle_rows(full_step)), "no decode window was taken"
    assert minimal.summary["engine_steps"] == full_step.summary["engine_steps"]
    for col in ("kv_bytes_read", "kv_pages_read", "decode_tokens", "prefill_tokens"):
        assert minimal.steps[col].sum() == full_step.steps[col].sum(), col
    assert minimal.steps["duration_s"].sum() == pytest.approx(full_step.steps["duration_s"].sum(), rel=1e-12)


def test_both_minimal_plugins_together(monkeypatch):
    full_step = simulate("step")
    _wrap(ALLOCATORS, "paged", MinimalAllocator, monkeypatch)
    _wrap(TIMING_MODELS, "analytical", StepOnlyTiming, monkeypatch)
    minimal = simulate("fast")
    pd.testing.assert_frame_equal(minimal.requests, full_step.requests, check_exact=True)


def test_default_vectorisation_is_step_time_element_by_element():
    from kvsim.timing.analytical import AnalyticalTiming
    from kvsim.timing.context import TimingContext
    from kvsim.config import Scenario

    scn = make_scenario()
    ctx = TimingContext(model=scn.model.spec(), gpu=scn.gpu.spec(), kv=scn.kv_geometry().with_block_size(16),
                        weight_bytes=scn.weight_bytes, base_dir=".")
    assert isinstance(scn, Scenario)
    native = AnalyticalTiming(AnalyticalTimingConfig(), ctx)
    pricer, is_native = decode_pricer(native)
    assert is_native and pricer is native and isinstance(native, VectorisedDecodeTiming)
    derived, is_native = decode_pricer(StepOnlyTiming(native))
    assert not is_native and isinstance(derived, StepTimeVectorisation)
    n = np.array([1, 7, 64, 3], np.int64)
    kv = np.array([10, 900, 40000, 5], np.int64)
    pages = np.array([1, 60, 2500, 1], np.int64)
    got, parts, kv_bytes = derived.decode_durations(n, kv, pages)
    want, want_parts, want_bytes = native.decode_durations(n, kv, pages)
    assert got.tolist() == want.tolist()  # bit for bit
    assert kv_bytes.tolist() == want_bytes.tolist()
    for j in range(len(n)):
        st = native.step_time(decode_shape(int(n[j]), int(kv[j]), int(pages[j])))
        assert got[j] == st.duration_s
        for name, v in st.breakdown_s.items():
            assert parts[name][j] == v
    with pytest.raises(TypeError, match="no step_time"):
        decode_pricer(object())
