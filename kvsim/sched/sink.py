"""Where the scheduler writes requests that end: the :class:`RequestSink` protocol.

The scheduler owns requests while they are queued or running; when one finishes (``Scheduler._finish``)
or is rejected on arrival (``Scheduler.add_request``) or while planning (``swap_space_full``, a
preempted group that can never run again) it appends the request to its sink and drops it. The sink is owned above the scheduler: :func:`kvsim.simulate.run` builds one
:class:`kvsim.metrics.request_log.RequestLog` shared by every replica and hands it to each
:class:`~kvsim.sched.scheduler.Scheduler`. Declaring the protocol here keeps the import edge
one way (metrics imports sched, never the reverse; docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from kvsim.sched.request import Request


@runtime_checkable
class RequestSink(Protocol):
    """An append-only store of ended requests, possibly shared by several schedulers."""

    def append(self, req: Request) -> None:
        """Record ``req``, which has ended (finished, rejected, or left unfinished when a run
        stops); its fields no longer change and the caller drops it."""
        ...

    def column(self, name: str) -> np.ndarray:
        """One numeric column of the rows appended so far, in append order (a copy; used by the
        scheduler's invariant checks: ``request_id``, ``arrival_s``, ``finish_s``)."""
        ...

    @property
    def num_finished(self) -> int:
        """Rows appended with status FINISHED."""
        ...
