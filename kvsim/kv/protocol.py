"""The allocator boundary: the protocol every KV allocator implements, and the optional
capabilities that let the engine take its fast paths.

:class:`KVAllocator` is all the scheduler and engine *require* (see :mod:`kvsim.kv.base` for the
semantics of each call). An allocator that implements only it runs in every engine mode, one step
at a time. The capability protocols below are optional; :func:`allocator_capabilities` checks them
once, when a run is built, and the engine installs a fast path only where they are all present
(``docs/architecture.md`` lists which fast path needs which). Nothing probes an allocator with
``getattr``/``hasattr`` while the simulation runs.

The paged allocator has one boundary of its own, its eviction policy (``allocator.eviction``):
:class:`EvictionPolicy` is what it requires of one, :func:`eviction_capabilities` checks the
optional extras once, when the allocator is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvsim.kv.base import Allocation, KVRequest, KVUsage, UsageSums
    from kvsim.kv.ledger import SlotLedger
    from kvsim.kv.eviction import BlockStats

log = logging.getLogger("kvsim.capabilities")


@runtime_checkable
class KVAllocator(Protocol):
    """Required. ``block_size`` is the page size in tokens that attention reads the KV in (None for
    allocators that keep each sequence in one contiguous extent)."""

    capacity_tokens: int
    block_size: int | None

    def max_footprint_fits(self, req: KVRequest) -> bool: ...

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None: ...

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool: ...

    def free(self, request_id: int) -> None: ...

    def held_tokens(self, request_id: int) -> int: ...

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage: ...

    def check_invariants(self) -> None: ...


# -- optional capabilities ------------------------------------------------------------------------

@runtime_checkable
class WindowAllocator(Protocol):
    """Decode windows (many decode steps advanced at once, exactly): what planning and replaying a
    window asks of the allocator besides the required calls.

    * ``can_allocate(req, hold_tokens)``: would ``allocate`` succeed now (no side effects);
    * ``usage_parts(head)``: the :class:`~kvsim.kv.base.UsageSums` (held, useful, shared, cached
      free, external tokens) a window's time-weighted memory means are built from;
    * ``num_free_blocks``: blocks ``ensure_slots`` can take now without failing (0 is fine for
      allocators with ``block_size = None``: they never take blocks while decoding);
    * ``seq_capacity_tokens(rid)``: tokens one of the request's sequences can hold in what it holds;
    * ``written_offset_tokens(rid)``: ``samples x sequence length - physical slots written``."""

    num_free_blocks: int

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool: ...

    def usage_parts(self, head: KVRequest | None = None) -> UsageSums: ...

    def seq_capacity_tokens(self, request_id: int) -> int: ...

    def written_offset_tokens(self, request_id: int) -> int: ...


@runtime_checkable
class BulkDecodeGrowth(Protocol):
    """``grow_all_by_one()``: every admitted request writes one more token (a decode step for all),
    all or nothing; False (nothing changed) if a block it needs is not free or the allocator cannot
    do it now (e.g. parallel samples). Enables the scheduler's lazy decode group."""

    def grow_all_by_one(self) -> bool: ...


@runtime_checkable
class BulkDecodeSteps(Protocol):
    """``grow_steps(steps, first_step, changes)``: ``grow_all_by_one()`` up to ``steps`` times in a
    row, stopping before the first step it cannot do (nothing changed by that one); returns the
    steps done. After each step that changed the held slots it appends ``(first_step + i,
    sum_held, sum_useful)`` (``usage_parts``' first two members) to ``changes``; the other
    ``usage_parts`` members do not change while requests only grow. Lets a decode window advance
    the runs of steps between finishes in one call instead of one call per step."""

    def grow_steps(self, steps: int, first_step: int, changes: list) -> int: ...


@runtime_checkable
class LazyLedger(Protocol):
    """The allocator keeps its slot counts in a :class:`~kvsim.kv.ledger.SlotLedger` whose running sums
    (``sum_written``, ``sum_held``) the decode group reads in O(1) instead of asking every request."""

    ledger: SlotLedger


@runtime_checkable
class BulkSlots(Protocol):
    """Vectorised slot calls for decode windows (each equals its one-request loop):
    ``seq_capacities(rids)``, ``ensure_slots_many(rids, num_tokens)`` (stops at the first that does
    not fit) and ``advance_written(rids, written_tokens)`` (tokens within the held slots)."""

    def seq_capacities(self, request_ids) -> list[int]: ...

    def ensure_slots_many(self, request_ids, num_tokens) -> bool: ...

    def advance_written(self, request_ids, written_tokens) -> None: ...


