"""Wiring: a validated Scenario in, a RunResult out. No file output here (see results.py).

The run's parts are built in kvsim/build.py, its resolved form and hash are kvsim/config/resolved.py,
and the step table's conversion to a DataFrame is kvsim/metrics/steps.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvsim.build import build_replica, build_shared_store, check_run_supported, host_link_record, host_transfers
from kvsim.config import Scenario
from kvsim.engine import Engine, EngineLimits, Replica
from kvsim.sched.router import Router
from kvsim.metrics.recorder import StepRecorder
from kvsim.metrics.request_log import RequestLog
from kvsim.metrics.steps import steps_table
from kvsim.client import ClosedLoopClient, client_record
from kvsim.frontend import FrontEndQueue, frontend_record, input_work, through_frontend
from kvsim.metrics.requests import log_table
from kvsim.metrics.summarize import SummaryInputs, summarize
from kvsim.models.geometry import KVGeometry
from kvsim.kv.beam import BeamModel
from kvsim.sched.scheduler import Scheduler
from kvsim.trace.schema import Trace

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd


@dataclass
class RunResult:
    name: str
    scenario: Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame | None  # None when streamed to a file
    summary: dict
    trace_report: dict = field(default_factory=dict)
    engine_wall_s: float = 0.0  # wall time of the event loop (not part of the deterministic results)
    engine_rows: int = 0


def build_trace(scn: Scenario, base_dir: Path) -> tuple[Trace, dict]:
    from kvsim.trace.config import build_trace as _build

    return _build(scn.trace, base_dir, scn.seed, scn.model.max_model_len_tokens)


IN_MEMORY_FLUSH_ROWS = 8192  # step rows buffered before an in-memory run makes an Arrow chunk of them


def _beam_counts(trace, replicas) -> tuple[int, int] | None:
    """(forks, copied tokens) summed over the replicas' allocators when the trace has beam-search
    requests (the summary's kv.beam_* keys), else None."""
    if trace.beam is None or not trace.beam.any():
        return None
    counters = [r.scheduler.allocator for r in replicas if r.caps.beam_counters]
    return sum(a.beam_forks for a in counters), sum(a.beam_copied_tokens for a in counters)


def summary_inputs(scn: Scenario, trace: Trace, replicas: list[Replica], budgets: list[int], engine: Engine,
                   recorder: StepRecorder, geometry: KVGeometry) -> SummaryInputs:
    """Everything :func:`summarize` needs besides the two tables, from all replicas at once (they
    are built from one scenario: capacity, block size, budget and timing capabilities agree)."""
    allocs = [r.scheduler.allocator for r in replicas]
    per_replica = {(a.capacity_tokens, a.block_size, b, r.timing_caps) for a, b, r in zip(allocs, budgets, replicas)}
    if len(per_replica) != 1:
        raise RuntimeError(f"replicas of one scenario disagree on capacity/block size/budget/timing: {per_replica}")
    capacity_tokens, block_size, budget, timing_caps = per_replica.pop()
    return SummaryInputs(
        capacity_tokens=capacity_tokens, num_replicas=len(replicas),
        prefix_caching=any(r.caps.prefix_caching for r in replicas),
        offloaded_blocks=sum(a.offloaded_blocks for a, r in zip(allocs, replicas) if r.caps.offload_counter),
        copy_bandwidth_bytes_per_s=timing_caps.copy_bandwidth_bytes_per_s,
        kv=geometry, attention_backend=timing_caps.attention_backend, moe_kernel=timing_caps.moe_kernel,
        budget_bytes=budget, end_s=engine.end_s, start_s=float(trace.arrival_s[0]) if len(trace) else 0.0,
        itl=recorder.itl, slo=scn.slo.as_dict() if scn.slo is not None else None,
        percentiles=tuple(scn.metrics.percentiles),
        hbm_bandwidth_bytes_per_s=scn.gpu.hbm_bandwidth_bytes_per_s,
        beam=_beam_counts(trace, replicas), reserve=scn.reserve_summary(),
        chunk_tokens=scn.scheduler.num_scheduler_steps)


def _step_recorder(geometry: KVGeometry, steps_path: Path | None) -> StepRecorder:
    # In memory, step rows wait in Python lists until a flush turns them into a compact Arrow chunk:
    # smaller flushes keep that buffer (~1.3 kB a row) small. Streamed to a file, the flush size is
    # the parquet row-group size, which stays as it was (the file must not change).
    return StepRecorder(geometry, path=steps_path,
                        **({} if steps_path is not None else {"flush_every": IN_MEMORY_FLUSH_ROWS}))


def run(scn: Scenario, base_dir: Path | str = ".", *, trace: Trace | None = None, trace_report: dict | None = None,
        steps_path: Path | None = None, check_invariants: bool = False,
        progress: Callable[[int], None] | None = None, event_log: list | None = None,
        where: str = "scenario") -> RunResult:
    """Simulate one scenario (no variants). ``steps_path`` streams step rows to parquet there."""
    base_dir = Path(base_dir)
    if trace is None:
        trace, trace_report = build_trace(scn, base_dir)
    engine_trace, client_arrival, client = _arrivals(scn, trace)
    request_log = RequestLog()  # every replica writes each request's row here when it ends
    transfers = host_transfers(scn, where)
    store = build_shared_store(scn)
    built = [build_replica(scn, i, base_dir, transfers, store, request_log, where) for i in range(scn.replicas.count)]
    replicas, budgets = [r for r, _, _ in built], [b for _, b, _ in built]
    geometry = built[0][2]  # the run's one KV geometry: the plan's, with the allocator's page size
    del built
    check_run_supported(scn, engine_trace, where)
    recorder = _step_recorder(geometry, steps_path)
    engine = Engine(engine_trace, recorder=recorder, max_model_len_tokens=scn.model.max_model_len_tokens,
                    check_invariants=check_invariants,
                    limits=EngineLimits(scn.limits.max_sim_time_s, scn.limits.max_wall_time_s),
                    progress=progress, event_log=event_log, mode=scn.engine.mode,
                    max_window_steps=scn.engine.max_window_steps, replicas=replicas,
                    router=Router(scn.replicas.router, [r.scheduler for r in replicas]), shared_store=store is not None,
                    beam_model=BeamModel(scn.beam_search.fork_prob, scn.seed), client=client)
    wall0 = time.perf_counter()
    try:
        engine.run()
    finally:
        table = recorder.close()
    engine_wall = time.perf_counter() - wall0
    # Take what the summary needs from the engine, build the request table, then let the engine go
    # (schedulers, allocators, queues, the recorder's step chunks) before the step table is
    # converted: at a million requests each of these is tens to hundreds of MB.
    summary_args = summary_inputs(scn, trace, replicas, budgets, engine, recorder, geometry)
    engine_rows = recorder.num_rows
    # Finished and rejected requests are rows of ``request_log`` already; a run that ends normally
    # leaves no other request (a limit stops it with an error).
    unfinished = [r for rep in replicas for r in _unfinished(rep.scheduler)]
    del engine, replicas, recorder, store
    if client is not None and scn.frontend is not None:
        client_arrival = client.sent_s  # the latencies count from the send, before the front end
    reqs = log_table(request_log, unfinished, client_arrival, None if client is None else client.queue_s())
    del unfinished, request_log
    box = [table]
    del table
    steps = steps_table(box, steps_path)
    del box
    summary = summarize(reqs, steps, summary_args)
    _add_prefix_ideal(summary, trace, reqs, geometry.block_size)
    summary["engine_profile"] = scn.profile_filled()  # the profile and the keys it filled (docs/metrics.md)
    summary["host_link"] = host_link_record(scn, transfers)
    if scn.frontend is not None:
        summary["frontend"] = frontend_record(scn.frontend, reqs)
    if scn.client is not None:
        summary["client"] = client_record(scn.client.max_concurrency, reqs)
    return RunResult(name=str(scn.name), scenario=scn, requests=reqs,
                     steps=None if steps_path is not None else steps, summary=summary,
                     trace_report=trace_report or {}, engine_wall_s=engine_wall, engine_rows=engine_rows)


def _arrivals(scn: Scenario, trace: Trace) -> tuple[Trace, np.ndarray | None, ClosedLoopClient | None]:
    """``(engine_trace, client_arrival_s, client)``. A front end alone: the engine runs its
    departures and the latencies count from the trace's arrivals (kvsim/frontend.py). A client
    (kvsim/client.py): it sends each request when a slot frees, through the front end if any, and
    the engine reads its arrival times as it writes them."""
    fe = scn.frontend
    if scn.client is None:
        return (trace, None, None) if fe is None else (*through_frontend(trace, fe), None)
    depart = None
    if fe is not None:
        queue, work = FrontEndQueue(fe.servers), input_work(trace, fe).tolist()
        depart = lambda i, sent_s: queue.depart(sent_s, work[i])  # noqa: E731
    return trace, None, ClosedLoopClient(trace.arrival_s, scn.client.max_concurrency, depart)


def _add_prefix_ideal(summary: dict, trace: Trace, reqs, block_size: int | None) -> None:
    """Beside the hit ratio the run reached, the ideal at the run's block size (an unbounded
    cache, :func:`kvsim.trace.stats.paged_ideal_hit_ratio`) over the requests the run admitted, as
    the hit ratio counts them (rejected requests neither hit nor produce blocks): ``prefix_cache.ideal_*``."""
    pc = summary.get("prefix_cache")
    if not isinstance(pc, dict) or not block_size or trace.prefix_keys is None:
        return
    from kvsim.trace.stats import paged_ideal_hit_ratio

    admitted = reqs["cached_tokens"].to_numpy() >= 0
    if not admitted.all():
        trace = trace.select(np.sort(reqs["request_id"].to_numpy()[admitted]))
    ideal = paged_ideal_hit_ratio(trace, block_size)
    if ideal is not None:
        pc["ideal_hit_ratio_tokens"] = ideal["hit_ratio_tokens"]
        pc["ideal_hit_ratio_blocks"] = ideal["hit_ratio_blocks"]


def _unfinished(sched: Scheduler):
    """The requests ``sched`` still holds (queued, running or swapped)."""
    held = sched.requests
    yield from held.values()
    for r in sched.waiting:
        if r.request_id not in held:  # never admitted
            yield r
