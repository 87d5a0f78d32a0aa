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
