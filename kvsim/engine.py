"""The SimPy model: an arrival process and an engine loop. The only module that imports simpy.

SimPy owns the clock and nothing else. Each engine step is one ``env.timeout(step duration)``:
the scheduler plans the step (plain Python), the timing model prices it, the recorder appends a
row, time advances, and the scheduler applies the step's results. An arrival during a step is
queued and considered at the next step's planning; an arrival at exactly a step boundary is
processed first (arrival events have SimPy's URGENT priority). When there is nothing to run the
engine waits on a wake-up event that the arrival process triggers, and records the gap as an idle
row.

``mode="fast"`` (default) advances runs of pure decode steps as one exact *decode window* (see
:mod:`kvsim.sched.window`): one SimPy timeout and one row for many steps, landing on exactly the
float time the step-by-step loop (``mode="step"``, kept as the reference) reaches, so both produce
identical request tables.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.core import URGENT

from kvsim.errors import SimulationLimitError
from kvsim.metrics.recorder import StepRecorder
from kvsim.sched.request import Request
from kvsim.sched.scheduler import Scheduler
from kvsim.sched.window import apply_decode_window, block_limited_steps, plan_decode_window, window_means
from kvsim.timing.base import TimingModel
from kvsim.trace.schema import Trace


@dataclass(frozen=True)
class EngineLimits:
    max_sim_time_s: float | None = None
    max_wall_time_s: float | None = None


class Engine:
    def __init__(self, trace: Trace, scheduler: Scheduler, timing: TimingModel, recorder: StepRecorder,
                 max_model_len_tokens: int, check_invariants: bool = False,
                 limits: EngineLimits = EngineLimits(),
                 progress: Callable[[int], None] | None = None,
                 event_log: list | None = None, mode: str = "fast", max_window_steps: int = 4096):
        self.env = simpy.Environment()
        self.trace = trace
        self.scheduler = scheduler
        self.timing = timing
        self.recorder = recorder
        self.max_model_len_tokens = max_model_len_tokens
        self.check_invariants = check_invariants
        self.limits = limits
        self.progress = progress
        self.event_log = event_log  # optional [(request_id, event, time_s)] for exact-timeline tests
        if mode not in ("fast", "step"):
            raise ValueError(f"engine mode must be 'fast' or 'step', got {mode!r}")
        self.mode = mode
        self.max_window_steps = max_window_steps
        self.num_windows = 0
        self._next_arrival_idx = 0
        self._wakeup: simpy.Event | None = None
        self._block_keys = None
        alloc = scheduler.allocator
        if getattr(alloc, "prefix_caching", False) and trace.prefix_keys is not None:
            from kvsim.trace.prefix import block_keys

            self._block_keys = block_keys(trace, alloc.block_size_tokens)
        self._priority = trace.priority
        self._samples = trace.num_samples
        self._arrivals_done = False
        self.num_steps = 0
        self.end_s = 0.0
        self._last_evictions = 0
        self.now_s = 0.0  # the engine's exact clock (see _advance_to)

    def _log(self, rid: int, event: str, t: float) -> None:
        if self.event_log is not None:
            self.event_log.append((rid, event, t))

    def _arrivals(self):
        env = self.env
        arr = self.trace.arrival_s
        prompt = self.trace.prompt_tokens
        output = self.trace.output_tokens
        for i in range(len(self.trace)):
            t = float(arr[i])
            if t > env.now:
                # URGENT: at a tie with a step boundary the arrival is seen by that step's plan.
                ev = env.event()
                ev._ok, ev._value = True, None  # a plain scheduled event, as simpy.Timeout builds one
                env.schedule(ev, URGENT, t - env.now)
                yield ev
            self._next_arrival_idx = i + 1
            req = Request(i, t, int(prompt[i]), int(output[i]), self.max_model_len_tokens,
                          priority=0 if self._priority is None else int(self._priority[i]),
                          block_keys=None if self._block_keys is None else self._block_keys[i],
                          num_samples=1 if self._samples is None else int(self._samples[i]))
            accepted = self.scheduler.add_request(req)
            self._log(i, "arrive" if accepted else "reject", t)
            if accepted and self._wakeup is not None and not self._wakeup.triggered:
                self._wakeup.succeed()
        self._arrivals_done = True
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def _loop(self):
        env = self.env
        sched = self.scheduler
        rec = self.recorder
        wall_start = time.monotonic()
        max_sim = self.limits.max_sim_time_s
        max_wall = self.limits.max_wall_time_s
        while True:
            if not sched.has_work:
                if self._arrivals_done:
                    break
                idle_start = self.now_s
                usage = sched.usage()
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                self.now_s = env.now  # woken by an arrival: exactly its trace time
                if self.now_s > idle_start:
                    rec.row(idle=True, start_s=idle_start, duration_s=self.now_s - idle_start, batch_size=0,
                            prefill_tokens=0, decode_tokens=0, running=0, waiting=len(sched.waiting),
                            admitted=0, preempted=0, finished=0, usage=usage, kv_bytes_read=0, breakdown={})
                continue
            start = self.now_s
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
                win = self._window(plan, start)
                if win is not None:
                    yield from win
                    if max_sim is not None and self.now_s > max_sim:
                        raise SimulationLimitError(
                            f"simulated time passed limits.max_sim_time_s = {max_sim} s "
                            f"({len(sched.finished)} of {len(self.trace)} requests finished)")
                    continue
            usage = sched.usage()
            evictions = getattr(sched.allocator, "evictions", 0)
            timing = self.timing.step_time(plan.shape)
            prefetch_target = sched.prefetch_target()  # the head while this step computes
            self.now_s = start + timing.duration_s
            yield self._advance_to(self.now_s)
            if prefetch_target is not None:
                prefetch_target.prefetched_s += timing.duration_s
            first, done = sched.on_step_done(self.now_s)
            for r in first:
                self._log(r.request_id, "first_token", self.now_s)
            for r in done:
                self._log(r.request_id, "finish", self.now_s)
            shape = plan.shape
            rec.row(idle=False, start_s=start, duration_s=timing.duration_s, batch_size=shape.num_seqs,
                    prefill_tokens=shape.num_prefill_tokens, decode_tokens=shape.num_decode_tokens,
                    running=len(sched.running) + len(done), waiting=len(sched.waiting),
                    admitted=len(plan.admitted), preempted=len(plan.preempted), finished=len(done),
                    usage=usage, kv_bytes_read=timing.kv_bytes_read, breakdown=timing.breakdown_s,
                    evictions=evictions - self._last_evictions, swap_in_bytes=shape.swap_in_bytes,
                    swap_out_bytes=shape.swap_out_bytes)
            self._last_evictions = evictions
            self.num_steps += 1
            if self.check_invariants:
                sched.check_invariants()
            if done and self.progress is not None:
                self.progress(len(done))
            if max_sim is not None and self.now_s > max_sim:
                raise SimulationLimitError(
                    f"simulated time passed limits.max_sim_time_s = {max_sim} s "
                    f"({len(sched.finished)} of {len(self.trace)} requests finished)"
                )
            if max_wall is not None and self.num_steps % 256 == 0 and time.monotonic() - wall_start > max_wall:
                raise SimulationLimitError(
                    f"wall time passed limits.max_wall_time_s = {max_wall} s at simulated t={self.now_s:.1f} s"
                )
        self.end_s = self.now_s

    def _advance_to(self, t_end: float):
        """A SimPy timeout to ``t_end``.

        The engine keeps its own clock ``now_s``, advanced one step at a time as ``now_s + d`` (the
        same float operations whether steps run one by one or as a window), and records every
        request time from it. SimPy's clock follows within an ulp: ``now + (t_end - now)`` cannot
        always land exactly on ``t_end`` in floating point."""
        return self.env.timeout(max(t_end - self.env.now, 0.0))

    def _window(self, plan, start: float):
        """If step 0 (``plan``) opens a decode window of >= 2 steps, return a generator that runs it."""
        sched = self.scheduler
        win = plan_decode_window(sched, plan, self.max_window_steps)
        if win is None:
            return None
        timing = self.timing
        if hasattr(timing, "decode_durations"):
            durations, _, _ = timing.decode_durations(win.num_seqs, win.kv_tokens_read)
        else:
            durations = np.array([timing.step_time(s).duration_s for s in _decode_shapes(win, win.max_steps)])
        times = np.cumsum(np.concatenate(([start], durations)))  # sequential, like SimPy's clock
        k = win.max_steps
        if not (sched.waiting or sched.swapped) and self._next_arrival_idx < len(self.trace):
            nxt = float(self.trace.arrival_s[self._next_arrival_idx])
            k = min(k, 1 + int(np.searchsorted(times[1:k], nxt, side="left")))
        max_sim = self.limits.max_sim_time_s
        if max_sim is not None:
            k = min(k, 1 + int(np.searchsorted(times[1:k], max_sim, side="right")))
        k, pop_steps, pop_idx = block_limited_steps(sched, win, k)
        if k < 2:
            return None
        return self._run_window(win, k, durations, times, pop_steps, pop_idx, start)

    def _run_window(self, win, k, durations, times, pop_steps, pop_idx, start):
        sched = self.scheduler
        alloc = sched.allocator
        waiting0 = len(sched.waiting)
        done = []

        def on_finish(r, t):
            done.append(r)
            self._log(r.request_id, "finish", t)

        # The replay needs nothing from SimPy (arrivals only join a blocked queue's tail meanwhile),
        # so it runs first and may end the window early; then the clock jumps to the window's end.
        target = sched.prefetch_target()  # constant through the window: nobody is admitted
        k, segments = apply_decode_window(sched, win, k, times, pop_steps, pop_idx, on_finish)
        if target is not None:
            p = target.prefetched_s
            for d in durations[:k].tolist():
                p += d
            target.prefetched_s = p
        self.now_s = float(times[k])
        yield self._advance_to(self.now_s)
        means = window_means(win, k, durations, segments, alloc.capacity_tokens)
        timing = self.timing
        if hasattr(timing, "decode_durations"):
            _, breakdown, kv_bytes = timing.decode_durations(win.num_seqs[:k], win.kv_tokens_read[:k])
        else:
            shapes = _decode_shapes(win, k)
            steps = [timing.step_time(s) for s in shapes]
            kv_bytes = sum(st.kv_bytes_read for st in steps)
            breakdown = {}
            for st in steps:
                for name, v in st.breakdown_s.items():
                    breakdown[name] = breakdown.get(name, 0.0) + v
        self.recorder.macro_row(
            start_s=start, duration_s=float(times[k]) - start, num_steps=k, max_batch=int(win.num_seqs[0]),
            batch_mean=means["batch_mean"], decode_tokens=int(win.num_seqs[:k].sum()), waiting=waiting0,
            finished=len(done), parts_mean_tokens=means, kv_bytes_read=kv_bytes, breakdown=breakdown,
            evictions=getattr(alloc, "evictions", 0) - self._last_evictions)
        self._last_evictions = getattr(alloc, "evictions", 0)
        self.num_steps += k
        self.num_windows += 1
        if self.check_invariants:
            sched.check_invariants()
        if done and self.progress is not None:
            self.progress(len(done))

    def run(self) -> None:
        self.env.process(self._arrivals())
        done = self.env.process(self._loop())
        self.env.run(until=done)


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
