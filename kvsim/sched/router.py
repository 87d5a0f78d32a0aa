"""Routing arriving requests across engine replicas (plain Python, no SimPy).

A routing policy is a plugin of the ``ROUTERS`` registry (``replicas.router: {kind: NAME}`` or the
bare name). Built-in kinds:

* ``round_robin``: replica ``i mod count`` for the i-th routed request;
* ``least_loaded``: the replica with the fewest queued + running sequences (ties: lowest index);
* ``prefix_affinity``: the replica whose prefix cache (any tier) already holds the most of the
  request's prompt; ties (e.g. no hits anywhere) go to the least loaded. No load cap: a prefix every
  request shares (a system prompt) sends them all to one replica.
* ``cache_aware``: the cache-aware policy of vLLM's router (vllm-project/router,
  ``src/policies/cache_aware.rs``; SGLang's router has the same rule): when the loads are imbalanced
  (``max - min > balance_abs_threshold`` and ``max > min * balance_rel_threshold``) the least loaded
  replica; else the replica whose routed history matches the most of the prompt if that share is
  above ``cache_threshold``, or the least loaded. The history is the router's own (the prompts it sent
  to each replica, by prefix block), not the replica's cache (docs/scenario.md, "Routers").

:class:`Router` is what the engine holds: it builds the policy from its config, answers a single
replica without asking the policy, and tells the engine whether decisions read replica state
(:attr:`Router.state_dependent`: then replicas may not run ahead of arrivals, so the state a policy
reads is the state at the request's arrival).

Writing a policy: a class with ``state_dependent: bool`` and ``route(req, replicas) -> int``
under ``@ROUTERS.policy("name")`` (:func:`kvsim.registry.declare_policy` makes its config class and
registers the kind). A policy reads replicas only through :class:`ReplicaView`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import Field

from kvsim.registry import ROUTERS, PolicyConfig

if TYPE_CHECKING:
    from kvsim.sched.request import Request

RouterKind = Literal["round_robin", "least_loaded", "prefix_affinity", "cache_aware"]
DEFAULT_ROUTER = "round_robin"


class ReplicaView(Protocol):
    """What a routing policy may read of a replica's scheduler (public methods, current at the
    arrival: the scheduler brings its running requests' progress up to date before answering)."""

    def load_seqs(self) -> int: ...

    def cached_prefix_tokens(self, req: Request) -> int: ...


def load(sched: ReplicaView) -> int:
    """Queued + running sequences of one replica (a request with n samples counts n)."""
    return sched.load_seqs()


def cached_tokens(sched: ReplicaView, req: Request) -> int:
    """Prompt tokens of ``req`` that the replica's prefix cache (any tier) already holds."""
    return sched.cached_prefix_tokens(req)


class RoutingPolicy(Protocol):
    state_dependent: bool  # does ``route`` read replica state?

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        """Index into ``replicas`` (at least two) of the replica that gets ``req``."""
        ...


@ROUTERS.policy("round_robin")
class RoundRobin:
    state_dependent = False

    def __init__(self) -> None:
        self._next = 0

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        i = self._next
        self._next = (i + 1) % len(replicas)
        return i


@ROUTERS.policy("least_loaded")
class LeastLoaded:
    state_dependent = True

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        loads = [load(s) for s in replicas]
        return min(range(len(replicas)), key=lambda i: (loads[i], i))


@ROUTERS.policy("prefix_affinity")
class PrefixAffinity:
    state_dependent = True

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        loads = [load(s) for s in replicas]
        hits = [cached_tokens(s, req) for s in replicas]
        return min(range(len(replicas)), key=lambda i: (-hits[i], loads[i], i))


# vllm-project/router's CLI defaults (src/main.rs at 811db12: --cache-threshold 0.3,
# --balance-abs-threshold 64, --balance-rel-threshold 1.5); docs/scenario.md, "Routers"
_CACHE_AWARE = {
    "cache_threshold": (float, Field(0.3, ge=0.0, le=1.0, description="prefix-match share above which the "
                                                                         "best-matching replica gets the request")),
    "balance_abs_threshold": (int, Field(64, ge=0, description="imbalanced if max - min load exceeds this ...")),
    "balance_rel_threshold": (float, Field(1.5, ge=1.0, description="... and max load exceeds min x this")),
}


@ROUTERS.policy("cache_aware", params=_CACHE_AWARE)
class CacheAware:
    """vLLM's (and SGLang's) cache-aware router: shortest queue when the loads are imbalanced, else
    the replica whose routed history holds the longest prefix of the prompt when it holds more than
    ``cache_threshold`` of it, else the least loaded. Owns its history: per replica, the prefix-block
    keys of the prompts it sent there (equal key at position k = equal prompt up to block k + 1, so a
    replica's keys are prefix-closed and the match is the last position whose key it holds)."""

    state_dependent = True

    def __init__(self, cache_threshold: float, balance_abs_threshold: int, balance_rel_threshold: float) -> None:
        self.cache_threshold = cache_threshold
        self.abs_threshold = balance_abs_threshold
        self.rel_threshold = balance_rel_threshold
        self._history: list[set[int]] = []

    def route(self, req: Request, replicas: Sequence[ReplicaView]) -> int:
        if not self._history:
            self._history = [set() for _ in replicas]
        loads = [load(s) for s in replicas]
        least = min(range(len(replicas)), key=lambda i: (loads[i], i))
        keys = req.kv.block_keys
        keys = [] if keys is None else keys.tolist()
        lo, hi = loads[least], max(loads)
        if hi - lo > self.abs_threshold and hi > lo * self.rel_threshold:
            choice = least  # imbalanced: shortest queue
        else:
            matched = [_matched_blocks(h, keys) for h in self._history]
            best = min(range(len(replicas)), key=lambda i: (-matched[i], loads[i], i))
            share = matched[best] / len(keys) if keys else 0.0
            choice = best if share > self.cache_threshold else least
        self._history[choice].update(keys)
        return choice


def _matched_blocks(history: set[int], keys: list[int]) -> int:
    """Leading blocks of ``keys`` found in ``history`` (prefix-closed: binary search on the last one)."""
    lo, hi = 0, len(keys)  # keys[:lo] are held; keys[hi:] are not
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[mid] in history:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Router:
    """The engine's router: ``policy`` is a kind name or a validated ``replicas.router`` config."""

    def __init__(self, policy: str | PolicyConfig, schedulers: list):
        cfg = ROUTERS.default_config(policy) if isinstance(policy, str) else policy
        self.kind: str = cfg.kind
        self.policy: RoutingPolicy = ROUTERS.build(cfg)
        self.schedulers = schedulers

    @property
    def state_dependent(self) -> bool:
        """Does a decision read replica state? (Then replicas may not run ahead of arrivals.)"""
        return self.policy.state_dependent and len(self.schedulers) > 1

    def route(self, req) -> int:
        if len(self.schedulers) == 1:
            return 0
        return self.policy.route(req, self.schedulers)
