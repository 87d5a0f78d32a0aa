"""The paged allocator without prefix caching, counting blocks instead of naming them.

Without prefix caching no result depends on *which* free block a request gets, so
:class:`CountingPagedAllocator` keeps only per-request block counts and a free count: O(1) per call
instead of O(blocks). It makes the same fit / does-not-fit decisions as
:class:`kvsim.kv.paged.PagedAllocator` with the same block size and watermark (a test runs both on
the same scenarios and compares the request tables). Geometry, samples and beams come from
:class:`kvsim.kv.paged_seqs.PagedCore`, as for the block-id allocator.
"""

from __future__ import annotations

from kvsim.kv.base import NO_HIT, Allocation, KVRequest, KVUsage, UsageSums, cdiv
from kvsim.kv.beam import BeamTables
from kvsim.kv.paged_seqs import PagedCore


class CountingPagedAllocator(PagedCore):
    prefix_caching = False
    evictions = 0

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        super().__init__(num_blocks, block_size, watermark, track_boundaries=True)
        self.num_free_blocks = num_blocks
        self._next_id = 0  # beam blocks are named by a plain counter

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def ensure_slots_many(self, request_ids, num_tokens) -> bool:
        """``ensure_slots`` for several requests in order; stops at the first that does not fit."""
        return all([self.ensure_slots(r, n) for r, n in zip(request_ids, num_tokens)])

    def seq_capacities(self, request_ids) -> list[int]:
        """``seq_capacity_tokens`` of many requests at once (decode windows)."""
        if self.seqs.samples or self.seqs.beams:
            return [self.seq_capacity_tokens(r) for r in request_ids]
        held = self.ledger.held
        return [held[r] for r in request_ids]

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        return self.num_free_blocks - self._blocks_for(req, hold_tokens) >= self.watermark_blocks

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        self.ledger.require_new(req.request_id, hold_tokens)
        need = self._blocks_for(req, hold_tokens)
        if self.num_free_blocks - need < self.watermark_blocks:
            return None
        self.num_free_blocks -= need
        self.ledger.add(req.request_id, self._final_written(req), need * self.block_size)
        if req.num_samples > 1:
            self.seqs.start(req, hold_tokens, self._take_id)
        return NO_HIT

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        ledger = self.ledger
        seqs = self.seqs
        if seqs.beams:
            bt = seqs.beams.get(request_id)
            if bt is not None:
                return self._ensure_beams(request_id, num_tokens, bt)
        held = ledger.held[request_id]
        geo = seqs.samples.get(request_id) if seqs.samples else None
        if geo is not None:
            need = geo.blocks(num_tokens) - held // self.block_size
            written = geo.written(num_tokens)
        else:
            need = cdiv(num_tokens - held, self.block_size) if num_tokens > held else 0
            written = num_tokens
        if need > 0:
            if need > self.num_free_blocks:
                return False
            self.num_free_blocks -= need
            ledger.set_held(request_id, held + need * self.block_size)
        if written < ledger.written_of(request_id):
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        ledger.set_written(request_id, written)
        if geo is not None:
            seqs.seq_len[request_id] = num_tokens
        return True

    def _ensure_beams(self, rid: int, num_tokens: int, bt: BeamTables) -> bool:
        """Beam search (SeqGroups.grow_beams) over counted blocks: all or nothing."""
        need = self.seqs.grow_beams(rid, bt, num_tokens, self.num_free_blocks, self._take_id, lambda b: None)
        if need is None:
            return False
        self.num_free_blocks -= need
        self.ledger.set_held(rid, bt.num_blocks() * self.block_size)
        self.ledger.set_written(rid, bt.written_slots())
        return True

    def advance_written(self, request_ids, written_tokens) -> None:
        """Bulk ``ensure_slots`` for tokens that fit the held blocks (decode windows)."""
        if self.seqs.samples:
            for r, w in zip(request_ids, written_tokens):
                self.ensure_slots(r, w)
            return
        self.ledger.set_written_many(request_ids, written_tokens)

    def grow_all_by_one(self) -> bool:
        """A decode step for every admitted request at once (all or nothing): see
        :meth:`SlotLedger.grow_all_by_one`. Block ids are not tracked, so the order is irrelevant."""
        if self.seqs.samples or self.seqs.beams:
            return False
        need = self.ledger.grow_all_by_one(self.block_size, self.num_free_blocks)
        if need < 0:
            return False
        self.num_free_blocks -= need
        return True

    def grow_steps(self, steps: int, first_step: int, changes: list) -> int:
        """``grow_all_by_one`` up to ``steps`` times, stopping before a step whose blocks are not
        free (BulkDecodeSteps; see :meth:`SlotLedger.grow_steps`). Returns the steps done."""
        if self.seqs.samples or self.seqs.beams:
            return 0
        done, taken = self.ledger.grow_steps(self.block_size, self.num_free_blocks, steps, first_step, changes)
        self.num_free_blocks -= taken
        return done

    def free(self, request_id: int) -> None:
        held = self.ledger.held.get(request_id)
        seqs = self.seqs
        if seqs.seq_len or seqs.samples or seqs.beams:  # (else there is nothing of it to drop)
            seqs.drop(request_id)
        self.ledger.remove(request_id)
        self.num_free_blocks += held // self.block_size

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        return self.ledger.usage(self.capacity_tokens, 0,
                                 unshared_extra_tokens=self.seqs.unshared_extra(self.ledger.written_of))

    def usage_parts(self, head: KVRequest | None = None) -> UsageSums:
        return UsageSums(self.ledger.sum_held, self.ledger.sum_useful, 0, 0, 0)

    def check_invariants(self) -> None:
        self.ledger.check("paged")
        for r, held in self.ledger.held.items():
            assert held % self.block_size == 0, f"request {r}: held {held} is not whole blocks"
        for r, bt in self.seqs.beams.items():
            bt.check(f"paged request {r}")
            assert bt.num_blocks() * self.block_size == self.ledger.held[r], f"request {r}: beams' blocks != held"
        used = self.ledger.sum_held // self.block_size
        assert 0 <= self.num_free_blocks and used + self.num_free_blocks == self.num_blocks, (
            f"free blocks ({self.num_free_blocks}) + owned ({used}) != {self.num_blocks}"
        )