@runtime_checkable
class PrefixCachePeek(Protocol):
    """``peek_cached_tokens(req, num_tokens)``: leading tokens ``allocate`` would find cached now."""

    def peek_cached_tokens(self, req: KVRequest, num_tokens: int) -> int: ...


@runtime_checkable
class BlockRuns(Protocol):
    """``block_runs(request_id, first_block, end_block)``: runs of consecutive block ids among the
    request's blocks ``[first_block, end_block)`` of its block table (how many copies a copy engine
    that coalesces contiguous blocks needs; docs/transfer_model.md). Allocators that do not name
    their blocks lack it, and a copy per block is counted."""

    def block_runs(self, request_id: int, first_block: int, end_block: int) -> int: ...


@runtime_checkable
class AdmissionWatermark(Protocol):
    """``max_footprint_fits_without_watermark(req)``: ``max_footprint_fits`` if the allocator kept no
    admission watermark (``allocator.watermark``), so a request the watermark alone keeps out is
    rejected as ``exceeds_kv_capacity_with_watermark`` (docs/metrics.md), not ``exceeds_kv_capacity``."""

    def max_footprint_fits_without_watermark(self, req: KVRequest) -> bool: ...


@runtime_checkable
class HostLinkTiers(Protocol):
    """``use_host_link(transfers)``: price loads from a CPU tier with the scenario's host link
    (kvsim.timing.transfer.HostTransfers); called once at build time when ``host_link:`` is given."""

    def use_host_link(self, transfers) -> None: ...


@runtime_checkable
class EvictionCounter(Protocol):
    """``evictions``: cached blocks evicted so far (the step table's ``evictions`` column)."""

    evictions: int


@runtime_checkable
class BeamCounters(Protocol):
    """``beam_forks`` / ``beam_copied_tokens``: beam-search forks so far and the KV slots they copied
    (kvsim.kv.beam; the summary's ``kv.beam_forks`` / ``kv.beam_copied_bytes``)."""

    beam_forks: int
    beam_copied_tokens: int


@runtime_checkable
class PrefixCaching(Protocol):
    """``prefix_caching``: whether the allocator reuses cached blocks by content (the engine then
    computes each request's block keys, and the summary reports the prefix cache)."""

    prefix_caching: bool


@runtime_checkable
class KnownTokenCaching(Protocol):
    """``ensure_slots_known(request_id, num_tokens, known_tokens)``: ``ensure_slots``, but register
    full blocks in the prefix cache up to ``known_tokens`` only (vLLM's async scheduling caches a
    block once the tokens in it are known, a step after its KV is scheduled; kvsim.sched.async_sched)."""

    def ensure_slots_known(self, request_id: int, num_tokens: int, known_tokens: int) -> bool: ...


@runtime_checkable
class KnownTokenBulkGrowth(Protocol):
    """``grow_all_by_one_known()``: ``grow_all_by_one`` (BulkDecodeGrowth) with the registrations of
    KnownTokenCaching: each request's blocks registered up to the tokens known before this step
    (``ensure_slots_known(r, written + 1, written)`` for each), so a block that fills in a step is
    registered at the request's next step, when it takes its next block. The lazy decode group under
    async scheduling with prefix caching."""

    def grow_all_by_one_known(self) -> bool: ...


@runtime_checkable
class OffloadCounter(Protocol):
    """``offloaded_blocks``: evicted blocks whose content went to a lower tier (the summary's
    ``prefix_cache.offloaded_blocks``)."""

    offloaded_blocks: int


@runtime_checkable
class SharedStoreTiers(Protocol):
    """``attach_shared_store(store)``: add a prefix store shared by replicas (a
    :class:`kvsim.kv.tiers.LowerTier`) as the last tier; called once at build time when
    ``replicas.shared_prefix_store`` is given."""

    def attach_shared_store(self, store) -> None: ...


