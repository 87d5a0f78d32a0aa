"""The slot ledger: per-request (held, written, final) slot counts with running sums, shared by the
allocators (:class:`SlotLedger`), and the lazy decode growth the decode group relies on."""

from __future__ import annotations

from kvsim.kv.base import KVUsage


class SlotLedger:
    """Per-request (held, written, final) slot counts with running sums, shared by all allocators.

    Keeps ``sum(W)``, ``sum(min(A, F))`` and ``sum(A)`` incrementally so a usage snapshot is O(1).

    Decode steps are lazy: :meth:`grow_all_by_one` ("every request writes one more token") only
    advances a ``step_count``; a request's written count is its stored offset plus the step count.
    With ``track_boundaries`` the ledger also keeps, by step count, the set of requests whose written
    count reaches their held slots then, so a decode step touches only the requests that need a
    new block (about one in ``block_size`` per step), not every request.
    """

    __slots__ = ("held", "_woff", "final", "sum_held", "sum_written", "sum_useful", "step_count", "_bounds",
                 "_track", "paused")

    def __init__(self, track_boundaries: bool = False) -> None:
        self.held: dict[int, int] = {}
        self._woff: dict[int, int] = {}  # written - step_count
        self.final: dict[int, int] = {}
        self.sum_held = 0
        self.sum_written = 0
        self.sum_useful = 0  # sum of min(A, F)
        self.step_count = 0  # decode steps taken by grow_all_by_one
        # step count at which written == held -> the requests for which it is (exactly; kept up to
        # date on every change of held or written)
        self._bounds: dict[int, set[int]] = {}
        self._track = track_boundaries
        # requests whose written count stays put while the others grow (async scheduling: finished,
        # their KV held a step; :meth:`pause`); not in the boundary sets
        self.paused: set[int] = set()

    def __contains__(self, request_id: int) -> bool:
        return request_id in self.held

    def __len__(self) -> int:
        return len(self.held)

    def written_of(self, request_id: int) -> int:
        return self._woff[request_id] + self.step_count

    def _unbound(self, request_id: int) -> None:
        """Forget where ``request_id`` fills its held slots (before its held or written count changes)."""
        if request_id in self.paused:
            return
        key = self.held[request_id] - self._woff[request_id]
        bucket = self._bounds[key]
        bucket.discard(request_id)
        if not bucket:
            del self._bounds[key]

    def _bound(self, request_id: int) -> None:
        """Record where ``request_id`` fills its held slots (after its held or written count changed)."""
        if request_id in self.paused:
            return
        key = self.held[request_id] - self._woff[request_id]
        bucket = self._bounds.get(key)
        if bucket is None:
            self._bounds[key] = {request_id}
        else:
            bucket.add(request_id)

    def add(self, request_id: int, final_tokens: int, held_tokens: int) -> None:
        if request_id in self.held:
            raise ValueError(f"request {request_id} is already allocated")
        self.held[request_id] = held_tokens
        self._woff[request_id] = -self.step_count
        self.final[request_id] = final_tokens
        self.sum_held += held_tokens
        self.sum_useful += min(held_tokens, final_tokens)
        if self._track:
            self._bound(request_id)

    def set_held(self, request_id: int, held_tokens: int) -> None:
        if self._track:
            self._unbound(request_id)
        old = self.held[request_id]
        f = self.final[request_id]
        self.held[request_id] = held_tokens
        self.sum_held += held_tokens - old
        self.sum_useful += min(held_tokens, f) - min(old, f)
        if self._track:
            self._bound(request_id)

    def set_written(self, request_id: int, written_tokens: int) -> None:
        old = self._woff[request_id] + self.step_count
        if written_tokens > self.held[request_id]:
            raise ValueError(f"request {request_id}: {written_tokens} written > {self.held[request_id]} held")
        if written_tokens == old:
            return
        if self._track:
            self._unbound(request_id)
        self._woff[request_id] = written_tokens - self.step_count
        self.sum_written += written_tokens - old
        if self._track:
            self._bound(request_id)

    def remove(self, request_id: int) -> None:
        if request_id not in self.held:
            raise ValueError(f"request {request_id} is not allocated")
        if self._track:
            self._unbound(request_id)
        a = self.held.pop(request_id)
        self.paused.discard(request_id)
        w = self._woff.pop(request_id) + self.step_count
        f = self.final.pop(request_id)
        self.sum_held -= a
        self.sum_written -= w
        self.sum_useful -= min(a, f)

    def require(self, request_id: int) -> None:
        if request_id not in self.held:
            raise ValueError(f"request {request_id} is not allocated")

    def require_new(self, request_id: int, hold_tokens: int) -> None:
        """Misuse checks of ``allocate``: the request is not held yet and asks for >= 1 slot."""
        if request_id in self.held:
            raise ValueError(f"request {request_id} is already allocated")
        if hold_tokens < 1:
            raise ValueError(f"hold_tokens must be >= 1, got {hold_tokens}")

    def usage(self, capacity_tokens: int, external_tokens: int, shared_tokens: int = 0,
              cached_free_tokens: int = 0, unshared_extra_tokens: int = 0) -> KVUsage:
        """``shared_tokens``: slots counted by more than one owner (full prefix blocks shared by
        reference count); they are subtracted once per extra owner so the parts stay physical."""
        free_total = capacity_tokens - (self.sum_held - shared_tokens)
        return KVUsage(
            capacity_tokens=capacity_tokens,
            token_states_tokens=self.sum_written - shared_tokens,
            reservation_tokens=self.sum_useful - self.sum_written,
            internal_frag_tokens=self.sum_held - self.sum_useful,
            external_frag_tokens=external_tokens,
            free_tokens=free_total - external_tokens,
            num_requests=len(self.held),
            cached_free_tokens=cached_free_tokens,
            unshared_tokens=self.sum_written + unshared_extra_tokens,
        )

    def grow_all_by_one(self, block_size: int, free_blocks: int) -> int:
        """Every request writes one more token (a decode step for all). A request whose next token
        does not fit its held slots takes one more ``block_size`` block. Returns the number of blocks
        taken, or -1 (and changes nothing) if more than ``free_blocks`` would be needed.
        Needs ``track_boundaries``: only the requests at a block boundary are touched."""
        done, taken = self.grow_steps(block_size, free_blocks, 1, 0, [])
        return taken if done else -1

    def grow_steps(self, block_size: int, free_blocks: int, steps: int, first_step: int,
                   changes: list) -> tuple[int, int]:
        """:meth:`grow_all_by_one` up to ``steps`` times in a row, stopping before the first step that
        needs more blocks than are left of ``free_blocks``. After every step that took blocks,
        appends ``(first_step + i, sum_held, sum_useful)`` to ``changes``. Returns ``(steps done,
        blocks taken)``; the same state as that many single calls (decode windows)."""
        if not self._track:
            raise ValueError("grow_steps needs a ledger that tracks block boundaries")
        bounds, held, final = self._bounds, self.held, self.final
        clock = self.step_count
        left = free_blocks
        end = clock + steps
        sum_held, sum_useful = self.sum_held, self.sum_useful
        offset = first_step - clock  # window step of ledger step ``clock``
        while clock < end:
            full = bounds.get(clock)  # requests whose held slots are all written
            if full:
                need = len(full)
                if need > left:
                    break
                left -= need
                del bounds[clock]
                useful = 0
                for r in full:
                    h = held[r]  # == written < final: the request still decodes
                    h2 = held[r] = h + block_size
                    f = final[r]
                    useful += (h2 if h2 < f else f) - h
                nxt = bounds.get(clock + block_size)  # each is full again block_size steps on
                if nxt is None:
                    bounds[clock + block_size] = full
                else:
                    nxt |= full
                sum_held += need * block_size
                sum_useful += useful
                changes.append((offset + clock, sum_held, sum_useful))
            clock += 1
        done = clock - self.step_count
        self.sum_held, self.sum_useful = sum_held, sum_useful
        self.sum_written += done * (len(held) - len(self.paused))
        if self.paused:  # their written counts stay put
            woff = self._woff
            for r in self.paused:
                woff[r] -= done
        self.step_count = clock
        return done, free_blocks - left

    def full_at(self, step: int):
        """The requests whose written count equals their held slots at step count ``step`` (so the
        decode step from ``step`` needs a new block for each); needs ``track_boundaries``. The set
        is the ledger's own: read it, do not keep or change it."""
        if not self._track:
            raise ValueError("full_at needs a ledger that tracks block boundaries")
        return self._bounds.get(step, ())

    @property
    def sum_growing_written(self) -> int:
        """``sum_written`` over the requests that grow with the step count (the paused ones left out)."""
        if not self.paused:
            return self.sum_written
        woff, clock = self._woff, self.step_count
        return self.sum_written - sum([woff[r] + clock for r in self.paused])

    def pause(self, request_id: int) -> None:
        """``request_id`` writes nothing more while the others grow (async scheduling: finished, its KV
        held until the next step ends); it stays paused until removed."""
        if request_id not in self.paused:
            if self._track:
                self._unbound(request_id)
            self.paused.add(request_id)

    def stop_tracking_boundaries(self) -> None:
        """No bulk decode growth will be asked of this ledger (no lazy decode group in this run): stop
        keeping the block boundaries, which every slot change would otherwise pay for."""
        self._track = False
        self._bounds.clear()

    def set_written_many(self, request_ids, written_tokens) -> None:
        """Bulk ``set_written`` (each value within the request's held slots)."""
        for r, w in zip(request_ids, written_tokens):
            self.set_written(r, w)

    def check(self, who: str) -> None:
        written = {r: o + self.step_count for r, o in self._woff.items()}
        assert self.sum_held == sum(self.held.values()), f"{who}: sum_held out of sync"
        assert self.sum_written == sum(written.values()), f"{who}: sum_written out of sync"
        useful = sum(min(a, self.final[r]) for r, a in self.held.items())
        assert self.sum_useful == useful, f"{who}: sum_useful out of sync"
        for r, a in self.held.items():
            w = written[r]
            assert 0 <= w <= a, f"{who}: request {r} written {w} outside [0, held {a}]"
            assert w <= self.final[r], f"{who}: request {r} written {w} beyond final {self.final[r]}"
        assert self.paused <= self.held.keys(), f"{who}: a paused request is not held"
        if self._track:
            for r, a in self.held.items():
                if r not in self.paused:
                    assert r in self._bounds.get(a - self._woff[r], ()), \
                        f"{who}: request {r}'s block boundary is not tracked"
            assert sum(len(b) for b in self._bounds.values()) == len(self.held) - len(self.paused), \
                f"{who}: stale block boundaries"
            assert all(self._bounds.values()), f"{who}: empty boundary set kept"
