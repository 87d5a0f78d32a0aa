"""The SimPy model: engine loops and arrivals. The only module that imports simpy.

SimPy owns the clock and nothing else. Each engine step is one ``env.timeout(step duration)``:
the scheduler plans the step (plain Python), the timing model prices it, the recorder appends a
row, time advances, and the scheduler applies the step's results. An arrival during a step is
queued and considered at the next step's planning; an arrival at exactly a step boundary is
seen by that boundary's plan. With one replica the loop queues the arrivals up to each time it
reaches (after every wait); with several, an arrival process routes each request at its time
(URGENT priority at ties) and wakes an idle replica. An idle engine waits for the next accepted
arrival and records the gap as an idle row.

``mode="fast"`` (default) advances runs of decode steps as one exact *decode window* (see
:mod:`kvsim.fast.window`): one SimPy timeout and one row for many steps, landing on exactly the
float time the step-by-step loop (``mode="step"``, kept as the reference) reaches, so both produce
identical request tables. With a closed-loop client (kvsim/client.py) the arrivals are the sends it
makes as requests end.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.core import URGENT

from kvsim.client import ClosedLoopClient
from kvsim.errors import SimulationLimitError
from kvsim.kv.base import KVRequest, MemoryParts
from kvsim.kv.beam import DEFAULT_FORK_PROB, BeamModel
from kvsim.metrics.recorder import StepRecorder
from kvsim.sched.request import Request
from kvsim.sched.router import Router
from kvsim.sched.scheduler import Scheduler
from kvsim.fast.group_window import apply_group_window, plan_group_window
from kvsim.fast.means import int_sum, window_means
from kvsim.fast.stepwise import StepwiseTimes
from kvsim.fast.window import apply_decode_window, block_limited_steps, plan_decode_window
from kvsim.replica import MIN_WINDOW_HORIZON, Replica
from kvsim.timing.base import TimingModel, decode_totals
from kvsim.trace.schema import Trace


# Backlogged group windows are priced step by step (ScalarDecodeSteps) when their horizon is at most
# this, i.e. the last window ran at most a quarter of it: a decode_durations call costs about as much
# as a dozen or two steps priced one by one (bench/README.md, seventh session). Speed only: both
# ways give the same doubles.
STEPWISE_HORIZON = 64

log = logging.getLogger("kvsim.engine")


@dataclass(frozen=True)
class EngineLimits:
    max_sim_time_s: float | None = None
    max_wall_time_s: float | None = None


class UrgentTimeout(simpy.Event):
    """A timeout scheduled at URGENT priority (``simpy.Timeout`` is always NORMAL): an arrival at the
    same time as a step boundary is seen by that step's plan. It triggers itself as ``simpy.Timeout``
    does: already successful (value None) when scheduled. Setting ``_ok`` / ``_value`` in a
    subclass's own ``__init__`` is how SimPy's own event subclasses (``Timeout``, ``Initialize``) are
    built: SimPy has no public call that schedules an already-triggered event at a chosen priority
    and delay; no code outside this class writes SimPy's fields."""

    def __init__(self, env: simpy.Environment, delay: float):
        super().__init__(env)
        self._ok = True
        self._value = None
        env.schedule(self, URGENT, delay)


