"""vLLM V1's async scheduling (``scheduler.async_scheduling``; vLLM's ``AsyncScheduler``, on by default
in vLLM 0.32 unless a feature rules it out).

A mixin of :class:`~kvsim.sched.scheduler.Scheduler` (its state, not its own). vLLM's engine core
keeps two batches in flight (``EngineCore.step_with_batch_queue``): it schedules step k + 1 when step
k starts on the GPU and processes step k's output when step k ends, after that plan. kvsim plans
step k + 1 when step k ends, as always, with what vLLM's plan could see then:

* **Arrivals** up to the start of step k only (the engine takes requests in before each plan, and
  its plan for k + 1 was made when step k started). A request that arrived later is *held* and
  joins the waiting queue at the next plan. After an idle engine (nothing in flight) a plan sees
  every arrival up to its own time.
* **Finishes of step k** are not yet processed: a request that sampled its last token in step k
  finishes at step k's end (its first and last tokens reach the client as without async
  scheduling), but it stays in the running list, holding its KV and its ``max_num_seqs`` place,
  through the plan of step k + 1, unscheduled (vLLM's placeholder check skips a request whose
  in-flight tokens reach ``max_tokens``) and a possible preemption victim; its KV is freed when
  step k + 1 ends, before that step's own output (:meth:`_release_finishing`). A victim among them
  leaves the waiting queue then, finished (vLLM's ``stopped_preempted_reqs``).
* **An empty plan** (every running request finishing, nothing else schedulable): vLLM's batch is
  empty, it then processes step k's output and plans again at once. kvsim does the same: it
  releases the finishing requests and the held arrivals up to now and plans again.

Everything else of step k's output -- computed tokens, the first tokens -- is what vLLM's plan sees
too (it counts a step's scheduled tokens as computed when it schedules them). Decode windows
(:mod:`kvsim.fast.window`) follow the same rules through the window hooks (``hold_decoded``,
``release_held``, ``grow_decoder``, ``window_ended``): a finish inside a window holds its KV a step,
the waiting head is tested when finishes are released, and no window opens while arrivals are
held. The lazy decode group (:mod:`kvsim.fast.group`) runs too: its bulk growth registers a block once
its tokens are known (the allocator's ``grow_all_by_one_known``: when the request takes its next
block), the finishes held a step are paused in the slot ledger (``SlotLedger.pause``: they grow no
more while the members do) and are not members, and when the group dissolves its members count as
having sampled in the last step; group windows make each step's end as ``on_step_done`` does (the held
finishes freed, then the step's own held). docs/conformance.md, "Async scheduling", gives the
check against vLLM's own ``AsyncScheduler``, in both engine modes.
"""

from __future__ import annotations

from dataclasses import replace

from kvsim.errors import ConfigError
from kvsim.kv.base import KVRequest
from kvsim.sched.request import Request, RequestStatus


