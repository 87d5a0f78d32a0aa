"""Victim policies: which running request the scheduler preempts when KV memory runs out.

A victim policy is a plugin of the ``VICTIMS`` registry (``scheduler.victim: {kind: NAME}``, or the
bare name). Built-in kinds, each breaking ties so that the *latest admitted* request loses:

* ``latest_admitted`` (default, vLLM): the most recently admitted running request;
* ``lowest_priority``: the lowest ``priority`` (trace column);
* ``largest_kv``: the request holding the most KV slots (``allocator.held_tokens``);
* ``fewest_tokens_left``: the request with the fewest output tokens still to generate.

When it is called: only from ``Scheduler`` while it must preempt, after the lazy decode group
has been dissolved for the step, so every request's counters (``num_generated``,
``num_computed_tokens``) and the allocator's holdings are current. ``running`` is in admission
order (oldest first) and never empty. A policy must not mutate the requests or the allocator.

Writing one: a pydantic config class deriving from :class:`~kvsim.registry.PolicyConfig` with
``kind: Literal["my_policy"] = "my_policy"`` (plus any parameters), a class with
``pick(running, allocator) -> Request``, and ``VICTIMS.register("my_policy", Config, factory)``
where ``factory(cfg)`` returns the policy. Register any time before the scenario is loaded
(kinds are looked up when a scenario is validated, see :mod:`kvsim.registry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from kvsim.registry import VICTIMS, PolicyConfig

if TYPE_CHECKING:
    from kvsim.sched.request import Request


class HeldTokens(Protocol):
    """What a victim policy may ask the allocator."""

    def held_tokens(self, request_id: int) -> int: ...


class VictimPolicy(Protocol):
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        """The request to preempt among ``running`` (non-empty, oldest admitted first)."""
        ...


class LatestAdmittedConfig(PolicyConfig):
    kind: Literal["latest_admitted"] = "latest_admitted"


class LowestPriorityConfig(PolicyConfig):
    kind: Literal["lowest_priority"] = "lowest_priority"


class LargestKVConfig(PolicyConfig):
    kind: Literal["largest_kv"] = "largest_kv"


class FewestTokensLeftConfig(PolicyConfig):
    kind: Literal["fewest_tokens_left"] = "fewest_tokens_left"


class LatestAdmitted:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return running[-1]


class LowestPriority:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return min(running, key=lambda r: (r.priority, -r.admit_seq))


class LargestKV:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return max(running, key=lambda r: (allocator.held_tokens(r.request_id), r.admit_seq))


class FewestTokensLeft:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return min(running, key=lambda r: (r.output_tokens - r.num_generated, -r.admit_seq))


DEFAULT_VICTIM = "latest_admitted"

for _kind, _cfg, _policy in (
        ("latest_admitted", LatestAdmittedConfig, LatestAdmitted),
        ("lowest_priority", LowestPriorityConfig, LowestPriority),
        ("largest_kv", LargestKVConfig, LargestKV),
        ("fewest_tokens_left", FewestTokensLeftConfig, FewestTokensLeft)):
    VICTIMS.register(_kind, _cfg, lambda cfg, _p=_policy: _p())


def build_victim_policy(cfg: PolicyConfig) -> VictimPolicy:
    """The policy object for a validated ``scheduler.victim`` config."""
    return VICTIMS.build(cfg)
