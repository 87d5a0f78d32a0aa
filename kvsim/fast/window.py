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
* every block a request needs is free at the window's start (frees inside the window are ignored
  for this bound, which only makes windows shorter), so no preemption happens.

Two implementations share these rules. With an allocator that grows every request by one token
in one call (the block-counting paged allocator, contiguous, buddy) all running requests are
members of the replica's lazy decode group (:mod:`kvsim.fast.group`): :func:`plan_group_window`
builds the arrays from the group's finish keys and :func:`apply_group_window` advances step by
step through the allocator, which touches only requests at a block boundary, so a window costs
O(steps + events) instead of O(running requests); it counts frees inside the window exactly and
stops where a block is not free. Allocators that name blocks (prefix caching, tiers, radix) and
requests with parallel samples use :func:`plan_decode_window` / :func:`block_limited_steps` /
:func:`apply_decode_window`, which replay block allocations request by request.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate, chain
from operator import mul

import numpy as np

from kvsim.kv.base import MemoryParts, UsageSums
from kvsim.fast.group import FINISH_KEY_SHIFT, DecodeGroup
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


def plan_decode_window(sched, plan, max_steps: int) -> DecodeWindow | None:
    """The candidate window after ``plan`` (step 0), or None if step 0 is not a pure decode step."""
    shape = plan.shape
    if plan.admitted or plan.preempted or shape.num_prefill_seqs or shape.swap_in_bytes or shape.swap_out_bytes \
            or shape.tier_load_s:
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
    rem_sorted = remaining[order]
    pages = pages_per_step(rem_sorted, (computed0 + 1)[order], None if samples is None else w[order], done_by,
                           sched.allocator.block_size)
    return DecodeWindow(list(running), remaining, computed0, num_seqs, kv_read, kcap, w, written, b - done_by, pages)


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
    and the usage :class:`Segments`.
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
    n_pops = len(pop_list)
    p = f = 0
    stop = k
    while p < n_pops or f < len(fin_steps):
        s = min(pop_list[p] if p < n_pops else k, fin_steps[f] if f < len(fin_steps) else k)
        fin = ()
        if f < len(fin_steps) and fin_steps[f] == s:
            fin = finishing[s]
            f += 1
        for i in fin:  # finished at the end of step s - 1
            _finish(sched, reqs[i], int(win.computed0[i]) + s, float(times[s]), on_finish)
        if fin and sched.waiting and sched.head_might_fit(num_running=int(win.num_seqs[s])):
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
                ok = all([alloc.ensure_slots(r, t) for r, t in zip(rids, targets)])
            if not ok:
                raise RuntimeError(f"decode window: a block needed at step {s} was not free")
            p = q
        segments.add(s, alloc.usage_parts(head))
    if stop == k:
        for i in finishing.get(k, ()):
            _finish(sched, reqs[i], int(win.computed0[i]) + k, float(times[k]), on_finish)
    k = stop
    alive = [i for i, r in enumerate(reqs) if r.status == RequestStatus.RUNNING]
    targets = (win.computed0[alive] + k).tolist()
    alive_reqs = [reqs[i] for i in alive]
    sched.advance_decoders(alive_reqs, targets, k)
    if sched.caps.bulk_slots:
        alloc.advance_written([r.request_id for r in alive_reqs], targets)
    else:  # e.g. the block-id allocator: ensure_slots also registers filled blocks in the cache
        for r, c in zip(alive_reqs, targets):
            alloc.ensure_slots(r.request_id, c)
    sched.drop_finished()
    return k, segments


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
# group windows: members outlasting the window enter as the group's sums only if at least this many
# (below, their columns in the (steps x members) evaluation cost less than the sums' numpy calls)
MIN_STAY_SUMS = 16
# windows of at most this many steps: time-weighted means in Python floats (numpy's per-call cost dominates)
SMALL_WINDOW_STEPS = 24
# group windows of at most this many steps and members taken one by one: planned in Python lists
SMALL_PLAN_STEPS = 32
SMALL_PLAN_MEMBERS = 16
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


