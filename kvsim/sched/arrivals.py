"""Arrivals: queueing a request, or rejecting one that could never run. A mixin of
:class:`~kvsim.sched.scheduler.Scheduler` (its state, not its own)."""

from __future__ import annotations

from kvsim.kv.base import KVRequest
from kvsim.sched.request import Request, RequestStatus, batch_tokens

REJECT_TOO_LONG = "exceeds_max_model_len"
REJECT_KV = "exceeds_kv_capacity"
REJECT_KV_WATERMARK = "exceeds_kv_capacity_with_watermark"  # fits the cache, not the cache less the watermark
REJECT_BUDGET = "exceeds_batch_token_budget"
REJECT_SEQS = "exceeds_max_num_seqs"
# a group the preemption rule swaps found the swap space full, and its recompute exceeds the budget
REJECT_SWAP_FULL = "swap_space_full"


class Arrivals:
    """The scheduler's arrival interface: ``add_request``, ``add_arrival``, ``reject_reason``."""

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
        if self.async_scheduling:  # (kvsim.sched.async_sched: it joins the waiting queue at a plan)
            self._hold(kv, arrival_s, req)
            return True
        if req is None:
            self.waiting.append_row(kv, arrival_s, self.replica_index)
        else:
            self.waiting.append(req)
        self._arrivals += 1
        return True

    def reject_reason(self, kv: KVRequest) -> str:
        """Why the request with allocator view ``kv`` could never run (a ``REJECT_*`` reason), or
        "" if it could."""
        prompt, output = kv.prompt_tokens, kv.output_tokens
        if prompt + output > self.max_model_len_tokens:
            return REJECT_TOO_LONG
        if not self.allocator.max_footprint_fits(kv):
            if self.caps.admission_watermark and self.allocator.max_footprint_fits_without_watermark(kv):
                return REJECT_KV_WATERMARK
            return REJECT_KV
        if kv.num_samples > self.max_num_seqs:  # its samples run as one group, never all in one batch
            return REJECT_SEQS
        if kv.num_samples > self.token_budget:  # a decode step of the group costs one token per sample
            return REJECT_BUDGET
        if not self.chunked_prefill and not (kv.num_samples > 1 and self.host.swaps(kv.num_samples)):
            # A recompute after preemption re-prefills prompt + generated tokens (each generated
            # position once per sample) in one step: Request.batch_tokens of them from 0 computed.
            # (A group the preemption rule swaps is not recomputed unless the swap space is full:
            # then _abort_unrecomputable ends it.)
            positions = output - 1 + prompt
            cost = positions if kv.num_samples == 1 else batch_tokens(prompt, kv.num_samples, positions, 0)
            if cost > self.token_budget:
                return REJECT_BUDGET
        return ""

    def _abort_unrecomputable(self, req: Request) -> bool:
        """A preempted ``req`` (its KV freed) that was not swapped: if its recompute (prompt +
        generated positions, each generated one per sample, in one step without chunked prefill)
        exceeds the token budget it could never run again, so it ends here, rejected as
        ``swap_space_full`` (True). Only a group the preemption rule swaps gets here, when the
        swap space is full (vLLM V0 stops the engine: "Aborted due to the lack of CPU swap
        space"); every other request's recompute was checked at arrival (reject_reason)."""
        if self.chunked_prefill or req.batch_tokens(req.num_tokens, computed=0) <= self.token_budget:
            return False
        req.status = RequestStatus.REJECTED
        req.reject_reason = REJECT_SWAP_FULL
        req.num_computed_tokens = 0
        self.log.append(req)
        del self.requests[req.request_id]
        self.num_rejected += 1
        self._ended_in_plan.append(req.request_id)
        return True

    def take_ended_in_plan(self) -> list[int]:
        """Request ids the last plan ended (rejected mid-run as ``swap_space_full``), once: an engine
        frees their client slots and logs them."""
        ended = self._ended_in_plan
        if ended:  # (no new list in the usual case: this runs at every plan)
            self._ended_in_plan = []
        return ended