class AsyncScheduling:
    """Held arrivals and the requests whose finish the next plan must not see yet."""

    def _init_async(self, on: bool) -> None:
        self.async_scheduling = on
        # vLLM caches a block once its tokens are known: a decode's input token, sampled in the step
        # just ended, is not yet known to the plan (KnownTokenCaching; without prefix caching: moot)
        self._known_caching = on and self.caps.prefix_caching
        if self._known_caching and not self.caps.known_token_caching:
            raise ConfigError(f"scheduler.async_scheduling: true with prefix caching needs an allocator that "
                              f"registers a block once its tokens are known (KnownTokenCaching: allocator kind "
                              f"paged), which {type(self.allocator).__name__} does not; use allocator kind paged, "
                              f"or set scheduler.async_scheduling: false")
        self._sampled_last: set[int] = set()  # requests that sampled a token in the step just ended
        self._group_sampled = False  # ... and, if it was a decode-group step, every member did
        self._held: list[tuple[KVRequest, float, Request | None]] = []  # arrivals the next plan may not see
        self._finishing: list[Request] = []  # finished at the last step's end, KV held until the next ends
        self._finishing_ids: set[int] = set()
        self._finish_s = 0.0  # when the finishing requests finished
        self._last_plan_s = -1.0  # start of the step planned last
        self._last_end_s = -1.0  # end of the last step (on_step_done)

    def _hold(self, kv: KVRequest, arrival_s: float, req: Request | None) -> None:
        self._held.append((kv, arrival_s, req))

    def _reveal(self, cutoff_s: float) -> None:
        """Held arrivals up to ``cutoff_s`` join the waiting queue, in arrival order."""
        held = self._held
        k = 0
        while k < len(held) and held[k][1] <= cutoff_s:
            kv, t, req = held[k]
            if req is None:
                self.waiting.append_row(kv, t, self.replica_index)
            else:
                self.waiting.append(req)
            self._arrivals += 1
            k += 1
        del held[:k]

    def _async_cutoff(self, now_s: float) -> float:
        """The latest arrival the plan at ``now_s`` may see: the start of the step that just ended
        if the engine runs on without a gap, else ``now_s``."""
        return self._last_plan_s if self._last_end_s == now_s and self._last_plan_s >= 0 else now_s

    def _defer_finish(self, done: list[Request], now_s: float) -> None:
        """Requests that sampled their last token in the step ending at ``now_s``: finished for the
        client now, their KV released when the next step ends (:meth:`_release_finishing`); at once
        when nothing else is left to plan (vLLM's next plan is empty and it processes them first)."""
        self._finishing = list(done)
        self._finishing_ids = {r.request_id for r in done}
        self._finish_s = now_s
        ids = self._finishing_ids
        if not (self._held or self.waiting or self.swapped or any(r.request_id not in ids for r in self.running)):
            self._release_finishing()
        elif self._decode is not None:  # the lazy decode group grows every other request in bulk
            pause = self.allocator.ledger.pause
            for r in done:
                pause(r.request_id)

    def _release_finishing(self) -> None:
        """Free the finishing requests (THE finish, ``_finish``, at their finish time); a victim the
        last plan preempted leaves the waiting queue's front, finished."""
        done = self._finishing
        if not done:
            return
        self._finishing, self._finishing_ids = [], set()
        preempted = [r for r in done if r.status == RequestStatus.WAITING]
        if preempted:
            for r in preempted:
                self.waiting.remove_front(r)
            done = [r for r in done if r not in preempted]
            self._finish(preempted, self._finish_s, keep_in_running=True, already_free=True)
        if self._known_caching:  # processing the last output caches the blocks it completed
            for r in done:
                self.allocator.ensure_slots(r.request_id, r.num_computed_tokens)
        self._finish(done, self._finish_s)

    @property
    def num_finishing(self) -> int:
        """Requests finished for the client whose KV the scheduler still holds (async scheduling)."""
        return len(self._finishing)

    def _async_plan(self, now_s: float):
        """``schedule`` with async scheduling: the plan from what vLLM's plan could see (the arrivals
        up to the cutoff, the finishing requests still held); an empty one is made again after the
        finishing requests and the arrivals up to now are taken in (the preemptions of both count)."""
        self._reveal(self._async_cutoff(now_s))
        self._last_plan_s = now_s
        plan = self._plan_step(now_s)
        if plan.is_empty and (self._finishing or self._held):
            self._plan = None
            self._arrivals += plan.shape.num_arrivals
            self._release_finishing()
            self._reveal(now_s)
            again = self._plan_step(now_s)
            if plan.preempted:
                again = replace(again, preempted=plan.preempted + again.preempted)
                self._plan = again
            plan = again
        return plan

    def running_in_step(self, done: list[Request]) -> int:
        """Requests that ran in the step just completed, ``done`` (its finishes) among them: with
        async scheduling they are still in the running list, unless nothing else was left and they
        were released at once (:meth:`_defer_finish`)."""
        return len(self.running) + (0 if self._finishing else len(done))

    def _ensure_known(self, req: Request, target: int) -> bool:
        """Slots for ``req``'s ``target`` tokens, its blocks cached up to the tokens vLLM's plan
        knows: a request that sampled in the step just ended has that token in flight."""
        known = min(target, req.num_tokens - 1) if req.request_id in self._sampled_last else target
        return self.allocator.ensure_slots_known(req.request_id, target, known)
