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
   Prompt-only steps (:mod:`kvsim.sched.prefill`; ``scheduler.prefill_only_steps``: vLLM v0 without
   chunked prefill, ``Scheduler._schedule_default``: "don't schedule decodes if prefills are
   scheduled"; ``scheduler.mixed_chunk: false``: SGLang's default with chunked prefill) try prompt
   work first, with the whole budget: the prompts the last step cut, then this phase; a step that
   schedules any runs only that prompt work; otherwise phases 0-2 follow and nobody is admitted in
   that step.

Requests that could never run are rejected when they arrive and counted: longer than the model's
max length (prompt + output), or larger than the whole KV budget. The scheduler never sees block ids.

Host copies are counted, not priced, here: :class:`~kvsim.sched.swap.HostSwap` owns the swap space
and counts the bytes and copies of swaps; the transfer model (:mod:`kvsim.timing.transfer`,
docs/transfer_model.md) turns them into seconds, for prefetch hiding and for the step time. The
batch shape is built in :mod:`kvsim.sched.shape`, the invariants checked in :mod:`kvsim.sched.invariants`.
Arrivals and rejections are :mod:`kvsim.sched.arrivals`; vLLM V1's async scheduling (what a plan may
see of the step in flight) is :mod:`kvsim.sched.async_sched`.
"""

from __future__ import annotations

import bisect
import math

from kvsim.models.geometry import KVGeometry
from kvsim.errors import ConfigError
from kvsim.kv.protocol import KVAllocator, WindowAllocator, allocator_capabilities
from kvsim.sched.arrivals import Arrivals
from kvsim.sched.async_sched import AsyncScheduling
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.fastpath import DecodeFastPath
from kvsim.sched.plan import StepPlan
from kvsim.sched.prefill import PrefillPhases
from kvsim.sched.invariants import check_scheduler
from kvsim.sched.request import Request, RequestStatus, WaitingQueue
from kvsim.sched.rounds import MultiStepRounds
from kvsim.sched.shape import StepDraft, batch_shape
from kvsim.sched.sink import RequestSink
from kvsim.sched.swap import HostSwap
from kvsim.sched.victim import build_victim_policy
from kvsim.sched.window_hooks import WindowHooks
from kvsim.timing.transfer import HostTransfers, legacy_transfers


_NO_KV = KVGeometry(1, 1, 1, 1, "fp16", 0)  # a scheduler built without a geometry counts no swap bytes


class Scheduler(Arrivals, WindowHooks, PrefillPhases, MultiStepRounds, AsyncScheduling):
    def __init__(self, cfg: SchedulerConfig, allocator: KVAllocator, max_model_len_tokens: int,
                 want_context_lens: bool = False, kv: KVGeometry | None = None,
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
        # prompt-only steps (kvsim.sched.prefill): a step with prompt work runs no decodes. vLLM v0
        # without chunked prefill (prefill_only_steps); SGLang's default with it (mixed_chunk: false)
        self.prefill_only_steps = not cfg.mixed_chunk if cfg.chunked_prefill else cfg.prefill_only_steps
        self.max_prefill_tokens = cfg.max_prefill_tokens
        self._chunks: list[Request] = []  # running requests whose prompt the last step cut (on_step_done)
        # per_chunk: blocks for each scheduled chunk only (vLLM v1), after the reserve_full_isl check
        self.per_chunk = cfg.prompt_blocks == "per_chunk"
        self.reserve_full_isl = cfg.reserve_full_isl
        self.want_context_lens = want_context_lens
        # the run's KV geometry: its bytes_per_token (this GPU's share) sizes swaps; None: no bytes
        self.kv = kv if kv is not None else _NO_KV
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
        # the host tier: swap space, swapped-out requests, bytes and copies moved, prefetch credit.
        # Copies are priced by the transfer model (host_transfers; None: the legacy default link).
        self.host = HostSwap(cfg, allocator, self.caps, self.kv.bytes_per_token,
                             host_transfers if host_transfers is not None else legacy_transfers())
        self.swapped: list[Request] = self.host.queue  # the same list (read by engines and windows)
        self.running: list[Request] = []
        self.log = request_log
        self.num_finished = 0
        self.num_rejected = 0
        self._ended_in_plan: list[int] = []  # ended while planning (swap_space_full): take_ended_in_plan
        self._admit_counter = 0
        self._arrivals = 0  # requests accepted since the last plan (BatchShape.num_arrivals)
        self._plan: StepPlan | None = None
        self.num_preemptions = 0
        self.preemptions_by_mode = {"recompute": 0, "swap": 0}
        self._any_samples = False  # any request with parallel samples (then count sequences)
        # Lazy decode steps: the engine may install a decode fast path (kvsim.fast.group) through
        # install_decode_path; running requests that decode then join it and are not touched one by
        # one while every running request decodes. Off for timing models that need each context
        # length, and once a request with parallel samples arrives.
        self._decode: DecodeFastPath | None = None
        self._lazy = False
        # vLLM 0.6's multi-step scheduling: rounds of num_scheduler_steps decode steps (kvsim.sched.rounds)
        self.num_scheduler_steps = cfg.num_scheduler_steps
        self._init_rounds(cfg.num_scheduler_steps)
        self._init_async(cfg.async_scheduling)  # vLLM V1's async scheduling (kvsim.sched.async_sched)

    def install_decode_path(self, path: DecodeFastPath) -> bool:
        """Use ``path`` for lazy decode steps (the engine calls this once, before the run, when the
        allocator has ``BulkDecodeGrowth`` + ``LazyLedger``). Returns whether it is on: not for a
        timing model that needs each request's context length, nor with swap preemption on an
        allocator that names its blocks (BlockRuns)."""
        if not isinstance(path, DecodeFastPath):
            raise TypeError(f"{type(path).__name__} is not a DecodeFastPath")
        if self.running or self.swapped or self.num_finished:
            raise RuntimeError("install_decode_path after the run started")
        if not self.caps.decode_group or self.want_context_lens or self._lookahead:
            return False
        if self._known_caching and not self.caps.known_bulk_growth:
            return False  # async scheduling with prefix caching: blocks cached once their tokens are known
        if self.host.swaps_singles and self.caps.block_runs:
            # An allocator that names its blocks takes a bulk decode step's blocks in allocation
            # order; a swapped-in request is allocated anew but returns to its admission place in
            # the running list, so that order would differ from a one-by-one step's. (A rule that
            # swaps only groups needs nothing: a group's arrival ends lazy steps for good.)
            return False
        if self._known_caching:
            path.use_known_growth()
        self._decode = path
        self._lazy = not self._any_samples
        return True

    @property
    def decode_group_enabled(self) -> bool:
        """Does this scheduler use a lazy decode fast path (until a request with samples arrives)?"""
        return self._lazy

    @property
    def has_work(self) -> bool:
        return self.waiting.head is not None or bool(self.running or self.swapped or self._held)

    # -- preemption ------------------------------------------------------------------------------
    def _pick_victim(self) -> Request:
        """The victim among running requests: the ``scheduler.victim`` plugin (kvsim/sched/victim.py).
        Policies read requests' progress, so it must be current: no lazy decode-group members."""
        if self._decode is not None and len(self._decode):
            raise RuntimeError("victim chosen while decode-group progress is lazy (scheduler bug)")
        return self._victim_policy.pick(self.running, self.allocator)

    def _preempt(self, victim: Request, step: StepDraft) -> None:
        """Preempt ``victim``: to the host tier if the preemption rule swaps it and there is room (a
        swap adds its bytes and copies to ``step``), else back to the front of the waiting queue, to
        be recomputed -- or, if its recompute could never run, ended (kvsim.sched.arrivals)."""
        held = self.host.held(victim)  # (read before its KV is freed)
        self.allocator.free(victim.request_id)
        self.running.remove(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        if held is not None and self.host.swap_out(victim, held, step):
            self.preemptions_by_mode["swap"] += 1
            return
        if self._abort_unrecomputable(victim):
            self.preemptions_by_mode["recompute"] += 1
            return
        # discarded work in tokens, as a step counts it: positions past the prompt once per sample
        victim.recomputed_tokens += victim.batch_tokens(victim.num_computed_tokens, computed=0)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.appendleft(victim)
        self.preemptions_by_mode["recompute"] += 1

    def prefetch_target(self) -> Request | None:
        """The request whose KV prefetch loads while the link is idle: the next to be swapped in,
        else the head of the waiting queue. The engine credits it each step's compute time, added in
        step order (``((p + d0) + d1) + ...``: the same floats one step at a time or as a window)."""
        return self.host.prefetch_target(self.waiting.head)

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

    def cached_prefix_tokens(self, req: Request) -> int:
        """Leading tokens of ``req`` the allocator would find in its prefix cache now (0 without one)."""
        return self._peek(req.kv, req.num_tokens) if self._peek is not None else 0

    # -- one step --------------------------------------------------------------------------------
    def schedule(self, now_s: float) -> StepPlan:
        """Plan one step, in four phases (module docstring): the decode group, the running requests
        one by one, swap-ins, admissions; with ``prefill_only_steps`` admissions first, and a step
        that admits is that prompt-only step. Then the step's batch shape."""
        if self._plan is not None:
            raise RuntimeError("schedule() called twice without on_step_done()")
        return self._async_plan(now_s) if self.async_scheduling else self._plan_step(now_s)

    def _plan_step(self, now_s: float) -> StepPlan:
        """The plan of one step from the queues as they are (``schedule``'s body)."""
        arrivals, self._arrivals = self._arrivals, 0
        if self._round_left:  # a multi-step round's next step (kvsim.sched.rounds)
            step = self._round_step()
            plan = StepPlan(scheduled=tuple([(rid, n) for rid, (n, _) in step.scheduled.items()]),
                            shape=batch_shape(step, self.requests, self.allocator.block_size,
                                              self.want_context_lens, 0, True, arrivals),
                            admitted=(), preempted=())
            self._plan = plan
            return plan
        step = StepDraft(self.token_budget)
        group_decodes = 0
        if self.prefill_only_steps and (self.waiting or self._chunks) and not self.swapped:
            self._prompt_only_step(step, now_s)
        if not step.scheduled:
            group_decodes = self._group_phase(step)
            if group_decodes < len(self.running) - len(self._finishing):  # (async: held finishes skipped)
                self._running_phase(step, group_decodes)
            if self.swapped:
                self._swap_in_phase(step)
            if self.waiting.head is not None and not self.swapped and not self.prefill_only_steps:
                self._admit_phase(step, now_s)
        plan = StepPlan(
            scheduled=tuple([(rid, n) for rid, (n, _) in step.scheduled.items()]),
            shape=batch_shape(step, self.requests, self.allocator.block_size, self.want_context_lens, group_decodes,
                              False, arrivals),
            admitted=tuple(step.admitted),
            preempted=tuple(step.preempted),
            group_decodes=group_decodes,
            swapped_in=step.swapped_in,
            swapped_in_bytes=step.swapped_in_bytes,
        )
        if self._lookahead:
            self._open_round(step, now_s, plan.shape.num_prefill_tokens, plan.shape.num_decode_seqs)
        self._plan = plan
        return plan

    def _group_phase(self, step: StepDraft) -> int:
        """Phase 0: if every running request is a member of the decode group and the budget holds
        one token each, grow them all by one token in one allocator call (all or nothing). Nobody is
        touched one by one; the group step count advances in on_step_done. Returns the members that
        decode (0: the group is dissolved and phase 1 takes every running request)."""
        path = self._decode
        if path is None:
            return 0
        # (async scheduling: the finished requests still held are not members and do not grow)
        n, kv_tokens, kv_pages = path.decode_step(len(self.running) - len(self._finishing) if self._lazy else 0,
                                                  step.budget)
        if not n and self._group_sampled and path.released:  # async: the members sampled in the last step
            self._sampled_last.update([r.request_id for r in path.released])
        if n:
            step.budget -= n
            step.group_kv_tokens = kv_tokens
            step.group_kv_pages = kv_pages
        return n

    def _running_phase(self, step: StepDraft, first: int) -> None:
        """Phase 1: running requests from index ``first`` on, in admission order; each gets room for
        its new tokens, preempting victims while that fails."""
        alloc = self.allocator
        scheduled = step.scheduled
        lookahead = self._lookahead  # multi-step: slots for the round's tokens (kvsim.sched.rounds)
        finishing = self._finishing_ids  # async scheduling: finished, output not yet processed
        known = self._ensure_known if self._known_caching else None  # (kvsim.sched.async_sched)
        i = first
        while i < len(self.running) and step.budget > 0:
            req = self.running[i]
            if finishing and req.request_id in finishing:
                i += 1
                continue
            n = req.num_uncomputed_tokens
            cost = n if req.num_samples == 1 else req.batch_tokens(n)
            if cost > step.budget:
                n = req.positions_within(step.budget) if self.chunked_prefill else 0
                if not n:
                    i += 1
                    continue
                cost = req.batch_tokens(n)
            target = req.num_computed_tokens + n
            if lookahead:
                target += self._lookahead_tokens(req, n)
            while not (alloc.ensure_slots(req.request_id, target) if known is None else known(req, target)):
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

    def _swap_in_phase(self, step: StepDraft) -> None:
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
            computed = self.host.swap_in(req, got, step)
            n = min(n, req.num_uncomputed_tokens)
            if not alloc.ensure_slots(req.request_id, computed + n):
                raise RuntimeError(f"request {req.request_id}: swapped in but its next tokens do not fit")
            req.status = RequestStatus.RUNNING
            self._insert_running(req)
            step.swapped_in += 1
            cost = req.batch_tokens(n)
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

    def on_step_done(self, now_s: float) -> tuple[list[Request], list[Request]]:
        """Advance the requests of the last plan. Returns (first-token requests, finished requests)."""
        plan = self.take_plan()
        if self._finishing:  # async scheduling: the last step's finishes are processed now
            self._release_finishing()
        self._last_end_s = now_s
        first: list[Request] = []
        done: list[Request] = []
        path = self._decode
        joins = self._lazy and plan.group_decodes
        if plan.group_decodes:
            done = path.advance()
        group_done = len(done)
        cut: list[Request] = []  # prompts this step cut at the budget (a prompt-only step continues them first)
        for rid, n in plan.scheduled:
            req = self.requests[rid]
            req.num_computed_tokens += n
            if req.num_computed_tokens != req.num_tokens:
                cut.append(req)
            else:  # caught up: this step sampled a token
                req.num_generated += 1
                if math.isnan(req.first_token_s):
                    req.first_token_s = now_s
                    first.append(req)
                if req.num_generated >= req.output_tokens:
                    done.append(req)
                elif joins:
                    path.join(req)
        self._chunks = cut
        if self.async_scheduling:  # the requests that sampled a token in this step (kvsim.sched.async_sched)
            self._sampled_last = {rid for rid, _ in plan.scheduled} - {r.request_id for r in cut}
            self._group_sampled = bool(plan.group_decodes)  # and the group's members, all of them
        if self._lookahead:
            done = self._round_progress(done)
        if group_done and len(done) > group_done:
            done.sort(key=lambda r: r.admit_seq)  # the order a one-by-one step finishes them in
        self.finish_requests(done, now_s)  # (async scheduling: their KV held until the next step ends)
        if self._lazy and not plan.group_decodes:
            # A step planned one request at a time: every running request that now decodes
            # (re)joins the group (async scheduling: not a finished one whose output is held).
            finishing = self._finishing_ids
            path.join_decoders([r for r in self.running if r.request_id not in finishing] if finishing
                               else self.running)
        return first, done

    def take_plan(self) -> StepPlan:
        """Hand over the plan in flight: whoever takes it (``on_step_done``, or a decode window that
        replays the step itself) completes it. The next ``schedule`` may follow."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("on_step_done() without schedule()")
        self._plan = None
        return plan

    def _finish(self, done: list[Request], now_s: float, keep_in_running: bool = False,
                already_free: bool = False) -> None:
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
            if not already_free:  # (a preempted one: kvsim.sched.async_sched)
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

    def usage(self):
        head = self.waiting.head.kv if self.waiting.head is not None and not self.swapped else None
        return self.allocator.usage(head)

    def check_invariants(self) -> None:
        """The scheduler's invariants, then the allocator's (:func:`kvsim.sched.invariants.check_scheduler`)."""
        check_scheduler(self)
