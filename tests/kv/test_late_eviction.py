"""Eviction policies registered AFTER ``kvsim.config`` was imported are chosen by ``kind:`` (issue 15,
item 4), and the declared :class:`kvsim.kv.protocol.EvictionPolicy` is all a policy needs.

The two policies below are written from scratch against the protocol only (no kvsim pool class,
queue or heap): ``list_lru`` is vLLM's free-block queue (the built-in ``lru``) over an ordered
dict, ``scan_lru_k`` the built-in ``lru-k`` as a linear scan, using the optional
``history_depth`` capability. Registered while the test runs, they are chosen from a scenario
*file* run through ``kvsim.api`` in the default engine mode with prefix caching and invariant
checks on; their request and step tables must equal the built-ins' bit for bit (and the built-ins
differ from each other on this trace, so the comparison can tell the policies apart).
"""

import sys
from collections import OrderedDict, deque
from typing import Literal

import numpy as np
import pandas as pd
import pytest
from pydantic import Field

import kvsim.config  # noqa: F401  (the point: imported before the policies are registered)
from kvsim import api
from kvsim.config import load_scenario
from kvsim.config_base import StrictModel
from kvsim.errors import ConfigError
from kvsim.kv.eviction import EVICTION_POLICIES
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.protocol import (AccessHistoryDepth, EvictionPolicy, ReuseOrder, SelfCheckingPool,
                               eviction_capabilities)

CREATED: list = []  # every pool the factories built, to look at after a run


class ListLRUConfig(StrictModel):
    kind: Literal["list_lru"] = "list_lru"


class ListLRU:
    """The required members and one capability, FrontReuse (``add_front_many``: blocks without cached
    content go to the front, as in vLLM's free queue). Never-used blocks first in id order; pop the
    front; a freed cached block goes to the back. Counts its calls, and the pops that evicted cached
    content."""

    def __init__(self, cfg, num_blocks: int):
        self.queue: OrderedDict[int, bool] = OrderedDict((b, False) for b in range(num_blocks))
        self.pops = self.adds = self.removes = self.cached_pops = 0
        CREATED.append(self)

    @property
    def num_free(self) -> int:
        return len(self.queue)

    def __contains__(self, block: int) -> bool:
        return block in self.queue

    def pop(self) -> int:
        block, cached = self.queue.popitem(last=False)
        self.pops += 1
        self.cached_pops += cached
        return block

    def remove(self, block: int) -> None:
        del self.queue[block]
        self.removes += 1

    def add(self, block: int, stats) -> None:
        assert block not in self.queue, f"block {block} added twice"
        self.queue[block] = stats is not None
        self.adds += 1

    def add_front_many(self, blocks) -> None:
        for block in reversed(blocks):
            assert block not in self.queue, f"block {block} added twice"
            self.queue[block] = False
            self.queue.move_to_end(block, last=False)
            self.adds += 1


class ScanLRUKConfig(StrictModel):
    kind: Literal["scan_lru_k"] = "scan_lru_k"
    k: int = Field(2, ge=1)


class ScanLRUK:
    """Uncached free blocks first (FIFO), then the cached one whose K-th most recent access is
    oldest (fewer than K accesses: first), ties by last access, then block id. Declares the
    ``history_depth`` and ``check_invariants`` capabilities."""

    def __init__(self, cfg: ScanLRUKConfig, num_blocks: int):
        self.history_depth = cfg.k
        self.empty: deque[int] = deque(range(num_blocks))
        self.cached: dict[int, tuple] = {}  # block -> score
        self.pops = self.cached_pops = self.checks = 0
        self.max_history = 0
        CREATED.append(self)

    @property
    def num_free(self) -> int:
        return len(self.empty) + len(self.cached)

    def __contains__(self, block: int) -> bool:
        return block in self.cached or block in self.empty

    def pop(self) -> int:
        self.pops += 1
        if self.empty:
            return self.empty.popleft()
        block = min(self.cached, key=lambda b: (self.cached[b], b))
        del self.cached[block]
        self.cached_pops += 1
        return block

    def remove(self, block: int) -> None:
        if block in self.cached:
            del self.cached[block]
        else:
            self.empty.remove(block)

    def add(self, block: int, stats) -> None:
        if stats is None:
            self.empty.append(block)
            return
        self.max_history = max(self.max_history, len(stats.history))
        kth = stats.history[0] if len(stats.history) >= self.history_depth else float("-inf")
        self.cached[block] = (kth, stats.last_access)

    def check_invariants(self) -> None:
        self.checks += 1
        assert not (set(self.empty) & set(self.cached)), "a block is both uncached-free and cached-free"
        assert len(set(self.empty)) == len(self.empty), "an uncached free block listed twice"


