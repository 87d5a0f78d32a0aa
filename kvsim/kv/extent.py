"""What allocators with one up-front extent per request (contiguous, buddy) share
(:class:`ExtentAllocator`): the extent holds every token, so growth never allocates."""

from __future__ import annotations

from kvsim.kv.base import KVRequest, KVUsage, UsageSums
from kvsim.kv.ledger import SlotLedger


class ExtentAllocator:
    """What allocators with one up-front extent per request (contiguous, buddy) share: the extent
    holds every token the request will write, so growth never allocates, and parallel samples get
    unshared copies (``n x`` the reservation; written = ``n x`` a sequence's length).

    Subclasses set ``capacity_tokens`` and implement ``_external(head)`` plus the placement."""

    block_size = None  # one contiguous run per sequence
    num_free_blocks = 0  # decoding never takes blocks: the extent holds every token

    def _init_ledger(self) -> None:
        self.ledger = SlotLedger(track_boundaries=True)
        self._samples: dict[int, int] = {}  # requests with parallel samples -> n
        self._beam_events: dict[int, object] = {}  # beam-search requests -> their BeamEvents
        self.beam_forks = 0  # forks so far: each copies the source beam's extent into the pruned one's
        self.beam_copied_tokens = 0

    def _add_extent(self, req: KVRequest, size_tokens: int) -> None:
        self.ledger.add(req.request_id, req.final_kv_tokens * req.num_samples, size_tokens)
        if req.num_samples > 1:
            self._samples[req.request_id] = req.num_samples
            if req.beam_events is not None:
                self._beam_events[req.request_id] = req.beam_events

    def _remove_extent(self, request_id: int) -> None:
        self.ledger.remove(request_id)
        self._samples.pop(request_id, None)
        self._beam_events.pop(request_id, None)

    def held_tokens(self, request_id: int) -> int:
        return self.ledger.held[request_id]

    def written_offset_tokens(self, request_id: int) -> int:
        return 0  # samples are unshared copies: written = samples x length

    def seq_capacity_tokens(self, request_id: int) -> int:
        return self.ledger.held[request_id] // self._samples.get(request_id, 1)

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        self.ledger.require(request_id)
        written = num_tokens * self._samples.get(request_id, 1)
        if written > self.ledger.held[request_id]:
            # The reservation covers prompt + output by construction: growing past it is a bug.
            raise ValueError(
                f"request {request_id}: {num_tokens} tokens exceed its extent of {self.ledger.held[request_id]}"
            )
        old = self.ledger.written_of(request_id)
        if written < old:
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        if self._beam_events:
            ev = self._beam_events.get(request_id)
            if ev is not None:  # a fork copies the source beam (its whole length) over the pruned one
                for k in ev.between(old // ev.width, num_tokens):
                    self.beam_forks += 1
                    self.beam_copied_tokens += ev.positions[k] - 1
        self.ledger.set_written(request_id, written)
        return True

    def advance_written(self, request_ids, written_tokens) -> None:
        """Bulk ``ensure_slots`` (decode windows)."""
        for r, w in zip(request_ids, written_tokens):
            self.ensure_slots(r, w)

    def grow_all_by_one(self) -> bool:
        """A decode step for every admitted request at once: extents already hold every token."""
        if self._samples:
            return False
        return self.ledger.grow_all_by_one(1, 0) == 0

    def grow_steps(self, steps: int, first_step: int, changes: list) -> int:
        """``grow_all_by_one`` up to ``steps`` times (BulkDecodeSteps): extents hold every token, so
        nothing is taken and ``changes`` stays empty."""
        if self._samples:
            return 0
        return self.ledger.grow_steps(1, 0, steps, first_step, changes)[0]

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        return self.ledger.usage(self.capacity_tokens, self._external(head))

    def usage_parts(self, head: KVRequest | None = None) -> UsageSums:
        return UsageSums(self.ledger.sum_held, self.ledger.sum_useful, 0, 0, self._external(head))
