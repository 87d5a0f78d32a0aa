"""Paged KV allocator: fixed-size blocks, per-request block tables, a free-block queue.

Invariants (``check_invariants``):
* every block is either free (in the queue, ref count 0) or owned (ref count == number of block
  tables that contain it, >= 1), never both;
* ``len(block_table[r]) == cdiv(held_tokens[r], block_size)`` and held tokens are whole blocks;
* free blocks + owned blocks == num_blocks.

Blocks are allocated on demand: admission takes ``cdiv(hold_tokens, block_size)`` blocks, and each
step's ``ensure_slots`` takes only the blocks the new tokens spill into. A request's blocks are
freed tail first (reverse block-table order). A ``watermark`` fraction of blocks is kept free at
admission (vLLM v0's ``watermark``) so running requests can grow without immediate preemption.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kvsim.config_base import StrictModel
from kvsim.kv.base import KVRequest, KVUsage, SlotLedger, cdiv
from kvsim.kv.block_pool import FreeBlockQueue
from kvsim.registry import ALLOCATORS


class PagedAllocatorConfig(StrictModel):
    kind: Literal["paged"] = "paged"
    block_size: int = Field(16, ge=1, le=512, description="tokens per block")
    watermark: float = Field(0.01, ge=0, lt=1, description="fraction of blocks kept free at admission")


class PagedAllocator:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        if num_blocks < 1:
            raise ValueError("a paged allocator needs at least one block")
        if not 1 <= block_size <= 512:
            raise ValueError(f"block_size must be in [1, 512], got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.block_size_tokens = block_size
        self.capacity_tokens = num_blocks * block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.free_queue = FreeBlockQueue(num_blocks)
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[int, list[int]] = {}
        self.ledger = SlotLedger()

    @classmethod
    def from_capacity(cls, cfg: PagedAllocatorConfig, capacity_tokens: int) -> "PagedAllocator":
        return cls(capacity_tokens // cfg.block_size, cfg.block_size, cfg.watermark)

    # -- queries -------------------------------------------------------------------------------
    def max_footprint_fits(self, req: KVRequest) -> bool:
        return cdiv(req.final_kv_tokens, self.block_size) <= self.num_blocks - self.watermark_blocks

    def held_tokens(self, request_id: int) -> int:
        return self.ledger.held[request_id]

    def block_table(self, request_id: int) -> list[int]:
        """A copy of the request's block ids (for tests; the scheduler never calls this)."""
        return list(self.block_tables[request_id])

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    # -- mutations -------------------------------------------------------------------------------
    def _take_blocks(self, table: list[int], count: int) -> None:
        for _ in range(count):
            b = self.free_queue.popleft()
            self.ref_counts[b] = 1
            table.append(b)

    def allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        if req.request_id in self.ledger:
            raise ValueError(f"request {req.request_id} is already allocated")
        if hold_tokens < 1:
            raise ValueError(f"hold_tokens must be >= 1, got {hold_tokens}")
        need = cdiv(hold_tokens, self.block_size)
        if self.free_queue.num_free - need < self.watermark_blocks:
            return False
        table: list[int] = []
        self._take_blocks(table, need)
        self.block_tables[req.request_id] = table
        self.ledger.add(req.request_id, req.final_kv_tokens, need * self.block_size)
        return True

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        self.ledger.require(request_id)
        table = self.block_tables[request_id]
        need = cdiv(num_tokens, self.block_size) - len(table)
        if need > 0:
            if need > self.free_queue.num_free:
                return False
            self._take_blocks(table, need)
            self.ledger.set_held(request_id, len(table) * self.block_size)
        if num_tokens < self.ledger.written[request_id]:
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        self.ledger.set_written(request_id, num_tokens)
        return True

    def free(self, request_id: int) -> None:
        self.ledger.remove(request_id)
        table = self.block_tables.pop(request_id)
        for b in reversed(table):  # tail first: see the eviction order in block_pool
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue.append(b)

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        # Any free block can serve any request: paging has no external fragmentation.
        return self.ledger.usage(self.capacity_tokens, 0)

    def check_invariants(self) -> None:
        self.free_queue.check_invariants()
        self.ledger.check("paged")
        owners = [0] * self.num_blocks
        for r, table in self.block_tables.items():
            assert r in self.ledger, f"block table of unknown request {r}"
            assert len(table) * self.block_size == self.ledger.held[r], (
                f"request {r}: {len(table)} blocks but {self.ledger.held[r]} held tokens"
            )
            for b in table:
                owners[b] += 1
        for b in range(self.num_blocks):
            free = b in self.free_queue
            assert self.ref_counts[b] == owners[b], (
                f"block {b}: ref count {self.ref_counts[b]} != owners {owners[b]}"
            )
            assert not (free and owners[b]), f"block {b} is both free and owned"
            assert free or owners[b], f"block {b} is neither free nor owned (leaked)"
        assert len(self.block_tables) == len(self.ledger), "block tables and ledger disagree"


ALLOCATORS.register("paged", PagedAllocatorConfig, PagedAllocator.from_capacity)
