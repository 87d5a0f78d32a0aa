"""Beam search: ``W`` beams that share the prompt and their common generated prefix, fork at
divergence and free pruned branches (``docs/beam_search.md``).

Two pieces, one owner each:

* :class:`BeamModel` (built from the scenario's ``beam_search:`` section and ``seed``) decides,
  per request, *where* beams are pruned and forked: a seeded divergence model. Its output, a
  :class:`BeamEvents`, travels with the request's :class:`~kvsim.kv.base.KVRequest`, so every
  allocator (and every engine mode) sees the same events.
* :class:`BeamTables` is the block-level state of one request's beams on a paged allocator: one
  block table per beam over ref-counted blocks. A fork shares every full block of the source beam
  (reference count + 1) and copies its partial last block (copy-on-write); a prune drops the pruned
  beam's references and frees the blocks no other beam holds.

The divergence model: for each KV position ``p`` a decode step writes after the first divergent one
(``prompt + 2 .. final``), with probability ``fork_prob`` one beam (uniform over ``W``) is pruned
and replaced by a fork of another beam (uniform over the other ``W - 1``) at its current length,
just before position ``p`` is written. The draws come from ``numpy.random.default_rng((seed,
request_id))``, so a request's events depend only on the scenario seed, its id and its lengths.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvsim.kv.base import cdiv


# Probability, per decode position and beam request, that one beam is pruned and another forks.
# No public number: how often the top-W set changes depends on the model, the data and the length
# penalty; it is a free parameter of the model (docs/beam_search.md), swept by the study.
DEFAULT_FORK_PROB = 0.05


@dataclass(frozen=True)
class BeamEvents:
    """One request's prune/fork events, in position order: before KV position ``positions[k]`` is
    written, beam ``pruned[k]`` is dropped and becomes a fork of beam ``source[k]``."""

    width: int
    positions: tuple[int, ...]
    pruned: tuple[int, ...]
    source: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.positions)

    def between(self, lo_tokens: int, hi_tokens: int) -> range:
        """Indices of the events at positions in ``(lo_tokens, hi_tokens]``."""
        pos = self.positions
        return range(bisect_right(pos, lo_tokens), bisect_right(pos, hi_tokens))


@dataclass(frozen=True)
class BeamModel:
    """The seeded divergence model (``fork_prob`` per decode position and request)."""

    fork_prob: float
    seed: int

    def events(self, request_id: int, prompt_tokens: int, output_tokens: int, width: int) -> BeamEvents:
        first = prompt_tokens + 2  # position prompt + 1 is the first divergent write (all beams differ)
        final = prompt_tokens + output_tokens - 1
        m = final - first + 1
        if width < 2 or m <= 0 or self.fork_prob <= 0.0:
            return BeamEvents(width, (), (), ())
        rng = np.random.default_rng((self.seed, request_id))
        hit = rng.random(m) < self.fork_prob
        pruned = rng.integers(0, width, m)
        source = rng.integers(0, width - 1, m)
        source = source + (source >= pruned)  # any beam but the pruned one
        idx = np.flatnonzero(hit)
        return BeamEvents(width, tuple((idx + first).tolist()), tuple(pruned[idx].tolist()),
                          tuple(source[idx].tolist()))


class BeamTables:
    """The beams of one request on ``block_size``-token blocks.

    ``tables[i]`` is beam ``i``'s block table; ``refs[b]`` the number of beams whose table holds
    block ``b``. Block ids come from the allocator through ``take`` / ``give`` (physical ids for the
    paged allocator, plain counters for the counting one). Until the first generated position all
    beams share one table (the prompt); at position ``prompt + 1`` beam 0 keeps the prompt's partial
    block and the others copy it (as parallel samples do); after that forks and prunes follow the
    request's :class:`BeamEvents`.
    """

    __slots__ = ("bs", "width", "prompt", "seq_len", "tables", "refs", "events", "forks", "copied_tokens")

    def __init__(self, events: BeamEvents, block_size: int, prompt_tokens: int, hold_tokens: int,
                 take: Callable[[], int]):
        self.bs = block_size
        self.width = events.width
        self.prompt = prompt_tokens
        self.events = events
        self.forks = 0
        self.copied_tokens = 0  # KV slots copied at forks (the copied partial blocks)
        self.refs: dict[int, int] = {}
        if hold_tokens <= prompt_tokens:  # admission: one shared table
            shared = [take() for _ in range(cdiv(hold_tokens, block_size))]
            self.tables = [shared] * self.width  # the same list object while undiverged
            for b in shared:
                self.refs[b] = self.width
            self.seq_len = 0
        else:  # a recomputed readmission: diverged beams sharing the prompt's full blocks
            full = prompt_tokens // block_size
            shared = [take() for _ in range(full)]
            for b in shared:
                self.refs[b] = self.width
            own = cdiv(hold_tokens - full * block_size, block_size)
            self.tables = []
            for _ in range(self.width):
                t = shared + [take() for _ in range(own)]
                for b in t[full:]:
                    self.refs[b] = 1
                self.tables.append(t)
            self.seq_len = 0

    @property
    def diverged(self) -> bool:
        return self.tables[0] is not self.tables[1]

    def num_blocks(self) -> int:
        return len(self.refs)

    def seq_capacity_tokens(self) -> int:
        """Tokens every beam can hold in the blocks it holds now."""
        return min(len(t) for t in self.tables) * self.bs

    def blocks_needed(self, num_tokens: int) -> int:
        """Net blocks :meth:`advance` to ``num_tokens`` takes (blocks taken minus blocks freed)."""
        probe = BeamTables.__new__(BeamTables)
        probe.bs, probe.width, probe.prompt, probe.events = self.bs, self.width, self.prompt, self.events
        probe.seq_len, probe.forks, probe.copied_tokens = self.seq_len, 0, 0
        probe.refs = dict(self.refs)
        probe.tables = [list(t) for t in self.tables] if self.diverged else [list(self.tables[0])] * self.width
        counter = iter(range(-1, -(1 << 62), -1))  # fresh ids that clash with no real block
        before = len(probe.refs)
        probe.advance(num_tokens, lambda: next(counter), lambda b: None)
        return len(probe.refs) - before

    def advance(self, num_tokens: int, take: Callable[[], int], give: Callable[[int], None]) -> None:
        """Grow every beam to ``num_tokens`` KV slots, applying the events on the way."""
        bs = self.bs
        if not self.diverged and num_tokens <= self.prompt:
            t = self.tables[0]
            while len(t) * bs < num_tokens:
                b = take()
                t.append(b)
                self.refs[b] = self.width
            self.seq_len = max(self.seq_len, num_tokens)
            return
        if not self.diverged:
            # Fill the prompt, then the first divergent write: the others copy the partial block.
            t = self.tables[0]
            while len(t) * bs < self.prompt:
                b = take()
                t.append(b)
                self.refs[b] = self.width
            self._diverge(take)
            self.seq_len = max(self.seq_len, self.prompt)
        ev = self.events
        for p in range(self.seq_len + 1, num_tokens + 1):
            for k in ev.between(p - 1, p):
                self._fork(ev.pruned[k], ev.source[k], p - 1, take, give)
            for t in self.tables:  # a beam whose blocks are full starts a new one
                if len(t) * bs < p:
                    b = take()
                    t.append(b)
                    self.refs[b] = 1
        self.seq_len = max(self.seq_len, num_tokens)

    def _diverge(self, take: Callable[[], int]) -> None:
        shared = self.tables[0]
        tables = [shared]
        full = self.prompt // self.bs
        for _ in range(1, self.width):
            tables.append(list(shared))
        if self.prompt % self.bs:
            last = shared[-1]
            self.refs[last] = 1  # beam 0 keeps it
            for t in tables[1:]:
                b = take()
                t[-1] = b
                self.refs[b] = 1
        for b in shared[:full]:
            self.refs[b] = self.width
        self.tables = tables

    def _fork(self, pruned: int, source: int, length: int, take, give) -> None:
        """Beam ``pruned`` is dropped and becomes a copy of beam ``source`` at ``length`` tokens."""
        refs = self.refs
        for b in self.tables[pruned]:
            refs[b] -= 1
            if refs[b] == 0:
                del refs[b]
                give(b)
        src = self.tables[source]
        full = length // self.bs
        t = src[:full]
        for b in t:
            refs[b] += 1
        part = length - full * self.bs
        if part:  # copy-on-write of the partial last block
            b = take()
            t.append(b)
            refs[b] = 1
            self.copied_tokens += part
        self.tables[pruned] = t
        self.forks += 1

    def written_slots(self) -> int:
        """Physical KV slots written: each distinct block's filled slots (a shared block sits at the
        same index of every table that holds it)."""
        n, bs = self.seq_len, self.bs
        if not self.diverged:
            return n
        seen: set[int] = set()
        total = 0
        for t in self.tables:
            for i, b in enumerate(t):
                if b not in seen:
                    seen.add(b)
                    total += min(bs, max(0, n - i * bs))
        return total

    def check(self, who: str) -> None:
        counts: dict[int, int] = {}
        tables = self.tables if self.diverged else self.tables[:1]
        mult = 1 if self.diverged else self.width
        for t in tables:
            assert len(set(t)) == len(t), f"{who}: a beam holds a block twice"
            assert len(t) * self.bs >= self.seq_len, f"{who}: a beam holds fewer slots than its length"
            for b in t:
                counts[b] = counts.get(b, 0) + mult
        assert counts == self.refs, f"{who}: beam reference counts disagree with the beams' tables"
