"""The scheduler's executable invariants (run after every step with ``check_invariants``): queue
membership and order, batch limits, the host tier's bookkeeping, the request log, then the
allocator's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from kvsim.sched.request import RequestStatus

if TYPE_CHECKING:
    from kvsim.sched.scheduler import Scheduler


def check_scheduler(sched: Scheduler) -> None:
    """Assert ``sched``'s invariants (an AssertionError names the first that fails)."""
    if sched._decode is not None:
        sched._decode.sync()
        sched._decode.check(sched.running)
    assert sched.num_running_seqs() <= sched.max_num_seqs, "more running sequences than max_num_seqs"
    seqs = [r.admit_seq for r in sched.running]
    assert seqs == sorted(seqs), "running list is not in admission order"
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING, f"{r} in running list"
        assert sched.allocator.held_tokens(r.request_id) >= r.num_computed_tokens, f"{r}: computed > held"
        assert 0 <= r.num_computed_tokens <= r.num_tokens, f"{r}: computed out of range"
    for r in sched._chunks:  # prompts the last step cut: still short of their tokens while running
        assert r.status != RequestStatus.RUNNING or r.num_computed_tokens < r.num_tokens, f"{r}: cut but caught up"
    for r in sched.waiting:
        assert r.status == RequestStatus.WAITING, f"{r} in waiting queue"
        assert r.num_computed_tokens == 0, f"{r}: waiting with computed tokens"
    for r in sched._finishing:  # async scheduling: finished for the client, KV held until the next step ends
        assert r.num_generated == r.output_tokens, f"{r}: finishing before its last token"
        assert r.status in (RequestStatus.RUNNING, RequestStatus.WAITING), f"{r}: finishing with status {r.status}"
    held = [t for _, t, _ in sched._held]
    assert held == sorted(held), "held arrivals out of arrival order"
    assert sched.swapped is sched.host.queue, "the swapped queue is not the host tier's"
    sched.host.check()
    ids = [r.request_id for r in sched.running] + [r.request_id for r in sched.waiting] + \
        [r.request_id for r in sched.swapped]
    assert len(ids) == len(set(ids)), "a request is queued twice"
    assert not set(ids) - set(sched.requests) - {r.request_id for r in sched.waiting if r.admit_seq < 0}, \
        "a running, swapped or preempted request is missing from the requests map"
    ended = sched.log.column("request_id")  # finished and rejected, of every replica sharing the log
    assert len(ended) == len(np.unique(ended)), "a request finished (or was rejected) twice"
    assert not set(ids) & set(ended.tolist()), "a request is queued after it ended"
    assert (sched.log.column("finish_s") >= sched.log.column("arrival_s")).sum() \
        == sched.log.num_finished, "a request finished before it arrived"
    sched.allocator.check_invariants()
