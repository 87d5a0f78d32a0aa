"""The paged allocator's bulk decode steps (a mixin of :class:`kvsim.kv.paged.PagedAllocator`, its
state, not its own): ``grow_all_by_one`` (BulkDecodeGrowth, the lazy decode group's allocator call)
and ``grow_all_by_one_known`` (KnownTokenBulkGrowth, the same under async scheduling with prefix
caching). Each equals one ``ensure_slots`` (``ensure_slots_known``) per request in allocation order,
touching only the requests at a block boundary, which the slot ledger tracks."""

from __future__ import annotations


class BulkDecode:
    """Bulk decode growth over the allocator's block tables and slot ledger."""

    def grow_all_by_one(self) -> bool:
        """A decode step for every admitted request at once, all or nothing (BulkDecodeGrowth): the
        same blocks, block ids, evictions and prefix-cache registrations as ``ensure_slots(r,
        written + 1)`` for each request in allocation order, touching only the requests at a block
        boundary (the ledger tracks them): those whose held slots are all written take a block, those
        whose last held slot this step writes register it (a full block). False (nothing changed)
        with samples or beams, or if the blocks needed are not free."""
        if self.seqs.samples or self.seqs.beams:
            return False
        ledger = self.ledger
        clock = ledger.step_count
        takers = ledger.full_at(clock)
        need = len(takers)
        if need > self.blocks.num_free:
            return False
        fills = ledger.full_at(clock + 1) if self.prefix_caching else ()
        if need or fills:
            self._boundary_step(takers, fills)
        ledger.grow_steps(self.block_size, need, 1, 0, [])
        return True

    def grow_all_by_one_known(self) -> bool:
        """KnownTokenBulkGrowth: ``grow_all_by_one`` with each request's blocks registered up to its
        tokens before this step (``ensure_slots_known(r, written + 1, written)`` for each, in
        allocation order). The requests whose held slots are all written take a block and register
        the one they filled last step; those whose last slot this step writes wait a step (short)."""
        if self.seqs.samples or self.seqs.beams:
            return False
        ledger = self.ledger
        clock = ledger.step_count
        takers = ledger.full_at(clock)
        if len(takers) > self.blocks.num_free:
            return False
        if takers:
            bs = self.block_size
            tables = self.block_tables
            for rid in sorted(takers, key=self._order.__getitem__):
                table = tables[rid]
                table.append(self._new_block())
                if self.prefix_caching:
                    self._register_full_blocks(rid, (len(table) - 1) * bs)
        ledger.grow_steps(self.block_size, len(takers), 1, 0, [])
        if self.prefix_caching:  # every request but the paused ones grew: these filled a block now
            paused = ledger.paused
            self._short = set(ledger.full_at(clock + 1)).union([r for r in self._short if r in paused])
        return True

    def _boundary_step(self, takers, fills) -> None:
        """The block events of one bulk decode step, request by request in allocation order: a taker
        takes one block (and with one-token blocks fills it at once), a filler registers its last block."""
        one = self.block_size == 1
        tables = self.block_tables
        order = self._order
        events = sorted(takers | fills if takers and fills else takers or fills, key=order.__getitem__)
        for rid in events:
            table = tables[rid]
            took = rid in takers
            if took:
                table.append(self._new_block())
            if self.prefix_caching and (rid in fills or (one and took)):
                self._register_full_blocks(rid, len(table) * self.block_size)