def plan_group_window(sched, group: DecodeGroup, plan, max_steps: int) -> DecodeWindow | None:
    """:func:`plan_decode_window` for a scheduler whose running requests are all members of its
    decode group (``plan.group_decodes``). Step 0 may also complete the prefill of requests it
    admits: they sample their first token in step 0 and decode with the group from step 1 on. The
    arrays follow from the members' finish keys and base constants (step 0's entries are the
    plan's own shape); no member is read one by one."""
    shape = plan.shape
    if (not plan.group_decodes or plan.preempted or shape.swap_in_bytes or shape.swap_out_bytes
            or shape.tier_load_s or (plan.scheduled and sched.swapped)):
        return None
    if plan.scheduled and sched.waiting and sched.head_might_fit(len(sched.running)):
        return None  # step 0's admissions may let the waiting head in at step 1 (see below)
    clock = group.step_count
    rem_new: list[int] = []
    computed_new: list[int] = []
    for rid, n in plan.scheduled:
        r = sched.requests[rid]
        if r.num_computed_tokens + n != r.num_tokens:
            return None  # a prefill chunk: the request does not decode from step 1
        rem_new.append(r.output_tokens - r.num_generated)
        computed_new.append(r.num_tokens - 1)  # so that step j >= 1 reads num_tokens + j
    first_finish = min([(group.keys[0] >> FINISH_KEY_SHIFT) - clock] + rem_new)
    last_finish = max([(group.keys[-1] >> FINISH_KEY_SHIFT) - clock] + rem_new)
    kcap = min(max_steps, first_finish if sched.swapped else last_finish)
    if kcap < 2:
        return None
    if sched.waiting and first_finish == 1:
        # The window would most likely stop after step 0 (a finish, or above: step 0's admissions,
        # may let the waiting head in): not worth planning. Only a cost estimate; apply re-checks.
        return None
    # Members still decoding after the window's last step read in every step: they enter as the
    # group's sums (O(1) per step) when there are enough of them to pay for that. Members that
    # finish inside the window and step 0's admissions (which decode from step 1 on) are taken one
    # by one.
    few_rem, few_len0, n_stay, stay_base, stay_q, stay_res = group.split_at(kcap, MIN_STAY_SUMS)
    if rem_new:
        few_rem = few_rem + rem_new
        few_len0 = few_len0 + [c + 1 for c in computed_new]
    bs = sched.allocator.block_size
    m = len(few_rem)
    if kcap <= SMALL_PLAN_STEPS and m <= SMALL_PLAN_MEMBERS:
        num_seqs, kv_read, pages = _small_group_steps(kcap, few_rem, few_len0, n_stay, stay_base, stay_q, stay_res,
                                                      clock, bs)
        return _group_window(shape, kcap, np.array(num_seqs, dtype=np.int64), np.array(kv_read, dtype=np.int64),
                             np.array(pages, dtype=np.int64))
    steps = _steps_column(kcap)[:, 0]
    if not m:
        num_seqs = np.full(kcap, n_stay, np.int64)
        kv_read = pages = None
    elif kcap * m <= DENSE_PAGES_MAX:
        # every (step, member) pair at once: step j reads length0 + j tokens of each active member
        col = _steps_column(kcap)
        remaining = np.array(few_rem, dtype=np.int64)
        length = np.array(few_len0, dtype=np.int64) + col  # (kcap, m)
        active = remaining > col
        num_seqs = _add(active, axis=1, dtype=np.int64)  # (ndarray.sum's Python wrapper costs more here)
        length *= active
        kv_read = _add(length, axis=1)
        if bs is None:
            pages = None
        else:
            length += bs - 1
            if bs & (bs - 1):
                length //= bs  # zero stays zero for finished members
            else:  # a power of two: the same quotient (lengths are >= 0), cheaper
                length >>= bs.bit_length() - 1
            pages = _add(length, axis=1)
    else:
        order = sorted(range(m), key=few_rem.__getitem__)
        remaining = np.array([few_rem[i] for i in order], dtype=np.int64)
        length0 = np.array([few_len0[i] for i in order], dtype=np.int64)
        done_by = remaining.searchsorted(steps, side="right")  # of these, finished before step j
        num_seqs = m - done_by
        csum = np.concatenate(([0], _acc(length0)))
        kv_read = (csum[-1] - csum[done_by]) + num_seqs * steps
        pages = None if bs is None else pages_per_step(remaining, length0, None, done_by, bs)
    if n_stay:
        # the staying members: step j reads base + clock + 1 + j tokens of each
        if m:
            num_seqs += n_stay
        stay_kv = steps * n_stay
        stay_kv += stay_base + n_stay * (clock + 1)
        kv_read = stay_kv if kv_read is None else kv_read + stay_kv
        if bs is not None:
            # a member's pages in step j: q + Q + 1 + [r + R >= bs] with clock + j = Q * bs + R
            # (see DecodeGroup.pages_read); sfx[x] counts staying members with remainder >= x
            at = steps + clock
            if bs & (bs - 1):
                big_q, big_r = np.divmod(at, bs)
            else:  # a power of two: the same quotient and remainder (clock + j >= 0), cheaper
                big_q, big_r = at >> (bs.bit_length() - 1), at & (bs - 1)
            sfx = list(accumulate(reversed(stay_res)))  # sfx[x] = sum(stay_res[bs - 1 - x:])
            sfx.reverse()
            sfx.append(0)
            stay_pages = big_q * n_stay
            stay_pages += np.array(sfx, dtype=np.int64)[bs - big_r]
            stay_pages += stay_q + n_stay
            pages = stay_pages if pages is None else pages + stay_pages
    if pages is None:  # one run per sequence
        pages = num_seqs.copy()
    return _group_window(shape, kcap, num_seqs, kv_read, pages)


