"""The decode group: running requests that decode one token per step, advanced lazily.

Most engine steps are "every running request decodes one token". Touching every request's
counters at each such step costs O(batch) Python per step; instead the group keeps a
``step_count`` (the number of group decode steps so far) and each member remembers the step count at which its
``num_computed_tokens`` / ``num_generated`` were last written (``Request.group_d0``). A member's
true counts are the stored ones plus ``clock - group_d0``; :meth:`sync` writes them back.

Members are ordered by finish key ``(clock value at which the member has generated all its output,
admission order)``: the order in which the step-by-step scheduler finishes them. So a step's
finishes are a prefix of the member list, and a decode window's batch sizes and KV reads follow
from the finish keys and one constant per member (``computed tokens - step_count``).

The group also keeps the pages (``block_size``-token blocks) its members' next decode step reads,
``sum ceil((computed_i + 1) / block_size)``, in O(block_size) per query: each base constant is kept
as ``q * block_size + r`` and the group counts members per remainder ``r``.

The engine creates one per replica (``Replica.install_fast_path``) and hands it to the scheduler,
which calls it only through :class:`kvsim.sched.fastpath.DecodeFastPath` (the scheduler decides
who joins and leaves). Its ``step_count`` counts group decode steps, not time: simulated time has one
owner, the engine's ``Replica.now_s``. It holds no KV state: growth goes through the allocator's
``grow_all_by_one`` and its ledger's running sums.
"""

from __future__ import annotations

import bisect

_SEQ_BITS = FINISH_KEY_SHIFT = 32  # finish key = finish clock << 32 | admit_seq
_SEQ_MASK = (1 << _SEQ_BITS) - 1


