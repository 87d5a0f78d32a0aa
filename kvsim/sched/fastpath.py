"""The scheduler's hook for a lazy decode fast path (implemented in :mod:`kvsim.fast.group`).

The scheduler does not know how decode steps are made lazy; it knows only this protocol. The
engine installs an implementation with :meth:`kvsim.sched.scheduler.Scheduler.install_decode_path`
when the allocator's capabilities allow (``BulkDecodeGrowth`` + ``LazyLedger``), and a scheduler
without one schedules every running request one by one (the reference behaviour; results are the
same either way).

Freshness contract: a member's ``num_computed_tokens`` / ``num_generated`` may lag while it is a
member. The scheduler calls :meth:`DecodeFastPath.dissolve` before any phase that reads running
requests one by one (victim choice included), members leave synced (``advance`` returns finished
ones synced), and :meth:`DecodeFastPath.sync` brings every member up to date
(``Scheduler.sync_progress``, called by the engine at the end of a run and by
``check_invariants``). A policy (victim, router, reservation) therefore never sees stale progress:
victims are chosen after ``dissolve``, and routers and reservations read no progress counters.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class DecodeFastPath(Protocol):
    def __len__(self) -> int:
        """Members (running requests that decode one token per step, advanced lazily)."""
        ...

    def decode_step(self, num_running: int, budget_tokens: int) -> tuple[int, int, int]:
        """Phase 0 of ``schedule``: if all ``num_running`` running requests are members and the
        budget holds a token each, grow them all by one token (one allocator call) and return
        ``(decoding members, KV tokens read, KV pages read)``; else dissolve (syncing every member)
        and return ``(0, 0, 0)``."""
        ...

    def advance(self) -> list:
        """The step planned with ``decode_step`` completed: advance one step and return the members
        that generated their last token (synced, removed, in finish order)."""
        ...

    def join(self, req) -> None:
        """Add a running request that decodes one token in the next step."""
        ...

    def join_decoders(self, running: list) -> None:
        """Add every request of ``running`` that is not a member and decodes next step."""
        ...

    def dissolve(self) -> None:
        """Sync and release every member."""
        ...

    released: list
    """The members the last ``decode_step`` released by dissolving (empty if it did not)."""

    def use_known_growth(self) -> None:
        """Grow members with their blocks registered once their tokens are known (async scheduling
        with prefix caching; the allocator's KnownTokenBulkGrowth)."""
        ...

    def sync(self) -> None:
        """Write every member's lazy progress back (membership is kept)."""
        ...

    def check(self, running: list) -> None:
        """Assert the members are consistent (and all in ``running``)."""
        ...