def _group_window(shape, kcap: int, num_seqs: np.ndarray, kv_read: np.ndarray, pages: np.ndarray) -> DecodeWindow:
    """The group window of these step arrays, step 0 as scheduled (prefills included)."""
    num_seqs[0] = shape.num_seqs
    kv_read[0] = shape.kv_tokens_read
    pages[0] = shape.kv_pages_read
    return DecodeWindow(None, None, None, num_seqs, kv_read, kcap, None, kv_read, num_seqs, pages)


def _small_group_steps(kcap: int, few_rem: list[int], few_len0: list[int], n_stay: int, stay_base: int, stay_q: int,
                       stay_res: list[int], clock: int, bs: int | None) -> tuple[list[int], list[int], list[int]]:
    """:func:`plan_group_window`'s step arrays of a short window as Python lists (the same integers
    as its numpy evaluation; below a few dozen steps numpy's fixed cost per call is most of the
    work). Member ``i`` decodes in steps ``j < few_rem[i]`` reading ``few_len0[i] + j`` tokens in
    ``ceil((few_len0[i] + j) / bs)`` pages; the staying members as in :func:`plan_group_window`."""
    n1 = kcap + 1
    cnt = [0] * n1  # difference arrays over the steps: members decoding, their step-0 lengths, pages
    tok = [0] * n1
    pg = [0] * n1
    for r, length in zip(few_rem, few_len0):
        end = r if r < kcap else kcap  # decodes in steps 0 .. end - 1
        if end <= 0:
            continue
        cnt[0] += 1
        cnt[end] -= 1
        tok[0] += length
        tok[end] -= length
        if bs is not None:
            p0 = -(-length // bs)
            pg[0] += p0
            pg[end] -= p0
            # one more page from each step j with (length + j - 1) % bs == 0 on
            first = (1 - length) % bs or bs
            grows = range(first, end, bs)
            for j in grows:
                pg[j] += 1
            pg[end] -= len(grows)
    cnt.pop()
    tok.pop()
    pg.pop()
    num_seqs = list(accumulate(cnt, initial=n_stay))[1:] if n_stay else list(accumulate(cnt))
    # step j: each decoding member reads its step-0 length + j tokens, each staying one also
    # base + clock + 1 + j; so sum(step-0 lengths of the active) + j * num_seqs + the stay constant
    at = stay_base + n_stay * (clock + 1)
    kv_read = [t + j * n + at for j, t, n in zip(range(kcap), accumulate(tok), num_seqs)]
    if bs is None:  # one run per sequence
        return num_seqs, kv_read, num_seqs.copy()
    pages = list(accumulate(pg))
    if n_stay:
        # a staying member's pages in step j: q + Q + 1 + [r + R >= bs] with clock + j = Q * bs + R;
        # sfx[x] counts staying members with remainder >= bs - x (see plan_group_window)
        sfx = list(accumulate(reversed(stay_res)))
        sfx.reverse()
        sfx.append(0)
        base = stay_q + n_stay
        q, r = divmod(clock, bs)
        out = []
        for p in pages:
            out.append(p + q * n_stay + sfx[bs - r] + base)
            r += 1
            if r == bs:
                r = 0
                q += 1
        pages = out
    return num_seqs, kv_read, pages


def apply_group_window(sched, group: DecodeGroup, plan, k: int, times: np.ndarray, on_first=None,
                       on_finish=None):
    """:func:`apply_decode_window` for a group window. Step 0 (planned by ``schedule``) completes
    through ``on_step_done``; steps 1..k-1 advance the group step count and grow every request by one
    token through the allocator (which touches only requests at a block boundary); finishes are a
    prefix of the group's members. The window ends early, at the step the one-by-one scheduler
    would plan differently: when the waiting head might fit (tested after step 0 if it admitted or
    finished anything, and after every finish), or a block is not free (the step-by-step
    scheduler would preempt there).

    Returns ``(steps advanced, usage segments)`` as :func:`apply_decode_window` does."""
    alloc = sched.allocator
    head = sched.waiting.head.kv if sched.waiting.head is not None and not sched.swapped else None
    segments = Segments(alloc.usage_parts(head))
    clock0 = group.step_count
    admitted = bool(plan.scheduled)
    t1 = float(times[1])
    first, done = sched.on_step_done(t1)  # step 0
    if on_first is not None:
        for r in first:
            on_first(r, t1)
    if on_finish is not None:
        for r in done:
            on_finish(r, t1)
    if (admitted or done) and sched.waiting and sched.head_might_fit(num_running=len(sched.running)):
        return 1, segments  # step 1 will be planned the ordinary way (it may admit the head)
    head = sched.waiting.head.kv if sched.waiting.head is not None and not sched.swapped else None
    next_finish = group.finish_step() if len(group) else -1
    changed = bool(admitted or done)
    if sched.caps.decode_steps:
        stop = _grow_runs(sched, group, k, times, clock0, next_finish, changed, head, segments, on_finish)
    else:
        stop = _grow_one_by_one(sched, group, k, times, clock0, next_finish, changed, head, segments, on_finish)
    next_finish = group.finish_step() if len(group) else -1
    group.step_count = clock0 + stop
    if stop == k and next_finish == clock0 + k:
        t = float(times[k])
        done = group.pop_finished()
        sched.finish_requests(done, t)
        if on_finish is not None:
            for r in done:
                on_finish(r, t)
    return stop, segments


def _finish_at(sched, group, clock: int, t: float, on_finish) -> bool:
    """Finish the group members done at group step count ``clock`` (time ``t``); True if the waiting
    head might fit afterwards (the window stops: that step is planned the ordinary way)."""
    group.step_count = clock
    done = group.pop_finished()
    sched.finish_requests(done, t)
    if on_finish is not None:
        for r in done:
            on_finish(r, t)
    return bool(sched.waiting) and sched.head_might_fit(num_running=len(sched.running))


def _grow_runs(sched, group: DecodeGroup, k: int, times, clock0: int, next_finish: int, changed: bool, head, segments,
               on_finish) -> int:
    """Steps 1..k-1 of a group window through ``grow_steps`` (BulkDecodeSteps): one allocator call
    per run of steps between finishes. Returns the step the window stops at (k: it ran whole)."""
    alloc = sched.allocator
    grow_steps = alloc.grow_steps
    s = 1
    while s < k:
        if next_finish == clock0 + s:  # members whose last token was step s - 1
            if _finish_at(sched, group, next_finish, float(times[s]), on_finish):
                return s
            next_finish = group.finish_step() if len(group) else -1
            changed = True
        end = next_finish - clock0 if clock0 + s < next_finish < clock0 + k else k
        parts = alloc.usage_parts(head) if changed else None
        changes: list = []
        done = grow_steps(end - s, s, changes)
        if changed and done and (not changes or changes[0][0] != s):
            segments.add(s, parts)
        if changes:
            base = parts or alloc.usage_parts(head)  # only held and useful change while requests grow
            shared, cached, external = base.shared_tokens, base.cached_free_tokens, base.external_tokens
            segments.starts.extend([c[0] for c in changes])
            segments.parts.extend([(held, useful, shared, cached, external) for _, held, useful in changes])
        changed = False
        if done < end - s:
            return s + done  # a block that step needs is not free: plan it one request at a time
        s = end
    return k


def _grow_one_by_one(sched, group: DecodeGroup, k: int, times, clock0: int, next_finish: int, changed: bool, head, segments,
                     on_finish) -> int:
    """Steps 1..k-1 of a group window, one ``grow_all_by_one`` call each (allocators without
    BulkDecodeSteps). Returns the step the window stops at (k: it ran whole)."""
    alloc = sched.allocator
    ledger = alloc.ledger
    grow = alloc.grow_all_by_one
    for s in range(1, k):
        if next_finish == clock0 + s:  # members whose last token was step s - 1
            if _finish_at(sched, group, next_finish, float(times[s]), on_finish):
                return s
            next_finish = group.finish_step() if len(group) else -1
            changed = True
        held = ledger.sum_held
        if not grow():
            return s  # a block step s needs is not free: plan it one request at a time (preemption)
        if changed or ledger.sum_held != held:
            segments.add(s, alloc.usage_parts(head))
            changed = False
    return k


class StepwiseTimes:
    """A group window's step start times, priced one decode step at a time as the replay reads them
    (a :class:`~kvsim.timing.base.DecodeStepPricer`): ``self[j]`` is the start of step ``j``
    (``self[k]`` the end of a window of ``k`` steps), the same doubles as ``np.add.accumulate`` over
    ``[start, step 0's duration, decode_durations(steps 1..)]``. Step 0 was priced as a step.

    For windows with no arrival cut (a backlog): the replay stops at the step where the
    step-by-step scheduler would plan differently, usually a few steps into the planned horizon,
    and only the steps before it are priced."""

    __slots__ = ("_column", "_pricer", "_win", "_n", "_kv", "_pages", "_times", "_durations", "_columns")

    def __init__(self, pricer, win: DecodeWindow, start_s: float, step0_s: float):
        self._pricer = pricer
        self._column = pricer.column
        self._win = win
        self._n = win.num_seqs.tolist()
        self._kv = win.kv_tokens_read.tolist()
        self._pages = win.kv_pages_read.tolist()
        self._durations = [step0_s]
        self._times = [start_s, start_s + step0_s]
        self._columns: list = []  # steps 1.. priced so far: their parts

    def __getitem__(self, j: int) -> float:
        times = self._times
        s = len(times) - 1  # the next step to price
        if j > s:
            column, durations, columns = self._column, self._durations, self._columns
            n, kv, pages = self._n, self._kv, self._pages
            t = times[s]
            for s in range(s, j):
                d, parts = column(n[s], kv[s], pages[s])
                durations.append(d)
                columns.append(parts)
                t += d
                times.append(t)
        return times[j]

    def settle(self, k: int):
        """``(durations of steps 0..k-1, (None, breakdown parts of steps 1..k-1, their KV bytes
        read))``: what the engine takes from ``decode_durations`` in a window of ``k`` steps."""
        self[k]
        durations = np.array(self._durations[:k], dtype=np.float64)
        kv_bytes = self._win.kv_tokens_read[1:k] * self._pricer.kv_bytes_per_token
        return durations, (None, self._pricer.totals(self._columns[:k - 1]), kv_bytes)


class Segments:
    """A window's piecewise-constant allocator sums: from step ``starts[i]`` on, the sums
    ``parts[i] = (held, useful, shared, cached free, external)`` tokens (a
    :class:`~kvsim.kv.base.UsageSums` as a plain tuple: one is kept per block event)."""

    __slots__ = ("starts", "parts")

    def __init__(self, first: UsageSums) -> None:
        self.starts: list[int] = [0]
        self.parts: list[tuple[int, int, int, int, int]] = []
        self.add_parts(first)

    def add(self, first_step: int, usage: UsageSums) -> None:
        self.starts.append(first_step)
        self.add_parts(usage)

    def add_parts(self, u: UsageSums) -> None:
        self.parts.append((u.held_tokens, u.useful_tokens, u.shared_tokens, u.cached_free_tokens, u.external_tokens))


def window_means(win: DecodeWindow, k: int, durations: np.ndarray, segments, capacity_tokens: int):
    """Time-weighted means over the window's steps: ``(memory parts in tokens, batch size)``.

    ``segments`` (:class:`Segments`, strictly increasing first steps, all < k) hold
    piecewise-constant allocator sums; the written / batch / KV-read series are per step."""
    parts = segments.parts
    if k <= SMALL_WINDOW_STEPS:
        return _window_means_small(win, k, durations, segments, capacity_tokens)
    d = durations[:k]
    total = float(_add(d))
    vals = np.fromiter(chain.from_iterable(parts), np.float64, 5 * len(parts)).reshape(-1, 5)  # (segments, 5)
    seg_time = np.add.reduceat(d, segments.starts)  # time spent in each segment
    held, useful, shared, cached_free, external = (seg_time @ vals / total).tolist()
    written = float(np.dot(win.written[:k], d)) / total
    batch = float(np.dot(win.num_requests[:k], d)) / total
    unshared = written if win.kv_tokens_read is win.written else float(np.dot(win.kv_tokens_read[:k], d)) / total
    return _means(held, useful, shared, cached_free, external, written, unshared, parts, capacity_tokens), batch


def _window_means_small(win: DecodeWindow, k: int, durations: np.ndarray, segments: Segments, capacity_tokens: int):
    """:func:`window_means` of a short window in plain Python floats: below a few dozen values
    numpy's fixed cost per call is most of the work. Sums run in step order (numpy's pairwise and
    BLAS sums may differ from these in the last bits; either is deterministic)."""
    d = durations[:k].tolist()
    total = sum(d)
    starts, parts = segments.starts, segments.parts
    held = useful = shared = cached_free = external = 0.0
    ends = starts[1:]
    ends.append(k)
    for s, e, p in zip(starts, ends, parts):
        t = sum(d[s:e])
        held += t * p[0]
        useful += t * p[1]
        shared += t * p[2]
        cached_free += t * p[3]
        external += t * p[4]
    held /= total
    useful /= total
    shared /= total
    cached_free /= total
    external /= total
    written = sum(map(mul, win.written[:k].tolist(), d)) / total
    batch = sum(map(mul, win.num_requests[:k].tolist(), d)) / total
    unshared = written if win.kv_tokens_read is win.written else sum(map(mul, win.kv_tokens_read[:k].tolist(), d)) / total
    return _means(held, useful, shared, cached_free, external, written, unshared, parts, capacity_tokens), batch


def _means(held: float, useful: float, shared: float, cached_free: float, external: float, written: float,
           unshared: float, parts: list, capacity_tokens: int) -> MemoryParts:
    """A window's MemoryParts from its time-weighted allocator sums and written slots (tokens)."""
    return MemoryParts(
        token_states=written - shared,
        reservation=useful - written,
        internal_frag=held - useful,
        external_frag=external,
        free=capacity_tokens - (held - shared) - external,
        cached_free=cached_free,
        peak_used=float(max([p[0] - p[2] for p in parts])),
        unshared=unshared,
    )
