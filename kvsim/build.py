"""A run's parts built from a validated Scenario: the host link's transfers, the allocator, timing
model and scheduler of each replica, the shared prefix store; and what a scenario cannot simulate,
checked before the run (one ConfigError line naming ``where``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.config import Scenario
from kvsim.engine import Replica
from kvsim.errors import ConfigError, KvsimError
from kvsim.metrics.request_log import RequestLog
from kvsim.models.geometry import KVGeometry
from kvsim.registry import ALLOCATORS, TIMING_MODELS
from kvsim.sched.scheduler import Scheduler
from kvsim.timing.base import timing_capabilities
from kvsim.timing.context import TimingContext
from kvsim.timing.transfer import HostTransfers
from kvsim.trace.schema import Trace

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


def build_shared_store(scn: Scenario):
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


def check_run_supported(scn: Scenario, trace: Trace, where: str) -> None:
    """Everything a run refuses before it simulates, as one ConfigError line: the token budget
    (:func:`check_token_budget`), then what the trace needs (:func:`check_trace_supported`). A run
    checks it (kvsim.simulate.run), and so do ``kvsim run`` over every variant and ``kvsim sweep``
    over every point before the first is simulated."""
    check_token_budget(scn, where)
    check_trace_supported(scn, trace, where)


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
