"""Paged KV allocator: fixed-size blocks, per-request block tables, a free-block pool, and optional
automatic prefix caching with vLLM v1 semantics.

Invariants (``check_invariants``):
* every block is either free (in the pool, ref count 0) or owned (ref count == number of block
  tables that contain it, >= 1), never both; free + owned == num_blocks;
* ``len(block_table[r]) * block_size == held_tokens[r]``;
* with prefix caching: ``key_to_block[k] == b`` iff ``block_key[b] == k``; a keyed block is full
  (all its tokens computed by the request that registered it).

Blocks are allocated on demand: admission takes ``cdiv(hold_tokens, block_size)`` blocks less the
prefix-cache hits, and each step's ``ensure_slots`` takes only the blocks new tokens spill into.
A ``watermark`` fraction of blocks is kept free at admission (vLLM v0) so running requests can grow.

Prefix caching (``prefix_caching: true``):
* Only full blocks are cached. Block *k* of a request is keyed by the trace's content key for that
  block (chained on its whole prefix, see :mod:`kvsim.trace.prefix`) when the trace has prefix
  information and the block lies inside the prompt; otherwise by ``(request_id, k)`` -- content no
  other request shares, which a preempted request still hits when it is readmitted.
* A block is registered in the cache when ``ensure_slots`` makes it full (at scheduling time, like
  vLLM's ``cache_blocks``); if another block already holds that key, the new one stays unkeyed.
  A bulk decode step (``grow_all_by_one``, the decode group's call) does the same at block
  boundaries only: the ledger tracks which requests fill or outgrow their last block at which step,
  and those take and register blocks in allocation order (the scheduler's running order), so block
  ids, evictions and registrations are those of one ``ensure_slots`` per request.
* On admission the longest run of leading cached blocks is hit, but at least the last prompt token
  is always computed: at most ``(num_tokens - 1) // block_size`` blocks can hit, so an exact
  full-prompt repeat does not hit its last block. A hit on a free block takes it out of the free
  pool; every hit bumps the block's reference count.
* Freed blocks keep their content and stay reusable in the free pool until evicted; a request's
  blocks are freed in reverse order (tail first). Allocation evicts per the eviction policy
  (:mod:`kvsim.kv.eviction`; default LRU = vLLM's free queue exactly), an object implementing
  :class:`kvsim.kv.protocol.EvictionPolicy` built from ``eviction:`` through ``EVICTION_POLICIES``
  (so a policy registered late is chosen by ``kind:`` too).

The pieces, one owner each: :class:`kvsim.kv.paged_pool.BlockPool` (reference counts, free blocks,
the key map), :class:`kvsim.kv.tiers.LowerTiers` (CPU/SSD/shared-store tiers and offload),
:class:`kvsim.kv.paged_seqs.SeqGroups` (parallel samples and beams) and
:class:`kvsim.kv.paged_seqs.PagedCore` (geometry, ledger and the queries both paged allocators
share). This module owns the block tables and the prefix-cache registration; the block-counting
variant used without prefix caching is :mod:`kvsim.kv.paged_counting`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from kvsim.config_base import StrictModel, Tokens
from kvsim.kv.base import MAX_BLOCK_TOKENS, NO_HIT, Allocation, KVRequest, KVUsage, SampleGeometry, UsageSums, cdiv
from kvsim.kv.beam import BeamTables
from kvsim.kv.eviction import EvictionConfig, LRUEvictionConfig, LRUFreePool
from kvsim.kv.paged_counting import CountingPagedAllocator
from kvsim.kv.paged_bulk import BulkDecode
from kvsim.kv.paged_pool import BlockPool
from kvsim.kv.paged_seqs import PagedCore
from kvsim.kv.protocol import EvictionPolicy
from kvsim.kv.tiers import LowerTier, LowerTiers, OffloadConfig, TierConfig
from kvsim.registry import ALLOCATORS
from kvsim.timing.transfer import HostTransfers, count_runs

__all__ = ["CountingPagedAllocator", "LowerTier", "OffloadConfig", "PagedAllocator", "PagedAllocatorConfig",
           "TierConfig"]



class PagedAllocatorConfig(StrictModel):
    kind: Literal["paged"] = "paged"
    block_size: Tokens = Field(16, ge=1, le=MAX_BLOCK_TOKENS, description="tokens per block")
    watermark: float = Field(0.01, ge=0, lt=1, description="fraction of blocks kept free at admission")
    prefix_caching: bool = Field(False, description="reuse full blocks across requests (vLLM v1 semantics)")
    track_block_ids: Literal["auto", "always"] = Field(
        "auto", description="auto: count blocks without naming them unless something reads ids -- prefix "
                            "caching, or swap copies per run of consecutive ids (host_link.granularity: "
                            "run) -- so results are identical to always")
    eviction: EvictionConfig = Field(  # type: ignore[valid-type]
        default_factory=LRUEvictionConfig,
        description="which cached free block is reused first: lru | fifo | lfu | lru-k | priority, or any "
                    "registered kind; {kind: NAME, ...} or NAME (kvsim/kv/eviction.py)")
    offload: OffloadConfig | None = Field(
        None, description="keep evicted prefix blocks in CPU/SSD tiers instead of dropping them (needs prefix_caching)")

    @model_validator(mode="after")
    def _offload_needs_cache(self):
        if self.offload is not None and not self.prefix_caching:
            raise ValueError("offload needs prefix_caching: true (only cached prefix blocks are offloaded)")
        return self


class PagedAllocator(BulkDecode, PagedCore):
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0,
                 prefix_caching: bool = False, eviction=None, offload: OffloadConfig | None = None,
                 bytes_per_token: int = 0):
        super().__init__(num_blocks, block_size, watermark, track_boundaries=True)
        self.prefix_caching = prefix_caching
        self.blocks = BlockPool(num_blocks, eviction, front_reuse=prefix_caching)
        self.lower = LowerTiers(offload, bytes_per_token, block_size)
        self.block_tables: dict[int, list[int]] = {}
        self._shared_blocks: dict[int, int] = {}  # sampled request -> leading table blocks its samples share
        self._requests: dict[int, KVRequest] = {}
        self._registered: dict[int, int] = {}  # request -> blocks of its table already considered
        self._short: set[int] = set()  # requests whose last full block waits for a known token (ensure_slots_known)
        # request -> allocation order: the scheduler's running order (admission order), in which a
        # bulk decode step (grow_all_by_one) takes blocks and registers them, as step by step
        self._order: dict[int, int] = {}
        self._allocations = 0
        # counters (read by the metrics)
        self.hit_blocks = 0
        self.query_blocks = 0

    @classmethod
    def from_capacity(cls, cfg: PagedAllocatorConfig, capacity_tokens: int, bytes_per_token: int = 0):
        num_blocks = capacity_tokens // cfg.block_size
        if not cfg.prefix_caching and cfg.track_block_ids == "auto":
            return CountingPagedAllocator(num_blocks, cfg.block_size, cfg.watermark)
        return cls(num_blocks, cfg.block_size, cfg.watermark, cfg.prefix_caching, cfg.eviction, cfg.offload,
                   bytes_per_token)

    # -- views of the pool and the tiers (the metrics, tests and the invariant checks read them) --
    @property
    def pool(self) -> EvictionPolicy:
        return self.blocks.free

    @property
    def ref_counts(self) -> list[int]:
        return self.blocks.ref_counts

    @property
    def key_to_block(self) -> dict:
        return self.blocks.key_to_block

    @property
    def eviction_kind(self) -> str:
        return self.blocks.eviction_kind

    @property
    def evictions(self) -> int:
        return self.blocks.evictions

    @property
    def tiers(self) -> list[LowerTier]:
        return self.lower.tiers

    @property
    def offloaded_blocks(self) -> int:
        return self.lower.offloaded_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free

    # -- queries -------------------------------------------------------------------------------
    def block_runs(self, request_id: int, first_block: int, end_block: int) -> int:
        """Runs of consecutive block ids among blocks ``[first_block, end_block)`` of the request's
        table (the BlockRuns capability: copies a coalescing copy engine needs)."""
        return count_runs(self.block_tables[request_id][first_block:end_block])

    def block_table(self, request_id: int) -> list[int]:
        """A copy of the request's block ids (for tests; the scheduler never calls this)."""
        return list(self.block_tables[request_id])

    def free_block_order(self) -> list[int]:
        """Free blocks in the order they would be reused (for tests; needs the ReuseOrder capability)."""
        if not self.blocks.caps.reuse_order:
            raise TypeError(f"eviction kind {self.eviction_kind!r}: its pool cannot list its reuse order")
        return self.pool.order()  # type: ignore[attr-defined]

    @property
    def free_queue(self):
        """The LRU free queue (only with the default LRU eviction)."""
        if not isinstance(self.pool, LRUFreePool):
            raise TypeError(f"eviction kind {self.eviction_kind!r} has no LRU free queue")
        return self.pool.queue

    def _key(self, req: KVRequest, k: int):
        keys = req.block_keys
        if keys is not None and k < len(keys):
            return int(keys[k])
        return (req.request_id, k)

    def _cache_hits(self, req: KVRequest, num_tokens: int) -> list[int]:
        hits: list[int] = []
        if not self.prefix_caching or req.num_samples > 1:  # sampled requests bypass the cache
            return hits
        max_hit = (num_tokens - 1) // self.block_size  # the last token is always computed
        key_to_block = self.blocks.key_to_block
        for k in range(max_hit):
            b = key_to_block.get(self._key(req, k))
            if b is None:
                break
            hits.append(b)
        return hits

    def _tier_hits(self, req: KVRequest, num_tokens: int, start: int) -> list[LowerTier]:
        """Tier of each block after the GPU hits that is found in a lower tier (leading run)."""
        if not self.lower.tiers or req.num_samples > 1:  # (the tier list's truth: no __bool__ call)
            return []
        return self.lower.hits(lambda k: self._key(req, k), start, (num_tokens - 1) // self.block_size)

    def peek_cached_tokens(self, req: KVRequest, num_tokens: int) -> int:
        """Tokens ``allocate(req, num_tokens)`` would find cached, in any tier (no side effects)."""
        gpu = len(self._cache_hits(req, num_tokens))
        return (gpu + len(self._tier_hits(req, num_tokens, gpu))) * self.block_size

    def peek_load_s(self, req: KVRequest, num_tokens: int) -> float:
        """Time ``allocate`` would spend loading blocks back from lower tiers (no side effects)."""
        gpu = len(self._cache_hits(req, num_tokens))
        return self.lower.load_s(self._tier_hits(req, num_tokens, gpu))

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        """Would ``allocate(req, hold_tokens)`` succeed now? (no side effects)"""
        hits = self._cache_hits(req, hold_tokens)
        need = self._blocks_for(req, hold_tokens) - len(hits)
        return self.blocks.num_free - self.blocks.hits_in_free(hits) - need >= self.watermark_blocks

    # -- tiers ---------------------------------------------------------------------------------
    def attach_shared_store(self, store: LowerTier) -> None:
        """Add a store shared with other replicas as the last tier (needs prefix caching)."""
        if not self.prefix_caching:
            raise ValueError("a shared prefix store needs prefix caching")
        self.lower.attach(store)

    def use_host_link(self, transfers: HostTransfers) -> None:
        """Price loads from the CPU tier with the host link (the HostLinkTiers capability; see
        :meth:`kvsim.kv.tiers.LowerTiers.use_host_link`)."""
        self.lower.use_host_link(transfers)

    # -- mutations -------------------------------------------------------------------------------
    def _new_block(self) -> int:
        b, evicted = self.blocks.take()
        if evicted is not None and self.lower.tiers:  # the cached content goes to the next tier down
            self.lower.offload(evicted)
        return b

    def _new_blocks(self, n: int) -> list[int]:
        """``_new_block`` ``n`` times (the offloads, which touch only the lower tiers, after the takes)."""
        evicted: list = []
        blocks = self.blocks.take_many(n, evicted)
        if evicted and self.lower.tiers:
            for key in evicted:
                self.lower.offload(key)
        return blocks

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        rid = req.request_id
        self.ledger.require_new(rid, hold_tokens)
        total = self._blocks_for(req, hold_tokens)
        hits = self._cache_hits(req, hold_tokens)
        tier_hits = self._tier_hits(req, hold_tokens, len(hits))
        pool = self.blocks
        if pool.num_free - pool.hits_in_free(hits) - (total - len(hits)) < self.watermark_blocks:
            return None
        pool.tick += 1
        for b in hits:
            pool.hit(b, req.priority)
        table: list[int] = list(hits)
        # Blocks found in lower tiers leave them before any new block is taken (taking blocks may
        # offload other cached blocks, which must not push these out).
        loaded_keys = []
        for k, tier in enumerate(tier_hits, start=len(hits)):
            key = self._key(req, k)
            self.lower.load(tier, key)
            loaded_keys.append(key)
        table += self._new_blocks(total - len(hits))
        for k, key in enumerate(loaded_keys, start=len(hits)):  # loaded blocks are cached again
            pool.cache(table[k], key, req.priority)
        self.block_tables[rid] = table
        self._order[rid] = self._allocations
        self._allocations += 1
        self.ledger.add(rid, self._final_written(req), total * self.block_size)
        if req.num_samples > 1:
            self._start_sequences(req, hold_tokens, table)
        cached = (len(hits) + len(tier_hits)) * self.block_size
        if self.prefix_caching:
            self._requests[rid] = req
            self._registered[rid] = len(hits) + len(tier_hits)
            self.query_blocks += cdiv(req.prompt_tokens, self.block_size)
            self.hit_blocks += len(hits)
        if cached:
            self.ledger.set_written(rid, cached)
            if tier_hits:
                return self.lower.allocation(cached, self.block_size, tier_hits)
            return Allocation(cached)
        return NO_HIT

    def _start_sequences(self, req: KVRequest, hold_tokens: int, table: list[int]) -> None:
        """Beams over the blocks just taken, or samples sharing the prompt's blocks by reference."""
        blocks = iter(table)
        started = self.seqs.start(req, hold_tokens, lambda: next(blocks))
        if isinstance(started, BeamTables):
            self.blocks.set_refs(started.refs)
            return
        # a recompute readmits diverged samples: then only the full prompt blocks are shared
        shared = cdiv(req.prompt_tokens, self.block_size) if hold_tokens <= req.prompt_tokens else started.full
        self._shared_blocks[req.request_id] = shared
        self.blocks.add_refs(table[:shared], req.num_samples - 1)

    def ensure_slots_known(self, request_id: int, num_tokens: int, known_tokens: int) -> bool:
        """KnownTokenCaching: slots for ``num_tokens``, blocks registered up to ``known_tokens``."""
        return self.ensure_slots(request_id, num_tokens, known_tokens)

    def ensure_slots(self, request_id: int, num_tokens: int, known_tokens: int | None = None) -> bool:
        self.ledger.require(request_id)
        seqs = self.seqs
        if seqs.samples:
            geo = seqs.samples.get(request_id)
            if geo is not None:
                return self._ensure_sampled(request_id, num_tokens, geo)
        if seqs.beams:
            bt = seqs.beams.get(request_id)
            if bt is not None:
                return self._ensure_beams(request_id, num_tokens, bt)
        table = self.block_tables[request_id]
        need = cdiv(num_tokens, self.block_size) - len(table)
        if need > 0:
            if need > self.blocks.num_free:
                return False
            table += self._new_blocks(need)
            self.ledger.set_held(request_id, len(table) * self.block_size)
        if num_tokens < self.ledger.written_of(request_id):
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        self.ledger.set_written(request_id, num_tokens)
        if self.prefix_caching:
            if known_tokens is None:
                known_tokens = num_tokens
            else:  # ensure_slots_known (async scheduling): a block may be full but not yet registered
                (self._short.add if known_tokens < num_tokens else self._short.discard)(request_id)
            if known_tokens // self.block_size > self._registered[request_id]:  # a block newly full
                self._register_full_blocks(request_id, known_tokens)
        return True

    def _ensure_sampled(self, rid: int, num_tokens: int, geo: SampleGeometry) -> bool:
        """n samples: shared prompt blocks, copy-on-write of the partial block at the first
        generated token, then ``n`` new blocks (one per sample, sample order) per block boundary."""
        table = self.block_tables[rid]
        need = geo.blocks(num_tokens) - len(table)
        if need > 0:
            if need > self.blocks.num_free:
                return False
            shared = self._shared_blocks[rid]
            first = len(table)
            for _ in range(need):
                table.append(self._new_block())
            if first < shared:  # a prompt prefilled in chunks: its later blocks are the samples' too
                self.blocks.add_refs(table[first:shared], geo.n - 1)
            if num_tokens > geo.prompt and shared > geo.full:
                # First divergent write: sample 0 keeps the partial prompt block, the others copy it.
                self.blocks.add_refs((table[shared - 1],), -(geo.n - 1))
                self._shared_blocks[rid] = geo.full
            self.ledger.set_held(rid, len(table) * self.block_size)
        written = geo.written(num_tokens)
        if written < self.ledger.written_of(rid):
            raise ValueError(f"request {rid}: written tokens cannot shrink")
        self.ledger.set_written(rid, written)
        self.seqs.seq_len[rid] = num_tokens
        return True

    def _ensure_beams(self, rid: int, num_tokens: int, bt: BeamTables) -> bool:
        """Beam search (SeqGroups.grow_beams) over physical blocks: all or nothing."""
        if self.seqs.grow_beams(rid, bt, num_tokens, self.blocks.num_free, self._new_block, self.blocks.give) is None:
            return False
        self.blocks.set_refs(bt.refs)
        table = self.block_tables[rid] = list(bt.refs)
        self.ledger.set_held(rid, len(table) * self.block_size)
        self.ledger.set_written(rid, bt.written_slots())
        return True

    def _register_full_blocks(self, rid: int, num_tokens: int) -> None:
        full = num_tokens // self.block_size
        start = self._registered[rid]
        if full <= start:
            return
        req = self._requests[rid]
        table = self.block_tables[rid]
        keys = req.block_keys
        if full == start + 1:  # one block (a decode crossing a boundary): the same, without the lists
            key = int(keys[start]) if keys is not None and start < len(keys) else (rid, start)
            if self.blocks.cache_one(table[start], key, req.priority) and self.lower.tiers:
                self.lower.recomputed(key)
            self._registered[rid] = full
            return
        # self._key for these blocks at once (int keys from the trace, then (request, block))
        trace_keys = [] if keys is None else [int(x) for x in keys[start:full]] if not isinstance(keys, np.ndarray) \
            else keys[start:full].tolist()
        if len(trace_keys) < full - start:
            trace_keys += [(rid, k) for k in range(start + len(trace_keys), full)]
        # content already cached in another block keeps that block
        cached = self.blocks.cache_new(table[start:full], trace_keys, req.priority)
        if self.lower:
            for key in cached:
                self.lower.recomputed(key)
        self._registered[rid] = full

    def free(self, request_id: int) -> None:
        self.ledger.remove(request_id)
        table = self.block_tables.pop(request_id)
        del self._order[request_id]
        self._requests.pop(request_id, None)
        self._registered.pop(request_id, None)
        self._short.discard(request_id)
        geo, bt = self.seqs.drop(request_id)
        pool = self.blocks
        if bt is not None:  # drop the beams' extra references first
            pool.set_refs({b: pool.ref_counts[b] - (bt.refs[b] - 1) for b in table})
        if geo is not None:  # drop the extra references of the samples first
            pool.add_refs(table[:self._shared_blocks.pop(request_id)], -(geo.n - 1))
        pool.release_many(reversed(table))  # tail first: see the eviction order in kvsim.kv.eviction

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        # Any free block can serve any request: paging has no external fragmentation.
        return self.ledger.usage(self.capacity_tokens, 0, self.blocks.shared_extra * self.block_size,
                                 self.blocks.cached_free * self.block_size,
                                 self.seqs.unshared_extra(self.ledger.written_of))

    def usage_parts(self, head: KVRequest | None = None) -> UsageSums:
        return UsageSums(self.ledger.sum_held, self.ledger.sum_useful, self.blocks.shared_extra * self.block_size,
                         self.blocks.cached_free * self.block_size, 0)

    def check_invariants(self) -> None:
        self.ledger.check("paged")
        owners = [0] * self.num_blocks
        intra = 0  # references of a request's own samples to its shared blocks, beyond the first
        for r, table in self.block_tables.items():
            assert r in self.ledger, f"block table of unknown request {r}"
            assert len(table) * self.block_size == self.ledger.held[r], (
                f"request {r}: {len(table)} blocks but {self.ledger.held[r]} held tokens"
            )
            assert len(set(table)) == len(table), f"request {r} holds a block twice"
            bt = self.seqs.beams.get(r)
            if bt is not None:
                bt.check(f"paged request {r}")
                assert set(table) == set(bt.refs), f"request {r}: block table and beams disagree"
                for b in table:
                    owners[b] += bt.refs[b]
                    intra += bt.refs[b] - 1
                continue
            geo = self.seqs.samples.get(r)
            shared, n = (self._shared_blocks[r], geo.n) if geo is not None else (len(table), 1)
            for i, b in enumerate(table):
                owners[b] += n if i < shared else 1
            if geo is not None:
                intra += min(shared, len(table)) * (n - 1)  # (a prompt prefilled in chunks: its blocks so far)
        assert len(self.block_tables) == len(self.ledger), "block tables and ledger disagree"
        assert self._order.keys() == self.block_tables.keys(), "allocation order and block tables disagree"
        if self.prefix_caching:  # full blocks are registered as they fill (lazily too: grow_all_by_one)
            for r in self.block_tables:
                if r not in self.seqs.samples and r not in self.seqs.beams:
                    full = self.ledger.written_of(r) // self.block_size
                    lag = 1 if r in self._short else 0  # ensure_slots_known: one known token short at most
                    assert full - lag <= self._registered[r] <= full, \
                        f"request {r}: {self._registered[r]} blocks registered, {full} full"
        self.blocks.check(owners, intra)
        self.lower.check(self.blocks.key_to_block)
        if not self.prefix_caching:
            assert not self.blocks.key_to_block, "cache entries without prefix caching"


ALLOCATORS.register("paged", PagedAllocatorConfig, PagedAllocator.from_capacity)
