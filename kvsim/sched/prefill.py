"""Prompt work of a step: admissions (phase 3) and prompt-only steps.

A mixin of :class:`~kvsim.sched.scheduler.Scheduler` (its state, not its own). Admissions take
waiting requests FCFS (the scheduler's module docstring gives the rules). A prompt-only step
(``Scheduler.prefill_only_steps``: vLLM v0 without chunked prefill, ``scheduler.prefill_only_steps``;
SGLang's default with it, ``scheduler.mixed_chunk: false``) holds prompt work and nothing else:
first the prompts the last step cut at the token budget continue (SGLang
``Scheduler.get_new_batch_prefill`` adds its ``chunked_req`` before the waiting queue), then
admissions take the rest of the budget. ``scheduler.max_prefill_tokens`` (SGLang's
``PrefillAdder.add_one_req``: ``real_input_tokens >= rem_input_tokens`` with a non-empty batch)
stops admissions into a step that already holds prompt work once a request's uncached prompt
tokens reach what is left of that limit; the first prompt of a step is never held back by it.
"""

from __future__ import annotations

import math

from kvsim.sched.request import Request, RequestStatus
from kvsim.sched.shape import StepDraft


class PrefillPhases:
    """Admissions and the prompt-only step (the scheduler's state: ``waiting``, ``running``, ...)."""

    _chunks: list[Request]

    def _prompt_only_step(self, step: StepDraft, now_s: float) -> None:
        """A prompt-only step: cut prompts continue, then admissions. Schedules nothing when no
        prompt can go on (then the running requests decode)."""
        if self._chunks and not self._continue_chunks(step):
            return  # a cut prompt could not go on: no admission ahead of it
        if self.waiting:
            self._admit_phase(step, now_s)

    def _continue_chunks(self, step: StepDraft) -> bool:
        """The prompts the last step cut (``_chunks``, admission order) take their next chunks
        first. False if one cannot (budget, or its slots do not fit: possible only when admission
        did not check the whole prompt, ``reserve_full_isl: false``); the step then stops there and
        that prompt goes on in a mixed step, with the running requests, as in phase 1."""
        alloc = self.allocator
        for req in self._chunks:
            if req.status != RequestStatus.RUNNING:
                continue
            n = req.num_uncomputed_tokens
            cost = req.batch_tokens(n)
            if cost > step.budget:
                n = req.positions_within(step.budget)
                if not n:
                    return False
                cost = req.batch_tokens(n)
            if not alloc.ensure_slots(req.request_id, req.num_computed_tokens + n):
                return False
            step.scheduled[req.request_id] = (n, cost)
            step.budget -= cost
        return True

    def _admit_phase(self, step: StepDraft, now_s: float) -> None:
        """Phase 3: waiting requests, FCFS, only if nothing was preempted or is swapped out."""
        alloc = self.allocator
        waiting, running = self.waiting, self.running
        limit = self.max_prefill_tokens
        while (waiting.head is not None and not self.swapped and not step.preempted and step.budget > 0
               and self.num_running_seqs() + waiting.head.num_samples <= self.max_num_seqs):
            req = waiting.head
            cached = self.cached_prefix_tokens(req)
            num_tokens = req.num_tokens  # (a property; nothing below changes it before admission)
            n = num_tokens - cached
            if (limit is not None and (step.admitted or (self.prefill_only_steps and step.scheduled))
                    and n >= limit - (self.token_budget - step.budget)):
                break
            cost = req.batch_tokens(n, computed=cached)
            if cost > step.budget:
                n = req.positions_within(step.budget, computed=cached) if self.chunked_prefill else 0
                if not n:
                    break
                cost = req.batch_tokens(n, computed=cached)
            hold = num_tokens
            if self.per_chunk:  # vLLM v1: check the whole prompt fits (reserve_full_isl), hold one chunk
                if self.reserve_full_isl and not alloc.can_allocate(req.kv, num_tokens):
                    break
                hold = cached + n
            got = alloc.allocate(req.kv, hold)
            if got is None:
                break
            if got.cached_tokens != cached:
                raise RuntimeError(f"request {req.request_id}: cache hit changed between peek and allocate")
            req.num_computed_tokens = cached
            self.host.load(req, got, step)
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
