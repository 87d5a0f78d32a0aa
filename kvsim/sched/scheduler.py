"""Iteration-level (continuous-batching) scheduler in the style of vLLM.

There is no prefill or decode phase here: every request has ``num_tokens`` (prompt + generated) and
``num_computed_tokens``, and each step gives each request up to ``num_tokens - num_computed`` new
tokens, within a per-step token budget. The order of one ``schedule()`` call:

1. running requests, in admission order. Each asks the allocator for room for its new tokens; when
   that fails the scheduler preempts a victim (default: the most recently admitted running request,
   as vLLM does), frees its KV, resets its computed tokens to 0 (recompute) and puts it at the
   *front* of the waiting queue, then retries. If the victim is the request itself it is not
   scheduled this step.
2. waiting requests, FCFS, only if nothing was preempted in this call: the head is admitted only if
   the allocator can hold its whole current prompt at once (all or nothing) and ``max_num_seqs`` and
   the token budget allow. Without chunked prefill a prompt is scheduled whole or not at all; with it,
   the head may take the remaining budget and catch up over several steps.

Requests that could never run are rejected when they arrive and counted: longer than the model's
max length (prompt + output), or larger than the whole KV budget. The scheduler never sees block ids.
"""

from __future__ import annotations

import math
from collections import deque

from kvsim.kv.base import KVAllocator
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.plan import StepPlan
from kvsim.sched.request import Request, RequestStatus
from kvsim.timing.base import BatchShape

