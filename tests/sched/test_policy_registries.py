"""Victim, router and reservation policies are registry plugins chosen by ``kind:``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import pandas as pd
import pytest

from helpers import make_scenario, make_trace
from kvsim.config import load_scenario, validate_scenario
from kvsim.errors import ConfigError
from kvsim.kv.base import KVRequest
from kvsim.kv.reservation import (MaxReservation, Pow2ReservationConfig, reservation_policy,
                                  reservation_tokens)
from kvsim.registry import RESERVATIONS, ROUTERS, VICTIMS, PolicyConfig, Registry
from kvsim.sched.router import Router
from kvsim.sched.victim import build_victim_policy
from kvsim.config.resolved import config_hash, resolved_dict
from kvsim.simulate import run

BASE = {"trace": {"file": "unused.csv"}, "model": "OPT-13B"}


def scn(**over):
    return validate_scenario({**BASE, **over}, "s.yaml")


def test_each_family_lists_its_kinds():
    assert VICTIMS.kinds == ["fewest_tokens_left", "largest_kv", "latest_admitted", "lowest_priority"]
    assert ROUTERS.kinds == ["cache_aware", "least_loaded", "prefix_affinity", "round_robin"]
    assert RESERVATIONS.kinds == ["max", "oracle", "pow2"]


@pytest.mark.parametrize("bare,mapping", [
    ({"scheduler": {"victim": "largest_kv"}}, {"scheduler": {"victim": {"kind": "largest_kv"}}}),
    ({"replicas": {"router": "least_loaded"}}, {"replicas": {"router": {"kind": "least_loaded"}}}),
    ({"allocator": {"kind": "contiguous", "reservation": "pow2"}},
     {"allocator": {"kind": "contiguous", "reservation": {"kind": "pow2"}}}),
])
def test_bare_kind_is_shorthand_and_is_written_back_bare(bare, mapping):
    a, b = scn(**bare), scn(**mapping)
    assert a == b
    assert resolved_dict(a) == resolved_dict(b)
    assert config_hash(a) == config_hash(b)
    (section, inner), = bare.items()
    key = next(k for k in inner if k != "kind")
    assert resolved_dict(a)[section][key] == inner[key]  # the old scenarios' resolved form


def test_defaults_resolve_to_the_old_strings():
    d = resolved_dict(scn())
    assert d["scheduler"]["victim"] == "latest_admitted"
    assert d["replicas"]["router"] == "round_robin"
    assert resolved_dict(scn(allocator={"kind": "buddy"}))["allocator"]["reservation"] == "oracle"
    assert resolved_dict(scn(allocator={"kind": "contiguous"}))["allocator"]["reservation"] == "max"


@pytest.mark.parametrize("over,expect", [
    ({"scheduler": {"victim": "largst_kv"}},
     "s.yaml: scheduler.victim: unknown victim kind 'largst_kv' (did you mean 'largest_kv'?); valid kinds: "
     "fewest_tokens_left, largest_kv, latest_admitted, lowest_priority"),
    ({"replicas": {"router": {"kind": "random"}}},
     "s.yaml: replicas.router: unknown router kind 'random'; valid kinds: cache_aware, least_loaded, prefix_affinity, round_robin"),
    ({"allocator": {"kind": "contiguous", "reservation": "pow3"}},
     "s.yaml: allocator.reservation: unknown reservation kind 'pow3' (did you mean 'pow2'?); valid kinds: "
     "max, oracle, pow2"),
    ({"scheduler": {"victim": 7}},
     "s.yaml: scheduler.victim: expected a victim kind name or a mapping with 'kind' (got 7); valid kinds: "
     "fewest_tokens_left, largest_kv, latest_admitted, lowest_priority"),
    ({"scheduler": {"victim": {"kind": "largest_kv", "k": 2}}},
     "s.yaml: scheduler.victim.k: unknown key 'k'; valid keys: kind"),
    ({"allocator": {"kind": "buddy", "block_size": 32, "min_block_tokens": 16}},
     "s.yaml: allocator.min_block_tokens: 'min_block_tokens' is a deprecated name of 'block_size', which is "
     "also given; keep only 'block_size'"),
])
def test_bad_policy_configs_are_one_line_errors(over, expect):
    with pytest.raises(ConfigError) as e:
        scn(**over)
    assert str(e.value) == expect


def test_registry_build_of_unknown_kind_lists_the_kinds():
    with pytest.raises(ConfigError, match="unknown reservation kind 'pow3'.*valid kinds: max, oracle, pow2"):
        reservation_tokens("pow3", KVRequest(0, 10, 5, 100))
    with pytest.raises(ConfigError, match="unknown router kind 'rr'; valid kinds"):
        Router("rr", [object(), object()])
    with pytest.raises(ValueError, match="registered twice"):
        VICTIMS.register("largest_kv", object, object)


# -- victim policies -----------------------------------------------------------------------------

def _req(rid, admit_seq, priority=0, left=10):
    return SimpleNamespace(request_id=rid, admit_seq=admit_seq, priority=priority, output_tokens=left + 3,
                           num_generated=3)


class _Held:
    def __init__(self, held):
        self.held = held

    def held_tokens(self, rid):
        return self.held[rid]


@pytest.mark.parametrize("kind,expect", [
    ("latest_admitted", 3),
    ("lowest_priority", 2),      # priorities 0, 0, 1: the later of the two 0s loses
    ("largest_kv", 1),           # holds 40
    ("fewest_tokens_left", 2),   # 5 left, tied with request 1: the later one loses
])
def test_victim_policies_choose_and_break_ties_by_latest_admission(kind, expect):
    running = [_req(1, 10, priority=0, left=5), _req(2, 11, priority=0, left=5), _req(3, 12, priority=1, left=9)]
    held = _Held({1: 40, 2: 8, 3: 8})
    policy = build_victim_policy(VICTIMS.default_config(kind))
    assert policy.pick(running, held).request_id == expect
    if kind == "largest_kv":  # equal holdings: the latest admitted loses
        assert policy.pick(running, _Held({1: 8, 2: 8, 3: 8})).request_id == 3


def test_the_scheduler_preempts_through_the_victim_plugin():
    # 64 KV tokens, 4-token blocks: five requests growing together must preempt.
    trace = make_trace([(0.0, 8, 30), (0.0, 8, 20), (0.0, 8, 25), (0.0, 12, 10), (0.05, 4, 28)])
    tables = {}
    for kind in ("latest_admitted", "largest_kv", "fewest_tokens_left"):
        for form in (kind, {"kind": kind}):
            r = run(make_scenario(scheduler={"victim": form}), trace=trace)
            tables.setdefault(kind, []).append(r.requests)
        pd.testing.assert_frame_equal(*tables[kind], check_exact=True)  # shorthand == mapping
        assert tables[kind][0]["preemptions"].sum() > 0
    firsts = [t[0] for t in tables.values()]
    assert not all(firsts[0].equals(t) for t in firsts[1:])  # the policy is really consulted


# -- routers -------------------------------------------------------------------------------------

class _Replica:
    def __init__(self, running, waiting=(), cached=0):
        self.waiting = [SimpleNamespace(num_samples=n) for n in waiting]
        self.swapped = []
        self._running = running
        self._cached = cached

    def load_seqs(self):  # running + waiting + swapped sequences, as Scheduler.load_seqs
        return self._running + sum(r.num_samples for r in self.waiting) + sum(r.num_samples for r in self.swapped)

    def cached_prefix_tokens(self, req):
        return self._cached


def test_routers():
    reps = [_Replica(3, (1,), cached=0), _Replica(1, (2,), cached=64), _Replica(2, (), cached=64)]
    rr = Router("round_robin", reps)
    assert [rr.route(None) for _ in range(4)] == [0, 1, 2, 0] and not rr.state_dependent
    ll = Router(ROUTERS.default_config("least_loaded"), reps)
    assert ll.route(None) == 2 and ll.state_dependent  # loads 4, 3, 2
    pa = Router("prefix_affinity", reps)
    assert pa.route(None) == 2  # most cached (tie 1/2), then least loaded
    single = Router("least_loaded", reps[:1])
    assert single.route(None) == 0 and not single.state_dependent


# -- reservations --------------------------------------------------------------------------------

def test_reservation_accepts_names_configs_and_policy_objects():
    req = KVRequest(0, 100, 29, 2048, num_samples=2)
    assert reservation_tokens("pow2", req) == reservation_tokens(reservation_policy(Pow2ReservationConfig()), req) \
        == 2 * 256
    assert reservation_tokens(MaxReservation(), req) == reservation_tokens("max", req) == 2 * 2048
    assert reservation_tokens("oracle", req) == 2 * 129
    policy = reservation_policy("oracle")
    assert reservation_policy(policy) is policy


class HalfReservationConfig(PolicyConfig):
    kind: Literal["half"] = "half"


def test_a_new_reservation_kind_plugs_into_a_registry():
    reg = Registry("reservation")

    class Half:
        def sequence_tokens(self, total, max_len):
            return max(total, max_len // 2)

    with pytest.raises(ValueError, match=r"Pow2ReservationConfig needs a field kind: Literal\['half'\]"):
        reg.register("half", Pow2ReservationConfig, lambda cfg: Half())  # its kind is 'pow2'
    reg.register("half", HalfReservationConfig, lambda cfg: Half())
    assert type(reg.validate({"kind": "half"})) is HalfReservationConfig
    assert reservation_tokens(reg.build(SimpleNamespace(kind="half")), KVRequest(0, 10, 5, 100)) == 50


# -- block_size is the page-size key; old keys are deprecated aliases ----------------------------

@pytest.mark.parametrize("old,new", [
    ({"kind": "buddy", "min_block_tokens": 32}, {"kind": "buddy", "block_size": 32}),
    ({"kind": "radix", "page_size": 4}, {"kind": "radix", "block_size": 4}),
])
def test_old_page_size_keys_still_validate(old, new):
    a, b = scn(allocator=old), scn(allocator=new)
    assert a == b and a.allocator.block_size == new["block_size"]
    assert "block_size" in resolved_dict(a)["allocator"]


def test_set_and_variants_work_on_the_shorthand(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("trace: {file: unused.csv}\nmodel: OPT-13B\nscheduler: {victim: lowest_priority}\n"
                 "variants:\n  a: {scheduler: {victim: {kind: largest_kv}}}\n  b: {scheduler.victim: fewest_tokens_left}\n")
    loaded = load_scenario(f)
    assert [s.scheduler.victim.kind for s in loaded.variants.values()] == ["largest_kv", "fewest_tokens_left"]
    loaded = load_scenario(f, ["scheduler.victim.kind=latest_admitted"])
    assert {s.scheduler.victim.kind for s in loaded.runs.values()} == {"latest_admitted"}


class Scaled:
    """A reservation of ``factor`` x the request (a parameter passed by name)."""

    def __init__(self, factor: int):
        self.factor = factor

    def sequence_tokens(self, total_tokens: int, max_model_len_tokens: int) -> int:
        return total_tokens * self.factor


def test_declare_policy_makes_the_config_class_and_registers_the_kind():
    import pickle

    from pydantic import Field

    from kvsim.kv.eviction import LRUKEvictionConfig, lru_k_pool
    from kvsim.registry import declare_policy
    from kvsim.sched.victim import LargestKV

    reg = Registry("reservation")
    cfg_cls = declare_policy(reg, "scaled", Scaled, params={"factor": (int, Field(2, ge=1))})
    assert Scaled.Config is cfg_cls and cfg_cls.__name__ == "ScaledConfig" and reg.kinds == ["scaled"]
    cfg = reg.validate({"kind": "scaled", "factor": 3})
    assert type(cfg) is cfg_cls and reg.build(cfg).sequence_tokens(10, 100) == 30
    assert cfg.model_dump() == {"kind": "scaled", "factor": 3}  # a kind with parameters: a mapping
    assert reg.default_config("scaled").factor == 2
    with pytest.raises(Exception, match="factor"):
        reg.validate({"kind": "scaled", "factor": 0})
    # a kind without parameters is written back as its bare name; every config pickles (sweeps)
    assert LargestKV.Config().model_dump() == "largest_kv" and VICTIMS.config_class("largest_kv") is LargestKV.Config
    for c in (cfg, LargestKV.Config(), LRUKEvictionConfig(k=3)):
        assert pickle.loads(pickle.dumps(c)) == c
    assert LRUKEvictionConfig is lru_k_pool.Config and LRUKEvictionConfig().model_dump() == {"kind": "lru-k", "k": 2}
