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

Writing one: a class with ``pick(running, allocator) -> Request`` under
``@VICTIMS.policy("my_policy")`` (:func:`kvsim.registry.declare_policy`: it makes the config class,
``MyPolicy.Config``, and registers the kind; ``params={...}`` adds parameters, passed to the class
by name). Declare it any time before the scenario is loaded (kinds are looked up when a scenario
is validated, see :mod:`kvsim.registry`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

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


@VICTIMS.policy("latest_admitted")
class LatestAdmitted:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return running[-1]


@VICTIMS.policy("lowest_priority")
class LowestPriority:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return min(running, key=lambda r: (r.priority, -r.admit_seq))


@VICTIMS.policy("largest_kv")
class LargestKV:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return max(running, key=lambda r: (allocator.held_tokens(r.request_id), r.admit_seq))


@VICTIMS.policy("fewest_tokens_left")
class FewestTokensLeft:
    def pick(self, running: Sequence[Request], allocator: HeldTokens) -> Request:
        return min(running, key=lambda r: (r.output_tokens - r.num_generated, -r.admit_seq))


DEFAULT_VICTIM = "latest_admitted"


def build_victim_policy(cfg: PolicyConfig) -> VictimPolicy:
    """The policy object for a validated ``scheduler.victim`` config."""
    return VICTIMS.build(cfg)