@dataclass(frozen=True)
class AllocatorCapabilities:
    """What an allocator offers beyond :class:`KVAllocator`, checked once per run."""

    windows: bool  # WindowAllocator: decode windows at all
    decode_group: bool  # BulkDecodeGrowth + LazyLedger (+ windows): the lazy decode group
    bulk_slots: bool  # BulkSlots
    prefix_peek: bool  # PrefixCachePeek
    eviction_counter: bool  # EvictionCounter
    block_runs: bool = False  # BlockRuns
    decode_steps: bool = False  # BulkDecodeSteps (with decode_group): window runs in one call
    prefix_caching: bool = False  # PrefixCaching, and its prefix_caching is true
    offload_counter: bool = False  # OffloadCounter
    shared_store: bool = False  # SharedStoreTiers
    host_link_tiers: bool = False  # HostLinkTiers
    beam_counters: bool = False  # BeamCounters
    known_token_caching: bool = False  # KnownTokenCaching
    known_bulk_growth: bool = False  # KnownTokenBulkGrowth (with decode_group)
    admission_watermark: bool = False  # AdmissionWatermark

    def describe(self) -> str:
        on = [name for name in ("windows", "decode_group", "bulk_slots", "prefix_peek", "eviction_counter",
                                "block_runs", "decode_steps", "prefix_caching", "offload_counter", "shared_store",
                                "host_link_tiers", "beam_counters", "known_token_caching", "known_bulk_growth",
                                "admission_watermark")
              if getattr(self, name)]
        return ", ".join(on) or "none"


def require_allocator(alloc: object) -> None:
    """Raise TypeError naming the missing members if ``alloc`` is not a :class:`KVAllocator`."""
    if not isinstance(alloc, KVAllocator):
        missing = [m for m in ("capacity_tokens", "block_size", "max_footprint_fits", "allocate", "ensure_slots",
                               "free", "held_tokens", "usage", "check_invariants") if not hasattr(alloc, m)]
        raise TypeError(f"{type(alloc).__name__} is not a KV allocator: missing {', '.join(missing)}")


def allocator_capabilities(alloc: object) -> AllocatorCapabilities:
    """Check ``alloc`` against the required protocol and every capability (once, at build time)."""
    require_allocator(alloc)
    windows = isinstance(alloc, WindowAllocator)
    decode_group = windows and isinstance(alloc, BulkDecodeGrowth) and isinstance(alloc, LazyLedger)
    caps = AllocatorCapabilities(
        windows=windows,
        decode_group=decode_group,
        bulk_slots=isinstance(alloc, BulkSlots),
        prefix_peek=isinstance(alloc, PrefixCachePeek),
        eviction_counter=isinstance(alloc, EvictionCounter),
        block_runs=isinstance(alloc, BlockRuns),
        decode_steps=decode_group and isinstance(alloc, BulkDecodeSteps),
        prefix_caching=isinstance(alloc, PrefixCaching) and bool(alloc.prefix_caching),
        offload_counter=isinstance(alloc, OffloadCounter),
        shared_store=isinstance(alloc, SharedStoreTiers),
        host_link_tiers=isinstance(alloc, HostLinkTiers),
        beam_counters=isinstance(alloc, BeamCounters),
        known_token_caching=isinstance(alloc, KnownTokenCaching),
        admission_watermark=isinstance(alloc, AdmissionWatermark),
        known_bulk_growth=decode_group and isinstance(alloc, KnownTokenBulkGrowth),
    )
    log.debug("allocator %s capabilities: %s", type(alloc).__name__, caps.describe())
    return caps


# -- the paged allocator's eviction policy ---------------------------------------------------------

@runtime_checkable
class EvictionPolicy(Protocol):
    """Required of an eviction policy (``allocator.eviction``): the paged allocator's *free pool*.
    It holds the blocks with reference count 0 -- never-used ones and freed ones that still hold
    cached prefix content -- and decides which of them a new block is taken from. The allocator owns
    everything else (reference counts, the prefix-cache map, the eviction counter, lower tiers).

    * ``num_free``: blocks in the pool;
    * ``block in pool``: is the block in the pool;
    * ``pop()``: take the block to reuse next out of the pool and return its id (only called when
      ``num_free > 0``). If it holds cached content, the allocator evicts that content: *this* is
      the eviction decision;
    * ``remove(block)``: take a specific block out (a prefix-cache hit on a free cached block);
    * ``add(block, stats)``: a block whose last reference was dropped enters the pool. ``stats``
      is the :class:`~kvsim.kv.eviction.BlockStats` access history of its cached content (it does
      not change while the block is in the pool), or None if the block holds no cached content.
      A request's blocks are added in reverse order (the tail of its prefix chain first).

    At construction every block is in the pool, holding nothing. Calls must be deterministic
    (no wall clock, no unseeded randomness; break ties by block id).
    """

    @property
    def num_free(self) -> int: ...

    def __contains__(self, block: int) -> bool: ...

    def pop(self) -> int: ...

    def remove(self, block: int) -> None: ...

    def add(self, block: int, stats: BlockStats | None) -> None: ...