@pytest.fixture
def late_policies():
    assert "kvsim.config" in sys.modules and "list_lru" not in EVICTION_POLICIES.kinds
    EVICTION_POLICIES.register("list_lru", ListLRUConfig, ListLRU)
    EVICTION_POLICIES.register("scan_lru_k", ScanLRUKConfig, ScanLRUK)
    CREATED.clear()
    try:
        yield
    finally:
        EVICTION_POLICIES.unregister("list_lru")
        EVICTION_POLICIES.unregister("scan_lru_k")
        CREATED.clear()


def write_trace(tmp_path, n=240, seed=6):
    """Four families of requests sharing chained prefix keys (16-token blocks), arriving fast."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 40.0, n))
    prompts, outputs = rng.integers(32, 400, n), rng.integers(1, 120, n)
    lines = ["arrival_s,prompt_tokens,output_tokens,prefix_keys,prefix_block_tokens"]
    for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs)):
        fam = i % 4
        keys = [1000 * fam + k for k in range(-(-int(p) // 16))]
        if int(p) % 16 and i % 3 == 0:  # some requests end in a private partial block
            keys[-1] = 10**6 + i
        lines.append(f"{a:.6f},{p},{o},{' '.join(map(str, keys))},16")
    (tmp_path / "trace.csv").write_text("\n".join(lines) + "\n")


def write_scenario(tmp_path, name: str, eviction: str, variants: str = "") -> object:
    f = tmp_path / f"{name}.yaml"
    f.write_text("trace: {file: trace.csv}\nmodel: OPT-13B\nkv_budget: {tokens: 4000}\n"
                 "timing: {kind: constant, step_s: 0.004, per_token_s: 0.00002}\n"
                 f"allocator: {{kind: paged, block_size: 16, prefix_caching: true, eviction: {eviction}}}\n"
                 + variants)
    return f


def test_late_eviction_policies_run_from_a_scenario_file(tmp_path, late_policies):
    write_trace(tmp_path)
    scn = write_scenario(tmp_path, "late", "lru", variants=(
        "variants:\n"
        "  builtin-lru: {allocator.eviction: lru}\n"
        "  late-lru: {allocator.eviction: list_lru}\n"           # the bare-kind shorthand
        "  builtin-lru-3: {allocator.eviction: {kind: lru-k, k: 3}}\n"
        "  late-lru-3: {allocator.eviction: {kind: scan_lru_k, k: 3}}\n"))
    loaded = load_scenario(scn)
    assert type(loaded.variants["late-lru"].allocator.eviction) is ListLRUConfig
    assert loaded.variants["late-lru-3"].allocator.eviction == ScanLRUKConfig(k=3)
    assert loaded.base.engine.mode == "fast"  # the default mode

    res = api.run(scn, check_invariants=True)

    lru, late_lru = res["builtin-lru"], res["late-lru"]
    lru3, late_lru3 = res["builtin-lru-3"], res["late-lru-3"]
    for r in res.values():
        assert r.summary["requests_finished"] == 240
        assert r.summary["prefix_cache"]["evictions"] > 100 and r.summary["prefix_cache"]["hit_ratio_tokens"] > 0.1
    # the two built-ins differ here, so equal tables below mean the late policy chose the same blocks
    assert lru.summary["prefix_cache"]["evictions"] != lru3.summary["prefix_cache"]["evictions"]
    for want, got in ((lru, late_lru), (lru3, late_lru3)):
        pd.testing.assert_frame_equal(got.requests, want.requests, check_exact=True)
        pd.testing.assert_frame_equal(got.steps.drop(columns="wall_s", errors="ignore"),
                                      want.steps.drop(columns="wall_s", errors="ignore"), check_exact=True)

    # the late policies were the ones the allocator called
    list_pools = [p for p in CREATED if isinstance(p, ListLRU)]
    scan_pools = [p for p in CREATED if isinstance(p, ScanLRUK)]
    assert len(list_pools) == 1 and len(scan_pools) == 1
    lp, sp = list_pools[0], scan_pools[0]
    assert lp.cached_pops == late_lru.summary["prefix_cache"]["evictions"]
    assert lp.pops > lp.cached_pops and lp.adds > 0 and lp.removes > 0  # prefix hits took free cached blocks
    assert sp.cached_pops == late_lru3.summary["prefix_cache"]["evictions"]
    assert sp.max_history == 3  # BlockStats kept the depth the policy declared
    assert sp.checks > 0  # its optional check_invariants ran with the allocator's


def test_capabilities_are_checked_once_at_construction(late_policies):
    lp = ListLRU(ListLRUConfig(), 8)
    assert isinstance(lp, EvictionPolicy)
    assert not isinstance(lp, (AccessHistoryDepth, SelfCheckingPool, ReuseOrder))
    caps = eviction_capabilities(lp)
    assert (caps.history_depth, caps.self_check, caps.reuse_order) == (1, False, False)
    caps = eviction_capabilities(ScanLRUK(ScanLRUKConfig(k=4), 8))
    assert (caps.history_depth, caps.self_check, caps.reuse_order) == (4, True, False)

    alloc = PagedAllocator(8, 16, prefix_caching=True, eviction=ListLRUConfig())
    assert alloc.blocks.caps.history_depth == 1
    alloc.check_invariants()  # runs without the pool's own check
    with pytest.raises(TypeError, match="cannot list its reuse order"):
        alloc.free_block_order()
    with pytest.raises(TypeError, match="no LRU free queue"):
        alloc.free_queue
    builtin = PagedAllocator(8, 16, prefix_caching=True)
    assert builtin.free_block_order() == list(range(8))
    assert builtin.blocks.caps.self_check and builtin.blocks.caps.reuse_order


def test_an_object_that_is_not_a_policy_is_refused_when_built():
    class NoAdd:
        num_free = 4

        def __contains__(self, block):
            return False

        def pop(self):
            return 0

        def remove(self, block):
            pass

    class NoAddConfig(StrictModel):
        kind: Literal["no_add"] = "no_add"

    class BadDepth(ListLRU):
        history_depth = 0

    class BadDepthConfig(StrictModel):
        kind: Literal["bad_depth"] = "bad_depth"

    class ShortConfig(StrictModel):
        kind: Literal["short"] = "short"

    with pytest.raises(TypeError, match="NoAdd is not an eviction policy: missing add"):
        eviction_capabilities(NoAdd())
    EVICTION_POLICIES.register("no_add", NoAddConfig, lambda cfg, n: NoAdd())
    EVICTION_POLICIES.register("bad_depth", BadDepthConfig, BadDepth)
    EVICTION_POLICIES.register("short", ShortConfig, lambda cfg, n: ListLRU(cfg, n - 1))
    try:
        with pytest.raises(TypeError, match="missing add"):
            PagedAllocator(4, 16, prefix_caching=True, eviction=NoAddConfig())
        with pytest.raises(TypeError, match="history_depth must be an int >= 1, got 0"):
            PagedAllocator(4, 16, prefix_caching=True, eviction=BadDepthConfig())
        with pytest.raises(ValueError, match="must hold all 5 blocks, it holds 4"):
            PagedAllocator(5, 16, prefix_caching=True, eviction=ShortConfig())
    finally:
        for kind in ("no_add", "bad_depth", "short"):
            EVICTION_POLICIES.unregister(kind)
        CREATED.clear()


def test_late_kinds_are_listed_and_gone_after_unregistering(tmp_path, late_policies):
    write_trace(tmp_path, n=8)
    typo = write_scenario(tmp_path, "typo", "lst_lru")
    with pytest.raises(ConfigError, match=r"allocator.eviction: unknown eviction kind 'lst_lru' \(did you mean "
                                          r"'list_lru'\?\); valid kinds: fifo, lfu, list_lru, lru, lru-k, priority, "
                                          r"scan_lru_k"):
        load_scenario(typo)
    bad_key = write_scenario(tmp_path, "bad_key", "{kind: scan_lru_k, kk: 3}")
    with pytest.raises(ConfigError, match=r"allocator.eviction.kk: unknown key 'kk' \(did you mean 'k'\?\); "
                                          r"valid keys: k, kind"):
        load_scenario(bad_key)
    # --set on the shorthand expands it; a parameter of the late kind is set like a built-in's
    got = load_scenario(write_scenario(tmp_path, "short", "scan_lru_k"), ["allocator.eviction.k=5"])
    assert got.base.allocator.eviction == ScanLRUKConfig(k=5)
    EVICTION_POLICIES.unregister("list_lru")
    try:
        with pytest.raises(ConfigError, match=r"unknown eviction kind 'list_lru'; valid kinds: fifo, lfu, lru, "
                                              r"lru-k, priority, scan_lru_k$"):
            load_scenario(write_scenario(tmp_path, "gone", "list_lru"))
    finally:
        EVICTION_POLICIES.register("list_lru", ListLRUConfig, ListLRU)


@pytest.mark.parametrize("bare,mapping", [
    ("lfu", {"kind": "lfu"}),
    ("lru-k", {"kind": "lru-k", "k": 2}),
])
def test_bare_eviction_kind_is_shorthand_and_written_back_as_a_mapping(bare, mapping):
    from kvsim.config import validate_scenario
    from kvsim.config.resolved import config_hash, resolved_dict

    def scn(eviction):
        return validate_scenario({"trace": {"file": "unused.csv"}, "model": "OPT-13B",
                                  "allocator": {"kind": "paged", "prefix_caching": True, "eviction": eviction}},
                                 "s.yaml")

    a, b = scn(bare), scn(mapping)
    assert a == b and config_hash(a) == config_hash(b)
    # written back as a mapping, as before the shorthand existed: earlier results keep their hashes
    assert resolved_dict(a)["allocator"]["eviction"] == mapping
    radix = validate_scenario({"trace": {"file": "unused.csv"}, "model": "OPT-13B",
                               "allocator": {"kind": "radix", "eviction": "lru"}}, "s.yaml")
    assert resolved_dict(radix)["allocator"]["eviction"] == {"kind": "lru"}
    lfu = validate_scenario({"trace": {"file": "unused.csv"}, "model": "OPT-13B",
                             "allocator": {"kind": "radix", "eviction": "lfu"}}, "s.yaml")
    assert resolved_dict(lfu)["allocator"]["eviction"] == {"kind": "lfu"}  # the radix tree takes any scored kind
    with pytest.raises(ConfigError, match=r"^s.yaml: allocator.eviction: .*valid kinds: fifo, lfu, lru, lru-k"):
        validate_scenario({"trace": {"file": "unused.csv"}, "model": "OPT-13B",
                           "allocator": {"kind": "radix", "eviction": "nope"}}, "s.yaml")


def test_variants_and_set_merge_into_the_shorthand(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("trace: {file: unused.csv}\nmodel: OPT-13B\n"
                 "allocator: {kind: paged, prefix_caching: true, eviction: lru-k}\n"
                 "variants:\n  deeper: {allocator: {eviction: {k: 4}}}\n  fifo: {allocator.eviction: fifo}\n"
                 "  lfu: {allocator: {eviction: {kind: lfu}}}\n")
    loaded = load_scenario(f)
    got = {n: s.allocator.eviction.model_dump() for n, s in loaded.variants.items()}
    assert got == {"deeper": {"kind": "lru-k", "k": 4}, "fifo": {"kind": "fifo"}, "lfu": {"kind": "lfu"}}
    # --set applies after the variants: another kind replaces the shorthand, a parameter extends it
    f.write_text("trace: {file: unused.csv}\nmodel: OPT-13B\n"
                 "allocator: {kind: paged, prefix_caching: true, eviction: lru-k}\n")
    assert load_scenario(f, ["allocator.eviction.kind=priority"]).base.allocator.eviction.kind == "priority"
    assert load_scenario(f, ["allocator.eviction.k=6"]).base.allocator.eviction.model_dump() == {"kind": "lru-k",
                                                                                                "k": 6}


def test_a_parameter_without_its_kind_names_the_kinds_that_have_it(tmp_path):
    """``eviction: {k: 2}`` has no kind, so the default (lru) applies, which has no ``k``: the
    error says which kind has it; an unknown key keeps the plain unknown-key error."""
    write_trace(tmp_path, n=8)
    with pytest.raises(ConfigError, match=r"^[^\n]*allocator.eviction: no kind given, and the default kind 'lru' "
                                          r"has no parameter 'k'; add kind: lru-k$"):
        load_scenario(write_scenario(tmp_path, "no_kind", "{k: 2}"))
    with pytest.raises(ConfigError, match=r"allocator.eviction.zz: unknown key 'zz'; valid keys: kind$"):
        load_scenario(write_scenario(tmp_path, "unknown", "{zz: 2}"))
