"""What decode windows (:mod:`kvsim.fast.window`) ask of the scheduler besides ``schedule``: whether
the waiting head could be admitted, and how to finish and advance requests a window stepped itself.
A mixin of :class:`~kvsim.sched.scheduler.Scheduler` (its state, not its own)."""

from __future__ import annotations

from kvsim.kv.protocol import WindowAllocator
from kvsim.sched.request import Request, RequestStatus


class WindowHooks:
    """The decode-window part of the scheduler's interface."""

    _window_alloc: WindowAllocator | None

    def head_might_fit(self, num_running: int) -> bool:
        """Could a schedule() with ``num_running`` decoding requests admit the waiting head, if the
        running requests took no more memory? (Decode windows: False means it surely stays blocked.
        Needs the WindowAllocator capability, which decode windows are built on.)"""
        if self._window_alloc is None:
            raise TypeError(f"{type(self.allocator).__name__} lacks the WindowAllocator capability (can_allocate)")
        req = self.waiting.head
        if req is None or self.swapped or num_running + req.num_samples > self.max_num_seqs:
            return False
        # prompt-only steps (vLLM v0) give admissions the whole budget; otherwise decodes take theirs first
        budget = self.token_budget if self.prefill_only_steps else self.token_budget - num_running
        if budget <= 0:
            return False
        cached = self.cached_prefix_tokens(req)
        num_tokens = req.num_tokens
        if num_tokens - cached > budget and not self.chunked_prefill:
            return False
        # per_chunk without reserve_full_isl admits once the first chunk fits: one token is a lower bound
        hold = cached + 1 if self.per_chunk and not self.reserve_full_isl else num_tokens
        return self._window_alloc.can_allocate(req.kv, hold)

    def drop_finished(self) -> None:
        """Remove finished requests from the running list (after ``_finish(..., keep_in_running)``)."""
        self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]

    def finish_requests(self, done: list[Request], now_s: float) -> None:
        """Finish ``done`` (running requests that generated their last token, progress synced) at
        ``now_s``, in that order, as ``on_step_done`` does (decode windows: the decode group's finished
        members; with async scheduling their KV is held until the next step ends)."""
        if done:
            (self._defer_finish if self.async_scheduling else self._finish)(done, now_s)

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

    # -- async scheduling (kvsim.sched.async_sched): a window holds finished requests' KV a step --
    def hold_decoded(self, reqs: list[Request], computed_tokens: list[int], now_s: float) -> None:
        """Async scheduling: a decode window's requests that generated their last token, finished
        for the client at ``now_s``; their KV is held until the next step ends (:meth:`release_held`)."""
        for r, c in zip(reqs, computed_tokens):
            self.grow_decoder(r.request_id, c)
            r.num_computed_tokens = c
            r.num_generated = r.output_tokens
        self._defer_finish(reqs, now_s)

    def release_held(self) -> bool:
        """Free the finished requests held since the last step (async scheduling). Returns whether any were."""
        if not self._finishing:
            return False
        self._release_finishing()
        return True

    @property
    def holds_arrivals(self) -> bool:
        """Async scheduling: arrivals the next plan will take in (a window cannot see them)."""
        return bool(self._held)

    def is_held(self, req: Request) -> bool:
        return req.request_id in self._finishing_ids

    def grow_decoder(self, request_id: int, tokens: int) -> bool:
        """``ensure_slots`` for a window's decoding request that has just written ``tokens``: with
        async scheduling and prefix caching its newest token is not yet known to a plan, so blocks are
        cached up to the one before it (as a plan step by step would)."""
        if self._known_caching:
            return self.allocator.ensure_slots_known(request_id, tokens, tokens - 1)
        return self.allocator.ensure_slots(request_id, tokens)

    def window_ended(self, sampled, last_start_s: float, end_s: float, group_step: bool = False) -> None:
        """Async scheduling: after a decode window whose last step started at ``last_start_s`` and ended
        at ``end_s``, in which ``sampled`` requests sampled a token (``group_step``: the step was the
        decode group's, every member sampled), the next plan sees what it would step by step (the
        arrival cutoff, the tokens not yet known)."""
        if self.async_scheduling:
            self._sampled_last = set(sampled)
            self._group_sampled = group_step
            self._last_plan_s, self._last_end_s = last_start_s, end_s