class Engine:
    """Arrival process + one engine loop per replica on one SimPy clock.

    ``replicas`` share the recorder (rows carry a ``replica`` column). The router picks a replica
    for each arrival. Fast decode windows are used unless replicas interact at every step: with a
    state-dependent router windows end at every arrival, and with a shared prefix store the engine
    steps one by one (``mode`` falls back to ``step``), which keeps results identical to ``step``.
    """

    def __init__(self, trace: Trace, scheduler: Scheduler | None = None, timing: TimingModel | None = None,
                 recorder: StepRecorder | None = None, max_model_len_tokens: int = 0,
                 check_invariants: bool = False, limits: EngineLimits = EngineLimits(),
                 progress: Callable[[int], None] | None = None,
                 event_log: list | None = None, mode: str = "fast", max_window_steps: int = 4096,
                 replicas: list[Replica] | None = None, router: Router | None = None,
                 shared_store: bool = False, beam_model: BeamModel | None = None,
                 client: ClosedLoopClient | None = None):
        self.env = simpy.Environment()
        self.trace = trace
        # each request's engine arrival: the trace's, or what a client (kvsim/client.py) writes as it sends
        self.client = client
        self._arrival_s = trace.arrival_s if client is None else client.engine_arrival_s
        self._slot_freed = None  # several replicas with a client: the arrival process waits on this
        if replicas is None:
            replicas = [Replica(0, scheduler, timing)]
        self.replicas = replicas
        self.router = router or Router("round_robin", [r.scheduler for r in replicas])
        self.recorder = recorder
        self.max_model_len_tokens = max_model_len_tokens
        self.check_invariants = check_invariants
        self.limits = limits
        self.progress = progress
        self.event_log = event_log  # optional [(request_id, event, time_s)] for exact-timeline tests
        if mode not in ("fast", "step"):
            raise ValueError(f"engine mode must be 'fast' or 'step', got {mode!r}")
        self.mode = "step" if shared_store else mode
        # Beam search: requests flagged in the trace's `beam` column (with num_samples > 1) get
        # their seeded prune/fork events (kvsim.kv.beam); without the column samples are parallel.
        beam = trace.beam
        self._beam = beam if beam is not None and trace.num_samples is not None and bool(
            np.any((beam != 0) & (trace.num_samples > 1))) else None
        self.beam_model = beam_model or BeamModel(fork_prob=DEFAULT_FORK_PROB, seed=0)
        for rep in replicas:
            log.info("fast paths: %s", rep.install_fast_path(self.mode, beam_search=self._beam is not None))
        self.max_window_steps = max_window_steps
        self._next_arrival_idx = 0
        self._block_keys = None
        if replicas[0].caps.prefix_caching and trace.prefix_keys is not None:
            from kvsim.trace.prefix import block_keys

            self._block_keys = block_keys(trace, replicas[0].scheduler.allocator.block_size)
        self._priority = trace.priority
        self._samples = trace.num_samples
        self._arrivals_done = False
        # One replica: the engine loop queues arrivals itself after each wait (no SimPy event per
        # request); several: an arrival process routes each at its time.
        self._pull = len(self.replicas) == 1
        self.end_s = 0.0
        self._wall_start = 0.0
        self._iterations = 0

    # single-replica conveniences (tests and older callers)
    @property
    def scheduler(self) -> Scheduler:
        return self.replicas[0].scheduler

    @property
    def num_steps(self) -> int:
        return sum(r.num_steps for r in self.replicas)

    @property
    def num_windows(self) -> int:
        return sum(r.num_windows for r in self.replicas)

    def _log(self, event: str, t: float, *rids: int) -> None:
        if self.event_log is not None:
            self.event_log.extend((rid, event, t) for rid in rids)

    def _arrive(self, i: int):
        """Route trace request ``i`` and queue it (or reject it). Returns (replica, accepted). With
        one replica nothing reads the request before it reaches the waiting queue's head, so only
        its allocator view is built now (the scheduler builds the Request then)."""
        trace = self.trace
        t = self._arrival_s.item(i)  # .item: the Python number, without a numpy scalar in between
        self._next_arrival_idx = i + 1
        kv = KVRequest(i, trace.prompt_tokens.item(i), trace.output_tokens.item(i), self.max_model_len_tokens,
                       block_keys=None if self._block_keys is None else self._block_keys[i],
                       priority=0 if self._priority is None else int(self._priority[i]),
                       num_samples=1 if self._samples is None else int(self._samples[i]),
                       beam_events=None if self._beam is None else self._beam_events(i))
        if len(self.replicas) == 1:
            rep = self.replicas[0]
            accepted = rep.scheduler.add_arrival(kv, t)
        else:  # a routing policy reads the request
            req = Request(i, t, kv.prompt_tokens, kv.output_tokens, kv.max_model_len_tokens, priority=kv.priority,
                          num_samples=kv.num_samples, kv=kv)
            rep = self.replicas[self.router.route(req)]
            accepted = rep.scheduler.add_request(req)
        self._log("arrive" if accepted else "reject", t, i)
        if not accepted and self.client is not None:
            self._ended(1, t)
        return rep, accepted

    def _ended(self, count: int, t: float) -> None:
        """``count`` requests ended at ``t`` (a client frees their slots): the requests it sends by
        ``t`` are queued or routed now, as arrivals at ``t`` are; the arrival process wakes."""
        self.client.ended(count, t)
        if self._pull:
            self._pull_arrivals(t)
            return
        arr, n = self._arrival_s, len(self._arrival_s)
        while self._next_arrival_idx < n and arr[self._next_arrival_idx] <= t:
            self._route(self._next_arrival_idx)
        if self._slot_freed is not None and not self._slot_freed.triggered:
            self._slot_freed.succeed()

    def _beam_events(self, i: int):
        """Trace request ``i``'s prune/fork events if it is a beam-search request, else None."""
        if self._beam is None or not self._beam[i] or self._samples[i] < 2:
            return None
        return self.beam_model.events(i, int(self.trace.prompt_tokens[i]), int(self.trace.output_tokens[i]),
                                      int(self._samples[i]))

    def _pull_arrivals(self, now_s: float) -> None:
        """Single replica: queue every arrival at or before ``now_s`` (an arrival at a step boundary
        is seen by that step's plan), in trace order. Called right after each SimPy wait, so the
        scheduler holds the same requests at every decision as with an arrival process; it saves a
        SimPy event per request."""
        arr = self._arrival_s
        n = len(arr)
        i = self._next_arrival_idx
        while i < n and arr[i] <= now_s:
            self._arrive(i)  # (a client's slot freed by a rejection sends the next ones: re-read)
            i = self._next_arrival_idx
        if i == n:
            self._arrivals_done = True

    def _arrivals(self):
        """The arrival process (several replicas: routing reads their state at each arrival's time)."""
        env = self.env
        arr = self._arrival_s
        n = len(self.trace)
        while self._next_arrival_idx < n:  # (a client's freed slot may route requests meanwhile)
            i = self._next_arrival_idx
            if arr[i] == np.inf:  # a client has not sent it yet: wait for a slot to free
                self._slot_freed = env.event()
                yield self._slot_freed
                continue
            t = float(arr[i])
            if t > env.now:
                yield UrgentTimeout(env, t - env.now)
                if self._next_arrival_idx != i:
                    continue
            self._route(i)
        self._arrivals_done = True
        for rep in self.replicas:
            if rep.wakeup is not None and not rep.wakeup.triggered:
                rep.wakeup.succeed()

    def _route(self, i: int) -> None:
        rep, accepted = self._arrive(i)
        if accepted and rep.wakeup is not None and not rep.wakeup.triggered:
            rep.wakeup.succeed()

    def _limit(self, rep: Replica) -> None:
        max_sim = self.limits.max_sim_time_s
        if max_sim is not None and rep.now_s > max_sim:
            done = sum(r.scheduler.num_finished for r in self.replicas)
            raise SimulationLimitError(
                f"simulated time passed limits.max_sim_time_s = {max_sim} s "
                f"({done} of {len(self.trace)} requests finished)")
        max_wall = self.limits.max_wall_time_s
        self._iterations += 1
        if max_wall is not None and self._iterations % 64 == 0 and time.monotonic() - self._wall_start > max_wall:
            raise SimulationLimitError(
                f"wall time passed limits.max_wall_time_s = {max_wall} s at simulated t={rep.now_s:.1f} s")

    def _loop(self, rep: Replica):
        sched = rep.scheduler
        while True:
            if not sched.has_work:
                if self._arrivals_done:
                    break
                yield from self._idle(rep)
                continue
            start = rep.now_s
            plan = sched.schedule(start)
            if ended := sched.take_ended_in_plan():  # rejected while planning (swap_space_full)
                self._log("reject", start, *ended)
                if self.client is not None:  # their slots free now
                    self._ended(len(ended), start)
                if plan.is_empty:
                    continue  # the plan only ended requests: plan again, or wait
            if plan.is_empty:
                raise RuntimeError(
                    f"t={start}: nothing schedulable with {len(sched.waiting)} waiting and "
                    f"{len(sched.running)} running requests (scheduler bug)"
                )
            self._log("preempt", start, *plan.preempted)
            self._log("admit", start, *plan.admitted)
            # A beam request's forks and prunes happen at positions a window cannot plan: steps
            # with one running go one by one (an admission ends any window, so none enters one).
            # A client with requests left sends at each finish, which no window plans: one by one; so does
            # a step that charges its arrivals' intake (step 0 of a window is priced as a decode step).
            win = (self._window(rep, plan, start)
                   if rep.windows and (self._beam is None or not sched.has_running_beams())
                   and (self.client is None or not self.client.pending)
                   and not (plan.shape.num_arrivals and rep.timing_caps.prices_arrivals) else None)
            yield from (win if win is not None else self._step(rep, plan, start))
            self._limit(rep)
        rep.end_s = rep.now_s

    def _idle(self, rep: Replica):
        """Wait for the next accepted arrival; record the gap as an idle row."""
        sched = rep.scheduler
        idle_start = rep.now_s
        usage = sched.usage()
        if self._pull:
            while not sched.has_work and not self._arrivals_done:  # until one is accepted
                yield from self._advance(rep, float(self._arrival_s[self._next_arrival_idx]))
        else:
            rep.wakeup = self.env.event()
            yield rep.wakeup
            rep.wakeup = None
            rep.now_s = self.env.now  # woken by an arrival: exactly its trace time
        if rep.now_s > idle_start:
            self.recorder.row(replica=rep.index, idle=True, start_s=idle_start, duration_s=rep.now_s - idle_start,
                              memory=MemoryParts.of(usage), waiting=len(sched.waiting))

    def _advance(self, rep: Replica, t_end: float):
        """Move ``rep``'s clock to ``t_end`` (SimPy follows) and queue the arrivals up to it."""
        rep.now_s = t_end
        yield self._advance_to(t_end)
        if self._pull:
            self._pull_arrivals(t_end)

    def _step(self, rep: Replica, plan, start: float):
        """Run ``plan`` as one step."""
        sched = rep.scheduler
        usage = sched.usage()
        timing = rep.timing.step_time(plan.shape)
        target = sched.prefetch_target()
        if target is not None:  # the head while this step computes
            sched.credit_prefetch(target, (timing.duration_s,))
        yield from self._advance(rep, start + timing.duration_s)
        first, done = sched.on_step_done(rep.now_s)
        itl_d, itl_n = sched.streamed_itl(rep.now_s, timing.duration_s)  # (None, None) but in multi-step rounds
        self._log("first_token", rep.now_s, *(r.request_id for r in first))
        self._log("finish", rep.now_s, *(r.request_id for r in done))
        shape = plan.shape
        self.recorder.row(
            replica=rep.index, idle=False, num_steps=1, finished=len(done), evictions=rep.new_evictions(),
            start_s=start, duration_s=timing.duration_s, batch_size=shape.num_seqs,
            prefill_tokens=shape.num_prefill_tokens, decode_tokens=shape.num_decode_tokens,
            running=sched.running_in_step(done), waiting=len(sched.waiting), admitted=len(plan.admitted),
            preempted=len(plan.preempted), memory=MemoryParts.of(usage), kv_bytes_read=timing.kv_bytes_read,
            kv_pages_read=shape.kv_pages_read, breakdown=timing.breakdown_s, swap_in_bytes=plan.swapped_in_bytes,
            swap_out_bytes=shape.swap_out_bytes, step_durations_s=itl_d, step_decode_tokens=itl_n)
        if done and self.client is not None:  # sent now: seen by the next step's plan
            self._ended(len(done), rep.now_s)
        self._after_step(rep, 1, done)

    def _after_step(self, rep: Replica, num_steps: int, done: list) -> None:
        """THE post-step bookkeeping, for a step or a window of ``num_steps`` (after its row was
        recorded): step counters, invariant checks, progress."""
        sched = rep.scheduler
        rep.num_steps += num_steps
        if num_steps > 1:
            rep.num_windows += 1
        if self.check_invariants:
            sched.check_invariants()
        if done and self.progress is not None:
            self.progress(len(done))

    def _advance_to(self, t_end: float):
        """A SimPy timeout to ``t_end``.

        Each replica keeps its own clock ``now_s``, advanced one step at a time as ``now_s + d`` (the
        same float operations whether steps run one by one or as a window), and records every
        request time from it. SimPy's clock follows within an ulp: ``now + (t_end - now)`` cannot
        always land exactly on ``t_end`` in floating point."""
        return self.env.timeout(max(t_end - self.env.now, 0.0))

    def _window(self, rep: Replica, plan, start: float):
        """If step 0 (``plan``) opens a decode window of >= 2 steps, return a generator that runs it."""
        sched = rep.scheduler
        intake = rep.timing_caps.prices_arrivals  # each arrival's intake is charged in the step after it
        group = plan.group_decodes > 0  # every running request is a lazy decode-group member
        horizon = min(self.max_window_steps, rep.window_horizon)
        if group:
            win = plan_group_window(sched, rep.group, plan, horizon)
        else:
            win = plan_decode_window(sched, plan, horizon)
        if win is None:
            return None
        pricer = rep.pricer
        step0 = None
        if group:
            # Step 0 (which may admit requests) is priced as a step; steps 1.. as decode steps.
            step0 = rep.timing.step_time(plan.shape)
            if (rep.step_pricer is not None and horizon <= STEPWISE_HORIZON and (sched.waiting or sched.swapped)
                    and not self.router.state_dependent and not intake and self.limits.max_sim_time_s is None):
                # A backlog: no arrival cuts the window (see below), and it usually stops at one of
                # its first finishes. After a short window (the horizon is four times the last
                # one's length) its steps are priced one by one as the replay reaches them.
                times = StepwiseTimes(rep.step_pricer, win, start, step0.duration_s)
                return self._run_window(rep, plan, win, win.max_steps, None, None, step0, times, None, None, start)
            priced = pricer.decode_durations(win.num_seqs[1:], win.kv_tokens_read[1:], win.kv_pages_read[1:])
            buf = np.empty(len(priced[0]) + 2)  # [start, step 0, steps 1..]
            buf[1] = step0.duration_s
            buf[2:] = priced[0]
        else:
            priced = pricer.decode_durations(win.num_seqs, win.kv_tokens_read, win.kv_pages_read)
            buf = np.empty(len(priced[0]) + 1)  # [start, steps 0..]
            buf[1:] = priced[0]
        buf[0] = start
        durations = buf[1:]
        times = np.add.accumulate(buf)  # (np.cumsum without its wrapper) sequential, like SimPy's clock
        k = win.max_steps
        if self._next_arrival_idx < len(self.trace):
            nxt = float(self._arrival_s[self._next_arrival_idx])
            if self.router.state_dependent or intake:
                # Routed on the replicas' state at its time, or its intake charged in the next step: the
                # window must end at a step boundary before it (one at the same time comes after it, URGENT).
                k = min(k, int(times[1:k + 1].searchsorted(nxt, side="left")))
            elif not (sched.waiting or sched.swapped):
                # It could be admitted at the first step boundary after it.
                k = min(k, 1 + int(times[1:k].searchsorted(nxt, side="left")))
        max_sim = self.limits.max_sim_time_s
        if max_sim is not None:
            k = min(k, 1 + int(times[1:k].searchsorted(max_sim, side="right")))
        if group:
            pop_steps = pop_idx = None  # the allocator finds block boundaries as the window runs
        else:
            k, pop_steps, pop_idx = block_limited_steps(sched, win, k)
        if k < 2:
            return None
        return self._run_window(rep, plan, win, k, durations, priced, step0, times, pop_steps, pop_idx, start)

    def _run_window(self, rep: Replica, plan, win, k, durations, priced, step0, times, pop_steps, pop_idx,
                    start):
        sched = rep.scheduler
        waiting0 = len(sched.waiting)
        done = []

        def on_first(r, t):
            self._log("first_token", t, r.request_id)

        def on_finish(r, t):
            done.append(r)
            self._log("finish", t, r.request_id)

        # The replay needs nothing from SimPy (arrivals only join a blocked queue's tail meanwhile),
        # so it runs first and may end the window early; then the clock jumps to the window's end.
        target = sched.prefetch_target()  # constant through the window: nobody is admitted
        if pop_steps is None:
            k, segments = apply_group_window(sched, rep.group, plan, k, times, on_first, on_finish)
        else:
            k, segments = apply_decode_window(sched, win, k, times, pop_steps, pop_idx, on_finish)
        if durations is None:  # priced step by step as the replay ran (StepwiseTimes)
            durations, priced = times.settle(k)
        if target is not None:  # (no list of durations to build without a prefetch target)
            sched.credit_prefetch(target, durations[:k].tolist())
        rep.window_horizon = max(MIN_WINDOW_HORIZON, 4 * k)
        yield from self._advance(rep, float(times[k]))
        memory, batch_mean = window_means(win, k, durations, segments, sched.allocator.capacity_tokens)
        decode_tokens = int_sum(win.num_seqs[:k])
        if step0 is not None:  # step 0 priced on its own, then k - 1 decode steps
            breakdown, kv_bytes = decode_totals(priced[1], priced[2], k - 1)
            for name, v in step0.breakdown_s.items():
                breakdown[name] = v + breakdown.get(name, 0.0)
            kv_bytes += step0.kv_bytes_read
            decode_tokens += plan.shape.num_decode_tokens - int(win.num_seqs[0])
        else:
            breakdown, kv_bytes = decode_totals(priced[1], priced[2], k)
        # ITL: each step's duration and decode tokens (kvsim/metrics/itl.py)
        step_decodes = win.num_seqs[:k]
        if step0 is not None:
            step_decodes = step_decodes.copy()
            step_decodes[0] = plan.shape.num_decode_tokens
        max_batch = int(win.num_requests[0])
        self.recorder.row(
            replica=rep.index, idle=False, num_steps=k, finished=len(done), evictions=rep.new_evictions(),
            start_s=start, duration_s=float(times[k]) - start, batch_size=max_batch,
            batch_mean=batch_mean, running=max_batch, running_mean=batch_mean,
            prefill_tokens=plan.shape.num_prefill_tokens, decode_tokens=decode_tokens, waiting=waiting0,
            admitted=len(plan.admitted), memory=memory, kv_bytes_read=kv_bytes,
            kv_pages_read=int_sum(win.kv_pages_read[:k]), breakdown=breakdown,
            step_durations_s=durations[:k], step_decode_tokens=step_decodes)
        if done and self.client is not None:  # (it has sent every request: nothing more to send)
            self._ended(len(done), rep.now_s)
        self._after_step(rep, k, done)

    def run(self) -> None:
        self._wall_start = time.monotonic()
        if self._pull:
            self._pull_arrivals(0.0)  # the clock starts at 0: earlier arrivals are queued at once
        else:
            self.env.process(self._arrivals())
        loops = [self.env.process(self._loop(rep)) for rep in self.replicas]
        # The run allocates one Request per arrival and keeps them all; the cyclic collector would
        # rescan that growing heap again and again (~8 % of a 100k-request run) to find nothing:
        # the engine makes no reference cycles that outlive a step. It runs once, at the end.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.env.run(until=self.env.all_of(loops))
        finally:
            if collecting:
                gc.enable()
        for rep in self.replicas:
            rep.scheduler.sync_progress()
        self.end_s = max(rep.end_s for rep in self.replicas)
        if len(self.replicas) > 1:
            # Pad replicas that went quiet early so time-weighted means cover the same span.
            for rep in self.replicas:
                if rep.end_s < self.end_s:
                    self.recorder.row(replica=rep.index, idle=True, start_s=rep.end_s,
                                      duration_s=self.end_s - rep.end_s, memory=MemoryParts.of(rep.scheduler.usage()))
