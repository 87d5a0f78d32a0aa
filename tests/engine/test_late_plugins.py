"""Plugins registered AFTER ``kvsim.config`` was imported are chosen by ``kind:`` (issue 15, item 4).

The allocator and the timing model below are written from scratch against the declared protocols
only (:class:`kvsim.kv.protocol.KVAllocator`, :class:`kvsim.timing.base.TimingModel`): no kvsim
base class, ledger or helper. They are registered while the test runs, long after the scenario
schema's module was imported, then chosen from a scenario *file* run through ``kvsim.api`` in the
default engine mode. They implement the same semantics as the built-in ``paged`` allocator
(without watermark) and ``constant`` timing, so the request table must equal the built-ins' to the
bit; the memory columns are checked against the allocator's own accounting.
"""

import sys
from typing import Literal

import numpy as np
import pandas as pd
import pytest
from pydantic import Field

import kvsim.config  # noqa: F401  (the point: imported before the plugins are registered)
from kvsim import api
from kvsim.config_base import StrictModel
from kvsim.config import load_scenario
from kvsim.errors import ConfigError
from kvsim.kv.base import Allocation, KVRequest, KVUsage
from kvsim.kv.protocol import KVAllocator, WindowAllocator
from kvsim.registry import ALLOCATORS, TIMING_MODELS
from kvsim.timing.base import BatchShape, StepTiming, TimingModel, VectorisedDecodeTiming


class PageListConfig(StrictModel):
    kind: Literal["page_list"] = "page_list"
    block_size: int = Field(16, ge=1)


class PageListAllocator:
    """Pages counted per request; held = pages x block_size; no sharing, no external fragmentation."""

    def __init__(self, cfg: PageListConfig, capacity_tokens: int, bytes_per_token: int = 0):
        self.block_size = cfg.block_size
        self.num_pages = capacity_tokens // cfg.block_size
        self.capacity_tokens = self.num_pages * self.block_size
        self.free_pages = self.num_pages
        self.pages: dict[int, int] = {}
        self.written: dict[int, int] = {}
        self.final: dict[int, int] = {}

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def max_footprint_fits(self, req: KVRequest) -> bool:
        return self._pages_for(req.final_kv_tokens * req.num_samples) <= self.num_pages

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        if req.request_id in self.pages:
            raise ValueError(f"request {req.request_id} allocated twice")
        if req.num_samples != 1:
            raise ValueError("page_list: one sequence per request")
        need = self._pages_for(hold_tokens)
        if need > self.free_pages:
            return None
        self.free_pages -= need
        self.pages[req.request_id] = need
        self.written[req.request_id] = 0
        self.final[req.request_id] = req.final_kv_tokens
        return Allocation(0)

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        if num_tokens < self.written[request_id]:
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        need = self._pages_for(num_tokens) - self.pages[request_id]
        if need > self.free_pages:
            return False
        if need > 0:
            self.free_pages -= need
            self.pages[request_id] += need
        self.written[request_id] = num_tokens
        return True

    def free(self, request_id: int) -> None:
        self.free_pages += self.pages.pop(request_id)
        del self.written[request_id], self.final[request_id]

    def held_tokens(self, request_id: int) -> int:
        return self.pages[request_id] * self.block_size

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        held = sum(self.pages.values()) * self.block_size
        written = sum(self.written.values())
        useful = sum(min(p * self.block_size, self.final[r]) for r, p in self.pages.items())
        return KVUsage(capacity_tokens=self.capacity_tokens, token_states_tokens=written,
                       reservation_tokens=useful - written, internal_frag_tokens=held - useful,
                       external_frag_tokens=0, free_tokens=self.capacity_tokens - held,
                       num_requests=len(self.pages), unshared_tokens=written)

    def check_invariants(self) -> None:
        assert self.free_pages + sum(self.pages.values()) == self.num_pages, "pages lost"
        for r, p in self.pages.items():
            assert self.written[r] <= p * self.block_size, f"request {r}: written beyond its pages"


class AffineTimingConfig(StrictModel):
    kind: Literal["affine"] = "affine"
    step_s: float = Field(0.01, gt=0)
    per_token_s: float = Field(0.0, ge=0)


class AffineTiming:
    """``step_s + per_token_s x tokens`` (and the tier loads), like the built-in ``constant``."""

    def __init__(self, cfg: AffineTimingConfig, ctx):
        self.cfg = cfg
        self.kv_bytes_per_token = ctx.kv_bytes_per_token

    def step_time(self, shape: BatchShape) -> StepTiming:
        compute = self.cfg.per_token_s * shape.num_tokens
        return StepTiming(duration_s=self.cfg.step_s + compute + shape.tier_load_s,
                          breakdown_s={"overhead_s": self.cfg.step_s, "compute_s": compute,
                                       "swap_s": shape.tier_load_s},
                          kv_bytes_read=shape.kv_tokens_read * self.kv_bytes_per_token)


