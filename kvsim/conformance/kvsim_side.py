"""Replay a conformance case through kvsim's engine (``step`` or ``fast`` mode, constant timing).

The engine, scheduler and paged allocator are the ones ``kvsim run`` builds from a scenario
(``scheduler:`` and ``allocator: {kind: paged}`` config models, the ``constant`` timing model); the
only addition is :class:`ProbedScheduler`, which records each planned step right after it is
scheduled. Fast-mode decode windows are planned once, so their inner steps have no record: the
window's row in the step table gives their sums, which the comparison checks instead.
"""

from __future__ import annotations

import numpy as np

from kvsim.conformance.cases import Case
from kvsim.conformance.timeline import Timeline
from kvsim.engine import Engine, Replica
from kvsim.kv.paged import PagedAllocatorConfig
from kvsim.kv.protocol import WindowAllocator
from kvsim.metrics.recorder import StepRecorder
from kvsim.metrics.request_log import RequestLog
from kvsim.metrics.requests import log_table
from kvsim.models.geometry import KVGeometry
from kvsim.registry import ALLOCATORS
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.scheduler import Scheduler
from kvsim.timing.constant import ConstantTiming, ConstantTimingConfig
from kvsim.trace.schema import Trace


class ProbedScheduler(Scheduler):
    """kvsim's scheduler, recording each plan's step fields (timeline.STEP_FIELDS) after it is made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.allocator, WindowAllocator):
            raise TypeError("conformance runs need a paged allocator (num_free_blocks)")
        self.records: list[dict] = []

    def schedule(self, now_s: float):
        plan = super().schedule(now_s)
        shape = plan.shape
        alloc = self.allocator
        self.records.append({
            "start_s": now_s, "running": len(self.running), "waiting": len(self.waiting) + len(self.swapped),
            "scheduled_tokens": shape.num_prefill_tokens + shape.num_decode_tokens,
            "prefill_reqs": shape.num_prefill_seqs, "decode_reqs": shape.num_decode_seqs,
            "kv_blocks_used": alloc.num_blocks - alloc.num_free_blocks, "preemptions": len(plan.preempted),
            "prefix_hit_tokens": sum(self.requests[r].num_computed_tokens for r in plan.admitted),
        })
        return plan


def token_keys(prompts) -> list[np.ndarray]:
    """Chained per-token content keys for each prompt: key j of two prompts is equal exactly when
    their tokens [0, j] are (each distinct prefix gets its own id; no hashing, no collisions)."""
    ids: dict[tuple[int, int], int] = {}
    out = []
    for prompt in prompts:
        keys = np.empty(len(prompt), dtype=np.int64)
        node = 0
        for j, t in enumerate(prompt):
            node = ids.setdefault((node, t), len(ids) + 1)
            keys[j] = node
        out.append(keys)
    return out


def case_trace(case: Case) -> Trace:
    n = len(case.requests)
    reqs = case.requests
    return Trace(
        arrival_s=np.array([q.arrival_s for q in reqs], dtype=np.float64),
        prompt_tokens=np.array([len(q.prompt) for q in reqs], dtype=np.int64),
        output_tokens=np.array([q.output_tokens for q in reqs], dtype=np.int64),
        prefix_keys=token_keys([q.prompt for q in reqs]) if case.prefix_caching else None,
        prefix_block_tokens=1 if case.prefix_caching else None,
        # vLLM: lower priority value is served first; kvsim's column: larger is more important
        priority=np.array([-q.priority for q in reqs], dtype=np.int64) if case.policy == "priority" else None,
        num_samples=np.array([q.n for q in reqs], dtype=np.int64) if any(q.n > 1 for q in reqs) else None,
        source={"conformance_case": case.name, "requests": n},
    )


def run_kvsim(case: Case, mode: str) -> Timeline:
    """Replay ``case`` through kvsim's engine in ``mode`` ("step" or "fast")."""
    trace = case_trace(case)
    alloc_cfg = PagedAllocatorConfig(block_size=case.block_size, watermark=0.0, prefix_caching=case.prefix_caching)
    allocator = ALLOCATORS.build(alloc_cfg, case.num_blocks * case.block_size, bytes_per_token=1)
    sched_cfg = SchedulerConfig(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                                chunked_prefill=case.chunked_prefill, prompt_blocks=case.prompt_blocks,
                                reserve_full_isl=case.reserve_full_isl, async_scheduling=case.async_scheduling,
                                victim="lowest_priority" if case.policy == "priority" else "latest_admitted")
    log = RequestLog()
    # one byte per token: memory columns count tokens (the comparison reads blocks and counts only)
    kv = KVGeometry(1, 1, 1, 1, "fp16", 1, block_size=allocator.block_size)
    sched = ProbedScheduler(sched_cfg, allocator, case.max_model_len, kv=kv, request_log=log)
    timing = ConstantTiming(ConstantTimingConfig(step_s=case.step_s))
    recorder = StepRecorder(kv)
    events: list = []
    engine = Engine(trace, recorder=recorder, max_model_len_tokens=case.max_model_len, mode=mode,
                    replicas=[Replica(0, sched, timing)], event_log=events, client=case.client())
    engine.run()
    rows = recorder.close().to_pandas()
    rows = rows[~rows["idle"]]
    tl = Timeline(f"kvsim-{mode}")
    records = iter(sched.records)
    ends: dict[float, int] = {}
    for row in rows.itertuples(index=False):
        rec = next(records)
        if rec["start_s"] != row.start_s:
            raise RuntimeError(f"case {case.name}: step rows and plans out of step at t={row.start_s}")
        first = len(tl.steps)
        t = row.start_s
        for j in range(int(row.num_steps)):
            tl.steps.append(rec if j == 0 else None)
            ends[t + case.step_s] = first + j
            t = t + case.step_s
        if row.num_steps > 1:
            tl.windows.append((first, int(row.num_steps)))
            tl.window_sums.append({"scheduled_tokens": int(row.prefill_tokens + row.decode_tokens),
                                   "preemptions": int(row.preempted), "finished": int(row.finished)})
    start_step = {rec_t: k for k, rec_t in ((k, s["start_s"]) for k, s in enumerate(tl.steps) if s is not None)}
    table = log_table(log)
    per: dict[int, dict] = {}
    for rid in table["request_id"].tolist():
        per[rid] = {"first_scheduled_step": None, "first_token_step": None, "finish_step": None,
                    "preemptions": 0, "cached_tokens": None}
    for rid, event, t in events:
        rec = per[rid]
        if event == "admit" and rec["first_scheduled_step"] is None:
            rec["first_scheduled_step"] = start_step[t]
        elif event == "preempt":
            rec["preemptions"] += 1
        elif event == "first_token":
            rec["first_token_step"] = ends[t]
        elif event == "finish":
            rec["finish_step"] = ends[t]
    for rid, cached in zip(table["request_id"].tolist(), table["cached_tokens"].tolist()):
        per[rid]["cached_tokens"] = int(cached) if per[rid]["first_scheduled_step"] is not None else None
    tl.requests = per
    return tl
