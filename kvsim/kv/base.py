"""The allocator boundary: what the scheduler may ask of any KV allocator (the protocol itself, and
the optional capabilities behind the fast paths, are declared in :mod:`kvsim.kv.protocol`).

The scheduler never sees block ids or addresses. It talks to an allocator in tokens:

* ``max_footprint_fits(req)`` -- could ``req`` ever be held, alone, in an empty cache? Requests
  that cannot are rejected at arrival instead of looping forever in preemption.
* ``allocate(req, hold_tokens)`` -- admit ``req`` holding room for ``hold_tokens`` tokens (all or
  nothing). Returns an :class:`Allocation` (how many leading tokens were found in a prefix cache and
  need no computing), or ``None``: "does not fit now", and nothing changed.
* ``ensure_slots(request_id, num_tokens)`` -- before a step computes tokens ``[c, num_tokens)``:
  make room for ``num_tokens`` tokens. On success the first ``num_tokens`` slots count as written
  (token states); ``False`` means "does not fit" and changes nothing, so the scheduler preempts
  and retries.
* ``free(request_id)`` -- release everything the request holds.
* ``usage(head)`` -- a :class:`KVUsage` snapshot; ``head`` is the request at the head of the waiting
  queue (external fragmentation is defined relative to it).
* ``check_invariants()`` -- raise ``AssertionError`` with a diagnostic message if internal state is
  inconsistent. Cheap enough to run after every step in tests.

Misuse (allocating a request twice, touching an unknown request, shrinking) raises ``ValueError``.

Memory accounting (all allocators; see docs/metrics.md). For each admitted request let ``A`` be the
slots it holds, ``W`` the slots written and ``F`` its final KV length (``prompt + output - 1``: the
last sampled token's KV is never computed). Then ``token_states = W``, ``reservation = min(A, F) - W``
and ``internal = A - min(A, F)``. ``free`` splits into ``external`` (free but unusable, below) and
``free``; the five parts sum to ``capacity``.
"""

from __future__ import annotations

from dataclasses import field

from kvsim.kv.protocol import KVAllocator  # noqa: F401  (re-exported: the declared boundary)
from kvsim.record import record


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@record  # one per request: slots keep a million of them small
class KVRequest:
    """What an allocator is told about a request when it is admitted (immutable)."""

    request_id: int
    prompt_tokens: int
    output_tokens: int  # the true output length; only the `oracle` reservation may look at it
    max_model_len_tokens: int
    # Content keys of the prompt's full blocks at the allocator's block size (equal key at index k
    # <=> equal prompt prefix up to block k's end); None = no prefix information.
    block_keys: object = field(default=None, compare=False, repr=False)
    priority: int = 0
    num_samples: int = 1  # parallel samples (or beams) decoding from the same prompt
    # Beam search: the request's prune/fork events (kvsim.kv.beam.BeamEvents); None = its
    # num_samples are independent parallel samples.
    beam_events: object = field(default=None, compare=False, repr=False)

    @property
    def final_kv_tokens(self) -> int:
        """Final KV length of one sequence (per sample)."""
        return self.prompt_tokens + self.output_tokens - 1


class SampleGeometry:
    """KV layout of a request with ``n`` parallel samples on ``bs``-token blocks (copy-on-write).

    The prompt's full blocks are shared by all samples (one physical copy, referenced n times).
    The prompt's partial last block is shared too until the first divergent write (the first
    generated token): then sample 0 keeps it and samples 1..n-1 each get a copy. Every sample's
    generated tokens go to its own blocks. ``num_tokens`` is a sequence's length (the same for
    every sample: they decode in lockstep).
    """

    __slots__ = ("n", "bs", "prompt", "full", "base", "partial")

    def __init__(self, num_samples: int, block_size: int, prompt_tokens: int):
        self.n = num_samples
        self.bs = block_size
        self.prompt = prompt_tokens
        self.full = prompt_tokens // block_size  # shared full prompt blocks
        self.base = self.full * block_size
        self.partial = prompt_tokens - self.base  # tokens in the shared partial block

    def blocks(self, num_tokens: int) -> int:
        """Distinct physical blocks holding sequences of ``num_tokens`` tokens."""
        if num_tokens <= self.prompt:
            return cdiv(num_tokens, self.bs)
        return self.full + self.n * cdiv(num_tokens - self.base, self.bs)

    def written(self, num_tokens: int) -> int:
        """Physical KV slots written, counting the copies of the partial block."""
        if num_tokens <= self.prompt:
            return num_tokens
        return self.prompt + (self.n - 1) * self.partial + self.n * (num_tokens - self.prompt)

    def seq_capacity(self, blocks: int) -> int:
        """Tokens one sequence can hold in ``blocks`` physical blocks once the samples diverged
        (for one sample: ``blocks * bs``)."""
        return self.base + (blocks - self.full) // self.n * self.bs


@record
class Allocation:
    """A successful admission. ``cached_tokens`` leading tokens were found in the prefix cache
    (already computed); the request's first step computes only the rest."""

    cached_tokens: int = 0
    # Of those, tokens found in lower tiers (offloaded prefix blocks) and loaded back, and the time
    # the loads take at the tiers' bandwidths.
    cpu_tokens: int = 0
    ssd_tokens: int = 0
    remote_tokens: int = 0  # from a prefix store shared by replicas
    load_s: float = 0.0


NO_HIT = Allocation(0)


@record
class KVUsage:
    """A snapshot of KV memory in token slots. The five parts sum to ``capacity_tokens``."""

    capacity_tokens: int
    token_states_tokens: int
    reservation_tokens: int
    internal_frag_tokens: int
    external_frag_tokens: int
    free_tokens: int
    num_requests: int
    cached_free_tokens: int = 0  # part of `free` holding reusable prefix-cache content
    # What the token states would occupy if nothing were shared (prefix blocks stored once per
    # owner, every parallel sample holding its own prompt copy); >= token_states_tokens.
    unshared_tokens: int = 0

    @property
    def used_tokens(self) -> int:
        return self.token_states_tokens + self.reservation_tokens + self.internal_frag_tokens


@record
class MemoryParts:
    """KV memory of a row in tokens: a snapshot (ints, :meth:`of`) or time-weighted means over the
    row's steps (floats). The first five parts sum to the capacity; ``peak_used`` is the most used
    (held) at any step of the row."""

    token_states: float
    reservation: float
    internal_frag: float
    external_frag: float
    free: float
    cached_free: float
    peak_used: float
    unshared: float

    @classmethod
    def of(cls, u: KVUsage) -> MemoryParts:
        return cls(u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens, u.external_frag_tokens,
                   u.free_tokens, u.cached_free_tokens, u.used_tokens, u.unshared_tokens)


@record
class UsageSums:
    """The allocator sums, in tokens, that a decode window's time-weighted memory means are built
    from (``WindowAllocator.usage_parts``): piecewise constant between the window's boundaries."""

    held_tokens: int  # sum over requests of the slots held
    useful_tokens: int  # sum of min(held, final): held slots the request will still write
    shared_tokens: int  # written slots shared with another owner (counted once in memory)
    cached_free_tokens: int  # free slots holding reusable prefix-cache content
    external_tokens: int  # free slots no request can use (external fragmentation)


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
