"""Buddy KV allocator: power-of-two extents, split on allocation, coalesced with buddies on free.

The slot space is measured in units of ``block_size`` tokens, the smallest extent (scenario key;
``min_block_tokens`` is its deprecated alias). The allocator object keeps it as ``extent_block_size``:
its protocol attribute ``block_size`` is None, because attention reads each extent as one contiguous
run, not through a page table (kvsim/kv/protocol.py). When the capacity is not a power of
two it is decomposed into power-of-two top-level blocks, largest first (``0, 2^K1, 2^K1+2^K2, ...``),
so every block is aligned to its own size and a block's buddy is ``address XOR size``; two buddies
merge only inside the same top-level block.

A request's extent is ``reservation_tokens(policy, req)`` rounded up to a power-of-two number of
units (internal fragmentation). Allocation takes the lowest-addressed free block of the smallest
sufficient order and splits it, returning upper halves to the free lists. Freeing merges with the
buddy while the buddy is free.

Invariants: free blocks and allocated extents tile the space without overlap; no two free buddies
of the same order coexist (they would have merged); every block is aligned to its size.
"""

from __future__ import annotations

import bisect
from typing import Literal

from pydantic import AliasChoices, Field

from kvsim.config_base import StrictModel, Tokens
from kvsim.kv.base import MAX_BLOCK_TOKENS, NO_HIT, Allocation, KVRequest, cdiv
from kvsim.kv.extent import ExtentAllocator
from kvsim.kv.reservation import ReservationChoice, reservation_field, reservation_policy, reservation_tokens
from kvsim.registry import ALLOCATORS


class BuddyAllocatorConfig(StrictModel):
    kind: Literal["buddy"] = "buddy"
    block_size: Tokens = Field(16, ge=1, le=MAX_BLOCK_TOKENS, validation_alias=AliasChoices("block_size", "min_block_tokens"),
                            description="smallest extent, in tokens (min_block_tokens: deprecated alias)")
    reservation: reservation_field("oracle") = Field(  # type: ignore[valid-type]
        "oracle", description="max | pow2 | oracle, or {kind: NAME}; then rounded to 2^k units")


class BuddyAllocator(ExtentAllocator):

    def __init__(self, capacity_tokens: int, block_size: int = 16,
                 reservation: ReservationChoice = "oracle"):
        self.extent_block_size = block_size  # smallest extent in tokens (block_size stays None: no pages)
        self.num_units = capacity_tokens // block_size
        if self.num_units < 1:
            raise ValueError("capacity is smaller than one minimum block")
        self.capacity_tokens = self.num_units * self.extent_block_size
        self.reservation = reservation_policy(reservation)
        self.max_order = self.num_units.bit_length() - 1
        self.free_lists: list[list[int]] = [[] for _ in range(self.max_order + 1)]  # sorted unit addrs
        self.top_bases: list[int] = []
        self.top_orders: list[int] = []
        base = 0
        for order in range(self.max_order, -1, -1):
            if self.num_units & (1 << order):
                self.top_bases.append(base)
                self.top_orders.append(order)
                self.free_lists[order].append(base)
                base += 1 << order
        self.extents: dict[int, tuple[int, int]] = {}  # request -> (unit address, order)
        self._init_ledger()

    @classmethod
    def from_capacity(cls, cfg: BuddyAllocatorConfig, capacity_tokens: int, bytes_per_token: int = 0) -> "BuddyAllocator":
        return cls(capacity_tokens, cfg.block_size, cfg.reservation)

    def order_for(self, req: KVRequest) -> int:
        units = cdiv(reservation_tokens(self.reservation, req), self.extent_block_size)
        return (units - 1).bit_length()

    def max_footprint_fits(self, req: KVRequest) -> bool:
        return self.order_for(req) <= self.max_order

    def _top_order(self, addr: int) -> int:
        return self.top_orders[bisect.bisect_right(self.top_bases, addr) - 1]

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        """Would ``allocate(req, hold_tokens)`` succeed now? (no side effects)"""
        order = self.order_for(req)
        return any(self.free_lists[j] for j in range(order, self.max_order + 1))

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        self.ledger.require_new(req.request_id, hold_tokens)
        order = self.order_for(req)
        if hold_tokens > (1 << order) * self.extent_block_size:
            raise ValueError(f"request {req.request_id}: hold {hold_tokens} exceeds its extent")
        j = order
        while j <= self.max_order and not self.free_lists[j]:
            j += 1
        if j > self.max_order:
            return None
        addr = self.free_lists[j].pop(0)  # lowest address of that order
        while j > order:  # split, keeping the lower half
            j -= 1
            bisect.insort(self.free_lists[j], addr + (1 << j))
        self.extents[req.request_id] = (addr, order)
        self._add_extent(req, (1 << order) * self.extent_block_size)
        return NO_HIT

    def free(self, request_id: int) -> None:
        self._remove_extent(request_id)
        addr, order = self.extents.pop(request_id)
        top = self._top_order(addr)
        while order < top:
            buddy = addr ^ (1 << order)
            fl = self.free_lists[order]
            i = bisect.bisect_left(fl, buddy)
            if i < len(fl) and fl[i] == buddy:
                del fl[i]
                addr = min(addr, buddy)
                order += 1
            else:
                break
        bisect.insort(self.free_lists[order], addr)

    def largest_free_units(self) -> int:
        for order in range(self.max_order, -1, -1):
            if self.free_lists[order]:
                return 1 << order
        return 0

    def _external(self, head: KVRequest | None) -> int:
        free_total = self.capacity_tokens - self.ledger.sum_held
        largest = self.largest_free_units() * self.extent_block_size
        if head is not None:
            need = (1 << self.order_for(head)) * self.extent_block_size
            if largest < need <= free_total:
                return free_total
        return free_total - largest

    def check_invariants(self) -> None:
        self.ledger.check("buddy")
        pieces = []
        for order, fl in enumerate(self.free_lists):
            assert fl == sorted(fl), f"free list of order {order} not sorted"
            for a in fl:
                pieces.append((a, 1 << order, "free", order))
        for r, (a, order) in self.extents.items():
            pieces.append((a, 1 << order, f"request {r}", order))
            assert self.ledger.held[r] == (1 << order) * self.extent_block_size, f"request {r}: held != extent"
        pieces.sort()
        pos = 0
        for a, size, who, order in pieces:
            assert a == pos, f"{who} at unit {a}, expected {pos} (overlap or gap)"
            assert a % size == 0, f"{who} at {a} not aligned to its size {size}"
            assert order <= self._top_order(a), f"{who} larger than its top-level block"
            pos = a + size
        assert pos == self.num_units, f"pieces cover {pos} of {self.num_units} units"
        for order, fl in enumerate(self.free_lists):
            s = set(fl)
            for a in fl:
                if order < self._top_order(a):
                    assert (a ^ (1 << order)) not in s, f"free buddies {a} and {a ^ (1 << order)} not merged"


ALLOCATORS.register("buddy", BuddyAllocatorConfig, BuddyAllocator.from_capacity)
