"""Contiguous KV allocator: one extent per request in a linear slot address space.

Each admitted request gets a single extent of ``reservation_tokens(policy, req)`` slots, placed
``first-fit`` (lowest address that fits) or ``best-fit`` (smallest free extent that fits, lowest
address on ties). Freed extents coalesce with free neighbours. Extents never move, so external
fragmentation is real: free slots split across holes smaller than the next request's reservation.

Invariants: extents and free holes are disjoint, sorted, tile ``[0, capacity)`` exactly, and no two
free holes are adjacent (they would have been coalesced).

External fragmentation for a snapshot: if the request at the head of the waiting queue does not fit
in the largest hole but would fit in the total free space, every free slot is external
fragmentation (free but unusable for it); otherwise the free slots outside the largest hole are.
"""

from __future__ import annotations

import bisect
from typing import Literal

from pydantic import Field

from kvsim.config_base import StrictModel
from kvsim.kv.base import NO_HIT, Allocation, KVRequest
from kvsim.kv.extent import ExtentAllocator
from kvsim.kv.reservation import ReservationChoice, reservation_field, reservation_policy, reservation_tokens
from kvsim.registry import ALLOCATORS


class ContiguousAllocatorConfig(StrictModel):
    kind: Literal["contiguous"] = "contiguous"
    reservation: reservation_field("max") = Field(  # type: ignore[valid-type]
        "max", description="max | pow2 | oracle, or {kind: NAME} (kvsim/kv/reservation.py)")
    placement: Literal["first-fit", "best-fit"] = "first-fit"


class ContiguousAllocator(ExtentAllocator):

    def __init__(self, capacity_tokens: int, reservation: ReservationChoice = "max",
                 placement: str = "first-fit"):
        if capacity_tokens < 1:
            raise ValueError("capacity must be at least one token")
        self.capacity_tokens = capacity_tokens
        self.reservation = reservation_policy(reservation)
        self.placement = placement
        self.hole_starts: list[int] = [0]  # sorted start addresses of free holes
        self.hole_sizes: list[int] = [capacity_tokens]
        self.extents: dict[int, tuple[int, int]] = {}  # request -> (start, size)
        self._init_ledger()

    @classmethod
    def from_capacity(cls, cfg: ContiguousAllocatorConfig, capacity_tokens: int, bytes_per_token: int = 0) -> "ContiguousAllocator":
        return cls(capacity_tokens, cfg.reservation, cfg.placement)

    def max_footprint_fits(self, req: KVRequest) -> bool:
        return reservation_tokens(self.reservation, req) <= self.capacity_tokens

    def extent(self, request_id: int) -> tuple[int, int]:
        return self.extents[request_id]

    def _find_hole(self, size: int) -> int:
        """Index of the hole to place ``size`` slots in, or -1."""
        best = -1
        for i, hole in enumerate(self.hole_sizes):
            if hole >= size:
                if self.placement == "first-fit":
                    return i
                if best < 0 or hole < self.hole_sizes[best]:
                    best = i
        return best

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        """Would ``allocate(req, hold_tokens)`` succeed now? (no side effects)"""
        return self._find_hole(reservation_tokens(self.reservation, req)) >= 0

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        self.ledger.require_new(req.request_id, hold_tokens)
        size = reservation_tokens(self.reservation, req)
        if hold_tokens > size:
            raise ValueError(f"request {req.request_id}: hold {hold_tokens} exceeds its reservation {size}")
        i = self._find_hole(size)
        if i < 0:
            return None
        start = self.hole_starts[i]
        if self.hole_sizes[i] == size:
            del self.hole_starts[i]
            del self.hole_sizes[i]
        else:
            self.hole_starts[i] += size
            self.hole_sizes[i] -= size
        self.extents[req.request_id] = (start, size)
        self._add_extent(req, size)
        return NO_HIT

    def free(self, request_id: int) -> None:
        self._remove_extent(request_id)
        start, size = self.extents.pop(request_id)
        i = bisect.bisect_left(self.hole_starts, start)
        # Coalesce with the previous and/or next hole when they touch.
        merge_prev = i > 0 and self.hole_starts[i - 1] + self.hole_sizes[i - 1] == start
        merge_next = i < len(self.hole_starts) and start + size == self.hole_starts[i]
        if merge_prev and merge_next:
            self.hole_sizes[i - 1] += size + self.hole_sizes[i]
            del self.hole_starts[i]
            del self.hole_sizes[i]
        elif merge_prev:
            self.hole_sizes[i - 1] += size
        elif merge_next:
            self.hole_starts[i] = start
            self.hole_sizes[i] += size
        else:
            self.hole_starts.insert(i, start)
            self.hole_sizes.insert(i, size)

    def largest_hole_tokens(self) -> int:
        return max(self.hole_sizes, default=0)

    def _external(self, head: KVRequest | None) -> int:
        free_total = self.capacity_tokens - self.ledger.sum_held
        largest = self.largest_hole_tokens()
        if head is not None:
            need = reservation_tokens(self.reservation, head)
            if largest < need <= free_total:
                return free_total
        return free_total - largest

    def check_invariants(self) -> None:
        self.ledger.check("contiguous")
        pieces = [(s, z, "hole") for s, z in zip(self.hole_starts, self.hole_sizes)]
        pieces += [(s, z, f"request {r}") for r, (s, z) in self.extents.items()]
        pieces.sort()
        pos = 0
        prev_kind = None
        for s, z, who in pieces:
            assert z > 0, f"{who}: empty piece at {s}"
            assert s == pos, f"{who} starts at {s}, expected {pos} (overlap or gap)"
            assert not (who == "hole" and prev_kind == "hole"), f"adjacent holes at {s} not coalesced"
            pos = s + z
            prev_kind = who
        assert pos == self.capacity_tokens, f"pieces cover {pos} of {self.capacity_tokens} slots"
        assert self.hole_starts == sorted(self.hole_starts), "hole list not sorted"
        for r, (s, z) in self.extents.items():
            assert self.ledger.held[r] == z, f"request {r}: extent {z} != held {self.ledger.held[r]}"


ALLOCATORS.register("contiguous", ContiguousAllocatorConfig, ContiguousAllocator.from_capacity)
