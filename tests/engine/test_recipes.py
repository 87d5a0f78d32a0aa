"""docs/architecture.md "How to add X", followed from the text alone (issue 24 item 6).

One plugin of each family -- an allocator, an eviction policy, a timing backend and a victim
policy -- written in this module as the recipes say (a plugin in one's own module touches only
that module), declared or registered after ``kvsim.config`` was imported, and run from scenario
files through ``kvsim.api`` with invariant checks on. Each run is checked against what the plugin
must do: the allocator against the built-in paged allocator with 1-token pages (the same
decisions), the timing model's durations and breakdown columns, the victim policy's choices, and
the eviction policy's order on a pool of its own.
"""

from typing import Literal

import numpy as np
import pandas as pd
import pytest
from pydantic import Field

import kvsim.config  # noqa: F401  (the recipes' plugins are registered after the schema exists)
from kvsim import api
from kvsim.config_base import StrictModel
from kvsim.kv.base import Allocation, KVUsage
from kvsim.kv.eviction import EVICTION_POLICIES, BlockStats
from kvsim.registry import ALLOCATORS, TIMING_MODELS, VICTIMS


# -- an allocator: every request holds exactly the slots it asked for (no pages) ----------------
class TokenPoolConfig(StrictModel):
    kind: Literal["recipe_tokens"] = "recipe_tokens"


class TokenPool:
    block_size = None

    def __init__(self, cfg, capacity_tokens: int, bytes_per_token: int = 0):
        self.capacity_tokens = capacity_tokens
        self.held: dict[int, int] = {}
        self.written: dict[int, int] = {}
        self.final: dict[int, int] = {}

    def _free(self) -> int:
        return self.capacity_tokens - sum(self.held.values())

    def max_footprint_fits(self, req) -> bool:
        return req.final_kv_tokens * req.num_samples <= self.capacity_tokens

    def allocate(self, req, hold_tokens: int):
        if hold_tokens > self._free():
            return None
        self.held[req.request_id], self.written[req.request_id] = hold_tokens, 0
        self.final[req.request_id] = req.final_kv_tokens
        return Allocation(0)

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        grow = num_tokens - self.held[request_id]
        if grow > self._free():
            return False
        self.held[request_id] = max(self.held[request_id], num_tokens)
        self.written[request_id] = num_tokens
        return True

    def free(self, request_id: int) -> None:
        del self.held[request_id], self.written[request_id], self.final[request_id]

    def held_tokens(self, request_id: int) -> int:
        return self.held[request_id]

    def usage(self, head=None, head_hold_tokens: int = 0) -> KVUsage:
        held, written = sum(self.held.values()), sum(self.written.values())
        useful = sum(min(h, self.final[r]) for r, h in self.held.items())
        return KVUsage(capacity_tokens=self.capacity_tokens, token_states_tokens=written,
                       reservation_tokens=useful - written, internal_frag_tokens=held - useful,
                       external_frag_tokens=0, free_tokens=self.capacity_tokens - held,
                       num_requests=len(self.held), unshared_tokens=written)

    def check_invariants(self) -> None:
        assert sum(self.held.values()) <= self.capacity_tokens, "over capacity"
        assert all(self.written[r] <= h for r, h in self.held.items()), "written beyond held"


# -- a timing backend: a fixed step plus a price per token, under declared breakdown names ------
class PerTokenConfig(StrictModel):
    kind: Literal["recipe_per_token"] = "recipe_per_token"
    step_s: float = Field(0.003, gt=0)
    per_token_s: float = Field(1e-5, ge=0)


class PerTokenTiming:
    def __init__(self, cfg: PerTokenConfig, ctx):
        self.cfg, self.kv_bytes_per_token = cfg, ctx.kv_bytes_per_token

    def step_time(self, shape):
        from kvsim.timing.base import StepTiming

        compute = self.cfg.per_token_s * shape.num_tokens
        return StepTiming(duration_s=self.cfg.step_s + compute + shape.tier_load_s,
                          breakdown_s={"overhead_s": self.cfg.step_s, "compute_s": compute,
                                       "swap_s": shape.tier_load_s},
                          kv_bytes_read=shape.kv_tokens_read * self.kv_bytes_per_token)


# -- a victim policy: preempt the oldest admitted request --------------------------------------
PICKED: list[tuple[int, list[int]]] = []


class OldestAdmitted:
    def pick(self, running, allocator):
        PICKED.append((running[0].request_id, [r.admit_seq for r in running]))
        return running[0]


# -- an eviction policy: the cached block freed first goes first (FIFO by free time) -----------
class FreedFirst:
    def __init__(self, num_blocks: int):
        self.empty = list(range(num_blocks - 1, -1, -1))  # never-used, popped in id order
        self.cached: dict[int, None] = {}

    @property
    def num_free(self) -> int:
        return len(self.empty) + len(self.cached)

    def __contains__(self, block: int) -> bool:
        return block in self.cached or block in self.empty

    def pop(self) -> int:
        if self.empty:
            return self.empty.pop()
        block = next(iter(self.cached))
        del self.cached[block]
        return block

    def remove(self, block: int) -> None:
        if block in self.cached:
            del self.cached[block]
        else:
            self.empty.remove(block)

    def add(self, block: int, stats) -> None:
        if stats is None:
            self.empty.insert(0, block)
        else:
            self.cached[block] = None


