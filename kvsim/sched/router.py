"""Routing arriving requests across engine replicas (plain Python, no SimPy).

A routing policy is a plugin of the ``ROUTERS`` registry (``replicas.router: {kind: NAME}`` or the
bare name). Built-in kinds:

* ``round_robin``: replica ``i mod count`` for the i-th routed request;
* ``least_loaded``: the replica with the fewest queued + running sequences (ties: lowest index);
* ``prefix_affinity``: the replica whose prefix cache (any tier) already holds the most of the
  request's prompt; ties (e.g. no hits anywhere) go to the least loaded.

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

from kvsim.registry import ROUTERS, PolicyConfig

if TYPE_CHECKING:
    from kvsim.sched.request import Request

RouterKind = Literal["round_robin", "least_loaded", "prefix_affinity"]
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
