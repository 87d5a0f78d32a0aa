"""Decode windows: advancing many identical-shaped decode steps at once, exactly.

Most engine steps differ from the previous one only in context lengths: every running request
decodes one token, nobody is admitted or preempted. :func:`plan_decode_window` recognises such a
step (already scheduled the ordinary way) and describes the steps that would follow it as
arrays; the engine prices them with the timing model's vectorised ``decode_durations`` and cuts
the window where something could change the schedule; :func:`apply_decode_window` then replays
only the events inside it -- block allocations (in the exact order the step-by-step scheduler
would make them) and finishes -- and advances every request in bulk.

A window of K steps starting with the scheduled step 0 is exact when, for steps 1..K-1:
* the waiting and swapped queues are empty and no request arrives before the step starts (an
  arrival could be admitted); or the waiting queue's head is blocked and stays blocked: between
  finishes free memory only shrinks and the token budget and ``max_num_seqs`` do not change, and at
  each finish the head is tested against the state after the finish *without* the step's block
  allocations -- an optimistic test, since those allocations only take free blocks and can only
  evict cached blocks the head would hit -- and the window ends there if the head might fit;
  while requests are swapped out the window ends at the first finish;
* step 0 swaps nothing in (even a swap-in that moves no bytes, its blocks still cached: the
  scheduler does not try the waiting head in such a step under prompt-only steps, so the head's
  blocked state at step 0 says nothing about step 1);
* every block a request needs is free at the window's start (frees inside the window are ignored
  for this bound, which only makes windows shorter), so no preemption happens;
* with async scheduling (kvsim.sched.async_sched) a finish holds its KV and running place until
  the next step ends, the head is tested when finishes are released (the step's own finishes
  still held), and no window opens while arrivals are held for the next plan or while step 0 holds
  the last step's finishes.

Two implementations share these rules. With an allocator that grows every request by one token
in one call (both paged allocators -- the block-id one takes and registers blocks at block
boundaries in allocation order --, contiguous, buddy) all running requests are members of the
replica's lazy decode group (:mod:`kvsim.fast.group`): :func:`plan_group_window` builds the
arrays from the group's finish keys and :func:`apply_group_window` advances step by step through
the allocator, which touches only requests at a block boundary, so a window costs O(steps +
events) instead of O(running requests); it counts frees inside the window exactly and stops where
a block is not free. Allocators without that call (radix), requests with parallel samples, the
block-id paged allocator under swap preemption, and steps planned one request at a time use
:func:`plan_decode_window` / :func:`block_limited_steps` / :func:`apply_decode_window`, which
replay block allocations request by request.

This module holds the window arrays (:class:`DecodeWindow`), the request-by-request
implementation and the page counts both use; the group implementation is
:mod:`kvsim.fast.group_window`, a window's time-weighted means :mod:`kvsim.fast.means`, and
backlogged windows' step-by-step pricing :mod:`kvsim.fast.stepwise`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.fast.means import Segments
from kvsim.sched.request import RequestStatus

_add = np.add.reduce  # == ndarray.sum (the same reduction), without its Python-level wrapper
_acc = np.add.accumulate  # == np.cumsum, likewise


@dataclass
class DecodeWindow:
    requests: list  # running requests, admission order
    remaining: np.ndarray  # steps until each request finishes, counting step 0
    computed0: np.ndarray  # computed tokens before step 0
    num_seqs: np.ndarray  # sequences decoding in step j
    kv_tokens_read: np.ndarray  # KV tokens read by step j
    max_steps: int
    samples: np.ndarray | None  # sequences (parallel samples) per request (None in a group window: one each)
    written: np.ndarray  # physical KV slots written after step j's scheduling
    num_requests: np.ndarray  # requests scheduled in step j (the rows' batch size)
    kv_pages_read: np.ndarray  # pages (blocks) attention reads in step j (see BatchShape.kv_pages_read)
    # the sequences' lengths summed over every request holding KV in step j (MemoryParts.unshared):
    # None = kv_tokens_read (every request holding KV reads it), else with the held finishes of async scheduling
    unshared: np.ndarray | None = None


def plan_decode_window(sched, plan, max_steps: int) -> DecodeWindow | None:
    """The candidate window after ``plan`` (step 0), or None if step 0 is not a pure decode step."""
    shape = plan.shape
    if plan.admitted or plan.preempted or plan.swapped_in or shape.num_prefill_seqs or shape.swap_out_bytes \
            or shape.tier_load_s or sched.holds_arrivals:
        return None
    running = sched.running
    b = len(running)
    samples = np.fromiter((r.num_samples for r in running), np.int64, b) if sched.has_parallel_samples else None
    if b == 0 or shape.num_decode_seqs != (b if samples is None else int(samples.sum())):
        return None
    remaining = np.fromiter((r.output_tokens - r.num_generated for r in running), np.int64, b)
    kcap = min(max_steps, int(remaining.min()) if sched.swapped else int(remaining.max()))
    if kcap < 2:
        return None
    computed0 = np.fromiter((r.num_computed_tokens for r in running), np.int64, b)
    j = np.arange(kcap, dtype=np.int64)
    order = np.argsort(remaining, kind="stable")
    done_by = np.searchsorted(remaining[order], j, side="right")  # requests finished before step j
    w = np.ones(b, np.int64) if samples is None else samples  # sequences per request
    wsum = np.concatenate(([0], np.cumsum(w[order])))
    num_seqs = wsum[-1] - wsum[done_by]
    csum = np.concatenate(([0], np.cumsum((w * computed0)[order])))
    kv_read = (csum[-1] - csum[done_by]) + num_seqs * (j + 1)
    written = kv_read
    if samples is not None:
        # Physical slots written differ from the sequences' lengths by a per-request constant
        # (shared prompt blocks are stored once): subtract it while the request is active.
        alloc = sched.allocator
        off = np.fromiter((alloc.written_offset_tokens(r.request_id) for r in running), np.int64, b)
        osum = np.concatenate(([0], np.cumsum(off[order])))
        written = kv_read - (osum[-1] - osum[done_by])
    unshared = None
    if sched.async_scheduling:
        held, held_offset = _held_tokens(sched, running, remaining, computed0, w, kcap)
        unshared = kv_read + held
        written = unshared if held_offset is None else written + (held - held_offset)
    rem_sorted = remaining[order]
    pages = pages_per_step(rem_sorted, (computed0 + 1)[order], None if samples is None else w[order], done_by,
                           sched.allocator.block_size)
    return DecodeWindow(list(running), remaining, computed0, num_seqs, kv_read, kcap, w, written, b - done_by, pages,
                        unshared)


def _held_tokens(sched, running: list, remaining: np.ndarray, computed0: np.ndarray, w: np.ndarray,
                 kcap: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Async scheduling: the tokens still held in step j by the requests that finished at the end of
    step j - 1 (their KV kept a step, kvsim.sched.async_sched): each sample's ``computed0 + j``; and,
    with parallel samples, the slots those requests share (which ``written`` subtracts while they run)."""
    held = np.zeros(kcap, np.int64)
    offset = np.zeros(kcap, np.int64) if sched.has_parallel_samples else None
    last = remaining < kcap
    if last.any():
        np.add.at(held, remaining[last], (w * (computed0 + remaining))[last])
        if offset is not None:
            alloc = sched.allocator
            off = np.fromiter((alloc.written_offset_tokens(r.request_id) for r in running), np.int64, len(running))
            np.add.at(offset, remaining[last], off[last])
    return held, offset


