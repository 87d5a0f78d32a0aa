"""Wiring: a validated Scenario in, a RunResult out. No file output here (see results.py)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvsim.config import Scenario
from kvsim.engine import Engine, EngineLimits, Replica
from kvsim.sched.router import Router
from kvsim.errors import ConfigError, KvsimError
from kvsim.metrics.recorder import StepRecorder
from kvsim.metrics.request_log import RequestLog
from kvsim.client import ClosedLoopClient, client_record
from kvsim.frontend import FrontEndQueue, frontend_record, input_work, through_frontend
from kvsim.metrics.requests import log_table
from kvsim.metrics.summarize import SummaryInputs, summarize
from kvsim.models.geometry import KVGeometry
from kvsim.kv.beam import BeamModel
from kvsim.registry import ALLOCATORS, TIMING_MODELS
from kvsim.sched.scheduler import Scheduler
from kvsim.timing.context import TimingContext
from kvsim.timing.base import timing_capabilities
from kvsim.timing.transfer import HostTransfers
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


# analytical timing keys whose default is the arithmetic before they existed (dropped from the resolved form)
_TIMING_KEYS_AT_DEFAULT = (("allreduce", "nccl"), ("moe_align_kernel", "none"), ("moe_layer_s", 0.0))


def resolved_dict(scn: Scenario) -> dict:
    """The scenario with every default filled in (JSON-able), minus the variants table."""
    d = scn.model_dump(mode="json")
    d.pop("variants", None)
    if d.get("host_link") is None:
        d.pop("host_link", None)  # absent = legacy link: old scenarios keep their resolved form and hash
    for key in ("frontend", "client"):
        if d.get(key, 0) is None:
            d.pop(key)  # absent = none: old scenarios keep their resolved form and hash
    gpu = d.get("gpu")
    if isinstance(gpu, dict) and gpu.get("preset") in ("", gpu.get("name")):
        # a preset under its own name, or a GPU of your own: the form before gpu.preset (loading it again
        # gives the same preset: Scenario._gpu_preset); a renamed preset keeps it
        gpu.pop("preset")
    model = d.get("model")
    if isinstance(model, dict):
        for key in ("q_lora_rank", "v_head_dim"):  # MLA shapes (issue 23), at their default 0: the form before them
            if model.get(key) == 0:
                model.pop(key)
    timing = d.get("timing")
    if isinstance(timing, dict) and "overhead" in timing and timing["overhead"] is None:
        timing.pop("overhead")  # absent = no batch-dependent CPU overhead: old resolved forms and hashes stay
    if isinstance(timing, dict):
        # keys added with the serving validation (issue 23 item 8), at their defaults: the form before them
        for key, default in _TIMING_KEYS_AT_DEFAULT:
            if key in timing and timing[key] == default:
                timing.pop(key)
        if timing.get("async_overlap") is True and not (d.get("scheduler") or {}).get("async_scheduling"):
            timing.pop("async_overlap")  # issue 23: it acts only under async scheduling
        ov = timing.get("overhead")
        if isinstance(ov, dict):
            for key in ("per_prefill_seq_s", "per_arrival_s"):  # added with issue 23, at their default 0
                if ov.get(key) == 0.0:
                    ov.pop(key)
    # likewise the defaults added by issue 22 (engine_profile, scheduler.prompt_blocks / reserve_full_isl)
    par = d.get("parallel") or {}
    if par.get("host_allreduce_ll") is None:
        par.pop("host_allreduce_ll", None)  # added with the LL protocol (issue 23), at its default
    if par.get("gpu_p2p") is True and par.get("host_allreduce_efficiency") is None \
            and par.get("host_allreduce_latency_s") is None:
        for key in ("gpu_p2p", "host_allreduce_efficiency", "host_allreduce_latency_s"):
            par.pop(key, None)  # added with issue 23's host-memory path, at their defaults: the form before them
    if d.get("engine_profile") == "kvsim":
        d.pop("engine_profile")
    sched = d.get("scheduler") or {}
    if sched.get("prompt_blocks") == "at_admission" and sched.get("reserve_full_isl") is True:
        del sched["prompt_blocks"], sched["reserve_full_isl"]
    if sched.get("prefill_only_steps") is False:
        del sched["prefill_only_steps"]  # absent = mixed steps, as before the key existed
    if sched.get("num_scheduler_steps") == 1:
        del sched["num_scheduler_steps"]  # likewise (issue 23: vLLM 0.6's multi-step scheduling)
    if sched.get("mixed_chunk") is True:
        del sched["mixed_chunk"]  # likewise (issue 23: SGLang's prefill batches)
    if sched.get("async_scheduling") is False:
        del sched["async_scheduling"]  # likewise (issue 23: vLLM V1's async scheduling)
    if "max_prefill_tokens" in sched and sched["max_prefill_tokens"] is None:
        del sched["max_prefill_tokens"]
    return d


def config_hash(scn: Scenario, trace_report: dict | None = None) -> str:
    payload = {"scenario": resolved_dict(scn), "trace": (trace_report or {}).get("sha256")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:8]


def build_trace(scn: Scenario, base_dir: Path) -> tuple[Trace, dict]:
    from kvsim.trace.config import build_trace as _build

    return _build(scn.trace, base_dir, scn.seed, scn.model.max_model_len_tokens)


IN_MEMORY_FLUSH_ROWS = 8192  # step rows buffered before an in-memory run makes an Arrow chunk of them
MAX_TRACKED_BLOCKS = 1 << 25  # ~33.5M named blocks (about 2 GB of bookkeeping)


def host_transfers(scn: Scenario, where: str = "scenario") -> HostTransfers:
    """How copies over the GPU<->host link are counted and priced in this scenario: ``host_link:``,
    else the legacy size-independent rate (``legacy``: the old arithmetic exactly). With
    ``host_link:`` the link also prices CPU-tier loads, so a CPU tier bandwidth of its own is refused.
    Without it the GPU preset's link (``gpu.host_link``) is used, unless the GPU names none or
    ``timing.host_link_bandwidth_bytes_per_s`` is given; a CPU tier bandwidth given then is kept."""
    hl = scn.host_link
    if hl is None:
        if not scn.default_link_name():
            return HostTransfers(scn.link_profile())  # legacy: size-independent
        # the GPU preset's link, one copy per block per layer per K/V tensor (vLLM's swap_blocks)
        return HostTransfers(scn.link_profile(), num_layers=scn.model.spec().num_layers, legacy=False)
    offload = scn.allocator_offload()
    cpu = offload.cpu if offload is not None else None
    if cpu is not None and cpu.bandwidth_bytes_per_s is not None:
        raise ConfigError(f"{where}: give host_link or allocator.offload.cpu.bandwidth_bytes_per_s, not both "
                          "(host_link prices CPU-tier loads per block, with its per-copy latency)")
    return HostTransfers(scn.link_profile(), granularity=hl.granularity, layout=hl.layout,
                         num_layers=scn.model.spec().num_layers, legacy=False)


def host_link_record(scn: Scenario, transfers: HostTransfers) -> dict:
    """The GPU<->host link a run priced its copies on (summary.json ``host_link``, docs/metrics.md):
    its name, where it came from (``scenario``: ``host_link:``; ``gpu``: the GPU preset's link;
    ``legacy``: the size-independent ``timing.host_link_bandwidth_bytes_per_s``) and its rates."""
    link = transfers.link
    if transfers.legacy:
        chosen = "legacy"
    else:
        chosen = "scenario" if scn.host_link is not None else "gpu"
    return {"name": link.name, "chosen_by": chosen, "h2d_bandwidth_bytes_per_s": link.h2d_bandwidth_bytes_per_s,
            "d2h_bandwidth_bytes_per_s": link.d2h_bandwidth_bytes_per_s,
            "per_transfer_latency_s": link.per_transfer_latency_s}


def _beam_counts(trace, replicas) -> tuple[int, int] | None:
    """(forks, copied tokens) summed over the replicas' allocators when the trace has beam-search
    requests (the summary's kv.beam_* keys), else None."""
    if trace.beam is None or not trace.beam.any():
        return None
    counters = [r.scheduler.allocator for r in replicas if r.caps.beam_counters]
    return sum(a.beam_forks for a in counters), sum(a.beam_copied_tokens for a in counters)


def build_allocator(scn: Scenario, where: str = "scenario"):
    budget = scn.kv_budget_bytes()
    bpt = scn.kv_geometry().bytes_per_token
    if budget <= 0:
        raise ConfigError(
            f"{where}: kv_budget: derived KV budget is {budget / 2**30:.2f} GiB: GPU memory "
            f"{scn.budget_terms()}; use a bigger gpu, a smaller model, "
            f"more GPUs (parallel.tensor) or set kv_budget.bytes / kv_budget.tokens"
        )
    capacity_tokens = budget // bpt
    # A budget beyond the GPU's memory is a legitimate what-if (an "unbounded" cache), but naming
    # every block costs memory: cap what the block-id allocator would have to track.
    block = scn.allocator_block_size()
    if block and scn.allocator_prefix_caching() and capacity_tokens // block > MAX_TRACKED_BLOCKS:
        raise ConfigError(
            f"{where}: kv_budget: {budget / 2**30:.1f} GiB (GPU {scn.gpu.name} has "
            f"{scn.gpu.memory_bytes / 2**30:.1f} GiB memory) makes {capacity_tokens // block:,} blocks of "
            f"{block} tokens, more than the {MAX_TRACKED_BLOCKS:,} a prefix-caching allocator can track; "
            f"lower kv_budget or raise allocator.block_size"
        )
    unit = block or 1  # the smallest allocation, in tokens
    if capacity_tokens < unit:
        raise ConfigError(
            f"{where}: kv_budget: {budget} bytes hold {capacity_tokens} tokens of {bpt} bytes, "
            f"less than one {unit}-token block of allocator '{scn.allocator.kind}'"
        )
    return ALLOCATORS.build(scn.allocator_to_build(), capacity_tokens, bytes_per_token=bpt), budget


def _shared_store(scn: Scenario):
    """The prefix store all replicas share (``replicas.shared_prefix_store``), or None."""
    cfg = scn.replicas.shared_prefix_store
    if cfg is None:
        return None
    from kvsim.kv.tiers import LowerTier

    block_bytes = scn.kv_geometry().bytes_per_token * scn.allocator.block_size
    return LowerTier("remote", cfg.capacity_bytes // block_bytes, cfg.bandwidth_bytes_per_s, shared=True)


def build_timing(scn: Scenario, page_size: int, base_dir: Path, transfers: HostTransfers, where: str):
    """The scenario's timing model on its parallel plan's KV geometry with ``page_size``-token pages,
    and that geometry (one GPU: whole-model bytes, no communication). The simulator builds each
    replica's from here; tools that price single steps (bench/engine_windows.py) call it too."""
    par = scn.parallel_plan()
    geometry = par.kv.with_block_size(page_size)
    ctx = TimingContext(
        model=scn.model.spec(), gpu=scn.gpu_spec(), kv=geometry, weight_bytes=par.weight_bytes_per_rank,
        base_dir=base_dir, weight_dtype=scn.weight_dtype,
        tensor_parallel=par.tensor, pipeline_parallel=par.pipeline,
        comm_s_per_step=par.comm_s_per_step, comm_s_per_token=par.comm_s_per_token,
        allreduces_per_step=par.allreduces_per_step, allreduce_bytes_per_token=par.allreduce_bytes_per_token,
        allreduce_s_per_step=par.allreduce_s_per_step, allreduce_s_per_token=par.allreduce_s_per_token,
        nccl_ll_protocol=par.nccl_ll,
        async_scheduling=scn.scheduler.async_scheduling,
        host_transfers=transfers,
    )
    try:
        return TIMING_MODELS.build(scn.timing, ctx), geometry
    except KvsimError as e:
        raise type(e)(f"{where}: {e}") from None


def build_scheduler(scn: Scenario, allocator, geometry: KVGeometry, where: str, **kw) -> Scheduler:
    """The scenario's scheduler over ``allocator`` (``kw``: Scheduler's keyword arguments); what it
    refuses (a capability the allocator lacks) is one ConfigError line naming ``where``."""
    try:
        return Scheduler(scn.scheduler, allocator, scn.model.max_model_len_tokens, kv=geometry, **kw)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def build_replica(scn: Scenario, index: int, base_dir: Path, transfers: HostTransfers, store, request_log: RequestLog,
                  where: str) -> tuple[Replica, int, KVGeometry]:
    """One engine replica (allocator, timing model, scheduler), its KV budget in bytes and the run's
    KV geometry (the parallel plan's, with the allocator's page size; the same for every replica). The
    plugins' capabilities are checked once here (``Scheduler.caps``, :func:`timing_capabilities`)."""
    allocator, budget = build_allocator(scn, where)
    timing, geometry = build_timing(scn, allocator.block_size, base_dir, transfers, where)
    timing_caps = timing_capabilities(timing)
    sched = build_scheduler(scn, allocator, geometry, where, want_context_lens=timing_caps.needs_context_lens,
                            host_transfers=transfers, request_log=request_log, replica_index=index)
    if not transfers.legacy and sched.caps.host_link_tiers:
        allocator.use_host_link(transfers)  # CPU-tier loads over the same link as swaps
    if store is not None:
        if not sched.caps.shared_store:
            raise ConfigError(f"{where}: replicas.shared_prefix_store: allocator kind '{scn.allocator.kind}' "
                              f"cannot use a shared prefix store (use kind paged with prefix_caching: true)")
        allocator.attach_shared_store(store)
    return Replica(index, sched, timing, timing_caps=timing_caps), budget, geometry


def check_trace_supported(scn: Scenario, trace: Trace, where: str) -> None:
    """What the scenario cannot simulate for this trace, as one ConfigError line (``kvsim run`` and
    ``kvsim validate`` alike): multi-step rounds (kvsim/sched/rounds.py) do not plan a beam request's forks
    and prunes; the radix allocator models one sequence per request."""
    if scn.scheduler.num_scheduler_steps > 1 and trace.beam is not None and trace.beam.any():
        raise ConfigError(f"{where}: scheduler.num_scheduler_steps > 1 with beam-search requests (the trace's beam "
                          f"column) is not modelled (a beam forks and prunes at positions a round's slot "
                          f"reservation does not plan); set num_scheduler_steps: 1")
    if scn.allocator.kind == "radix" and trace.num_samples is not None and (trace.num_samples > 1).any():
        i = int(np.argmax(trace.num_samples > 1))
        raise ConfigError(f"{where}: allocator.kind: radix models one sequence per request, and trace request {i} "
                          f"has {int(trace.num_samples[i])} parallel samples or beams; use allocator kind paged")


def check_token_budget(scn: Scenario, where: str) -> None:
    """The scheduler's token budget must hold the longest prompt when prompts are not chunked: one
    ConfigError line otherwise (``kvsim run`` and ``kvsim validate`` alike)."""
    max_len = scn.model.max_model_len_tokens
    budget = scn.scheduler.token_budget(max_len)  # the Scheduler's own token_budget
    if not scn.scheduler.chunked_prefill and budget < max_len:
        raise ConfigError(
            f"{where}: scheduler.max_num_batched_tokens ({budget}) is smaller than the model's "
            f"max length ({max_len}); without chunked_prefill a long prompt could never be scheduled: raise it "
            f"or set scheduler.chunked_prefill: true"
        )


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


def _steps_table(box: list, steps_path: Path | None):
    """The step table as a DataFrame, from the recorder's Arrow table (``box[0]``; the box holds the
    only reference, so the Arrow columns are freed as they are copied) or, if None, the streamed file."""
    if box[0] is None:
        return steps_frame(_file_columns(steps_path))
    return steps_frame(_table_columns(box))


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
    store = _shared_store(scn)
    built = [build_replica(scn, i, base_dir, transfers, store, request_log, where) for i in range(scn.replicas.count)]
    replicas, budgets = [r for r, _, _ in built], [b for _, b, _ in built]
    geometry = built[0][2]  # the run's one KV geometry: the plan's, with the allocator's page size
    del built
    check_token_budget(scn, where)
    check_trace_supported(scn, engine_trace, where)
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
    steps = _steps_table(box, steps_path)
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


def _table_columns(box: list):
    """(name, numpy array) for each column of the pyarrow Table ``box[0]``, dropping each column
    from the table once copied; empties ``box``."""
    table = box.pop()
    for name in table.column_names:
        col = table.column(name)
        arr = _to_numpy(col)
        del col
        table = table.drop_columns([name])
        yield name, arr


def _file_columns(path: Path):
    """(name, numpy array) for each column of a parquet file, read one column at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    try:
        for name in pf.schema_arrow.names:
            col = pf.read(columns=[name]).column(0)
            arr = _to_numpy(col)
            del col
            pa.default_memory_pool().release_unused()
            yield name, arr
    finally:
        pf.close()


def _to_numpy(col) -> np.ndarray:
    """A writable numpy copy of a pyarrow ChunkedArray without nulls (as ``to_pandas`` makes it)."""
    if col.num_chunks == 0:
        return col.to_numpy()
    if col.num_chunks == 1:
        return col.chunk(0).to_numpy(zero_copy_only=False).copy()
    return np.concatenate([c.to_numpy(zero_copy_only=False) for c in col.chunks])


def steps_frame(columns) -> pd.DataFrame:
    """The step table from ``(name, numpy array)`` pairs: the values, dtypes and column order of
    ``table.to_pandas()``, one block per column (no consolidation copy). Memory that the columns'
    sources free on the way is handed back to the OS every few columns, so the step table is not
    held twice at its full size."""
    import pandas as pd

    cols = {}
    for i, (name, arr) in enumerate(columns):
        cols[name] = arr
        if i % 4 == 3:
            release_free_memory()
    release_free_memory()
    return pd.DataFrame(cols, copy=False)


def release_free_memory() -> None:
    """Hand memory that the C allocator keeps after ``free`` back to the OS (glibc only; no-op
    elsewhere). The step chunks are many small buffers inside the heap: freed, they stay in the
    process's RSS unless trimmed, so converting them would otherwise hold the step table twice."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list = []


def _malloc_trim():
    if not _TRIM:
        fn = None
        try:
            import ctypes

            fn = ctypes.CDLL("libc.so.6").malloc_trim
            fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _TRIM.append(fn)
    return _TRIM[0]