@pytest.fixture(scope="module")
def recipes():
    ALLOCATORS.register("recipe_tokens", TokenPoolConfig, TokenPool)
    TIMING_MODELS.register("recipe_per_token", PerTokenConfig, PerTokenTiming)
    VICTIMS.policy("recipe_oldest")(OldestAdmitted)
    EVICTION_POLICIES.policy("recipe_freed_first")(FreedFirst)
    try:
        yield
    finally:
        for reg, kind in ((ALLOCATORS, "recipe_tokens"), (TIMING_MODELS, "recipe_per_token"),
                          (VICTIMS, "recipe_oldest"), (EVICTION_POLICIES, "recipe_freed_first")):
            reg.unregister(kind)


def write_trace(tmp_path, n=120, seed=3, prefixes=False):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 80.0, n))
    prompts, outputs = rng.integers(16, 300, n), rng.integers(1, 120, n)
    head = "arrival_s,prompt_tokens,output_tokens" + (",prefix_keys,prefix_block_tokens" if prefixes else "")
    lines = [head]
    for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs)):
        row = f"{a:.6f},{p},{o}"
        if prefixes:
            row += "," + " ".join(str(1000 * (i % 3) + k) for k in range(-(-int(p) // 16))) + ",16"
        lines.append(row)
    (tmp_path / "trace.csv").write_text("\n".join(lines) + "\n")


def scenario(tmp_path, name: str, body: str):
    f = tmp_path / f"{name}.yaml"
    # engine_profile: kvsim -- prompt blocks at admission: the recipe allocator has no WindowAllocator
    # capability, which the default profile's per-chunk prompt blocks need (docs/architecture.md)
    f.write_text("engine_profile: kvsim\ntrace: {file: trace.csv}\nmodel: OPT-13B\nkv_budget: {tokens: 1500}\n" + body)
    return f


def test_allocator_and_timing_recipes(tmp_path, recipes):
    write_trace(tmp_path)
    got = api.run(scenario(tmp_path, "mine", "allocator: {kind: recipe_tokens}\n"
                                             "timing: {kind: recipe_per_token, step_s: 0.003, per_token_s: 0.00001}\n"),
                  check_invariants=True)
    want = api.run(scenario(tmp_path, "builtin", "allocator: {kind: paged, block_size: 1, watermark: 0.0}\n"
                                                 "timing: {kind: constant, step_s: 0.003, per_token_s: 0.00001}\n"),
                   check_invariants=True)
    assert got.summary["requests_finished"] == 120 and got.summary["preemptions"] > 0  # memory was tight
    pd.testing.assert_frame_equal(got.requests, want.requests, check_exact=True)
    busy = got.steps[~got.steps["idle"]]
    tokens = (busy["prefill_tokens"] + busy["decode_tokens"]).to_numpy()
    assert busy["duration_s"].to_numpy() == pytest.approx(0.003 * busy["num_steps"].to_numpy() + 1e-5 * tokens,
                                                          rel=1e-9)
    assert busy["overhead_s"].sum() == pytest.approx(0.003 * busy["num_steps"].sum(), rel=1e-9)
    assert busy["compute_s"].sum() == pytest.approx(1e-5 * tokens.sum(), rel=1e-9)


def test_victim_policy_recipe(tmp_path, recipes):
    write_trace(tmp_path)
    PICKED.clear()
    body = "allocator: {kind: paged, block_size: 16}\ntiming: {kind: constant, step_s: 0.003}\n"
    got = api.run(scenario(tmp_path, "oldest", body + "scheduler: {victim: recipe_oldest}\n"), check_invariants=True)
    base = api.run(scenario(tmp_path, "latest", body), check_invariants=True)
    assert got.summary["requests_finished"] == 120 and got.summary["preemptions"] == len(PICKED) > 0
    assert all(admits == sorted(admits) for _, admits in PICKED)  # running is oldest first: running[0] is it
    assert not got.requests["preemptions"].equals(base.requests["preemptions"])  # a different policy chose
    assert got.scenario.scheduler.victim.model_dump() == "recipe_oldest"  # written back as its bare kind


def test_eviction_policy_recipe(tmp_path, recipes):
    pool = EVICTION_POLICIES.build(EVICTION_POLICIES.default_config("recipe_freed_first"), 4)
    assert [pool.pop() for _ in range(4)] == [0, 1, 2, 3] and pool.num_free == 0
    for b in (2, 0, 3):
        pool.add(b, BlockStats(0, 1))
    assert 0 in pool and pool.pop() == 2 and pool.pop() == 0  # freed first, evicted first
    write_trace(tmp_path, prefixes=True)
    body = ("timing: {kind: constant, step_s: 0.003}\n"
            "allocator: {kind: paged, block_size: 16, prefix_caching: true, eviction: recipe_freed_first}\n")
    got = api.run(scenario(tmp_path, "freed_first", body), check_invariants=True)
    assert got.summary["requests_finished"] == 120
    assert got.summary["prefix_cache"]["hit_ratio_tokens"] > 0 and got.steps["evictions"].sum() > 0