class DecodeGroup:
    __slots__ = ("step_count", "keys", "members", "base", "sum_base", "block_size", "sum_q", "res_count", "allocator",
                 "_grow", "released")

    def __init__(self, block_size: int | None = None, allocator=None) -> None:
        """``allocator``: the replica's allocator with ``grow_all_by_one`` and a ``ledger``
        (``BulkDecodeGrowth`` + ``LazyLedger``); needed only by :meth:`decode_step`."""
        self.allocator = allocator
        self._grow = None if allocator is None else allocator.grow_all_by_one
        self.released: list = []  # the members the last dissolve released (DecodeFastPath.released)
        self.step_count = 0
        self.keys: list[int] = []  # sorted finish keys
        self.members: list = []  # Requests, in key order
        self.base: list[int] = []  # computed tokens - clock, per member (constant while a member)
        self.sum_base = 0
        # pages: base = q * block_size + r (floor division); sum of q, and members per r
        self.block_size = block_size
        self.sum_q = 0
        self.res_count = [0] * (block_size or 1)

    def __len__(self) -> int:
        return len(self.keys)

    # -- the scheduler's hooks (kvsim.sched.fastpath.DecodeFastPath) ----------------------------
    def decode_step(self, num_running: int, budget_tokens: int) -> tuple[int, int, int]:
        """Phase 0: every running request is a member and the budget holds one token each: grow
        them all by one token in one allocator call (all or nothing). Returns (members decoding,
        KV tokens they read, KV pages they read); (0, 0, 0) after dissolving otherwise."""
        n = num_running
        self.released = []
        if n > 0 and len(self.keys) == n and n <= budget_tokens and self._grow():
            # each member reads its context + 1: the ledger's written sum after the growth (less the
            # finished requests whose KV async scheduling holds a step: paused, not members)
            return n, self.allocator.ledger.sum_growing_written, self.pages_read()
        self.dissolve()
        return 0, 0, 0

    def grow(self) -> bool:
        """One decode step's growth for every member, the allocator call :meth:`decode_step` makes
        (all or nothing; a decode window's steps after its first)."""
        return self._grow()

    def use_known_growth(self) -> None:
        """Async scheduling with prefix caching: grow through ``grow_all_by_one_known``
        (KnownTokenBulkGrowth), blocks registered once their tokens are known."""
        self._grow = self.allocator.grow_all_by_one_known

    def advance(self) -> list:
        """A step planned with :meth:`decode_step` completed: the step count moves on; returns the
        members that generated their last token (synced, removed, in finish order)."""
        self.step_count += 1
        if self.keys and (self.keys[0] >> _SEQ_BITS) == self.step_count:
            return self.pop_finished()
        return []

    def join_decoders(self, running: list) -> None:
        """Join every request of ``running`` that is not a member and decodes one token next step
        (after a step planned one request at a time)."""
        for r in running:
            if r.group_d0 < 0 and r.num_generated and r.num_computed_tokens == r.num_tokens - 1:
                self.join(r)

    def join(self, req) -> None:
        """Add a running request that is one token behind (it decodes next step)."""
        clock = self.step_count
        remaining = req.output_tokens - req.num_generated
        if req.group_d0 >= 0 or remaining <= 0 or req.num_computed_tokens != req.prompt_tokens + req.num_generated - 1:
            raise ValueError(f"{req} cannot join the decode group")
        if req.admit_seq > _SEQ_MASK:
            raise ValueError(f"{req}: admission counter out of range")
        req.group_d0 = clock
        key = ((clock + remaining) << _SEQ_BITS) | req.admit_seq
        i = bisect.bisect(self.keys, key)
        self.keys.insert(i, key)
        self.members.insert(i, req)
        b = req.num_computed_tokens - clock
        self.base.insert(i, b)
        self.sum_base += b
        if self.block_size is not None:
            q, r = divmod(b, self.block_size)
            self.sum_q += q
            self.res_count[r] += 1

    @staticmethod
    def _write_back(req, clock: int) -> None:
        delta = clock - req.group_d0
        req.num_computed_tokens += delta
        req.num_generated += delta
        req.group_d0 = clock

    def sync(self) -> None:
        """Bring every member's counters up to date (membership is kept)."""
        clock = self.step_count
        for r in self.members:
            if r.group_d0 != clock:
                self._write_back(r, clock)

    def dissolve(self) -> None:
        """Sync and release every member (before the scheduler treats requests one by one)."""
        clock = self.step_count
        for r in self.members:
            self._write_back(r, clock)
            r.group_d0 = -1
        self.released = self.members
        self.members = []
        self.keys.clear()
        self.base.clear()
        self.sum_base = 0
        self.sum_q = 0
        self.res_count = [0] * (self.block_size or 1)

    def pages_read(self) -> int:
        """Pages the members read in a decode step at the current step count (each reads
        ``computed + 1`` tokens): ``sum ceil((base_i + clock + 1) / block_size)``, or one per member
        without pages. With ``base = q*bs + r`` and ``step_count = Q*bs + R`` a member's term is
        ``q + 1 + Q + [r + R >= bs]``."""
        n = len(self.keys)
        bs = self.block_size
        if bs is None:
            return n
        big_q, rem = divmod(self.step_count, bs)
        return self.sum_q + n * (1 + big_q) + (sum(self.res_count[bs - rem:]) if rem else 0)

    def split_at(self, steps: int, min_stay: int = 0) -> tuple[list[int], list[int], int, int, int, list[int]]:
        """The members as a decode window of ``steps`` steps (from the current clock) needs them:
        those that finish inside it one by one, the others as sums (they read in every step).

        Returns ``(remaining, length0, n_stay, stay_base, stay_q, stay_res)``: for each member that
        finishes within ``steps`` (a prefix of the finish order), its remaining steps and the
        tokens it reads in the window's first step (``computed + 1``); then, over the other
        members, their count, the sum of their base constants, and (with pages) the sum of the
        quotients and the count per remainder of ``base = q * block_size + r``. If fewer than
        ``min_stay`` members would stay, every member is returned one by one (no sums)."""
        clock = self.step_count
        nf = bisect.bisect_left(self.keys, (clock + steps) << _SEQ_BITS)  # finish key < clock + steps
        if len(self.keys) - nf < min_stay:
            nf = len(self.keys)
        base = self.base
        head = base[:nf]
        remaining = [(key >> _SEQ_BITS) - clock for key in self.keys[:nf]]
        length0 = [b + clock + 1 for b in head]
        n_stay = len(base) - nf
        stay_q = self.sum_q
        stay_res = self.res_count
        bs = self.block_size
        if nf and n_stay and bs is not None:
            # the staying members' quotients and remainders: from whichever side is shorter
            if n_stay < nf:
                stay = base[nf:]
                stay_q = sum([b // bs for b in stay])
                stay_res = [0] * bs
                for b in stay:
                    stay_res[b % bs] += 1
            else:
                stay_q -= sum([b // bs for b in head])
                stay_res = stay_res.copy()
                for b in head:
                    stay_res[b % bs] -= 1
        return remaining, length0, n_stay, self.sum_base - sum(head), stay_q, stay_res

    def finish_step(self) -> int:
        """Clock value at which the first member finishes (group must not be empty)."""
        return self.keys[0] >> _SEQ_BITS

    def pop_finished(self) -> list:
        """Remove and return (synced, in finish order) the members that have generated all their
        output at the current step count."""
        end = bisect.bisect(self.keys, (self.step_count << _SEQ_BITS) | _SEQ_MASK)
        if not end:
            return []
        done = self.members[:end]
        gone = self.base[:end]
        self.sum_base -= sum(gone)
        bs = self.block_size
        if bs is not None:
            res = self.res_count
            sum_q = self.sum_q
            for b in gone:
                sum_q -= b // bs
                res[b % bs] -= 1
            self.sum_q = sum_q
        del self.keys[:end], self.members[:end], self.base[:end]
        clock = self.step_count
        for r in done:
            self._write_back(r, clock)
            r.group_d0 = -1
        return done

    def check(self, running: list | None = None) -> None:
        if running is not None:
            ids = {id(r) for r in running}
            assert all(id(r) in ids for r in self.members), "a decode-group member is not running"
        assert self.keys == sorted(self.keys), "decode group out of finish order"
        assert len(self.keys) == len(self.members) == len(self.base), "decode group lists disagree"
        assert self.sum_base == sum(self.base), "decode group base sum out of sync"
        bs = self.block_size
        if bs is not None:
            assert self.sum_q == sum(b // bs for b in self.base), "decode group page quotients out of sync"
            assert self.res_count == [sum(1 for b in self.base if b % bs == r) for r in range(bs)], \
                "decode group page remainders out of sync"
            pages = sum(-(-(b + self.step_count + 1) // bs) for b in self.base)
            assert self.pages_read() == pages, "decode group pages out of sync"
        clock = self.step_count
        for key, r, b in zip(self.keys, self.members, self.base):
            assert 0 <= r.group_d0 <= clock, f"{r}: group step count {r.group_d0} outside [0, {clock}]"
            lag = clock - r.group_d0
            computed, generated = r.num_computed_tokens + lag, r.num_generated + lag
            assert computed - clock == b, f"{r}: computed tokens out of sync with the group"
            assert computed == r.prompt_tokens + generated - 1, f"{r}: group member is not decoding"
            assert (key >> _SEQ_BITS) - clock == r.output_tokens - generated, f"{r}: wrong finish key"
            assert key & _SEQ_MASK == r.admit_seq, f"{r}: finish key has the wrong admission order"
