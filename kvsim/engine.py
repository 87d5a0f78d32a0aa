"""The SimPy model: an arrival process and an engine loop. The only module that imports simpy.

SimPy owns the clock and nothing else. Each engine step is one ``env.timeout(step duration)``:
the scheduler plans the step (plain Python), the timing model prices it, the recorder appends a
row, time advances, and the scheduler applies the step's results. An arrival during a step is
queued and considered at the next step's planning. When there is nothing to run the engine waits
on a wake-up event that the arrival process triggers, and records the gap as an idle row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import simpy

from kvsim.errors import SimulationLimitError
from kvsim.metrics.recorder import StepRecorder
from kvsim.sched.request import Request
from kvsim.sched.scheduler import Scheduler
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
                 event_log: list | None = None):
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
        self._wakeup: simpy.Event | None = None
        self._block_keys = None
        alloc = scheduler.allocator
        if getattr(alloc, "prefix_caching", False) and trace.prefix_keys is not None:
            from kvsim.trace.prefix import block_keys

            self._block_keys = block_keys(trace, alloc.block_size_tokens)
        self._priority = trace.priority
        self._arrivals_done = False
        self.num_steps = 0
        self.end_s = 0.0
        self._last_evictions = 0

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
                yield env.timeout(t - env.now)
            req = Request(i, t, int(prompt[i]), int(output[i]), self.max_model_len_tokens,
                          priority=0 if self._priority is None else int(self._priority[i]),
                          block_keys=None if self._block_keys is None else self._block_keys[i])
            accepted = self.scheduler.add_request(req)
            self._log(i, "arrive" if accepted else "reject", env.now)
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
                idle_start = env.now
                usage = sched.usage()
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                if env.now > idle_start:
                    rec.row(idle=True, start_s=idle_start, duration_s=env.now - idle_start, batch_size=0,
                            prefill_tokens=0, decode_tokens=0, running=0, waiting=len(sched.waiting),
                            admitted=0, preempted=0, finished=0, usage=usage, kv_bytes_read=0, breakdown={})
                continue
            start = env.now
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
            usage = sched.usage()
            evictions = getattr(sched.allocator, "evictions", 0)
            timing = self.timing.step_time(plan.shape)
            yield env.timeout(timing.duration_s)
            first, done = sched.on_step_done(env.now)
            for r in first:
                self._log(r.request_id, "first_token", env.now)
            for r in done:
                self._log(r.request_id, "finish", env.now)
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
            if max_sim is not None and env.now > max_sim:
                raise SimulationLimitError(
                    f"simulated time passed limits.max_sim_time_s = {max_sim} s "
                    f"({len(sched.finished)} of {len(self.trace)} requests finished)"
                )
            if max_wall is not None and self.num_steps % 256 == 0 and time.monotonic() - wall_start > max_wall:
                raise SimulationLimitError(
                    f"wall time passed limits.max_wall_time_s = {max_wall} s at simulated t={env.now:.1f} s"
                )
        self.end_s = env.now

    def run(self) -> None:
        self.env.process(self._arrivals())
        done = self.env.process(self._loop())
        self.env.run(until=done)
