"""Per-request progress. Owned and mutated only by the scheduler."""

from __future__ import annotations

import enum
import math

from kvsim.kv.base import KVRequest


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2
    REJECTED = 3
    SWAPPED = 4


class Request:
    """Phase-free progress: ``num_tokens = prompt + generated`` and ``num_computed_tokens`` catches
    up to it. Whenever it has caught up, the step that did so samples one more output token.

    After a recompute preemption ``num_computed_tokens`` drops to 0 while generated tokens are kept,
    so the request's next "prefill" recomputes ``prompt + generated`` tokens (vLLM semantics).
    """

    __slots__ = (
        "request_id", "arrival_s", "prompt_tokens", "output_tokens", "kv", "status",
        "num_computed_tokens", "num_generated", "admitted_s", "first_token_s", "finish_s",
        "num_preemptions", "recomputed_tokens", "admit_seq", "reject_reason", "priority",
        "cached_tokens", "num_swaps", "swapped_tokens", "cpu_hit_tokens", "ssd_hit_tokens", "prefetched_s",
        "load_s", "hidden_s", "num_samples", "replica", "remote_hit_tokens", "group_d0",
    )

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 max_model_len_tokens: int, priority: int = 0, block_keys=None, num_samples: int = 1,
                 beam_events=None):
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.kv = KVRequest(request_id, prompt_tokens, output_tokens, max_model_len_tokens,
                            block_keys=block_keys, priority=priority, num_samples=num_samples,
                            beam_events=beam_events)
        self.num_samples = num_samples  # parallel samples decoding in lockstep from one prompt
        self.replica = 0  # the engine replica the router sent it to
        self.priority = priority
        self.cached_tokens = -1  # prefix-cache hit at first admission (-1: never admitted)
        self.num_swaps = 0
        self.swapped_tokens = 0  # tokens held in the host tier while swapped out
        self.cpu_hit_tokens = 0  # prefix tokens loaded back from lower tiers at first admission
        self.ssd_hit_tokens = 0
        self.remote_hit_tokens = 0
        self.prefetched_s = 0.0  # idle link time spent prefetching this request's KV
        self.load_s = 0.0  # transfer time its admissions / swap-ins needed
        self.hidden_s = 0.0  # of which prefetch hid
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_generated = 0
        self.admitted_s = math.nan  # first admission
        self.first_token_s = math.nan
        self.finish_s = math.nan
        self.num_preemptions = 0
        self.recomputed_tokens = 0
        self.admit_seq = -1  # admission order, for "latest admitted" victim selection
        self.reject_reason = ""
        # Decode-group membership (scheduler-internal): the group clock value at which
        # ``num_computed_tokens`` and ``num_generated`` were last brought up to date, or -1.
        self.group_d0 = -1

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_generated

    def batch_tokens(self, new_positions: int, computed: int | None = None) -> int:
        """Tokens a step computes when this request advances ``new_positions`` positions from
        ``computed`` (default: its computed tokens): prompt positions once, positions past the
        prompt once per sample."""
        c = self.num_computed_tokens if computed is None else computed
        prompt_part = max(0, min(c + new_positions, self.prompt_tokens) - c)
        return prompt_part + self.num_samples * (new_positions - prompt_part)

    def positions_within(self, budget_tokens: int, computed: int | None = None) -> int:
        """The most new positions (from ``computed``, default: its computed tokens) whose
        :meth:`batch_tokens` fit in ``budget_tokens``: a chunk of a prefill or recompute. Past the
        prompt a position costs one token per sample, so a multi-sample chunk may be 0."""
        c = self.num_computed_tokens if computed is None else computed
        prompt_part = max(0, self.prompt_tokens - c)
        if budget_tokens <= prompt_part or self.num_samples == 1:
            return budget_tokens
        return prompt_part + (budget_tokens - prompt_part) // self.num_samples

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, {self.status.name}, computed={self.num_computed_tokens}/"
                f"{self.num_tokens}, generated={self.num_generated}/{self.output_tokens})")
