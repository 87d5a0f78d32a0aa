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
:mod:`kvsim.sched.window`): one SimPy timeout and one row for many steps, landing on exactly the
float time the step-by-step loop (``mode="step"``, kept as the reference) reaches, so both produce
identical request tables.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.core import URGENT

from kvsim.errors import SimulationLimitError
from kvsim.metrics.recorder import StepRecorder
from kvsim.sched.request import Request
from kvsim.sched.router import Router
from kvsim.sched.scheduler import Scheduler
from kvsim.sched.window import (
    apply_decode_window,
    apply_group_window,
    block_limited_steps,
    plan_decode_window,
    plan_group_window,
    window_means,
)
from kvsim.timing.base import TimingModel, decode_totals
from kvsim.trace.schema import Trace


MIN_WINDOW_HORIZON = 32


@dataclass(frozen=True)
class EngineLimits:
    max_sim_time_s: float | None = None
    max_wall_time_s: float | None = None


class Replica:
    """One serving engine in the model: its scheduler, timing model and clock. With a single
    replica this is simply "the engine"."""

    def __init__(self, index: int, scheduler: Scheduler, timing: TimingModel):
        self.index = index
        self.scheduler = scheduler
        self.timing = timing
        self.now_s = 0.0  # this replica's exact clock (see Engine._advance_to)
        self.end_s = 0.0
        self.wakeup: simpy.Event | None = None
        self.num_steps = 0
        self.num_windows = 0
        self.last_evictions = 0
        # Steps the next decode window is planned for: four times the last window's length (at least
        # MIN_WINDOW_HORIZON). Planning costs O(horizon) numpy work, and in a saturated engine a
        # window ends at the first finish, far short of the longest request's end.
        self.window_horizon = MIN_WINDOW_HORIZON


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
                 shared_store: bool = False):
        self.env = simpy.Environment()
        self.trace = trace
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
        self.max_window_steps = max_window_steps
        self._next_arrival_idx = 0
        self._block_keys = None
        alloc = replicas[0].scheduler.allocator
        if getattr(alloc, "prefix_caching", False) and trace.prefix_keys is not None:
            from kvsim.trace.prefix import block_keys

            self._block_keys = block_keys(trace, alloc.block_size_tokens)
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

    def _log(self, rid: int, event: str, t: float) -> None:
        if self.event_log is not None:
            self.event_log.append((rid, event, t))

    def _arrive(self, i: int):
        """Create trace request ``i``, route it and queue it (or reject it). Returns (replica, accepted)."""
        t = float(self.trace.arrival_s[i])
        self._next_arrival_idx = i + 1
        req = Request(i, t, int(self.trace.prompt_tokens[i]), int(self.trace.output_tokens[i]),
                      self.max_model_len_tokens,
                      priority=0 if self._priority is None else int(self._priority[i]),
                      block_keys=None if self._block_keys is None else self._block_keys[i],
                      num_samples=1 if self._samples is None else int(self._samples[i]))
        rep = self.replicas[self.router.route(req)]
        req.replica = rep.index
        accepted = rep.scheduler.add_request(req)
        self._log(i, "arrive" if accepted else "reject", t)
        return rep, accepted

    def _pull_arrivals(self, now_s: float) -> None:
        """Single replica: queue every arrival at or before ``now_s`` (an arrival at a step boundary
        is seen by that step's plan), in trace order. Called right after each SimPy wait, so the
        scheduler holds the same requests at every decision as with an arrival process; it saves a
        SimPy event per request."""
        arr = self.trace.arrival_s
        n = len(arr)
        i = self._next_arrival_idx
        while i < n and arr[i] <= now_s:
            self._arrive(i)
            i += 1
        if i == n:
            self._arrivals_done = True

    def _arrivals(self):
        """The arrival process (several replicas: routing reads their state at each arrival's time)."""
        env = self.env
        arr = self.trace.arrival_s
        for i in range(len(self.trace)):
            t = float(arr[i])
            if t > env.now:
                # URGENT: at a tie with a step boundary the arrival is seen by that step's plan.
                ev = env.event()
                ev._ok, ev._value = True, None  # a plain scheduled event, as simpy.Timeout builds one
                env.schedule(ev, URGENT, t - env.now)
                yield ev
            rep, accepted = self._arrive(i)
            if accepted and rep.wakeup is not None and not rep.wakeup.triggered:
                rep.wakeup.succeed()
        self._arrivals_done = True
        for rep in self.replicas:
            if rep.wakeup is not None and not rep.wakeup.triggered:
                rep.wakeup.succeed()

    def _limit(self, rep: Replica) -> None:
        max_sim = self.limits.max_sim_time_s
        if max_sim is not None and rep.now_s > max_sim:
            done = sum(len(r.scheduler.finished) for r in self.replicas)
            raise SimulationLimitError(
                f"simulated time passed limits.max_sim_time_s = {max_sim} s "
                f"({done} of {len(self.trace)} requests finished)")
        max_wall = self.limits.max_wall_time_s
        self._iterations += 1
        if max_wall is not None and self._iterations % 64 == 0 and time.monotonic() - self._wall_start > max_wall:
            raise SimulationLimitError(
                f"wall time passed limits.max_wall_time_s = {max_wall} s at simulated t={rep.now_s:.1f} s")

    def _loop(self, rep: Replica):
        env = self.env
        sched = rep.scheduler
        rec = self.recorder
        while True:
            if not sched.has_work:
                if self._arrivals_done:
                    break
                idle_start = rep.now_s
                usage = sched.usage()
                if self._pull:
                    while not sched.has_work and not self._arrivals_done:  # until one is accepted
                        rep.now_s = float(self.trace.arrival_s[self._next_arrival_idx])
                        yield self._advance_to(rep.now_s)
                        self._pull_arrivals(rep.now_s)
                else:
                    rep.wakeup = env.event()
                    yield rep.wakeup
                    rep.wakeup = None
                    rep.now_s = env.now  # woken by an arrival: exactly its trace time
                if rep.now_s > idle_start:
                    rec.row(idle=True, start_s=idle_start, duration_s=rep.now_s - idle_start, batch_size=0,
                            prefill_tokens=0, decode_tokens=0, running=0, waiting=len(sched.waiting),
                            admitted=0, preempted=0, finished=0, usage=usage, kv_bytes_read=0, breakdown={},
                            replica=rep.index)
                continue
            start = rep.now_s
            plan = sched.schedule(start)
            if plan.is_empty:
                raise RuntimeError(
                    f"t={start}: nothing schedulable with {len(sched.waiting)} waiting and "
                    f"{len(sched.running)} running requests (scheduler bug)"
                )
            for rid in plan.preempted:
                self._log(rid, "preempt", start)
            for rid in plan.admitted:
                self._log(rid, "admit", start)
            if self.mode == "fast":
                win = self._window(rep, plan, start)
                if win is not None:
                    yield from win
                    self._limit(rep)
                    continue
            usage = sched.usage()
            evictions = getattr(sched.allocator, "evictions", 0)
            timing = rep.timing.step_time(plan.shape)
            prefetch_target = sched.prefetch_target()  # the head while this step computes
            rep.now_s = start + timing.duration_s
            yield self._advance_to(rep.now_s)
            if self._pull:
                self._pull_arrivals(rep.now_s)
            if prefetch_target is not None:
                prefetch_target.prefetched_s += timing.duration_s
            first, done = sched.on_step_done(rep.now_s)
            for r in first:
                self._log(r.request_id, "first_token", rep.now_s)
            for r in done:
                self._log(r.request_id, "finish", rep.now_s)
            shape = plan.shape
            rec.row(idle=False, start_s=start, duration_s=timing.duration_s, batch_size=shape.num_seqs,
                    prefill_tokens=shape.num_prefill_tokens, decode_tokens=shape.num_decode_tokens,
                    running=len(sched.running) + len(done), waiting=len(sched.waiting),
                    admitted=len(plan.admitted), preempted=len(plan.preempted), finished=len(done),
                    usage=usage, kv_bytes_read=timing.kv_bytes_read, breakdown=timing.breakdown_s,
                    evictions=evictions - rep.last_evictions, swap_in_bytes=shape.swap_in_bytes,
                    swap_out_bytes=shape.swap_out_bytes, replica=rep.index)
            rep.last_evictions = evictions
            rep.num_steps += 1
            if self.check_invariants:
                sched.check_invariants()
            if done and self.progress is not None:
                self.progress(len(done))
            self._limit(rep)
        rep.end_s = rep.now_s

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
        group = plan.group_decodes > 0  # every running request is a lazy decode-group member
        horizon = min(self.max_window_steps, rep.window_horizon)
        if group:
            win = plan_group_window(sched, plan, horizon)
        else:
            win = plan_decode_window(sched, plan, horizon)
        if win is None:
            return None
        timing = rep.timing
        priced = step0 = None
        if group:
            if not hasattr(timing, "decode_durations"):
                return None
            # Step 0 (which may admit requests) is priced as a step; steps 1.. as decode steps.
            step0 = timing.step_time(plan.shape)
            priced = timing.decode_durations(win.num_seqs[1:], win.kv_tokens_read[1:])
            durations = np.concatenate(([step0.duration_s], priced[0]))
        elif hasattr(timing, "decode_durations"):
            priced = timing.decode_durations(win.num_seqs, win.kv_tokens_read)
            durations = priced[0]
        else:
            durations = np.array([timing.step_time(s).duration_s for s in _decode_shapes(win, win.max_steps)])
        times = np.cumsum(np.concatenate(([start], durations)))  # sequential, like SimPy's clock
        k = win.max_steps
        if self._next_arrival_idx < len(self.trace):
            nxt = float(self.trace.arrival_s[self._next_arrival_idx])
            if self.router.state_dependent:
                # The arrival is routed on the replicas' state at its time: the window must end at a
                # step boundary before it (a boundary at the same time comes after it, URGENT).
                k = min(k, int(np.searchsorted(times[1:k + 1], nxt, side="left")))
            elif not (sched.waiting or sched.swapped):
                # It could be admitted at the first step boundary after it.
                k = min(k, 1 + int(np.searchsorted(times[1:k], nxt, side="left")))
        max_sim = self.limits.max_sim_time_s
        if max_sim is not None:
            k = min(k, 1 + int(np.searchsorted(times[1:k], max_sim, side="right")))
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
        alloc = sched.allocator
        waiting0 = len(sched.waiting)
        done = []

        def on_first(r, t):
            self._log(r.request_id, "first_token", t)

        def on_finish(r, t):
            done.append(r)
            self._log(r.request_id, "finish", t)

        # The replay needs nothing from SimPy (arrivals only join a blocked queue's tail meanwhile),
        # so it runs first and may end the window early; then the clock jumps to the window's end.
        target = sched.prefetch_target()  # constant through the window: nobody is admitted
        if pop_steps is None:
            k, segments = apply_group_window(sched, k, times, on_first, on_finish)
        else:
            k, segments = apply_decode_window(sched, win, k, times, pop_steps, pop_idx, on_finish)
        if target is not None:
            p = target.prefetched_s
            for d in durations[:k].tolist():
                p += d
            target.prefetched_s = p
        rep.window_horizon = max(MIN_WINDOW_HORIZON, 4 * k)
        rep.now_s = float(times[k])
        yield self._advance_to(rep.now_s)
        if self._pull:
            self._pull_arrivals(rep.now_s)
        means = window_means(win, k, durations, segments, alloc.capacity_tokens)
        timing = rep.timing
        decode_tokens = int(win.num_seqs[:k].sum())
        if step0 is not None:  # step 0 priced on its own, then k - 1 decode steps
            breakdown, kv_bytes = decode_totals(priced[1], priced[2], k - 1)
            for name, v in step0.breakdown_s.items():
                breakdown[name] = v + breakdown.get(name, 0.0)
            kv_bytes += step0.kv_bytes_read
            decode_tokens += plan.shape.num_decode_tokens - int(win.num_seqs[0])
        elif priced is not None:
            breakdown, kv_bytes = decode_totals(priced[1], priced[2], k)
        else:
            shapes = _decode_shapes(win, k)
            steps = [timing.step_time(s) for s in shapes]
            kv_bytes = sum(st.kv_bytes_read for st in steps)
            breakdown = {}
            for st in steps:
                for name, v in st.breakdown_s.items():
                    breakdown[name] = breakdown.get(name, 0.0) + v
        # ITL hook: each step's duration and decode tokens (kvsim/metrics/itl.py)
        step_decodes = win.num_seqs[:k]
        if step0 is not None:
            step_decodes = step_decodes.copy()
            step_decodes[0] = plan.shape.num_decode_tokens
        self.recorder.macro_row(
            start_s=start, duration_s=float(times[k]) - start, num_steps=k, max_batch=int(win.num_requests[0]),
            batch_mean=means["batch_mean"], decode_tokens=decode_tokens, waiting=waiting0,
            finished=len(done), parts_mean_tokens=means, kv_bytes_read=kv_bytes, breakdown=breakdown,
            evictions=getattr(alloc, "evictions", 0) - rep.last_evictions, replica=rep.index,
            admitted=len(plan.admitted), prefill_tokens=plan.shape.num_prefill_tokens,
            step_durations_s=durations[:k], step_decode_tokens=step_decodes)
        rep.last_evictions = getattr(alloc, "evictions", 0)
        rep.num_steps += k
        rep.num_windows += 1
        if self.check_invariants:
            sched.check_invariants()
        if done and self.progress is not None:
            self.progress(len(done))

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
                    self.recorder.row(
                        idle=True, start_s=rep.end_s, duration_s=self.end_s - rep.end_s, batch_size=0,
                        prefill_tokens=0, decode_tokens=0, running=0, waiting=0, admitted=0, preempted=0,
                        finished=0, usage=rep.scheduler.usage(), kv_bytes_read=0, breakdown={}, replica=rep.index)


def _decode_shapes(win, k):
    """BatchShapes of a window's steps, for timing models without ``decode_durations``."""
    from kvsim.timing.base import BatchShape

    out = []
    for j in range(k):
        active = [i for i in range(len(win.requests)) if win.remaining[i] > j]
        ctx = tuple(int(win.computed0[i]) + j + 1 for i in active)
        n = len(active)
        out.append(BatchShape(num_seqs=n, num_prefill_seqs=0, num_decode_seqs=n, num_prefill_tokens=0,
                              num_decode_tokens=n, kv_tokens_read=int(win.kv_tokens_read[j]),
                              attention_pairs=int(win.kv_tokens_read[j]), context_lens=ctx))
    return out
