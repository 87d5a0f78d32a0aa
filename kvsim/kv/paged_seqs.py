"""What both paged allocators share: the block geometry (:class:`PagedCore`) and the requests with
several sequences -- parallel samples and beams (:class:`SeqGroups`).

A request with ``n`` parallel samples shares its prompt's blocks by reference (copy-on-write of the
partial block at the first generated token, :class:`kvsim.kv.base.SampleGeometry`); a beam-search
request keeps one block table per beam (:class:`kvsim.kv.beam.BeamTables`). Block ids come from
the allocator (physical ids, or plain counters for the counting allocator), so the bookkeeping
here is the same for both.
"""

from __future__ import annotations

from collections.abc import Callable

from kvsim.kv.base import KVRequest, SampleGeometry, cdiv
from kvsim.kv.ledger import SlotLedger
from kvsim.kv.beam import BeamTables


class SeqGroups:
    """The samples and beams of the requests that have more than one sequence."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.samples: dict[int, SampleGeometry] = {}  # requests with parallel samples
        self.beams: dict[int, BeamTables] = {}  # beam-search requests: their beams' block tables
        self.seq_len: dict[int, int] = {}  # a sequence's written length (samples and beams)
        self.forks = 0  # beam forks so far (each after a prune)
        self.copied_tokens = 0  # KV slots copied at forks (copy-on-write of partial blocks)

    def start(self, req: KVRequest, hold_tokens: int, take: Callable[[], int]) -> BeamTables | SampleGeometry | None:
        """Register an admitted request with ``req.num_samples > 1``: its beams over blocks from
        ``take`` (beam search), or its sample geometry. None for one sequence."""
        rid = req.request_id
        if req.num_samples == 1:
            return None
        if req.beam_events is not None:
            bt = self.beams[rid] = BeamTables(req.beam_events, self.block_size, req.prompt_tokens, hold_tokens, take)
            self.seq_len[rid] = 0
            return bt
        geo = self.samples[rid] = SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens)
        return geo

    def drop(self, rid: int) -> tuple[SampleGeometry | None, BeamTables | None]:
        """Forget a freed request; its sample geometry and beams (either may be None)."""
        self.seq_len.pop(rid, None)
        return self.samples.pop(rid, None), self.beams.pop(rid, None)

    def grow_beams(self, rid: int, bt: BeamTables, num_tokens: int, free_blocks: int,
                   take: Callable[[], int], give: Callable[[int], None]) -> int | None:
        """Grow every beam to ``num_tokens``, forking and pruning on the way (kvsim.kv.beam). All or
        nothing: None (and no change) unless the net blocks it takes are among ``free_blocks``;
        else the net blocks taken."""
        if num_tokens < bt.seq_len:
            raise ValueError(f"request {rid}: written tokens cannot shrink")
        need = bt.blocks_needed(num_tokens)
        if need > free_blocks:
            return None
        forks, copied = bt.forks, bt.copied_tokens
        bt.advance(num_tokens, take, give)
        self.forks += bt.forks - forks
        self.copied_tokens += bt.copied_tokens - copied
        self.seq_len[rid] = num_tokens
        return need

    def written_offset_tokens(self, rid: int) -> int:
        """``sequences x sequence length - physical slots written`` once samples diverged: the
        prompt's full blocks are stored once for all sequences."""
        bt = self.beams.get(rid)
        if bt is not None:
            return bt.width * bt.seq_len - bt.written_slots()
        geo = self.samples.get(rid)
        return 0 if geo is None else (geo.n - 1) * geo.base

    def seq_capacity_tokens(self, rid: int, held_tokens: int) -> int:
        """Tokens one of the request's sequences can hold in ``held_tokens`` of blocks."""
        bt = self.beams.get(rid)
        if bt is not None:
            return bt.seq_capacity_tokens()
        geo = self.samples.get(rid)
        return held_tokens if geo is None else geo.seq_capacity(held_tokens // self.block_size)

    def width(self, rid: int) -> int:
        bt = self.beams.get(rid)
        return bt.width if bt is not None else self.samples[rid].n

    def unshared_extra(self, written_of: Callable[[int], int]) -> int:
        """Over requests with several sequences: token states their sequences hold beyond the
        physical slots written (what sharing saves)."""
        if not self.seq_len:
            return 0
        return sum(self.width(r) * n - written_of(r) for r, n in self.seq_len.items())


class PagedCore:
    """Block geometry, the slot ledger and the sequence groups of a paged allocator, with the
    queries that read only them (the same for the block-id and the counting allocator)."""

    def __init__(self, num_blocks: int, block_size: int, watermark: float, track_boundaries: bool = False):
        if num_blocks < 1:
            raise ValueError("a paged allocator needs at least one block")
        if not 1 <= block_size <= 512:
            raise ValueError(f"block_size must be in [1, 512], got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.capacity_tokens = num_blocks * block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.ledger = SlotLedger(track_boundaries=track_boundaries)
        self.seqs = SeqGroups(block_size)

    @property
    def beam_forks(self) -> int:
        return self.seqs.forks

    @property
    def beam_copied_tokens(self) -> int:
        return self.seqs.copied_tokens

    def _blocks_for(self, req: KVRequest, hold_tokens: int) -> int:
        if req.num_samples == 1:
            return cdiv(hold_tokens, self.block_size)
        return SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens).blocks(hold_tokens)

    def _final_blocks(self, req: KVRequest) -> int:
        if req.num_samples == 1:
            return cdiv(req.final_kv_tokens, self.block_size)
        return SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens).blocks(
            req.final_kv_tokens if req.output_tokens > 1 else req.prompt_tokens)

    def _final_written(self, req: KVRequest) -> int:
        if req.num_samples == 1:
            return req.final_kv_tokens
        g = SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens)
        return g.written(req.final_kv_tokens) if req.output_tokens > 1 else req.prompt_tokens

    def max_footprint_fits(self, req: KVRequest) -> bool:
        return self._final_blocks(req) <= self.num_blocks - self.watermark_blocks

    def max_footprint_fits_without_watermark(self, req: KVRequest) -> bool:
        return self._final_blocks(req) <= self.num_blocks

    def held_tokens(self, request_id: int) -> int:
        return self.ledger.held[request_id]

    def written_offset_tokens(self, request_id: int) -> int:
        return self.seqs.written_offset_tokens(request_id)

    def seq_capacity_tokens(self, request_id: int) -> int:
        """Tokens one of the request's sequences can hold in its current blocks (diverged samples)."""
        return self.seqs.seq_capacity_tokens(request_id, self.ledger.held[request_id])
