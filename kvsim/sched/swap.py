"""The host tier of swap preemption and prefetch, as the scheduler sees it: bytes and copies.

:class:`HostSwap` owns the swap space (``scheduler.swap_space_bytes``), the queue of swapped-out
requests and what moved through it. A swap moves and holds whole blocks, as vLLM V0 does (its CPU
block allocator hands out ``swap_space_bytes // block_bytes`` blocks, and ``swap_blocks`` copies
each block whole, a partial last block included): the swap space holds whole blocks, and a swap's
bytes are its blocks x block bytes (allocators without blocks: tokens x bytes per token). A request
with several sequences (parallel samples, beams) moves the blocks the allocator holds for it -- the
prompt's shared blocks once and each sequence's own blocks (``held_tokens``, whole blocks on a paged
allocator) -- as vLLM V0's ``swap_out`` maps every block of the group's running sequences; without
blocks, one extent per sample. Whether a victim is swapped is ``scheduler.preemption_mode``'s rule
(:meth:`~kvsim.sched.config.SchedulerConfig.swaps`). It counts the bytes and the copies a swap takes -- blocks, or
runs of consecutive blocks from the allocator's BlockRuns capability, times the layout's copies per
block; one run per sequence extent on allocators without blocks -- and never prices them itself:
:class:`~kvsim.timing.transfer.HostTransfers` (the transfer model, docs/transfer_model.md) turns
copies into seconds, both for prefetch hiding here and for the step time in the timing model.
"""

from __future__ import annotations

import bisect

from kvsim.kv.base import Allocation, cdiv
from kvsim.kv.protocol import AllocatorCapabilities, KVAllocator
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.request import Request, RequestStatus
from kvsim.sched.shape import StepDraft
from kvsim.timing.transfer import HostTransfers, LoadCharge