REJECT_TOO_LONG = "exceeds_max_model_len"
REJECT_KV = "exceeds_kv_capacity"
REJECT_BUDGET = "exceeds_batch_token_budget"


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, allocator: KVAllocator, max_model_len_tokens: int,
                 want_context_lens: bool = False):
        self.cfg = cfg
        self.allocator = allocator
        self.max_model_len_tokens = max_model_len_tokens
        self.max_num_seqs = cfg.max_num_seqs
        self.token_budget = cfg.token_budget(max_model_len_tokens)
        self.chunked_prefill = cfg.chunked_prefill
        self.want_context_lens = want_context_lens
        self.requests: dict[int, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.rejected: list[Request] = []
        self._admit_counter = 0
        self._plan: StepPlan | None = None
        self.num_preemptions = 0

    # -- arrivals ------------------------------------------------------------------------------
    def add_request(self, req: Request) -> bool:
        """Queue an arriving request, or reject it (returns False) if it could never run."""
        if req.request_id in self.requests:
            raise ValueError(f"request {req.request_id} added twice")
        self.requests[req.request_id] = req
        reason = ""
        if req.prompt_tokens + req.output_tokens > self.max_model_len_tokens:
            reason = REJECT_TOO_LONG
        elif not self.allocator.max_footprint_fits(req.kv):
            reason = REJECT_KV
        elif not self.chunked_prefill and req.prompt_tokens + req.output_tokens - 1 > self.token_budget:
            # A recompute after preemption re-prefills prompt + generated tokens in one step.
            reason = REJECT_BUDGET
        if reason:
            req.status = RequestStatus.REJECTED
            req.reject_reason = reason
            self.rejected.append(req)
            return False
        self.waiting.append(req)
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step --------------------------------------------------------------------------------
    def _pick_victim(self) -> Request:
        policy = self.cfg.victim
        if policy == "latest_admitted":
            return self.running[-1]
        if policy == "largest_kv":
            return max(self.running, key=lambda r: (self.allocator.held_tokens(r.request_id), r.admit_seq))
        if policy == "fewest_tokens_left":
            return min(self.running, key=lambda r: (r.output_tokens - r.num_generated, -r.admit_seq))
        if policy == "lowest_priority":
            # No priorities in the request record yet: every request ties, latest admitted loses.
            return self.running[-1]
        raise ValueError(f"unknown victim policy {policy!r}")

    def _preempt(self, victim: Request) -> None:
        self.allocator.free(victim.request_id)
        victim.recomputed_tokens += victim.num_computed_tokens
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        victim.status = RequestStatus.WAITING
        self.running.remove(victim)
        self.waiting.appendleft(victim)
        self.num_preemptions += 1

    def schedule(self, now_s: float) -> StepPlan:
        if self._plan is not None:
            raise RuntimeError("schedule() called twice without on_step_done()")
        alloc = self.allocator
        budget = self.token_budget
        scheduled: dict[int, int] = {}
        preempted: list[int] = []
        admitted: list[int] = []

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = req.num_uncomputed_tokens
            if n > budget:
                if not self.chunked_prefill:
                    i += 1
                    continue
                n = budget
            while not alloc.ensure_slots(req.request_id, req.num_computed_tokens + n):
                victim = self._pick_victim()
                vi = self.running.index(victim)
                if victim.request_id in scheduled:
                    budget += scheduled.pop(victim.request_id)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    n = 0
                    break
                if vi < i:
                    i -= 1
            if n:
                scheduled[req.request_id] = n
                budget -= n
                i += 1

        while (self.waiting and not preempted and len(self.running) < self.max_num_seqs and budget > 0):
            req = self.waiting[0]
            n = req.num_tokens
            if n > budget:
                if not self.chunked_prefill:
                    break
                n = budget
            if not alloc.allocate(req.kv, req.num_tokens):
                break
            if not alloc.ensure_slots(req.request_id, n):
                raise RuntimeError(f"request {req.request_id}: admitted but its first chunk does not fit")
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.admit_seq = self._admit_counter
            self._admit_counter += 1
            if math.isnan(req.admitted_s):
                req.admitted_s = now_s
            self.running.append(req)
            admitted.append(req.request_id)
            scheduled[req.request_id] = n
            budget -= n

        plan = StepPlan(
            scheduled=tuple(scheduled.items()),
            shape=self._batch_shape(scheduled),
            admitted=tuple(admitted),
            preempted=tuple(preempted),
        )
        self._plan = plan
        return plan

    def _batch_shape(self, scheduled: dict[int, int]) -> BatchShape:
        n_pre_seqs = n_dec_seqs = pre_tok = dec_tok = kv_read = pairs = 0
        ctx: list[int] = []
        for rid, n in scheduled.items():
            req = self.requests[rid]
            c = req.num_computed_tokens
            if n == 1 and req.num_generated > 0 and c == req.num_tokens - 1:
                n_dec_seqs += 1
                dec_tok += 1
            else:
                n_pre_seqs += 1
                pre_tok += n
            kv_read += c + n
            pairs += n * c + n * (n + 1) // 2
            if self.want_context_lens:
                ctx.append(c + n)
        return BatchShape(
            num_seqs=len(scheduled), num_prefill_seqs=n_pre_seqs, num_decode_seqs=n_dec_seqs,
            num_prefill_tokens=pre_tok, num_decode_tokens=dec_tok, kv_tokens_read=kv_read,
            attention_pairs=pairs, context_lens=tuple(ctx),
        )

    def on_step_done(self, now_s: float) -> tuple[list[Request], list[Request]]:
        """Advance the requests of the last plan. Returns (first-token requests, finished requests)."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("on_step_done() without schedule()")
        self._plan = None
        first: list[Request] = []
        done: list[Request] = []
        for rid, n in plan.scheduled:
            req = self.requests[rid]
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:  # caught up: this step sampled a token
                req.num_generated += 1
                if math.isnan(req.first_token_s):
                    req.first_token_s = now_s
                    first.append(req)
                if req.num_generated >= req.output_tokens:
                    req.status = RequestStatus.FINISHED
                    req.finish_s = now_s
                    self.allocator.free(rid)
                    self.finished.append(req)
                    done.append(req)
        if done:
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return first, done

    def usage(self):
        head = self.waiting[0].kv if self.waiting else None
        return self.allocator.usage(head)

    def check_invariants(self) -> None:
        assert len(self.running) <= self.max_num_seqs, "more running requests than max_num_seqs"
        seqs = [r.admit_seq for r in self.running]
        assert seqs == sorted(seqs), "running list is not in admission order"
        for r in self.running:
            assert r.status == RequestStatus.RUNNING, f"{r} in running list"
            assert self.allocator.held_tokens(r.request_id) >= r.num_computed_tokens, f"{r}: computed > held"
            assert 0 <= r.num_computed_tokens <= r.num_tokens, f"{r}: computed out of range"
        for r in self.waiting:
            assert r.status == RequestStatus.WAITING, f"{r} in waiting queue"
            assert r.num_computed_tokens == 0, f"{r}: waiting with computed tokens"
        ids = [r.request_id for r in self.running] + [r.request_id for r in self.waiting]
        assert len(ids) == len(set(ids)), "a request is queued twice"
        fin = [r.request_id for r in self.finished]
        assert len(fin) == len(set(fin)), "a request finished twice"
        for r in self.finished:
            assert r.finish_s >= r.arrival_s, f"{r} finished before it arrived"
            assert r.num_generated == r.output_tokens, f"{r}: finished with wrong output count"
        self.allocator.check_invariants()
