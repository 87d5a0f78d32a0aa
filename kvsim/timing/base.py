"""The timing-model boundary: a batch shape in, a step duration with a breakdown out.

Timing models are plain Python (no SimPy) and stateless after construction, so they can be unit
tested directly and evaluated vectorised by a fast engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class BatchShape:
    """What one engine step computes, aggregated over the scheduled requests.

    For request *i* scheduled with ``n_i`` new tokens on top of ``c_i`` already-computed tokens:

    * ``num_prefill_tokens`` / ``num_decode_tokens``: new tokens of requests still catching up on
      their prompt (prefill, including recompute) / generating (exactly one token each);
    * ``kv_tokens_read``: sum of ``c_i + n_i`` -- every KV entry attention reads this step;
    * ``attention_pairs``: sum of ``n_i*c_i + n_i*(n_i+1)/2`` -- causal (query, key) pairs;
    * ``kv_pages_read``: sum of ``ceil((c_i + n_i) / block_size)`` on paged allocators (one run per
      sequence on contiguous/buddy); 0 = not known (timing models then estimate it, see
      :func:`kvsim.timing.kernel.pages_or_estimate`);
    * ``num_prefill_seqs`` / ``num_decode_seqs``: requests in each group;
    * ``swap_in_bytes`` / ``swap_out_bytes``: KV moved between GPU and a host tier this step;
    * ``tier_load_s``: time loading offloaded prefix blocks back (the allocator prices it at its
      tiers' bandwidths; the part hidden by prefetch is already taken off);
    * ``context_lens`` (optional): per-request ``c_i + n_i`` for models that need the shape of the
      batch (the calibrated model); engines that do not need it may leave it empty.
    """

    num_seqs: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    kv_tokens_read: int
    attention_pairs: int
    kv_pages_read: int = 0  # sum over scheduled sequences of pages (blocks) attention reads: ceil(context_i / block_size) on paged allocators, one contiguous run per sequence on contiguous/buddy
    swap_in_bytes: int = 0
    swap_out_bytes: int = 0
    tier_load_s: float = 0.0  # loading offloaded prefix blocks back from CPU/SSD tiers (serial)
    context_lens: tuple[int, ...] = field(default=(), compare=False)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


@dataclass(frozen=True)
class StepTiming:
    """One step's duration and where it went. ``breakdown_s`` values sum to at least ``duration_s``
    when components overlap (roofline ``max``); ``duration_s`` is authoritative."""

    duration_s: float
    breakdown_s: dict[str, float]
    kv_bytes_read: int


class TimingModel(Protocol):
    def step_time(self, shape: BatchShape) -> StepTiming: ...


def decode_totals(parts: dict, kv_read_bytes, k: int) -> tuple[dict[str, float], int]:
    """Breakdown sums and KV bytes read over the first ``k`` steps of a ``decode_durations`` result.

    ``parts`` maps a breakdown name to its per-step values: an array, or a float that is the same
    every step (summed as ``value * k``)."""
    breakdown = {name: (float(v[:k].sum()) if hasattr(v, "shape") else v * k) for name, v in parts.items()}
    return breakdown, int(kv_read_bytes[:k].sum())