class HostSwap:
    """Swap space, swapped-out requests (ordered by ``admit_seq``) and prefetch credit."""

    def __init__(self, cfg: SchedulerConfig, allocator: KVAllocator, caps: AllocatorCapabilities,
                 bytes_per_token: int, transfers: HostTransfers):
        self.swaps = cfg.swaps  # the rule: does a preempted request with n sequences come here?
        self.enabled = cfg.may_swap  # some request may be swapped
        self.swaps_singles = cfg.swaps(1)  # ... one with one sequence too
        self.bytes_per_token = bytes_per_token  # this GPU's share (the run's KV geometry); 0: no bytes
        # the unit a swap moves and holds: a block (tokens), or a token on allocators without blocks
        self.unit_tokens = allocator.block_size or 1
        unit_bytes = bytes_per_token * self.unit_tokens
        # swap space and its use in token slots of whole units (whole blocks)
        self.capacity_tokens = (cfg.swap_space_bytes // unit_bytes) * self.unit_tokens if unit_bytes else 0
        self.used_tokens = 0
        self.queue: list[Request] = []
        self.swapped_out_bytes = 0
        self.swapped_in_bytes = 0
        self.prefetch = cfg.prefetch
        self.transfers = transfers
        self.hidden_by_prefetch_s = 0.0
        self._allocator = allocator
        self._block_runs = caps.block_runs

    def _copies(self, request_id: int, first_unit: int, end_unit: int, extents: int) -> int:
        """Copies moving units (blocks; tokens without blocks) ``[first_unit, end_unit)`` of the
        request's KV over the host link (0 on the legacy link, whose price has no per-copy cost);
        ``extents``: its sequences' extents on an allocator without blocks."""
        tr = self.transfers
        if tr.legacy or end_unit <= first_unit:
            return 0
        if self._allocator.block_size is None:
            units = extents  # one contiguous extent per sequence
        elif tr.granularity == "run" and self._block_runs:
            units = self._allocator.block_runs(request_id, first_unit, end_unit)
        else:
            units = end_unit - first_unit  # per block (or blocks not named: no coalescing can be seen)
        return units * tr.copies_per_unit

    def held(self, victim: Request) -> tuple[int, int] | None:
        """Called before the preempted ``victim``'s KV is freed: the token slots (whole units) and
        the copies a swap of it moves, or None when the preemption rule recomputes it. One sequence:
        the units covering its computed tokens. Several (parallel samples, beams): what the allocator
        holds for it (shared prompt blocks once, each sequence's own blocks), or one extent of its
        computed tokens per sample on an allocator without blocks."""
        n = victim.num_samples
        if not self.swaps(n):
            return None
        rid, computed, u = victim.request_id, victim.num_computed_tokens, self.unit_tokens
        if n == 1:
            slots = cdiv(computed, u) * u
        elif self._allocator.block_size is None:
            slots = computed * n
        else:
            slots = self._allocator.held_tokens(rid)
        return slots, self._copies(rid, 0, slots // u if n > 1 else cdiv(computed, u), n)

    def swap_out(self, victim: Request, held: tuple[int, int], step: StepDraft) -> bool:
        """Park the preempted ``victim`` (its KV already freed on the GPU; ``held``: its slots and
        copies from :meth:`held`) in the host tier if it has computed tokens and the swap space
        holds them; its bytes (whole blocks) and copies go into ``step``. False: it must be
        recomputed (kvsim's fallback when the swap space is full; vLLM V0 stops there)."""
        slots, out_copies = held
        if not (victim.num_computed_tokens and self.used_tokens + slots <= self.capacity_tokens):
            return False
        victim.status = RequestStatus.SWAPPED
        victim.num_swaps += 1
        victim.swapped_tokens = slots
        self.used_tokens += slots
        keys = [r.admit_seq for r in self.queue]
        self.queue.insert(bisect.bisect(keys, victim.admit_seq), victim)
        nbytes = slots * self.bytes_per_token
        self.swapped_out_bytes += nbytes
        step.swap_out_bytes += nbytes
        step.swap_out_copies += out_copies
        return True

    def swap_in(self, req: Request, got: Allocation, step: StepDraft) -> int:
        """The queue's head ``req`` got its GPU blocks back (``got``): the tokens not found in the
        prefix cache come back over the link, in whole blocks. Returns its computed tokens now; the
        bytes moved go into ``step`` whole (``swapped_in_bytes``), the bytes and copies to pay less what prefetch hid."""
        if self.queue.pop(0) is not req:
            raise RuntimeError(f"request {req.request_id}: swapped in out of order")
        computed = max(req.num_computed_tokens, got.cached_tokens)
        first = min(got.cached_tokens, req.num_computed_tokens)
        # what it holds in the host tier less the whole units found in the prefix cache
        u = self.unit_tokens
        transfer = req.swapped_tokens - first // u * u if first < req.num_computed_tokens else 0
        copies = self._copies(req.request_id, first // u, first // u + transfer // u, req.num_samples)
        req.num_computed_tokens = computed
        self.used_tokens -= req.swapped_tokens
        req.swapped_tokens = 0
        nbytes = transfer * self.bytes_per_token
        self.swapped_in_bytes += nbytes
        step.swapped_in_bytes += nbytes
        self._pay(req, self.transfers.swap_in_charge(nbytes, copies, got.load_s, self._prefetched(req)), step)
        return computed

    def load(self, req: Request, got: Allocation, step: StepDraft) -> None:
        """An admission found prefix blocks in lower tiers (``got.load_s``): pay what prefetch did not hide."""
        if got.load_s:
            self._pay(req, self.transfers.load_charge(got.load_s, self._prefetched(req)), step)

    def _prefetched(self, req: Request) -> float | None:
        return req.prefetched_s if self.prefetch else None

    def _pay(self, req: Request, charge: LoadCharge, step: StepDraft) -> None:
        """Record a load on the request (needed, hidden) and add its unhidden part to ``step``."""
        req.prefetched_s = 0.0
        req.load_s += charge.need_s
        req.hidden_s += charge.hidden_s
        self.hidden_by_prefetch_s += charge.hidden_s
        step.swap_in_bytes += charge.swap_in_bytes
        step.swap_in_copies += charge.swap_in_copies
        step.tier_load_s += charge.tier_load_s

    def prefetch_target(self, waiting_head: Request | None) -> Request | None:
        """The request whose KV prefetch loads while the link is idle: the next to be swapped in,
        else the head of the waiting queue (None: prefetch off)."""
        if not self.prefetch:
            return None
        if self.queue:
            return self.queue[0]
        return waiting_head

    def check(self) -> None:
        assert sum(r.swapped_tokens for r in self.queue) == self.used_tokens, "host tier usage out of sync"
        assert self.used_tokens <= self.capacity_tokens or not self.queue, "host tier over capacity"
        for r in self.queue:
            assert r.status == RequestStatus.SWAPPED, f"{r} in swapped queue"
