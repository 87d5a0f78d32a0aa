"""The ``cache_aware`` router: vLLM's router's (and SGLang's) cache-aware policy (docs/scenario.md,
"Routers"): shortest queue when the loads are imbalanced, else the best prefix match of the router's
own history above ``cache_threshold``, else the least loaded."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from kvsim.config import Scenario
from kvsim.sched.router import CacheAware


class Replica:
    def __init__(self, load: int):
        self.load = load

    def load_seqs(self) -> int:
        return self.load

    def cached_prefix_tokens(self, req) -> int:  # never read by cache_aware (its history is its own)
        raise AssertionError("cache_aware reads the router's history, not the replica's cache")


def req(keys):
    return SimpleNamespace(kv=SimpleNamespace(block_keys=None if keys is None else np.asarray(keys, np.int64)))


def router(**kw):
    return CacheAware(**{"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5, **kw})


def test_cache_hits_follow_the_history_until_the_loads_are_imbalanced():
    r = router()
    reps = [Replica(5), Replica(0)]
    assert r.route(req([1, 2, 3, 4]), reps) == 1  # no history: least loaded
    reps[1].load = 50  # 45 more than replica 0: still balanced (not > 64)
    assert r.route(req([1, 2, 3, 9]), reps) == 1  # 3 of 4 blocks held there: 0.75 > 0.3
    reps[1].load = 80  # 75 > 64 and 80 > 5 x 1.5: imbalanced, shortest queue whatever the match
    assert r.route(req([1, 2, 3, 4]), reps) == 0
    # the imbalanced choice joins the history: replica 0 now holds the chain as well; ties -> less loaded
    reps[0].load, reps[1].load = 20, 21
    assert r.route(req([1, 2, 3, 4, 5]), reps) == 0


def test_both_thresholds_must_be_crossed_for_imbalance():
    r = router()
    reps = [Replica(0), Replica(0)]
    r.route(req([7, 8]), reps)  # -> 0
    reps[0].load, reps[1].load = 300, 230  # 70 > 64 but 300 < 230 x 1.5: balanced, the match wins
    assert r.route(req([7, 8]), reps) == 0


def test_a_small_match_or_no_keys_go_to_the_least_loaded():
    r = router()
    reps = [Replica(0), Replica(3)]
    r.route(req(list(range(10))), reps)  # -> 0
    reps[0].load = 4
    assert r.route(req([0, 1, 2] + list(range(100, 107))), reps) == 1  # 3 of 10 = 0.3: not above
    assert r.route(req(list(range(4))), reps) == 0  # 4 of 4 held by replica 0
    assert r.route(req(None), reps) == 1  # a trace without prefix keys: least loaded
    assert router(cache_threshold=0.2).route(req([0, 1, 2] + list(range(200, 207))), reps) == 1  # fresh history


def _chat_run(router_kind, mode="fast"):
    from kvsim.simulate import run

    chat = {"preset": "sharegpt", "num_requests": 400, "seed": 1, "prefix_block_tokens": 16,
            "arrival": {"process": "poisson", "rate_per_s": 40.0},
            "system_prompt": {"tokens": 512, "fraction": 1.0}}
    scn = Scenario.model_validate({"model": "Llama-3.1-8B", "gpu": "A100-80GB", "engine": {"mode": mode},
                                   "trace": {"synthetic": chat}, "replicas": {"count": 4, "router": router_kind}})
    return run(scn)


def test_a_shared_system_prompt_no_longer_sends_everything_to_one_replica():
    """QA (twenty-ninth session): prefix_affinity sent all 1,500 requests of such a trace to one of four
    replicas (TTFT p50 30.7 s, least_loaded 0.07 s); a real cache-aware router caps the imbalance."""
    pa = _chat_run("prefix_affinity").summary["replicas"]["requests"]
    ca = _chat_run("cache_aware")
    per = ca.summary["replicas"]["requests"]
    assert max(pa) == 400  # the documented rule: the shared prefix always wins
    assert sum(per) == 400 and min(per) > 0 and max(per) < 400
    assert ca.summary["prefix_cache"]["hit_ratio_tokens"] > 0


def test_fast_and_step_agree_under_cache_aware_routing():
    fast, step = _chat_run("cache_aware"), _chat_run("cache_aware", mode="step")
    pd.testing.assert_frame_equal(fast.requests, step.requests, check_exact=True)


@pytest.mark.parametrize("bad, key", [({"cache_threshold": 1.5}, "cache_threshold"),
                                      ({"balance_rel_threshold": 0.5}, "balance_rel_threshold"),
                                      ({"balance_abs_threshold": -1}, "balance_abs_threshold")])
def test_bad_thresholds_are_refused(bad, key):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=key):
        Scenario.model_validate({"model": "Llama-3.1-8B", "trace": {"file": "t.csv"},
                                 "replicas": {"count": 2, "router": {"kind": "cache_aware", **bad}}})
