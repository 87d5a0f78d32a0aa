"""Routing arriving requests across engine replicas (plain Python, no SimPy).

* ``round_robin``: replica ``i mod count`` for the i-th routed request;
* ``least_loaded``: the replica with the fewest queued + running sequences (ties: lowest index);
* ``prefix_affinity``: the replica whose prefix cache (any tier) already holds the most of the
  request's prompt; ties (e.g. no hits anywhere) go to the least loaded.
"""

from __future__ import annotations

from typing import Literal

RouterKind = Literal["round_robin", "least_loaded", "prefix_affinity"]


def load(sched) -> int:
    return sched.load_seqs()


class Router:
    def __init__(self, kind: RouterKind, schedulers: list):
        self.kind = kind
        self.schedulers = schedulers
        self._next = 0

    @property
    def state_dependent(self) -> bool:
        """Does a decision read replica state? (Then replicas may not run ahead of arrivals.)"""
        return self.kind != "round_robin" and len(self.schedulers) > 1

    def route(self, req) -> int:
        n = len(self.schedulers)
        if n == 1:
            return 0
        if self.kind == "round_robin":
            i = self._next
            self._next = (i + 1) % n
            return i
        loads = [load(s) for s in self.schedulers]
        if self.kind == "least_loaded":
            return min(range(n), key=lambda i: (loads[i], i))
        if self.kind == "prefix_affinity":
            hits = [s.cached_prefix_tokens(req) for s in self.schedulers]
            return min(range(n), key=lambda i: (-hits[i], loads[i], i))
        raise ValueError(f"unknown router {self.kind!r}")
