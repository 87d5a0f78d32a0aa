"""Group decode windows: :func:`plan_group_window` and :func:`apply_group_window`, the decode-window
implementation for replicas whose running requests are all members of the lazy decode group
(:mod:`kvsim.fast.group`). The rules a window follows are :mod:`kvsim.fast.window`'s."""

from __future__ import annotations

from itertools import accumulate

import numpy as np

import kvsim.fast.window as plans  # DENSE_PAGES_MAX is read at call time (one constant, shared)
from kvsim.fast.group import FINISH_KEY_SHIFT, DecodeGroup
from kvsim.fast.means import Segments
from kvsim.fast.window import DecodeWindow, _acc, _add, _steps_column, pages_per_step

# group windows: members outlasting the window enter as the group's sums only if at least this many
# (below, their columns in the (steps x members) evaluation cost less than the sums' numpy calls)
MIN_STAY_SUMS = 16
# group windows of at most this many steps and members taken one by one: planned in Python lists
SMALL_PLAN_STEPS = 32
SMALL_PLAN_MEMBERS = 16


def plan_group_window(sched, group: DecodeGroup, plan, max_steps: int) -> DecodeWindow | None:
    """:func:`plan_decode_window` for a scheduler whose running requests are all members of its
    decode group (``plan.group_decodes``). Step 0 may also complete the prefill of requests it
    admits: they sample their first token in step 0 and decode with the group from step 1 on. The
    arrays follow from the members' finish keys and base constants (step 0's entries are the
    plan's own shape); no member is read one by one."""
    shape = plan.shape
    asy = sched.async_scheduling  # finishes hold their KV a step (kvsim.sched.async_sched)
    if asy and (sched.holds_arrivals or sched.num_finishing):
        return None  # arrivals the next plan takes in, or step 0 holds the last step's finishes
    if (not plan.group_decodes or plan.preempted or plan.swapped_in or shape.swap_out_bytes
            or shape.tier_load_s or (plan.scheduled and sched.swapped)):
        return None
    if plan.scheduled and sched.waiting.head is not None and sched.head_might_fit(len(sched.running)):
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
    if sched.waiting.head is not None and first_finish == 1:
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
    held = _held_member_tokens(kcap, few_rem, few_len0) if asy else None
    if kcap <= SMALL_PLAN_STEPS and m <= SMALL_PLAN_MEMBERS:
        num_seqs, kv_read, pages = _small_group_steps(kcap, few_rem, few_len0, n_stay, stay_base, stay_q, stay_res,
                                                      clock, bs)
        return _group_window(shape, kcap, np.array(num_seqs, dtype=np.int64), np.array(kv_read, dtype=np.int64),
                             np.array(pages, dtype=np.int64), held)
    steps = _steps_column(kcap)[:, 0]
    if m:
        num_seqs, kv_read, pages = _member_steps(kcap, few_rem, few_len0, steps, bs)
    else:
        num_seqs = np.full(kcap, n_stay, np.int64)
        kv_read = pages = None
    if n_stay:
        if m:
            num_seqs += n_stay
        kv_read, pages = _add_staying(steps, n_stay, stay_base, stay_q, stay_res, clock, bs, kv_read, pages)
    if pages is None:  # one run per sequence
        pages = num_seqs.copy()
    return _group_window(shape, kcap, num_seqs, kv_read, pages, held)


def _held_member_tokens(kcap: int, few_rem: list[int], few_len0: list[int]) -> np.ndarray:
    """Async scheduling: the tokens still held in step j by the members that finished at the end of step
    j - 1 (a member read ``length0 + j - 1`` tokens in its last step, j - 1, and holds as many)."""
    held = np.zeros(kcap, np.int64)
    for r, length0 in zip(few_rem, few_len0):
        if r < kcap:
            held[r] += length0 + r - 1
    return held


def _member_steps(kcap: int, few_rem: list[int], few_len0: list[int], steps: np.ndarray, bs: int | None):
    """:func:`plan_group_window`'s step arrays over the members taken one by one (member ``i``
    decodes in steps ``j < few_rem[i]`` reading ``few_len0[i] + j`` tokens): ``(num_seqs, kv_read,
    pages)``, pages None without them."""
    m = len(few_rem)
    if kcap * m <= plans.DENSE_PAGES_MAX:
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
    return num_seqs, kv_read, pages


def _add_staying(steps: np.ndarray, n_stay: int, stay_base: int, stay_q: int, stay_res: list[int], clock: int,
                 bs: int | None, kv_read, pages):
    """``(kv_read, pages)`` with the staying members added (they decode in every step; kv_read or
    pages None: the members taken one by one contributed none)."""
    # the staying members: step j reads base + clock + 1 + j tokens of each
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
    return kv_read, pages