@pytest.fixture
def late_plugins():
    assert "kvsim.config" in sys.modules and "page_list" not in ALLOCATORS.kinds
    ALLOCATORS.register("page_list", PageListConfig, PageListAllocator)
    TIMING_MODELS.register("affine", AffineTimingConfig, AffineTiming)
    try:
        yield
    finally:
        ALLOCATORS.unregister("page_list")
        TIMING_MODELS.unregister("affine")


def write_case(tmp_path, name: str, allocator: str, timing: str):
    rng = np.random.default_rng(11)
    n = 80
    arrivals = np.cumsum(rng.exponential(1 / 40.0, n))
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    lines += [f"{a:.6f},{p},{o}" for a, p, o in zip(arrivals, rng.integers(1, 300, n), rng.integers(1, 120, n))]
    (tmp_path / "trace.csv").write_text("\n".join(lines) + "\n")
    f = tmp_path / f"{name}.yaml"
    # engine_profile kvsim: prompt blocks at admission (per_chunk needs can_allocate, which this
    # allocator leaves out on purpose: it has only the required calls)
    f.write_text(f"engine_profile: kvsim\ntrace: {{file: trace.csv}}\nmodel: OPT-13B\nkv_budget: {{tokens: 3000}}\n"
                 f"allocator: {allocator}\ntiming: {timing}\n")
    return f


def test_late_registered_allocator_and_timing_run_from_a_scenario_file(tmp_path, late_plugins):
    late = write_case(tmp_path, "late", "{kind: page_list, block_size: 16}",
                      "{kind: affine, step_s: 0.004, per_token_s: 0.00002}")
    builtin = write_case(tmp_path, "builtin", "{kind: paged, block_size: 16, watermark: 0.0}",
                         "{kind: constant, step_s: 0.004, per_token_s: 0.00002}")
    loaded = load_scenario(late)
    assert type(loaded.base.allocator) is PageListConfig and type(loaded.base.timing) is AffineTimingConfig
    assert loaded.base.engine.mode == "fast"  # the default mode
    # the plugins have the required protocol and nothing more
    alloc = PageListAllocator(loaded.base.allocator, 64)
    assert isinstance(alloc, KVAllocator) and not isinstance(alloc, WindowAllocator)
    timing = AffineTiming(loaded.base.timing, type("Ctx", (), {"kv_bytes_per_token": 1})())
    assert isinstance(timing, TimingModel) and not isinstance(timing, VectorisedDecodeTiming)

    got = api.run(late, check_invariants=True)
    want = api.run(builtin, check_invariants=True)
    assert got.summary["requests_finished"] == 80 and got.summary["preemptions"] > 0  # memory was tight
    pd.testing.assert_frame_equal(got.requests, want.requests, check_exact=True)
    assert got.summary["kv"]["block_size"] == 16
    steps = got.steps[~got.steps["idle"]]
    assert (steps["num_steps"] == 1).all()  # no decode windows: the allocator has only the required calls
    parts = ["token_states_bytes", "reservation_bytes", "internal_frag_bytes", "external_frag_bytes", "free_bytes"]
    cap = got.summary["kv"]["capacity_bytes"]
    assert (got.steps[parts].sum(axis=1) == cap).all()
    assert steps["internal_frag_bytes"].max() > 0 and steps["external_frag_bytes"].max() == 0
    assert steps["duration_s"].to_numpy() == pytest.approx(
        0.004 + 0.00002 * (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(), rel=1e-12)


def test_late_kinds_are_listed_and_gone_after_unregistering(tmp_path, late_plugins):
    typo = write_case(tmp_path, "typo", "{kind: page_lst}", "{kind: affine}")
    with pytest.raises(ConfigError, match=r"unknown allocator kind 'page_lst' \(did you mean 'page_list'\?\); "
                                          r"valid kinds: .*page_list"):
        load_scenario(typo)
    bad_key = write_case(tmp_path, "bad_key", "{kind: page_list, blok_size: 8}", "{kind: affine}")
    with pytest.raises(ConfigError, match=r"allocator.blok_size: unknown key 'blok_size' \(did you mean "
                                          r"'block_size'\?\); valid keys: block_size, kind"):
        load_scenario(bad_key)
    assert load_scenario(typo, ["timing.step_s=0.5", "allocator.kind=page_list"]).base.timing.step_s == 0.5
    ALLOCATORS.unregister("page_list")
    try:
        with pytest.raises(ConfigError, match=r"unknown allocator kind 'page_list'; valid kinds: buddy, contiguous"):
            load_scenario(typo, ["allocator.kind=page_list"])
    finally:
        ALLOCATORS.register("page_list", PageListConfig, PageListAllocator)


def test_register_checks_the_kind_field():
    class Wrong(StrictModel):
        kind: Literal["other"] = "other"

    with pytest.raises(ValueError, match="needs a field kind: Literal\\['mine'\\]"):
        ALLOCATORS.register("mine", Wrong, PageListAllocator)
    with pytest.raises(ValueError, match="registered twice"):
        ALLOCATORS.register("paged", Wrong, PageListAllocator)
    assert "mine" not in ALLOCATORS.kinds
