"""Up-front reservation sizes of the Orca baselines (vLLM paper, section 6.2).

A reservation policy is a plugin of the ``RESERVATIONS`` registry, chosen by the ``reservation:``
key of the contiguous and buddy allocators (``reservation: pow2`` or ``reservation: {kind: pow2}``):

* ``max``: the model's maximum sequence length, whatever the request needs;
* ``pow2``: prompt + true output length rounded up to a power of two (capped at the max length);
* ``oracle``: exactly prompt + true output length -- an upper bound no real system reaches.

Every policy reserves at least prompt + output tokens for one sequence, and a request with n
parallel samples reserves n unshared copies (:func:`reservation_tokens`). Writing one: a class
with ``sequence_tokens(total_tokens, max_model_len_tokens) -> int`` under
``@RESERVATIONS.policy("name")`` (:func:`kvsim.registry.declare_policy` makes its config class and
registers the kind).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

from kvsim.kv.base import KVRequest
from kvsim.registry import RESERVATIONS, PolicyConfig, policy_field


class ReservationPolicy(Protocol):
    def sequence_tokens(self, total_tokens: int, max_model_len_tokens: int) -> int:
        """Slots reserved for one sequence of ``total_tokens`` (prompt + true output) tokens."""
        ...


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@RESERVATIONS.policy("max")
class MaxReservation:
    def sequence_tokens(self, total_tokens: int, max_model_len_tokens: int) -> int:
        return max(max_model_len_tokens, total_tokens)


@RESERVATIONS.policy("pow2")
class Pow2Reservation:
    def sequence_tokens(self, total_tokens: int, max_model_len_tokens: int) -> int:
        return max(min(next_pow2(total_tokens), max_model_len_tokens), total_tokens)


@RESERVATIONS.policy("oracle")
class OracleReservation:
    def sequence_tokens(self, total_tokens: int, max_model_len_tokens: int) -> int:
        return total_tokens


Pow2ReservationConfig = Pow2Reservation.Config  # the config classes by name (tests, plugins)


def reservation_field(default_kind: str):
    """The field type of an allocator's ``reservation:`` key (a kind name or ``{kind: NAME}``)."""
    return policy_field(RESERVATIONS, default_kind)


ReservationConfig = reservation_field("max")


@lru_cache(maxsize=None)
def _policy_for_kind(kind: str) -> ReservationPolicy:
    return RESERVATIONS.build(RESERVATIONS.default_config(kind))


ReservationChoice = str | PolicyConfig | ReservationPolicy  # what an allocator constructor accepts


def reservation_policy(policy: ReservationChoice) -> ReservationPolicy:
    """A policy object from a kind name, a validated config or a policy object (returned as is).
    An unknown kind name raises a ConfigError listing the valid kinds."""
    if isinstance(policy, str):
        return _policy_for_kind(policy)
    if isinstance(policy, PolicyConfig):
        return RESERVATIONS.build(policy)
    return policy


def reservation_tokens(policy: str | ReservationPolicy, req: KVRequest) -> int:
    """Slots reserved up front; a request with n parallel samples reserves n unshared copies.
    ``policy`` is a policy object (hot path: allocators build theirs once with
    :func:`reservation_policy`) or a kind name."""
    if type(policy) is str:
        policy = _policy_for_kind(policy)
    return policy.sequence_tokens(req.prompt_tokens + req.output_tokens, req.max_model_len_tokens) * req.num_samples