@runtime_checkable
class AccessHistoryDepth(Protocol):
    """``history_depth``: how many of a cached block's most recent access times its
    ``BlockStats.history`` keeps (LRU-K needs K; 1 for a policy without it)."""

    history_depth: int


@runtime_checkable
class SelfCheckingPool(Protocol):
    """``check_invariants()``: assert the pool's own bookkeeping is consistent (called from the
    allocator's ``check_invariants``, i.e. with ``--check-invariants``)."""

    def check_invariants(self) -> None: ...


@runtime_checkable
class ReuseOrder(Protocol):
    """``order()``: the free blocks in the order ``pop`` would return them (tests and debugging:
    ``PagedAllocator.free_block_order``)."""

    def order(self) -> list[int]: ...


@runtime_checkable
class ScoredEviction(Protocol):
    """``score(stats) -> tuple``: the policy's order as a key over a cached block's
    :class:`~kvsim.kv.eviction.BlockStats` (lowest evicted first; ties by id). A tree-structured
    cache (the radix allocator) orders its evictable leaves by it; without it the radix allocator
    refuses the policy when it is built."""

    def score(self, stats: BlockStats) -> tuple: ...


@runtime_checkable
class StatsBlindEviction(Protocol):
    """``ignores_block_stats``: True if the policy's order never reads the ``stats`` that ``add``
    receives (LRU: the order of the free queue is the order of frees). The allocator then builds
    no :class:`~kvsim.kv.eviction.BlockStats` and passes None to ``add`` for every block."""

    ignores_block_stats: bool


@runtime_checkable
class BulkFreePool(Protocol):
    """``pop_many(n)``: the ``n`` blocks that ``n`` calls of ``pop`` would return, in that order
    (only called when ``num_free >= n``); ``add_many(blocks, stats)``: ``add`` for each block in
    order, ``stats`` an iterable with one entry per block. One call per request instead of one per
    block."""

    def pop_many(self, n: int) -> list[int]: ...

    def add_many(self, blocks: list[int], stats) -> None: ...


@runtime_checkable
class FrontReuse(Protocol):
    """``add_front_many(blocks)``: free blocks that hold no cached content, put where ``pop`` takes
    them first, in order (vLLM's ``free_blocks`` prepends them since vllm-project/vllm#42656). The
    paged allocator uses it with prefix caching on; a pool without it gets them through ``add``."""

    def add_front_many(self, blocks: list[int]) -> None: ...


@dataclass(frozen=True)
class EvictionCapabilities:
    """What an eviction policy offers beyond :class:`EvictionPolicy`, checked once per allocator."""

    history_depth: int  # AccessHistoryDepth, else 1
    self_check: bool  # SelfCheckingPool
    reuse_order: bool  # ReuseOrder
    scored: bool  # ScoredEviction
    ignores_stats: bool  # StatsBlindEviction with ignores_block_stats True
    bulk: bool  # BulkFreePool
    front_reuse: bool = False  # FrontReuse


_EVICTION_MEMBERS = ("num_free", "__contains__", "pop", "remove", "add")


def eviction_capabilities(pool: object) -> EvictionCapabilities:
    """Check ``pool`` against :class:`EvictionPolicy` (TypeError naming the missing members) and
    each optional capability (once, when the allocator is built)."""
    if not isinstance(pool, EvictionPolicy):
        missing = [m for m in _EVICTION_MEMBERS if not hasattr(pool, m)]
        raise TypeError(f"{type(pool).__name__} is not an eviction policy: missing {', '.join(missing)}")
    depth = pool.history_depth if isinstance(pool, AccessHistoryDepth) else 1
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise TypeError(f"{type(pool).__name__}.history_depth must be an int >= 1, got {depth!r}")
    blind = pool.ignores_block_stats if isinstance(pool, StatsBlindEviction) else False
    if not isinstance(blind, bool):
        raise TypeError(f"{type(pool).__name__}.ignores_block_stats must be True or False, got {blind!r}")
    return EvictionCapabilities(history_depth=depth, self_check=isinstance(pool, SelfCheckingPool),
                                reuse_order=isinstance(pool, ReuseOrder), scored=isinstance(pool, ScoredEviction),
                                ignores_stats=blind, bulk=isinstance(pool, BulkFreePool),
                                front_reuse=isinstance(pool, FrontReuse))