def _group_window(shape, kcap: int, num_seqs: np.ndarray, kv_read: np.ndarray, pages: np.ndarray,
                  held: np.ndarray | None = None) -> DecodeWindow:
    """The group window of these step arrays, step 0 as scheduled (prefills included); ``held``: async
    scheduling's held finishes, whose tokens stay written a step (None: none)."""
    num_seqs[0] = shape.num_seqs
    kv_read[0] = shape.kv_tokens_read
    pages[0] = shape.kv_pages_read
    written = kv_read if held is None else kv_read + held
    return DecodeWindow(None, None, None, num_seqs, kv_read, kcap, None, written, num_seqs, pages,
                        None if held is None else written)


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
    prefix of the group's members. Each step's end is made as ``on_step_done`` makes it
    (:func:`_boundary`): with async scheduling (kvsim.sched.async_sched) it first frees the finishes
    held since the step before, then holds its own a step. The window ends early, at the step the
    one-by-one scheduler would plan differently: when the waiting head might fit (tested after step 0
    if it admitted or finished anything, and whenever finishes are freed), or a block is not free (the
    step-by-step scheduler would preempt there).

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
    if (admitted or done) and sched.waiting.head is not None and sched.head_might_fit(num_running=len(sched.running)):
        return 1, segments  # step 1 will be planned the ordinary way (it may admit the head)
    head = sched.waiting.head.kv if sched.waiting.head is not None and not sched.swapped else None
    next_finish = group.finish_step() if len(group) else -1
    changed = bool(admitted or done)
    grow = _grow_runs if sched.caps.decode_steps else _grow_one_by_one
    stop = grow(sched, group, k, times, clock0, next_finish, changed, head, segments, on_finish)
    group.step_count = clock0 + stop
    if stop == k and (sched.num_finishing or (len(group) and group.finish_step() == clock0 + k)):
        _boundary(sched, group, clock0 + k, float(times[k]), on_finish)  # (its head test is the next plan's)
    if stop > 1:
        sched.window_ended((), float(times[stop - 1]), float(times[stop]), group_step=True)
    return stop, segments


def _boundary(sched, group, clock: int, t: float, on_finish) -> bool:
    """The end (time ``t``) of the group window's step that takes the group step count to ``clock``,
    as ``on_step_done`` makes it: with async scheduling the finishes held since the last step's end
    are freed first; the members done at ``clock`` finish (async: are held a step). True if something
    was freed and the waiting head might fit now (the window stops: that step is planned the
    ordinary way)."""
    freed = sched.release_held()
    group.step_count = clock
    done = group.pop_finished()
    if done:
        sched.finish_requests(done, t)
        if on_finish is not None:
            for r in done:
                on_finish(r, t)
        freed = freed or not sched.is_held(done[0])  # (held, unless nothing else was left to plan)
    return freed and sched.waiting.head is not None and sched.head_might_fit(num_running=len(sched.running))


def _grow_runs(sched, group: DecodeGroup, k: int, times, clock0: int, next_finish: int, changed: bool, head, segments,
               on_finish) -> int:
    """Steps 1..k-1 of a group window through ``grow_steps`` (BulkDecodeSteps): one allocator call
    per run of steps between step ends with events (finishes; async scheduling: held finishes freed).
    Returns the step the window stops at (k: it ran whole)."""
    alloc = sched.allocator
    grow_steps = alloc.grow_steps
    s = 1
    while s < k:
        # step s's start: members whose last token was step s - 1, or (async scheduling, after step 1)
        # finishes held through step s - 1 (step 0's end was on_step_done's)
        if next_finish == clock0 + s or (s > 1 and sched.num_finishing):
            if _boundary(sched, group, clock0 + s, float(times[s]), on_finish):
                return s
            next_finish = group.finish_step() if len(group) else -1
            changed = True
        if sched.num_finishing:  # held through step s, freed at its end: a run of one step
            end = s + 1
        else:
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
    """Steps 1..k-1 of a group window, one growth call each (``DecodeGroup.grow``: allocators without
    BulkDecodeSteps). Returns the step the window stops at (k: it ran whole)."""
    alloc = sched.allocator
    ledger = alloc.ledger
    grow = group.grow
    for s in range(1, k):
        if next_finish == clock0 + s or (s > 1 and sched.num_finishing):  # as in _grow_runs
            if _boundary(sched, group, clock0 + s, float(times[s]), on_finish):
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
