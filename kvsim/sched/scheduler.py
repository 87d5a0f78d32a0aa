"""Iteration-level (continuous-batching) scheduler in the style of vLLM.

There is no prefill or decode phase here: every request has ``num_tokens`` (prompt + generated) and
``num_computed_tokens``, and each step gives each request up to ``num_tokens - num_computed`` new
tokens, within a per-step token budget. The phases of one ``schedule()`` call:

0. the decode fast path, if the engine installed one (:mod:`kvsim.sched.fastpath`; the decode group
   of :mod:`kvsim.fast.group`): when every running request is a member (each decodes one token),
   they all grow by one token in one allocator call, untouched one by one; otherwise the group is
   dissolved and phase 1 takes every running request;
1. running requests, in admission order. Each asks the allocator for room for its new tokens; when
   that fails the scheduler preempts a victim (default: the most recently admitted running request,
   as vLLM does) and retries. If the victim is the request itself it is not scheduled this step.
   Preemption by ``recompute`` frees the victim's KV, resets its computed tokens to 0 and puts it at
   the *front* of the waiting queue; by ``swap`` it moves the victim's KV to the host tier (if it has
   room, else recompute) and parks it in the swapped queue, with its computed tokens kept.
2. swapped requests (oldest admission first), swapped back in when they fit; the transfer is part
   of this step's batch shape (``swap_in_bytes``) and so of its time. While any request is swapped
   out no new request is admitted (vLLM v0).
3. waiting requests, FCFS, only if nothing was preempted in this call: the head is admitted only if
   the allocator can hold its whole current prompt at once (all or nothing) and ``max_num_seqs`` and
   the token budget allow. It takes the blocks for the whole prompt then (``prompt_blocks:
   at_admission``), or only for the first chunk (``per_chunk``, vLLM v1: later chunks take theirs
   when scheduled, in phase 1; ``reserve_full_isl: false`` admits once the first chunk fits). Leading prompt blocks found in the prefix cache count as computed (at
   least the last token is always computed). Without chunked prefill the rest of the prompt is
   scheduled whole or not at all; with it, the head may take the remaining budget.

Requests that could never run are rejected when they arrive and counted: longer than the model's
max length (prompt + output), or larger than the whole KV budget. The scheduler never sees block ids.

Swaps are priced with the host link (kvsim/timing/transfer.py, docs/transfer_model.md): the scheduler
counts the copies a swap takes (blocks, or runs of consecutive blocks from the allocator's BlockRuns
capability, times the layout's copies per block; one run per sequence extent on allocators without
blocks) and puts bytes and copies into the batch shape; the timing model prices them with the same
:class:`~kvsim.timing.transfer.HostTransfers` that prefetch hiding uses here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from kvsim.models.geometry import KVGeometry
from kvsim.errors import ConfigError
from kvsim.kv.base import KVRequest
from kvsim.kv.protocol import KVAllocator, WindowAllocator, allocator_capabilities
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.fastpath import DecodeFastPath
from kvsim.sched.plan import StepPlan
from kvsim.sched.request import Request, RequestStatus, WaitingQueue, batch_tokens
from kvsim.sched.sink import RequestSink
from kvsim.sched.victim import build_victim_policy
from kvsim.timing.base import BatchShape
from kvsim.timing.transfer import DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S, HostTransfers, legacy_transfers

@dataclass(slots=True)
class _Step:
    """What the phases of one ``schedule()`` call build up (private to it)."""

    budget: int
    scheduled: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (new positions, tokens)
    preempted: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    swap_in_bytes: int = 0
    swap_out_bytes: int = 0
    swap_in_copies: int = 0
    swap_out_copies: int = 0
    tier_load_s: float = 0.0
    group_kv_tokens: int = 0  # the decode group's members (phase 0): KV tokens and pages they read
    group_kv_pages: int = 0


REJECT_TOO_LONG = "exceeds_max_model_len"
_NO_KV = KVGeometry(1, 1, 1, 1, "fp16", 0)  # a scheduler built without a geometry counts no swap bytes
REJECT_KV = "exceeds_kv_capacity"
REJECT_BUDGET = "exceeds_batch_token_budget"


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, allocator: KVAllocator, max_model_len_tokens: int,
                 want_context_lens: bool = False, kv: KVGeometry | None = None,
                 host_link_bandwidth_bytes_per_s: float = DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S,
                 host_transfers: HostTransfers | None = None,
                 *, request_log: RequestSink, replica_index: int = 0):
        self.cfg = cfg
        self.replica_index = replica_index  # the engine replica this scheduler plans for
        self.allocator = allocator
        self._victim_policy = build_victim_policy(cfg.victim)
        self.max_model_len_tokens = max_model_len_tokens
        self.max_num_seqs = cfg.max_num_seqs
        self.token_budget = cfg.token_budget(max_model_len_tokens)
        self.chunked_prefill = cfg.chunked_prefill
        # per_chunk: blocks for each scheduled chunk only (vLLM v1), after the reserve_full_isl check
        self.per_chunk = cfg.prompt_blocks == "per_chunk"
        self.reserve_full_isl = cfg.reserve_full_isl
        self.want_context_lens = want_context_lens
        # the run's KV geometry: its bytes_per_token (this GPU's share) sizes swaps; None: no bytes
        self.kv = kv if kv is not None else _NO_KV
        self.swap_mode = cfg.preemption_mode == "swap"
        bpt = self.kv.bytes_per_token
        self.swap_capacity_tokens = cfg.swap_space_bytes // bpt if bpt else 0
        self.swap_used_tokens = 0
        self.caps = allocator_capabilities(allocator)  # checked once: the optional allocator calls used
        self._peek = allocator.peek_cached_tokens if self.caps.prefix_peek else None
        # the allocator as a WindowAllocator (decode windows ask it whether the head could fit), else None
        self._window_alloc: WindowAllocator | None = allocator if self.caps.windows else None  # type: ignore[assignment]
        if self.per_chunk and not self.caps.windows:
            raise ConfigError(f"scheduler.prompt_blocks: per_chunk needs an allocator with can_allocate "
                             f"(the WindowAllocator capability), not {type(allocator).__name__}; set "
                             f"scheduler.prompt_blocks: at_admission (engine profiles vllm-v1 and sglang "
                             f"fill per_chunk where it is left out) or engine_profile: kvsim")
        # Requests admitted at least once and not finished (running, swapped, preempted back to
        # waiting). Requests that end are written to ``log`` (a RequestSink, kvsim.sched.sink; the run
        # hands in kvsim.metrics.request_log.RequestLog) and dropped;
        # never-admitted waiting requests are rows of the waiting queue (kvsim.sched.request).
        self.requests: dict[int, Request] = {}
        self.waiting = WaitingQueue()
        self.swapped: list[Request] = []  # ordered by admit_seq
        self.running: list[Request] = []
        self.log = request_log
        self.num_finished = 0
        self.num_rejected = 0
        self._admit_counter = 0
        self._plan: StepPlan | None = None
        self.num_preemptions = 0
        self.preemptions_by_mode = {"recompute": 0, "swap": 0}
        self.swapped_out_bytes = 0
        self.swapped_in_bytes = 0
        self.prefetch = cfg.prefetch
        self.host_link_bandwidth = host_link_bandwidth_bytes_per_s
        # how swaps are priced; None: the legacy size-independent host_link_bandwidth (docs/transfer_model.md)
        self.transfers = host_transfers if host_transfers is not None else legacy_transfers(host_link_bandwidth_bytes_per_s)
        self.hidden_by_prefetch_s = 0.0
        self._any_samples = False  # any request with parallel samples (then count sequences)
        # Lazy decode steps: the engine may install a decode fast path (kvsim.fast.group) through
        # install_decode_path; running requests that decode then join it and are not touched one by
        # one while every running request decodes. Off for timing models that need each context
        # length, and once a request with parallel samples arrives.
        self._decode: DecodeFastPath | None = None
        self._lazy = False

    def install_decode_path(self, path: DecodeFastPath) -> bool:
        """Use ``path`` for lazy decode steps (the engine calls this once, before the run, when the
        allocator has ``BulkDecodeGrowth`` + ``LazyLedger``). Returns whether it is on: not for a
        timing model that needs each request's context length."""
        if not isinstance(path, DecodeFastPath):
            raise TypeError(f"{type(path).__name__} is not a DecodeFastPath")
        if self.running or self.swapped or self.num_finished:
            raise RuntimeError("install_decode_path after the run started")
        if not self.caps.decode_group or self.want_context_lens:
            return False
        self._decode = path
        self._lazy = not self._any_samples
        return True

    # -- arrivals ------------------------------------------------------------------------------
    def add_request(self, req: Request) -> bool:
        """Queue an arriving request built by the caller (e.g. to route it first), or reject it
        (returns False) if it could never run. The scheduler records its replica."""
        req.replica = self.replica_index
        return self._arrive(req.kv, req.arrival_s, req)

    def add_arrival(self, kv: KVRequest, arrival_s: float) -> bool:
        """:meth:`add_request` for an arrival given by its allocator view and arrival time: its
        :class:`Request` is built only when it reaches the head of the waiting queue (or is
        rejected)."""
        return self._arrive(kv, arrival_s, None)

    def _arrive(self, kv: KVRequest, arrival_s: float, req: Request | None) -> bool:
        """THE arrival: queue the request (``req``, or a row for ``kv``) or reject it."""
        if kv.request_id in self.requests:
            raise ValueError(f"request {kv.request_id} added twice")
        if kv.num_samples > 1:
            self._any_samples = True
            # No more lazy decoding. The group is dissolved by the next schedule(), not here: a
            # step planned with it may be in flight (arrivals come between schedule and
            # on_step_done), and its members still advance when it completes.
            self._lazy = False
        reason = self.reject_reason(kv)
        if reason:
            if req is None:
                req = Request.of_view(kv, arrival_s, self.replica_index)
            req.status = RequestStatus.REJECTED
            req.reject_reason = reason
            self.log.append(req)
            self.num_rejected += 1
            return False
        if req is None:
            self.waiting.append_row(kv, arrival_s, self.replica_index)
        else:
            self.waiting.append(req)
        return True

    def reject_reason(self, kv: KVRequest) -> str:
        """Why the request with allocator view ``kv`` could never run (a ``REJECT_*`` reason), or
        "" if it could."""
        prompt, output = kv.prompt_tokens, kv.output_tokens
        if prompt + output > self.max_model_len_tokens:
            return REJECT_TOO_LONG
        if not self.allocator.max_footprint_fits(kv) or kv.num_samples > self.max_num_seqs:
            return REJECT_KV
        if not self.chunked_prefill:
            # A recompute after preemption re-prefills prompt + generated tokens (each generated
            # position once per sample) in one step: Request.batch_tokens of them from 0 computed.
            positions = output - 1 + prompt
            cost = positions if kv.num_samples == 1 else batch_tokens(prompt, kv.num_samples, positions, 0)
            if cost > self.token_budget:
                return REJECT_BUDGET
        return ""

    @property
    def decode_group_enabled(self) -> bool:
        """Does this scheduler use a lazy decode fast path (until a request with samples arrives)?"""
        return self._lazy

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # -- preemption ------------------------------------------------------------------------------
    def _pick_victim(self) -> Request:
        """The victim among running requests: the ``scheduler.victim`` plugin (kvsim/sched/victim.py).
        Policies read requests' progress, so it must be current: no lazy decode-group members."""
        if self._decode is not None and len(self._decode):
            raise RuntimeError("victim chosen while decode-group progress is lazy (scheduler bug)")
        return self._victim_policy.pick(self.running, self.allocator)

    def _copies(self, request_id: int, first_token: int, end_token: int) -> int:
        """Copies moving the request's KV of tokens ``[first_token, end_token)`` over the host link
        (0 on the legacy link, whose price has no per-copy cost)."""
        tr = self.transfers
        if tr.legacy or end_token <= first_token:
            return 0
        bs = self.allocator.block_size
        if bs is None:
            units = 1  # one contiguous extent per sequence
        else:
            first, end = first_token // bs, -(-end_token // bs)
            if tr.granularity == "run" and self.caps.block_runs:
                units = self.allocator.block_runs(request_id, first, end)
            else:
                units = end - first  # per block (or blocks not named: no coalescing can be seen)
        return units * tr.copies_per_unit

    def _preempt(self, victim: Request, step: _Step) -> None:
        """Preempt ``victim``; a swap adds its bytes and copies to ``step``."""
        out_copies = self._copies(victim.request_id, 0, victim.num_computed_tokens) if self.swap_mode else 0
        self.allocator.free(victim.request_id)
        self.running.remove(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        computed = victim.num_computed_tokens
        if self.swap_mode and computed and self.swap_used_tokens + computed <= self.swap_capacity_tokens:
            victim.status = RequestStatus.SWAPPED
            victim.num_swaps += 1
            victim.swapped_tokens = computed
            self.swap_used_tokens += computed
            keys = [r.admit_seq for r in self.swapped]
            self.swapped.insert(bisect.bisect(keys, victim.admit_seq), victim)
            self.preemptions_by_mode["swap"] += 1
            nbytes = computed * self.kv.bytes_per_token
            self.swapped_out_bytes += nbytes
            step.swap_out_bytes += nbytes
            step.swap_out_copies += out_copies
            return
        victim.recomputed_tokens += computed
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.appendleft(victim)
        self.preemptions_by_mode["recompute"] += 1

    def head_might_fit(self, num_running: int) -> bool:
        """Could a schedule() with ``num_running`` decoding requests admit the waiting head, if the
        running requests took no more memory? (Decode windows: False means it surely stays blocked.
        Needs the WindowAllocator capability, which decode windows are built on.)"""
        if self._window_alloc is None:
            raise TypeError(f"{type(self.allocator).__name__} lacks the WindowAllocator capability (can_allocate)")
        req = self.waiting.head
        if req is None or self.swapped or num_running + req.num_samples > self.max_num_seqs:
            return False
        budget = self.token_budget - num_running
        if budget <= 0:
            return False
        cached = self.cached_prefix_tokens(req)
        if req.num_tokens - cached > budget and not self.chunked_prefill:
            return False
        # per_chunk without reserve_full_isl admits once the first chunk fits: one token is a lower bound
        hold = cached + 1 if self.per_chunk and not self.reserve_full_isl else req.num_tokens
        return self._window_alloc.can_allocate(req.kv, hold)

    def prefetch_target(self) -> Request | None:
        """The request whose KV prefetch loads while the link is idle: the next to be swapped in,
        else the head of the waiting queue. The engine credits it each step's compute time, added in
        step order (``((p + d0) + d1) + ...``: the same floats one step at a time or as a window)."""
        if not self.prefetch:
            return None
        if self.swapped:
            return self.swapped[0]
        return self.waiting.head

    @staticmethod
    def credit_prefetch(target: Request | None, durations) -> None:
        """Credit the prefetch ``target`` (from :meth:`prefetch_target`; None: nobody) with each
        step's compute time, added in step order (``((p + d0) + d1) + ...``: the same floats one
        step at a time or as a window)."""
        if target is not None:
            p = target.prefetched_s
            for d in durations:
                p += d
            target.prefetched_s = p

    def _hide(self, req: Request, need_s: float) -> float:
        """Transfer time still to pay for ``need_s`` of loads, after prefetch (records both)."""
        hidden = min(need_s, req.prefetched_s) if self.prefetch else 0.0
        req.prefetched_s = 0.0
        req.load_s += need_s
        req.hidden_s += hidden
        self.hidden_by_prefetch_s += hidden
        return need_s - hidden

    def cached_prefix_tokens(self, req: Request) -> int:
        """Leading tokens of ``req`` the allocator would find in its prefix cache now (0 without one)."""
        return self._peek(req.kv, req.num_tokens) if self._peek is not None else 0

    # -- one step --------------------------------------------------------------------------------
    def schedule(self, now_s: float) -> StepPlan:
        """Plan one step, in four phases (module docstring): the decode group, the running requests
        one by one, swap-ins, admissions. Then the step's batch shape."""
        if self._plan is not None:
            raise RuntimeError("schedule() called twice without on_step_done()")
        step = _Step(self.token_budget)
        group_decodes = self._group_phase(step)
        if group_decodes < len(self.running):
            self._running_phase(step, group_decodes)
        if self.swapped:
            self._swap_in_phase(step)
        if self.waiting and not self.swapped:
            self._admit_phase(step, now_s)
        plan = StepPlan(
            scheduled=tuple([(rid, n) for rid, (n, _) in step.scheduled.items()]),
            shape=self._batch_shape(step, group_decodes),
            admitted=tuple(step.admitted),
            preempted=tuple(step.preempted),
            group_decodes=group_decodes,
        )
        self._plan = plan
        return plan

    def _group_phase(self, step: _Step) -> int:
        """Phase 0: if every running request is a member of the decode group and the budget holds
        one token each, grow them all by one token in one allocator call (all or nothing). Nobody is
        touched one by one; the group step count advances in on_step_done. Returns the members that
        decode (0: the group is dissolved and phase 1 takes every running request)."""
        path = self._decode
        if path is None:
            return 0
        n, kv_tokens, kv_pages = path.decode_step(len(self.running) if self._lazy else 0, step.budget)
        if n:
            step.budget -= n
            step.group_kv_tokens = kv_tokens
            step.group_kv_pages = kv_pages
        return n

    def _running_phase(self, step: _Step, first: int) -> None:
        """Phase 1: running requests from index ``first`` on, in admission order; each gets room for
        its new tokens, preempting victims while that fails."""
        alloc = self.allocator
        scheduled = step.scheduled
        i = first
        while i < len(self.running) and step.budget > 0:
            req = self.running[i]
            n = req.num_uncomputed_tokens
            cost = n if req.num_samples == 1 else req.batch_tokens(n)
            if cost > step.budget:
                n = req.positions_within(step.budget) if self.chunked_prefill else 0
                if not n:
                    i += 1
                    continue
                cost = req.batch_tokens(n)
            while not alloc.ensure_slots(req.request_id, req.num_computed_tokens + n):
                victim = self._pick_victim()
                vi = self.running.index(victim)
                if victim.request_id in scheduled:
                    step.budget += scheduled.pop(victim.request_id)[1]
                self._preempt(victim, step)
                step.preempted.append(victim.request_id)
                if victim is req:
                    n = 0
                    break
                if vi < i:
                    i -= 1
            if n:
                scheduled[req.request_id] = (n, cost)
                step.budget -= cost
                i += 1

    def _swap_in_phase(self, step: _Step) -> None:
        """Phase 2: swapped requests come back (oldest admission first) before any new admission."""
        alloc = self.allocator
        while (self.swapped and not step.preempted and step.budget > 0
               and self.num_running_seqs() + self.swapped[0].num_samples <= self.max_num_seqs):
            req = self.swapped[0]
            n = req.num_uncomputed_tokens
            if req.batch_tokens(n) > step.budget:
                n = req.positions_within(step.budget) if self.chunked_prefill else 0
                if not n:
                    break
            got = alloc.allocate(req.kv, req.num_tokens)
            if got is None:
                break
            self.swapped.pop(0)
            computed = max(req.num_computed_tokens, got.cached_tokens)
            first = min(got.cached_tokens, req.num_computed_tokens)
            transfer = req.num_computed_tokens - first
            copies = self._copies(req.request_id, first, req.num_computed_tokens)
            req.num_computed_tokens = computed
            n = min(n, req.num_uncomputed_tokens)
            self.swap_used_tokens -= req.swapped_tokens
            req.swapped_tokens = 0
            nbytes = transfer * self.kv.bytes_per_token
            self.swapped_in_bytes += nbytes
            if self.transfers.legacy:
                unhidden_s = self._hide(req, nbytes / self.host_link_bandwidth + got.load_s)
                # what prefetch did not hide is paid now: swap bytes at the link, the rest as tier loads
                step.swap_in_bytes += min(nbytes, int(unhidden_s * self.host_link_bandwidth))
                step.tier_load_s += max(0.0, unhidden_s - nbytes / self.host_link_bandwidth)
            else:
                swap_s = self.transfers.copy_s(nbytes, copies, "h2d")
                unhidden_s = self._hide(req, swap_s + got.load_s)
                self._pay_swap_in(step, nbytes, copies, swap_s, min(unhidden_s, swap_s))
                step.tier_load_s += max(0.0, unhidden_s - swap_s)
            if not alloc.ensure_slots(req.request_id, computed + n):
                raise RuntimeError(f"request {req.request_id}: swapped in but its next tokens do not fit")
            req.status = RequestStatus.RUNNING
            self._insert_running(req)
            cost = req.batch_tokens(n)
            step.scheduled[req.request_id] = (n, cost)
            step.budget -= cost

    @staticmethod
    def _pay_swap_in(step: _Step, nbytes: int, copies: int, swap_s: float, unhidden_s: float) -> None:
        """Add the part of a swap-in that prefetch did not hide to ``step``: prefetch issued the
        first copies while the link was idle; the copies not finished when the step starts are paid
        whole (a copy in flight is waited for), with their share of the bytes."""
        if unhidden_s >= swap_s or copies == 0:
            left = copies
        elif unhidden_s <= 0.0:
            return
        else:
            left = copies - int((swap_s - unhidden_s) / (swap_s / copies))
        step.swap_in_bytes += nbytes if left == copies else nbytes * left // copies
        step.swap_in_copies += left

    def _admit_phase(self, step: _Step, now_s: float) -> None:
        """Phase 3: waiting requests, FCFS, only if nothing was preempted or is swapped out."""
        alloc = self.allocator
        waiting, running = self.waiting, self.running
        while (waiting.head is not None and not self.swapped and not step.preempted and step.budget > 0
               and self.num_running_seqs() + waiting.head.num_samples <= self.max_num_seqs):
            req = waiting.head
            cached = self.cached_prefix_tokens(req)
            n = req.num_tokens - cached
            cost = req.batch_tokens(n, computed=cached)
            if cost > step.budget:
                n = req.positions_within(step.budget, computed=cached) if self.chunked_prefill else 0
                if not n:
                    break
                cost = req.batch_tokens(n, computed=cached)
            hold = req.num_tokens
            if self.per_chunk:  # vLLM v1: check the whole prompt fits (reserve_full_isl), hold one chunk
                if self.reserve_full_isl and not alloc.can_allocate(req.kv, req.num_tokens):
                    break
                hold = cached + n
            got = alloc.allocate(req.kv, hold)
            if got is None:
                break
            if got.cached_tokens != cached:
                raise RuntimeError(f"request {req.request_id}: cache hit changed between peek and allocate")
            req.num_computed_tokens = cached
            if got.load_s:
                step.tier_load_s += self._hide(req, got.load_s)
            if not alloc.ensure_slots(req.request_id, cached + n):
                raise RuntimeError(f"request {req.request_id}: admitted but its first chunk does not fit")
            waiting.popleft()
            self.requests[req.request_id] = req
            req.status = RequestStatus.RUNNING
            req.admit_seq = self._admit_counter
            self._admit_counter += 1
            if math.isnan(req.admitted_s):
                req.admitted_s = now_s
                req.cached_tokens = cached
                req.cpu_hit_tokens = got.cpu_tokens
                req.ssd_hit_tokens = got.ssd_tokens
                req.remote_hit_tokens = got.remote_tokens
            running.append(req)
            step.admitted.append(req.request_id)
            step.scheduled[req.request_id] = (n, cost)
            step.budget -= cost

    def num_running_seqs(self) -> int:
        """Running sequences (a request with n parallel samples counts n), for ``max_num_seqs``."""
        if not self._any_samples:
            return len(self.running)
        return sum(r.num_samples for r in self.running)

    def has_running_beams(self) -> bool:
        """Is a beam-search request (kvsim.kv.beam) running? (The engine steps one by one then.)"""
        return any(r.kv.beam_events is not None for r in self.running)

    @property
    def has_parallel_samples(self) -> bool:
        """Has any request with parallel samples arrived? (Then sequences are counted per sample.)"""
        return self._any_samples

    def load_seqs(self) -> int:
        """Queued + running sequences (what a load-aware router compares)."""
        return (self.num_running_seqs() + self.waiting.num_seqs
                + sum(r.num_samples for r in self.swapped))

    def _insert_running(self, req: Request) -> None:
        """Keep the running list in admission order (a swapped-in request returns to its place)."""
        keys = [r.admit_seq for r in self.running]
        self.running.insert(bisect.bisect(keys, req.admit_seq), req)

    def _batch_shape(self, step: _Step, group_decodes: int) -> BatchShape:
        """THE batch shape of a step: the decode group's members (aggregates from phase 0), then
        each request scheduled one by one. A sequence reads ``c + n`` KV tokens in
        ``ceil((c + n) / block_size)`` pages (one run without pages); each of a request's parallel
        samples is a sequence once they diverged (past the prompt)."""
        bs = self.allocator.block_size
        want_ctx = self.want_context_lens
        n_pre_seqs = pre_tok = 0
        n_dec_seqs = dec_tok = group_decodes
        kv_read = pairs = step.group_kv_tokens
        pages = step.group_kv_pages
        ctx: list[int] = []
        for rid, (n, cost) in step.scheduled.items():
            req = self.requests[rid]
            c = req.num_computed_tokens
            s = req.num_samples  # each sample is a sequence reading its own context
            if n == 1 and req.num_generated > 0 and c == req.num_tokens - 1:
                n_dec_seqs += s
                dec_tok += s
                kv_read += s * (c + 1)
                pairs += s * (c + 1)
                pages += s if bs is None else s * -(-(c + 1) // bs)
                if want_ctx:
                    ctx.extend([c + 1] * s)
                continue
            n_pre_seqs += 1
            pre_tok += cost
            kv_read += c + n if s == 1 else cost + c
            pairs += n * c + n * (n + 1) // 2
            seqs = 1 if s == 1 or c + n <= req.prompt_tokens else s
            pages += seqs if bs is None else seqs * -(-(c + n) // bs)
            if want_ctx:
                ctx.append(c + n)
        return BatchShape(
            num_seqs=group_decodes + len(step.scheduled), num_prefill_seqs=n_pre_seqs, num_decode_seqs=n_dec_seqs,
            num_prefill_tokens=pre_tok, num_decode_tokens=dec_tok, kv_tokens_read=kv_read,
            attention_pairs=pairs, kv_pages_read=pages, swap_in_bytes=step.swap_in_bytes,
            swap_out_bytes=step.swap_out_bytes, swap_in_copies=step.swap_in_copies,
            swap_out_copies=step.swap_out_copies, tier_load_s=step.tier_load_s, context_lens=tuple(ctx),
        )

    def on_step_done(self, now_s: float) -> tuple[list[Request], list[Request]]:
        """Advance the requests of the last plan. Returns (first-token requests, finished requests)."""
        plan = self.take_plan()
        first: list[Request] = []
        done: list[Request] = []
        path = self._decode
        joins = self._lazy and plan.group_decodes
        if plan.group_decodes:
            done = path.advance()
        group_done = len(done)
        for rid, n in plan.scheduled:
            req = self.requests[rid]
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:  # caught up: this step sampled a token
                req.num_generated += 1
                if math.isnan(req.first_token_s):
                    req.first_token_s = now_s
                    first.append(req)
                if req.num_generated >= req.output_tokens:
                    done.append(req)
                elif joins:
                    path.join(req)
        if group_done and len(done) > group_done:
            done.sort(key=lambda r: r.admit_seq)  # the order a one-by-one step finishes them in
        if done:
            self._finish(done, now_s)
        if self._lazy and not plan.group_decodes:
            # A step planned one request at a time: every running request that now decodes
            # (re)joins the group.
            path.join_decoders(self.running)
        return first, done

    def take_plan(self) -> StepPlan:
        """Hand over the plan in flight: whoever takes it (``on_step_done``, or a decode window that
        replays the step itself) completes it. The next ``schedule`` may follow."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("on_step_done() without schedule()")
        self._plan = None
        return plan

    def _finish(self, done: list[Request], now_s: float, keep_in_running: bool = False) -> None:
        """THE place requests finish (in ``done``'s order): status, finish time, KV freed, the
        row written to the request log (and the request dropped from ``requests``), and out of the
        running list (``keep_in_running``: the caller drops them later, at once, with
        :meth:`drop_finished`)."""
        free = self.allocator.free
        append = self.log.append
        requests = self.requests
        for r in done:
            if r.num_generated != r.output_tokens:
                raise RuntimeError(f"{r}: finished with {r.num_generated} of {r.output_tokens} output tokens")
            r.status = RequestStatus.FINISHED
            r.finish_s = now_s
            free(r.request_id)
            append(r)
            del requests[r.request_id]
        self.num_finished += len(done)
        if keep_in_running:
            return
        if len(done) <= 4:
            for r in done:
                self.running.remove(r)
        else:
            self.drop_finished()

    def drop_finished(self) -> None:
        """Remove finished requests from the running list (after ``_finish(..., keep_in_running)``)."""
        self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]

    def finish_requests(self, done: list[Request], now_s: float) -> None:
        """Finish ``done`` (running requests that generated their last token, progress synced) at
        ``now_s``, in that order (decode windows: the decode group's finished members)."""
        if done:
            self._finish(done, now_s)

    def finish_decoded(self, req: Request, computed_tokens: int, now_s: float) -> None:
        """A decode window's request generated its last token with ``computed_tokens`` computed:
        catch the allocator up on the tokens written since its last block event (a block filled by
        the final token is registered in the prefix cache before the request frees it, as step by
        step) and finish it. It stays in the running list until :meth:`drop_finished`."""
        self.allocator.ensure_slots(req.request_id, computed_tokens)
        req.num_computed_tokens = computed_tokens
        req.num_generated = req.output_tokens
        self._finish([req], now_s, keep_in_running=True)

    def advance_decoders(self, reqs: list[Request], computed_tokens: list[int], steps: int) -> None:
        """A decode window advanced each of ``reqs`` by ``steps`` tokens, to ``computed_tokens``."""
        for r, c in zip(reqs, computed_tokens):
            r.num_computed_tokens = c
            r.num_generated += steps

    def sync_progress(self) -> None:
        """Write the decode fast path's lazy progress back into its requests (before reading them)."""
        if self._decode is not None:
            self._decode.sync()

    def usage(self):
        head = self.waiting.head.kv if self.waiting.head is not None and not self.swapped else None
        return self.allocator.usage(head)

    def check_invariants(self) -> None:
        if self._decode is not None:
            self._decode.sync()
            self._decode.check(self.running)
        assert self.num_running_seqs() <= self.max_num_seqs, "more running sequences than max_num_seqs"
        seqs = [r.admit_seq for r in self.running]
        assert seqs == sorted(seqs), "running list is not in admission order"
        for r in self.running:
            assert r.status == RequestStatus.RUNNING, f"{r} in running list"
            assert self.allocator.held_tokens(r.request_id) >= r.num_computed_tokens, f"{r}: computed > held"
            assert 0 <= r.num_computed_tokens <= r.num_tokens, f"{r}: computed out of range"
        for r in self.waiting:
            assert r.status == RequestStatus.WAITING, f"{r} in waiting queue"
            assert r.num_computed_tokens == 0, f"{r}: waiting with computed tokens"
        assert sum(r.swapped_tokens for r in self.swapped) == self.swap_used_tokens, "host tier usage out of sync"
        assert self.swap_used_tokens <= self.swap_capacity_tokens or not self.swapped, "host tier over capacity"
        for r in self.swapped:
            assert r.status == RequestStatus.SWAPPED, f"{r} in swapped queue"
        ids = [r.request_id for r in self.running] + [r.request_id for r in self.waiting] + \
            [r.request_id for r in self.swapped]
        assert len(ids) == len(set(ids)), "a request is queued twice"
        assert not set(ids) - set(self.requests) - {r.request_id for r in self.waiting if r.admit_seq < 0}, \
            "a running, swapped or preempted request is missing from the requests map"
        ended = self.log.column("request_id")  # finished and rejected, of every replica sharing the log
        assert len(ended) == len(np.unique(ended)), "a request finished (or was rejected) twice"
        assert not set(ids) & set(ended.tolist()), "a request is queued after it ended"
        assert (self.log.column("finish_s") >= self.log.column("arrival_s")).sum() \
            == self.log.num_finished, "a request finished before it arrived"
        self.allocator.check_invariants()
