"""Up-front reservation sizes of the Orca baselines (vLLM paper, section 6.2).

* ``max``: the model's maximum sequence length, whatever the request needs;
* ``pow2``: prompt + true output length rounded up to a power of two (capped at the max length);
* ``oracle``: exactly prompt + true output length -- an upper bound no real system reaches.
"""

from __future__ import annotations

from typing import Literal

from kvsim.kv.base import KVRequest

ReservationPolicy = Literal["max", "pow2", "oracle"]


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def reservation_tokens(policy: ReservationPolicy, req: KVRequest) -> int:
    """Slots reserved up front; a request with n parallel samples reserves n unshared copies."""
    return _one_sequence(policy, req) * req.num_samples


def _one_sequence(policy: ReservationPolicy, req: KVRequest) -> int:
    total = req.prompt_tokens + req.output_tokens
    if policy == "max":
        return max(req.max_model_len_tokens, total)
    if policy == "pow2":
        return max(min(next_pow2(total), req.max_model_len_tokens), total)
    if policy == "oracle":
        return total
    raise ValueError(f"unknown reservation policy {policy!r}")
