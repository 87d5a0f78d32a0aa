"""Multi-step scheduling (``scheduler.num_scheduler_steps``; vLLM 0.6's ``--num-scheduler-steps``).

A mixin of :class:`~kvsim.sched.scheduler.Scheduler` (its state, not its own). vLLM 0.6's V0 engine
with ``--num-scheduler-steps N`` (vllm-project/vllm#7000, in v0.6.0) schedules a decode batch once
and runs it for N steps; the sampled tokens stay on the GPU between them and are processed, and
streamed, when the round ends. kvsim's rules, each with what it stands for:

* **A round opens** at a step the ordinary phases plan with no prompt work (a decode step that
  admits nobody: the V0 scheduler runs prompts in steps of their own, ``prefill_only_steps``). Its first step reserves,
  for every request it schedules, KV slots for the round's tokens (vLLM's ``num_lookahead_slots =
  N - 1`` in ``can_append_slots`` / ``append_slots``; kvsim stops the reservation at the request's
  last output token, where vLLM reserves N - 1 slots past it). A step with prompt work is a round
  of one step (the first token of a prompt comes alone, as the streamed chunks of such runs show).
* **During a round** nothing is admitted, swapped or preempted: steps 2..N decode the same batch,
  one token each, with no allocation (their slots were reserved).
* **Completion at the round's end**: a request that samples its last token before the last step
  goes on decoding to the end of the round (vLLM checks stop conditions when it processes the
  round's outputs; the extra tokens are dropped) -- an *overrun* sequence, priced as a decode of
  its growing context -- and it finishes, with the others, when the round ends.
* **The engine's CPU work once per round**: the round's later steps carry
  ``BatchShape.round_continuation`` and timing models charge them no overhead term
  (:mod:`kvsim.timing.overhead`).

The client sees a round's tokens together at its end: :meth:`round_itl` gives the engine the
round's inter-token latency (one gap per sequence per round, as a streaming client measures it).
Decode windows and the lazy decode group are off in this mode (the engine steps one by one, so
``fast`` and ``step`` runs are the same run).
"""

from __future__ import annotations

import numpy as np

from kvsim.sched.request import Request
from kvsim.sched.shape import StepDraft


class MultiStepRounds:
    """The round in flight: how many of its steps are left, its overrun sequences, its start."""

    def _init_rounds(self, num_scheduler_steps: int) -> None:
        self._lookahead = num_scheduler_steps - 1  # slots a round reserves past its first new token
        self._round_left = 0  # steps of the round in flight after the one planned last
        self._round_start_s = 0.0
        self._round_seqs = 0  # sequences that decode in the round's first step (a streamed chunk each)
        self._round_members: list[Request] = []  # the requests the round's first step scheduled, in its order
        self._overrun: dict[int, int] = {}  # request id -> steps it decoded past its last output token

    def _lookahead_tokens(self, req: Request, n: int) -> int:
        """Slots a round's first step reserves for ``req`` past its ``n`` new tokens: the round's
        further tokens, up to its last output token."""
        return max(0, min(self._lookahead, req.output_tokens - req.num_generated - 1)) if n == 1 else 0

    def _open_round(self, step: StepDraft, now_s: float, prefill_tokens: int, decode_seqs: int) -> None:
        """The step just planned opens a round of ``1 + lookahead`` steps if it has no prompt work: it
        computes no prompt token and admits nobody (a request admitted with all but its last token in
        the prefix cache computes one token, but it is a prompt step all the same, as in vLLM)."""
        if self._lookahead and step.scheduled and not step.admitted and not prefill_tokens:
            self._round_left = self._lookahead
            self._round_start_s = now_s
            self._round_seqs = decode_seqs
            requests = self.requests
            self._round_members = [requests[rid] for rid in step.scheduled]

    def _round_step(self) -> StepDraft:
        """Plan a round's next step: every request of its first step decodes one token (overrun
        sequences go on past their last one), no allocation, nobody admitted, swapped or preempted."""
        self._round_left -= 1
        step = StepDraft(self.token_budget)
        scheduled = step.scheduled
        bs = self.allocator.block_size
        overrun = self._overrun
        want_ctx = self.want_context_lens
        for req in self._round_members:
            k = overrun.get(req.request_id)
            if k is None:
                scheduled[req.request_id] = (1, req.num_samples)
                continue
            # an overrun sequence reads its context and the k tokens it decoded past its last one
            s = req.num_samples
            ctx = req.num_tokens + k
            step.overrun_requests += 1
            step.overrun_seqs += s
            step.overrun_kv_tokens += s * ctx
            step.overrun_kv_pages += s if bs is None else s * -(-ctx // bs)
            if want_ctx:
                step.overrun_ctx.extend([ctx] * s)
        return step

    def _round_progress(self, done: list[Request]) -> list[Request]:
        """After a step of a round: sequences that completed go on while the round has steps left
        (overrun); at its end every one of them finishes. Returns the requests that finish now."""
        overrun = self._overrun
        for rid in overrun:
            overrun[rid] += 1
        if self._round_left:
            for r in done:
                overrun[r.request_id] = 0
            return []
        if overrun:
            requests = self.requests
            done = done + [requests[rid] for rid in overrun]
            done.sort(key=lambda r: r.admit_seq)
            overrun.clear()
        self._round_members = []
        return done

    def streamed_itl(self, now_s: float, duration_s: float) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The inter-token latencies a step of ``duration_s`` just ended at ``now_s`` adds, as
        ``(durations, tokens)`` for the recorder: ``(None, None)`` without multi-step rounds (each
        decode token's gap is its step), else the round's ITL at its end (:meth:`round_itl`) and no
        tokens at its other steps."""
        if not self._lookahead:
            return None, None
        chunk = self.round_itl(now_s)
        if chunk is None:
            return np.array([duration_s]), np.zeros(1, dtype=np.int64)
        return np.array([chunk[0]]), np.array([chunk[1]], dtype=np.int64)

    def round_itl(self, now_s: float) -> tuple[float, int] | None:
        """At the end of a multi-step round (after its last step's ``on_step_done``): ``(the round's
        duration, sequences that got a chunk)``, the inter-token latency a streaming client sees
        once per sequence per round; None while a round has steps left or without rounds."""
        if not self._lookahead or self._round_left or not self._round_seqs:
            return None
        seqs, self._round_seqs = self._round_seqs, 0
        return now_s - self._round_start_s, seqs