def block_limited_steps(sched, win: DecodeWindow, k: int):
    """Cut ``k`` so every block the window allocates is free now. Returns (k, pop events) with the
    events as (step, running index) in the order the step-by-step scheduler would allocate."""
    alloc = sched.allocator
    bs = alloc.block_size
    if bs is None:  # contiguous / buddy: extents already hold every token
        return k, np.zeros(0, np.int64), np.zeros(0, np.int64)
    if sched.caps.bulk_slots:
        cap0 = np.array(alloc.seq_capacities([r.request_id for r in win.requests]), dtype=np.int64)
    else:
        cap0 = np.fromiter((alloc.seq_capacity_tokens(r.request_id) for r in win.requests), np.int64,
                           len(win.requests))
    written0 = win.computed0 + 1  # a sequence's length after step 0
    first = cap0 - written0 + 1  # first step whose token does not fit in the blocks held now
    last = np.minimum(win.remaining, k)  # steps 0..last-1 are active
    count = np.where(first < last, (last - first + bs - 1) // bs, 0)
    total = int(count.sum())
    if total == 0:
        return k, np.zeros(0, np.int64), np.zeros(0, np.int64)
    idx = np.repeat(np.arange(len(count), dtype=np.int64), count)
    starts = np.cumsum(count) - count
    m = np.arange(total, dtype=np.int64) - np.repeat(starts, count)
    steps = np.repeat(first, count) + m * bs
    order = np.lexsort((idx, steps))
    steps, idx = steps[order], idx[order]
    blocks = np.cumsum(win.samples[idx])  # each event takes one block per sample
    free0 = alloc.num_free_blocks
    if blocks[-1] > free0:
        k = min(k, int(steps[np.searchsorted(blocks, free0, side="right")]))
        keep = steps < k
        steps, idx = steps[keep], idx[keep]
    return k, steps, idx


def apply_decode_window(sched, win: DecodeWindow, k: int, times: np.ndarray, pop_steps: np.ndarray,
                        pop_idx: np.ndarray, on_finish=None):
    """Advance the scheduler through steps 0..k-1 of ``win`` (step 0 was planned by ``schedule``).

    ``times[j]`` is the start of step j (``times[k]`` the end). Returns the number of steps actually
    advanced (``k`` or fewer, when the blocked head of the waiting queue might fit after a finish)
    and the usage :class:`Segments`. With async scheduling (kvsim.sched.async_sched) a finished
    request's KV and running place are held until the next step ends: the head is tested when they
    are released, with the step's own finishes still held.
    """
    sched.take_plan()  # step 0 completes here, with the rest of the window
    alloc = sched.allocator
    reqs = win.requests
    head = sched.waiting.head.kv if sched.waiting.head is not None and not sched.swapped else None
    segments = Segments(alloc.usage_parts(head))
    rem = win.remaining
    finishing = {}
    for i in np.flatnonzero(rem <= k):
        finishing.setdefault(int(rem[i]), []).append(int(i))
    fin_steps = sorted(s for s in finishing if s < k)
    # Walk boundaries in step order, touching only the pop events before the window stops (a
    # saturated engine stops at its first finish, long before most planned events).
    pop_list = pop_steps.tolist()
    grow_many = alloc.ensure_slots_many if sched.caps.bulk_slots else None
    asy = sched.async_scheduling
    held_at = -1  # async: the boundary whose finishes are held (released when the next step ends)
    n_pops = len(pop_list)
    p = f = 0
    stop = k
    while p < n_pops or f < len(fin_steps) or 0 <= held_at < k - 1:
        s = min(pop_list[p] if p < n_pops else k, fin_steps[f] if f < len(fin_steps) else k,
                held_at + 1 if held_at >= 0 else k)
        released = held_at >= 0 and sched.release_held()
        held_at = -1
        fin = ()
        if f < len(fin_steps) and fin_steps[f] == s:
            fin = finishing[s]
            f += 1
        if asy:
            if fin:  # finished at the end of step s - 1, held through plan s
                _hold_finished(sched, [reqs[i] for i in fin], [int(win.computed0[i]) + s for i in fin], float(times[s]),
                      on_finish)
                held_at = s
            freed = released
            held = int(_add(win.samples[fin])) if fin else 0
        else:
            for i in fin:  # finished at the end of step s - 1
                _finish(sched, reqs[i], int(win.computed0[i]) + s, float(times[s]), on_finish)
            freed, held = bool(fin), 0
        if freed and sched.waiting and sched.head_might_fit(num_running=int(win.num_seqs[s]) + held):
            stop = s  # step s will be planned the ordinary way (it may admit the head)
            break
        if p < n_pops and pop_list[p] == s:
            q = p
            while q < n_pops and pop_list[q] == s:
                q += 1
            idx = pop_idx[p:q]
            rids = [reqs[i].request_id for i in idx.tolist()]
            targets = (win.computed0[idx] + 1 + s).tolist()
            if grow_many is not None:
                ok = grow_many(rids, targets)
            else:
                ok = all([sched.grow_decoder(r, t) for r, t in zip(rids, targets)])
            if not ok:
                raise RuntimeError(f"decode window: a block needed at step {s} was not free")
            p = q
        segments.add(s, alloc.usage_parts(head))
    if stop == k:
        if held_at >= 0:
            sched.release_held()
        last = [reqs[i] for i in finishing.get(k, ())]
        if asy and last:
            _hold_finished(sched, last, [int(win.computed0[i]) + k for i in finishing[k]], float(times[k]), on_finish)
        for i in () if asy else finishing.get(k, ()):
            _finish(sched, reqs[i], int(win.computed0[i]) + k, float(times[k]), on_finish)
    k = stop
    alive = [i for i, r in enumerate(reqs) if r.status == RequestStatus.RUNNING and not sched.is_held(r)]
    targets = (win.computed0[alive] + k).tolist()
    alive_reqs = [reqs[i] for i in alive]
    sched.advance_decoders(alive_reqs, targets, k)
    if sched.caps.bulk_slots:
        alloc.advance_written([r.request_id for r in alive_reqs], targets)
    else:  # e.g. the block-id allocator: ensure_slots also registers filled blocks in the cache
        for r, c in zip(alive_reqs, targets):
            sched.grow_decoder(r.request_id, c)
    sched.drop_finished()
    sched.window_ended([r.request_id for r in alive_reqs], float(times[k - 1]), float(times[k]))
    return k, segments


def _hold_finished(sched, reqs: list, computed: list[int], t: float, on_finish) -> None:
    sched.hold_decoded(reqs, computed, t)
    if on_finish is not None:
        for r in reqs:
            on_finish(r, t)


def _finish(sched, r, computed: int, t: float, on_finish) -> None:
    sched.finish_decoded(r, computed, t)
    if on_finish is not None:
        on_finish(r, t)


def pages_per_step(remaining: np.ndarray, length0: np.ndarray, weights: np.ndarray | None, done_by: np.ndarray,
                   block_size: int | None) -> np.ndarray:
    """Pages attention reads in each step of a window, exactly: ``sum w_i * ceil((length0_i + j) /
    block_size)`` over the members active in step ``j`` (``w_i`` sequences of ``length0_i`` tokens
    read in step 0), or ``sum w_i`` (one run per sequence) without pages.

    Members are sorted by ``remaining`` (ascending; member i is active in steps ``j < remaining_i``)
    and ``done_by[j]`` members have finished before step j. Small windows evaluate every (step,
    member) pair; larger ones take O(members x block_size + steps): from step j-1 to j a member's
    pages grow by one iff ``(length0_i + j - 1) % block_size == 0`` (counted per remainder class
    over the still-active suffix) and finished members drop out.
    ``weights=None`` means one sequence per member."""
    if block_size is None:  # one run per sequence
        if weights is None:
            return len(remaining) - done_by
        wsum = np.concatenate(([0], np.cumsum(weights)))
        return wsum[-1] - wsum[done_by]
    bs = block_size
    b = len(remaining)
    kcap = len(done_by)
    ones = weights is None
    if kcap * b <= DENSE_PAGES_MAX:
        # small windows (most): every (step, member) pair at once, in a few numpy calls
        steps = _steps_column(kcap)
        per = (length0 + steps + (bs - 1)) // bs  # (kcap, b): pages member i reads in step j
        per *= remaining > steps  # active members only
        return _add(per, axis=1) if ones else per @ weights
    pages = np.empty(kcap, np.int64)
    first = -(-length0 // bs)
    pages[0] = int(first.sum()) if ones else int(np.dot(weights, first))  # every member is active in step 0
    if kcap == 1:
        return pages
    gone = np.zeros(b + 1, np.int64)  # gone[m]: pages the first m members read in their last step
    last = -(-(length0 + remaining - 1) // bs)
    _acc(last if ones else weights * last, out=gone[1:])
    # suffix[m, r]: sequences of the members at positions >= m whose step-0 length has remainder r
    suffix = np.zeros((b + 1, bs), np.int64)
    suffix[np.arange(b), length0 % bs] = 1 if ones else weights
    _acc(suffix[::-1], axis=0, out=suffix[::-1])
    fin = done_by[1:]
    # step j adds a page to the active members whose remainder is (1 - j) % bs
    _acc(suffix[fin, _page_phase(bs, kcap - 1)], out=pages[1:])
    pages[1:] += pages[0] - gone[fin]
    return pages


DENSE_PAGES_MAX = 1 << 13  # pages_per_step: (steps x members) pairs evaluated directly up to this
_PHASES: dict[int, np.ndarray] = {}
_STEPS: list = [np.zeros((0, 1), np.int64)]


def _steps_column(n: int) -> np.ndarray:
    """``arange(n)`` as an (n, 1) int64 column (cached)."""
    col = _STEPS[0]
    if len(col) < n:
        col = np.arange(max(n, 4096), dtype=np.int64)[:, None]
        _STEPS[0] = col
    return col[:n]


def _page_phase(bs: int, n: int) -> np.ndarray:
    """``(1 - j) % bs`` for ``j = 1..n`` (a cached period-``bs`` pattern)."""
    pat = _PHASES.get(bs)
    if pat is None or len(pat) < n:
        pat = (1 - np.arange(1, max(n, 4096) + 1, dtype=np.int64)) % bs
        _PHASES[bs] = pat
    return pat[:n]
