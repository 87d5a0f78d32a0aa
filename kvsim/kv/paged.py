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
* On admission the longest run of leading cached blocks is hit, but at least the last prompt token
  is always computed: at most ``(num_tokens - 1) // block_size`` blocks can hit, so an exact
  full-prompt repeat does not hit its last block. A hit on a free block takes it out of the free
  pool; every hit bumps the block's reference count.
* Freed blocks keep their content and stay reusable in the free pool until evicted; a request's
  blocks are freed in reverse order (tail first). Allocation evicts per the eviction policy
  (:mod:`kvsim.kv.eviction`; default LRU = vLLM's free queue exactly), an object implementing
  :class:`kvsim.kv.protocol.EvictionPolicy` built from ``eviction:`` through ``EVICTION_POLICIES``
  (so a policy registered late is chosen by ``kind:`` too).
"""

from __future__ import annotations

from typing import Literal

from collections import OrderedDict

from pydantic import Field, model_validator

from kvsim.config_base import Bytes, ByteRate, StrictModel, Tokens
from kvsim.kv.beam import BeamTables
from kvsim.kv.base import NO_HIT, Allocation, KVRequest, KVUsage, SampleGeometry, SlotLedger, UsageSums, cdiv
from kvsim.kv.eviction import EVICTION_POLICIES, BlockStats, LRUEvictionConfig, LRUFreePool
from kvsim.kv.protocol import EvictionPolicy, eviction_capabilities
from kvsim.registry import ALLOCATORS, policy_field
from kvsim.timing.transfer import HostTransfers, count_runs

# Any kind registered in EVICTION_POLICIES when the scenario is validated; a bare kind is shorthand.
EvictionConfig = policy_field(EVICTION_POLICIES, "lru")


class TierConfig(StrictModel):
    capacity_bytes: Bytes = Field(gt=0)
    bandwidth_bytes_per_s: ByteRate = Field(gt=0, description="load bandwidth back to GPU memory")


class OffloadConfig(StrictModel):
    """Lower KV tiers for evicted prefix blocks: CPU DRAM (over PCIe) and optionally SSD."""

    cpu: TierConfig = Field(default_factory=lambda: TierConfig(capacity_bytes=64 << 30, bandwidth_bytes_per_s=64e9))
    ssd: TierConfig | None = None


class PagedAllocatorConfig(StrictModel):
    kind: Literal["paged"] = "paged"
    block_size: Tokens = Field(16, ge=1, le=512, description="tokens per block")
    watermark: float = Field(0.01, ge=0, lt=1, description="fraction of blocks kept free at admission")
    prefix_caching: bool = Field(False, description="reuse full blocks across requests (vLLM v1 semantics)")
    track_block_ids: Literal["auto", "always"] = Field(
        "auto", description="auto: count blocks without naming them unless prefix caching needs ids "
                            "(results are identical; ids only matter for which cached block is reused)")
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


def _init_geometry(alloc, num_blocks: int, block_size: int, watermark: float) -> None:
    """Block-pool sizes shared by both paged allocators (validated here, once)."""
    if num_blocks < 1:
        raise ValueError("a paged allocator needs at least one block")
    if not 1 <= block_size <= 512:
        raise ValueError(f"block_size must be in [1, 512], got {block_size}")
    alloc.num_blocks = num_blocks
    alloc.block_size = block_size
    alloc.capacity_tokens = num_blocks * block_size
    alloc.watermark_blocks = int(watermark * num_blocks)


class LowerTier:
    """An LRU set of block keys held outside GPU memory. Private tiers (cpu, ssd) are exclusive: a
    key lives in one of them or in GPU memory. A ``shared`` tier (a store shared by replicas) keeps
    its copy when a replica loads a block back."""

    def __init__(self, name: str, capacity_blocks: int, bandwidth_bytes_per_s: float, shared: bool = False):
        self.shared = shared
        # seconds to load one block back when priced by the host link (kvsim.timing.transfer); None:
        # block bytes / bandwidth_bytes_per_s
        self.block_load_s: float | None = None
        self.name = name
        self.capacity_blocks = capacity_blocks
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.keys: OrderedDict = OrderedDict()

    def __contains__(self, key) -> bool:
        return key in self.keys

    def insert(self, key):
        """Add ``key`` as most recent; return the key pushed out (LRU) or None."""
        self.keys[key] = None
        self.keys.move_to_end(key)
        if len(self.keys) > self.capacity_blocks:
            return self.keys.popitem(last=False)[0]
        return None

    def remove(self, key) -> None:
        del self.keys[key]


class PagedAllocator:
    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0,
                 prefix_caching: bool = False, eviction=None, offload: OffloadConfig | None = None,
                 bytes_per_token: int = 0):
        _init_geometry(self, num_blocks, block_size, watermark)
        self.prefix_caching = prefix_caching
        eviction = eviction or LRUEvictionConfig()
        self.eviction_kind = eviction.kind
        self.pool: EvictionPolicy = EVICTION_POLICIES.build(eviction, num_blocks)
        self.pool_caps = eviction_capabilities(self.pool)  # checked once; TypeError if not a policy
        if self.pool.num_free != num_blocks:
            raise ValueError(f"eviction kind {eviction.kind!r}: a new pool must hold all {num_blocks} blocks, "
                             f"it holds {self.pool.num_free}")
        self._history_k = self.pool_caps.history_depth
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[int, list[int]] = {}
        self.ledger = SlotLedger()
        # prefix cache state
        self.block_key: list[object] = [None] * num_blocks
        self.key_to_block: dict[object, int] = {}
        self.block_stats: dict[int, BlockStats] = {}
        self._requests: dict[int, KVRequest] = {}
        self._registered: dict[int, int] = {}  # request -> blocks of its table already considered
        # parallel sampling: request -> (geometry, number of leading table blocks shared by its samples)
        self._samples: dict[int, list] = {}
        self._seq_len: dict[int, int] = {}  # sampled requests: a sequence's written length
        self._beams: dict[int, BeamTables] = {}  # beam-search requests: their beams' block tables
        self.beam_forks = 0  # forks so far (each after a prune)
        self.beam_copied_tokens = 0  # KV slots copied at forks (copy-on-write of partial blocks)
        self._shared_extra = 0  # sum over owned blocks of (ref count - 1)
        self._cached_free = 0  # free blocks that still hold cached content
        self._tick = 0
        # counters (read by the metrics)
        self.hit_blocks = 0
        self.query_blocks = 0
        self.evictions = 0
        self.offloaded_blocks = 0
        self.tiers: list[LowerTier] = []
        self.bytes_per_token = bytes_per_token
        if offload is not None:
            if bytes_per_token <= 0:
                raise ValueError("offload tiers need bytes_per_token")
            block_bytes = bytes_per_token * block_size
            self.tiers.append(LowerTier("cpu", offload.cpu.capacity_bytes // block_bytes, offload.cpu.bandwidth_bytes_per_s))
            if offload.ssd is not None:
                self.tiers.append(LowerTier("ssd", offload.ssd.capacity_bytes // block_bytes,
                                            offload.ssd.bandwidth_bytes_per_s))

    @classmethod
    def from_capacity(cls, cfg: PagedAllocatorConfig, capacity_tokens: int, bytes_per_token: int = 0):
        num_blocks = capacity_tokens // cfg.block_size
        if not cfg.prefix_caching and cfg.track_block_ids == "auto":
            return CountingPagedAllocator(num_blocks, cfg.block_size, cfg.watermark)
        return cls(num_blocks, cfg.block_size, cfg.watermark, cfg.prefix_caching, cfg.eviction, cfg.offload,
                   bytes_per_token)

    # -- queries -------------------------------------------------------------------------------
    def max_footprint_fits(self, req: KVRequest) -> bool:
        return self._final_blocks(req) <= self.num_blocks - self.watermark_blocks

    def _blocks_for(self, req: KVRequest, hold_tokens: int) -> int:
        if req.num_samples == 1:
            return cdiv(hold_tokens, self.block_size)
        return SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens).blocks(hold_tokens)

    def _final_blocks(self, req: KVRequest) -> int:
        if req.num_samples == 1:
            return cdiv(req.final_kv_tokens, self.block_size)
        return SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens).blocks(
            req.final_kv_tokens if req.output_tokens > 1 else req.prompt_tokens)

    def _final_written(self, req: KVRequest) -> int:
        if req.num_samples == 1:
            return req.final_kv_tokens
        g = SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens)
        return g.written(req.final_kv_tokens) if req.output_tokens > 1 else req.prompt_tokens

    def held_tokens(self, request_id: int) -> int:
        return self.ledger.held[request_id]

    def written_offset_tokens(self, request_id: int) -> int:
        """``samples x sequence length - physical slots written`` once samples diverged: the
        prompt's full blocks are stored once for all samples."""
        bt = self._beams.get(request_id)
        if bt is not None:
            return bt.width * bt.seq_len - bt.written_slots()
        s = self._samples.get(request_id)
        return 0 if s is None else (s[0].n - 1) * s[0].base

    def seq_capacity_tokens(self, request_id: int) -> int:
        """Tokens one of the request's sequences can hold in its current blocks (diverged samples)."""
        bt = self._beams.get(request_id)
        if bt is not None:
            return bt.seq_capacity_tokens()
        held = self.ledger.held[request_id]
        s = self._samples.get(request_id)
        return held if s is None else s[0].seq_capacity(held // self.block_size)

    def block_runs(self, request_id: int, first_block: int, end_block: int) -> int:
        """Runs of consecutive block ids among blocks ``[first_block, end_block)`` of the request's
        table (the BlockRuns capability: copies a coalescing copy engine needs)."""
        return count_runs(self.block_tables[request_id][first_block:end_block])

    def block_table(self, request_id: int) -> list[int]:
        """A copy of the request's block ids (for tests; the scheduler never calls this)."""
        return list(self.block_tables[request_id])

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def free_block_order(self) -> list[int]:
        """Free blocks in the order they would be reused (for tests; needs the ReuseOrder capability)."""
        if not self.pool_caps.reuse_order:
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

    # -- mutations -------------------------------------------------------------------------------
    def _new_block(self) -> int:
        b = self.pool.pop()
        key = self.block_key[b]
        if key is not None:  # evict the cached content (to the next tier down, if any)
            self._cached_free -= 1
            del self.key_to_block[key]
            self.block_key[b] = None
            self.block_stats.pop(b, None)
            self.evictions += 1
            if self.tiers:
                self.offloaded_blocks += 1
                for tier in self.tiers:
                    if tier.shared and key in tier:
                        break  # the store already has it
                    key = tier.insert(key)
                    if key is None:
                        break
        self.ref_counts[b] = 1
        return b

    def _cache_hits(self, req: KVRequest, num_tokens: int) -> list[int]:
        hits: list[int] = []
        if not self.prefix_caching or req.num_samples > 1:  # sampled requests bypass the cache
            return hits
        max_hit = (num_tokens - 1) // self.block_size  # the last token is always computed
        for k in range(max_hit):
            b = self.key_to_block.get(self._key(req, k))
            if b is None:
                break
            hits.append(b)
        return hits

    def attach_shared_store(self, store: LowerTier) -> None:
        """Add a store shared with other replicas as the last tier (needs prefix caching)."""
        if not self.prefix_caching:
            raise ValueError("a shared prefix store needs prefix caching")
        if self.bytes_per_token <= 0:
            raise ValueError("a shared prefix store needs bytes_per_token")
        self.tiers.append(store)

    def _tier_hits(self, req: KVRequest, num_tokens: int, start: int) -> list[LowerTier]:
        """Tier of each block after the GPU hits that is found in a lower tier (leading run)."""
        out: list[LowerTier] = []
        if not self.tiers or req.num_samples > 1:
            return out
        max_hit = (num_tokens - 1) // self.block_size
        for k in range(start, max_hit):
            key = self._key(req, k)
            tier = next((t for t in self.tiers if key in t), None)
            if tier is None:
                break
            out.append(tier)
        return out

    def peek_cached_tokens(self, req: KVRequest, num_tokens: int) -> int:
        """Tokens ``allocate(req, num_tokens)`` would find cached, in any tier (no side effects)."""
        gpu = len(self._cache_hits(req, num_tokens))
        return (gpu + len(self._tier_hits(req, num_tokens, gpu))) * self.block_size

    def peek_load_s(self, req: KVRequest, num_tokens: int) -> float:
        """Time ``allocate`` would spend loading blocks back from lower tiers (no side effects)."""
        gpu = len(self._cache_hits(req, num_tokens))
        return self._load_s(self._tier_hits(req, num_tokens, gpu))

    def _load_s(self, tiers: list[LowerTier]) -> float:
        block_bytes = self.bytes_per_token * self.block_size
        return sum(block_bytes / t.bandwidth_bytes_per_s if t.block_load_s is None else t.block_load_s
                   for t in tiers)

    def use_host_link(self, transfers: HostTransfers) -> None:
        """Price loads from the CPU tier with the host link (the HostLinkTiers capability): one block
        at a time, ``transfers.copies_per_unit`` copies of its bytes each, per-copy latency included.
        The SSD tier and a shared store keep their own bandwidth (their bottleneck is not the link)."""
        block_bytes = self.bytes_per_token * self.block_size
        for t in self.tiers:
            if t.name == "cpu":
                t.block_load_s = transfers.copy_s(block_bytes, transfers.copies_per_unit, "h2d")

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        """Would ``allocate(req, hold_tokens)`` succeed now? (no side effects)"""
        hits = self._cache_hits(req, hold_tokens)
        hits_in_pool = sum(1 for b in hits if self.ref_counts[b] == 0)
        need = self._blocks_for(req, hold_tokens) - len(hits)
        return self.pool.num_free - hits_in_pool - need >= self.watermark_blocks

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        rid = req.request_id
        self.ledger.require_new(rid, hold_tokens)
        total = self._blocks_for(req, hold_tokens)
        hits = self._cache_hits(req, hold_tokens)
        tier_hits = self._tier_hits(req, hold_tokens, len(hits))
        hits_in_pool = sum(1 for b in hits if self.ref_counts[b] == 0)
        if self.pool.num_free - hits_in_pool - (total - len(hits)) < self.watermark_blocks:
            return None
        self._tick += 1
        table: list[int] = []
        for b in hits:
            if self.ref_counts[b] == 0:
                self.pool.remove(b)
                self._cached_free -= 1
            else:
                self._shared_extra += 1
            self.ref_counts[b] += 1
            stats = self.block_stats.get(b)
            if stats is not None:
                stats.touch(self._tick, req.priority)
            table.append(b)
        # Blocks found in lower tiers leave them before any new block is taken (taking blocks may
        # offload other cached blocks, which must not push these out).
        loaded_keys = []
        for k, tier in enumerate(tier_hits, start=len(hits)):
            key = self._key(req, k)
            if not tier.shared:
                tier.remove(key)
            loaded_keys.append(key)
        for _ in range(total - len(hits)):
            table.append(self._new_block())
        for k, key in enumerate(loaded_keys, start=len(hits)):  # loaded blocks are cached again
            b = table[k]
            self.key_to_block[key] = b
            self.block_key[b] = key
            stats = BlockStats(self._tick, self._history_k)
            stats.touch(self._tick, req.priority)
            self.block_stats[b] = stats
        self.block_tables[rid] = table
        self.ledger.add(rid, self._final_written(req), total * self.block_size)
        if req.num_samples > 1 and req.beam_events is not None:  # beams over the blocks just taken
            blocks = iter(table)
            bt = self._beams[rid] = BeamTables(req.beam_events, self.block_size, req.prompt_tokens, hold_tokens,
                                               lambda: next(blocks))
            for b, n in bt.refs.items():
                self.ref_counts[b] = n
            self._seq_len[rid] = 0
        elif req.num_samples > 1:  # the prompt's blocks are shared by reference count
            geo = SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens)
            # a recompute readmits diverged samples: then only the full prompt blocks are shared
            shared = cdiv(req.prompt_tokens, self.block_size) if hold_tokens <= req.prompt_tokens else geo.full
            self._samples[rid] = [geo, shared]
            for b in table[:shared]:
                self.ref_counts[b] += req.num_samples - 1
        cached = (len(hits) + len(tier_hits)) * self.block_size
        if self.prefix_caching:
            self._requests[rid] = req
            self._registered[rid] = len(hits) + len(tier_hits)
            self.query_blocks += cdiv(req.prompt_tokens, self.block_size)
            self.hit_blocks += len(hits)
        if cached:
            self.ledger.set_written(rid, cached)
            if tier_hits:
                bs = self.block_size
                return Allocation(cached, cpu_tokens=bs * sum(1 for t in tier_hits if t.name == "cpu"),
                                  ssd_tokens=bs * sum(1 for t in tier_hits if t.name == "ssd"),
                                  remote_tokens=bs * sum(1 for t in tier_hits if t.name == "remote"),
                                  load_s=self._load_s(tier_hits))
            return Allocation(cached)
        return NO_HIT

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        self.ledger.require(request_id)
        sampled = self._samples.get(request_id)
        if sampled is not None:
            return self._ensure_sampled(request_id, num_tokens, sampled)
        if self._beams:
            bt = self._beams.get(request_id)
            if bt is not None:
                return self._ensure_beams(request_id, num_tokens, bt)
        table = self.block_tables[request_id]
        need = cdiv(num_tokens, self.block_size) - len(table)
        if need > 0:
            if need > self.pool.num_free:
                return False
            for _ in range(need):
                table.append(self._new_block())
            self.ledger.set_held(request_id, len(table) * self.block_size)
        if num_tokens < self.ledger.written_of(request_id):
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        self.ledger.set_written(request_id, num_tokens)
        if self.prefix_caching:
            self._register_full_blocks(request_id, num_tokens)
        return True

    def _ensure_sampled(self, rid: int, num_tokens: int, sampled: list) -> bool:
        """n samples: shared prompt blocks, copy-on-write of the partial block at the first
        generated token, then ``n`` new blocks (one per sample, sample order) per block boundary."""
        geo, shared = sampled
        table = self.block_tables[rid]
        need = geo.blocks(num_tokens) - len(table)
        if need > 0:
            if need > self.pool.num_free:
                return False
            if num_tokens > geo.prompt and shared > geo.full:
                # First divergent write: sample 0 keeps the partial prompt block, the others copy it.
                b = table[shared - 1]
                self.ref_counts[b] -= geo.n - 1
                sampled[1] = shared = geo.full
            for _ in range(need):
                table.append(self._new_block())
            self.ledger.set_held(rid, len(table) * self.block_size)
        written = geo.written(num_tokens)
        if written < self.ledger.written_of(rid):
            raise ValueError(f"request {rid}: written tokens cannot shrink")
        self.ledger.set_written(rid, written)
        self._seq_len[rid] = num_tokens
        return True

    def _ensure_beams(self, rid: int, num_tokens: int, bt: BeamTables) -> bool:
        """Beam search: grow every beam to ``num_tokens``, forking and pruning on the way
        (kvsim.kv.beam). All or nothing: the net blocks it takes must be free."""
        if num_tokens < bt.seq_len:
            raise ValueError(f"request {rid}: written tokens cannot shrink")
        if bt.blocks_needed(num_tokens) > self.pool.num_free:
            return False
        forks, copied = bt.forks, bt.copied_tokens
        bt.advance(num_tokens, self._new_block, self._give_block)
        self.beam_forks += bt.forks - forks
        self.beam_copied_tokens += bt.copied_tokens - copied
        for b, n in bt.refs.items():
            self.ref_counts[b] = n
        table = self.block_tables[rid] = list(bt.refs)
        self.ledger.set_held(rid, len(table) * self.block_size)
        self.ledger.set_written(rid, bt.written_slots())
        self._seq_len[rid] = num_tokens
        return True

    def _give_block(self, b: int) -> None:
        """A block no beam holds any more goes back to the pool (beam blocks are never cached)."""
        self.ref_counts[b] = 0
        self.pool.add(b, self.block_stats.get(b))

    def _register_full_blocks(self, rid: int, num_tokens: int) -> None:
        full = num_tokens // self.block_size
        start = self._registered[rid]
        if full <= start:
            return
        req = self._requests[rid]
        table = self.block_tables[rid]
        k_hist = self._history_k
        for k in range(start, full):
            key = self._key(req, k)
            if key in self.key_to_block:
                continue  # the same content is already cached in another block: keep that one
            b = table[k]
            self.key_to_block[key] = b
            self.block_key[b] = key
            for tier in self.tiers:  # recomputed content supersedes an offloaded copy (tiers are exclusive)
                if key in tier and not tier.shared:
                    tier.remove(key)
                    break
            stats = BlockStats(self._tick, k_hist)
            stats.touch(self._tick, req.priority)
            self.block_stats[b] = stats
        self._registered[rid] = full

    def free(self, request_id: int) -> None:
        self.ledger.remove(request_id)
        table = self.block_tables.pop(request_id)
        self._requests.pop(request_id, None)
        self._registered.pop(request_id, None)
        sampled = self._samples.pop(request_id, None)
        self._seq_len.pop(request_id, None)
        bt = self._beams.pop(request_id, None)
        if bt is not None:
            for b in table:  # drop the beams' extra references first
                self.ref_counts[b] -= bt.refs[b] - 1
        if sampled is not None:
            n, shared = sampled[0].n, sampled[1]
            for b in table[:shared]:  # drop the extra references of the samples first
                self.ref_counts[b] -= n - 1
        for b in reversed(table):  # tail first: see the eviction order in kvsim.kv.eviction
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.pool.add(b, self.block_stats.get(b))
                if self.block_key[b] is not None:
                    self._cached_free += 1
            else:
                self._shared_extra -= 1

    def _unshared_extra(self) -> int:
        if not self._seq_len:
            return 0
        w = self.ledger.written_of
        return sum(self._width(r) * n - w(r) for r, n in self._seq_len.items())

    def _width(self, rid: int) -> int:
        bt = self._beams.get(rid)
        return bt.width if bt is not None else self._samples[rid][0].n

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        # Any free block can serve any request: paging has no external fragmentation.
        return self.ledger.usage(self.capacity_tokens, 0, self._shared_extra * self.block_size,
                                 self._cached_free * self.block_size, self._unshared_extra())

    def usage_parts(self, head: KVRequest | None = None) -> UsageSums:
        return UsageSums(self.ledger.sum_held, self.ledger.sum_useful, self._shared_extra * self.block_size,
                         self._cached_free * self.block_size, 0)

    def check_invariants(self) -> None:
        if self.pool_caps.self_check:
            self.pool.check_invariants()  # type: ignore[attr-defined]
        self.ledger.check("paged")
        owners = [0] * self.num_blocks
        intra = 0  # references of a request's own samples to its shared blocks, beyond the first
        for r, table in self.block_tables.items():
            assert r in self.ledger, f"block table of unknown request {r}"
            assert len(table) * self.block_size == self.ledger.held[r], (
                f"request {r}: {len(table)} blocks but {self.ledger.held[r]} held tokens"
            )
            assert len(set(table)) == len(table), f"request {r} holds a block twice"
            sampled = self._samples.get(r)
            bt = self._beams.get(r)
            if bt is not None:
                bt.check(f"paged request {r}")
                assert set(table) == set(bt.refs), f"request {r}: block table and beams disagree"
                for b in table:
                    owners[b] += bt.refs[b]
                    intra += bt.refs[b] - 1
                continue
            shared, n = (sampled[1], sampled[0].n) if sampled else (len(table), 1)
            for i, b in enumerate(table):
                owners[b] += n if i < shared else 1
            if sampled:
                intra += shared * (n - 1)
        extra = -intra
        for b in range(self.num_blocks):
            free = b in self.pool
            assert self.ref_counts[b] == owners[b], (
                f"block {b}: ref count {self.ref_counts[b]} != owners {owners[b]}"
            )
            assert not (free and owners[b]), f"block {b} is both free and owned"
            assert free or owners[b], f"block {b} is neither free nor owned (leaked)"
            extra += max(owners[b] - 1, 0)
        assert extra == self._shared_extra, f"shared-owner count {self._shared_extra} != {extra}"
        assert len(self.block_tables) == len(self.ledger), "block tables and ledger disagree"
        assert self.pool.num_free + sum(1 for o in owners if o) == self.num_blocks, "blocks leaked"
        for key, b in self.key_to_block.items():
            assert self.block_key[b] == key, f"cache map says key -> block {b}, block says {self.block_key[b]}"
            assert not any(key in t for t in self.tiers if not t.shared), f"key of block {b} is also in a lower tier"
        private = [t for t in self.tiers if not t.shared]
        for i, t in enumerate(private):
            assert len(t.keys) <= t.capacity_blocks, f"tier {t.name} over capacity"
            for u in private[i + 1:]:
                assert not (set(t.keys) & set(u.keys)), f"a key is in both tiers {t.name} and {u.name}"
        cached_free = sum(1 for b in range(self.num_blocks) if self.block_key[b] is not None and owners[b] == 0)
        assert cached_free == self._cached_free, f"cached-free count {self._cached_free} != {cached_free}"
        keyed = sum(1 for k in self.block_key if k is not None)
        assert keyed == len(self.key_to_block), "keyed blocks and cache map disagree"
        if not self.prefix_caching:
            assert not self.key_to_block, "cache entries without prefix caching"


class CountingPagedAllocator:
    """The paged allocator without prefix caching, counting blocks instead of naming them.

    Without prefix caching no result depends on *which* free block a request gets, so this keeps
    only per-request block counts and a free count: O(1) per call instead of O(blocks). It makes
    the same fit / does-not-fit decisions as :class:`PagedAllocator` with the same block size and
    watermark (a test runs both on the same scenarios and compares the request tables).
    """

    prefix_caching = False
    evictions = 0

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.0):
        _init_geometry(self, num_blocks, block_size, watermark)
        self.num_free_blocks = num_blocks
        self.ledger = SlotLedger(track_boundaries=True)
        self._geo: dict[int, SampleGeometry] = {}  # requests with parallel samples
        self._seq_len: dict[int, int] = {}
        self._beams: dict[int, BeamTables] = {}  # beam-search requests (block ids are plain counters)
        self._next_id = 0
        self.beam_forks = 0
        self.beam_copied_tokens = 0

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id

    _blocks_for = PagedAllocator._blocks_for
    _final_blocks = PagedAllocator._final_blocks
    _final_written = PagedAllocator._final_written

    def max_footprint_fits(self, req: KVRequest) -> bool:
        return self._final_blocks(req) <= self.num_blocks - self.watermark_blocks

    def held_tokens(self, request_id: int) -> int:
        return self.ledger.held[request_id]

    def written_offset_tokens(self, request_id: int) -> int:
        bt = self._beams.get(request_id)
        if bt is not None:
            return bt.width * bt.seq_len - bt.written_slots()
        geo = self._geo.get(request_id)
        return 0 if geo is None else (geo.n - 1) * geo.base

    def ensure_slots_many(self, request_ids, num_tokens) -> bool:
        """``ensure_slots`` for several requests in order; stops at the first that does not fit."""
        return all([self.ensure_slots(r, n) for r, n in zip(request_ids, num_tokens)])

    def seq_capacities(self, request_ids) -> list[int]:
        """``seq_capacity_tokens`` of many requests at once (decode windows)."""
        if self._geo or self._beams:
            return [self.seq_capacity_tokens(r) for r in request_ids]
        held = self.ledger.held
        return [held[r] for r in request_ids]

    def seq_capacity_tokens(self, request_id: int) -> int:
        bt = self._beams.get(request_id)
        if bt is not None:
            return bt.seq_capacity_tokens()
        held = self.ledger.held[request_id]
        geo = self._geo.get(request_id)
        return held if geo is None else geo.seq_capacity(held // self.block_size)

    def can_allocate(self, req: KVRequest, hold_tokens: int) -> bool:
        return self.num_free_blocks - self._blocks_for(req, hold_tokens) >= self.watermark_blocks

    def allocate(self, req: KVRequest, hold_tokens: int) -> Allocation | None:
        self.ledger.require_new(req.request_id, hold_tokens)
        need = self._blocks_for(req, hold_tokens)
        if self.num_free_blocks - need < self.watermark_blocks:
            return None
        self.num_free_blocks -= need
        self.ledger.add(req.request_id, self._final_written(req), need * self.block_size)
        if req.num_samples > 1 and req.beam_events is not None:
            self._beams[req.request_id] = BeamTables(req.beam_events, self.block_size, req.prompt_tokens,
                                                     hold_tokens, self._take_id)
            self._seq_len[req.request_id] = 0
        elif req.num_samples > 1:
            self._geo[req.request_id] = SampleGeometry(req.num_samples, self.block_size, req.prompt_tokens)
        return NO_HIT

    def ensure_slots(self, request_id: int, num_tokens: int) -> bool:
        ledger = self.ledger
        if self._beams:
            bt = self._beams.get(request_id)
            if bt is not None:
                return self._ensure_beams(request_id, num_tokens, bt)
        held = ledger.held[request_id]
        geo = self._geo.get(request_id) if self._geo else None
        if geo is not None:
            need = geo.blocks(num_tokens) - held // self.block_size
            written = geo.written(num_tokens)
        else:
            need = cdiv(num_tokens - held, self.block_size) if num_tokens > held else 0
            written = num_tokens
        if need > 0:
            if need > self.num_free_blocks:
                return False
            self.num_free_blocks -= need
            ledger.set_held(request_id, held + need * self.block_size)
        if written < ledger.written_of(request_id):
            raise ValueError(f"request {request_id}: written tokens cannot shrink")
        ledger.set_written(request_id, written)
        if geo is not None:
            self._seq_len[request_id] = num_tokens
        return True

    def _ensure_beams(self, rid: int, num_tokens: int, bt: BeamTables) -> bool:
        """Beam search (see PagedAllocator._ensure_beams): all or nothing."""
        if num_tokens < bt.seq_len:
            raise ValueError(f"request {rid}: written tokens cannot shrink")
        need = bt.blocks_needed(num_tokens)
        if need > self.num_free_blocks:
            return False
        forks, copied = bt.forks, bt.copied_tokens
        bt.advance(num_tokens, self._take_id, lambda b: None)
        self.beam_forks += bt.forks - forks
        self.beam_copied_tokens += bt.copied_tokens - copied
        self.num_free_blocks -= need
        self.ledger.set_held(rid, bt.num_blocks() * self.block_size)
        self.ledger.set_written(rid, bt.written_slots())
        self._seq_len[rid] = num_tokens
        return True

    def advance_written(self, request_ids, written_tokens) -> None:
        """Bulk ``ensure_slots`` for tokens that fit the held blocks (decode windows)."""
        if self._geo:
            for r, w in zip(request_ids, written_tokens):
                self.ensure_slots(r, w)
            return
        self.ledger.set_written_many(request_ids, written_tokens)

    def grow_all_by_one(self) -> bool:
        """A decode step for every admitted request at once (all or nothing): see
        :meth:`SlotLedger.grow_all_by_one`. Block ids are not tracked, so the order is irrelevant."""
        if self._geo or self._beams:
            return False
        need = self.ledger.grow_all_by_one(self.block_size, self.num_free_blocks)
        if need < 0:
            return False
        self.num_free_blocks -= need
        return True

    def grow_steps(self, steps: int, first_step: int, changes: list) -> int:
        """``grow_all_by_one`` up to ``steps`` times, stopping before a step whose blocks are not
        free (BulkDecodeSteps; see :meth:`SlotLedger.grow_steps`). Returns the steps done."""
        if self._geo or self._beams:
            return 0
        done, taken = self.ledger.grow_steps(self.block_size, self.num_free_blocks, steps, first_step, changes)
        self.num_free_blocks -= taken
        return done

    def free(self, request_id: int) -> None:
        held = self.ledger.held.get(request_id)
        self._geo.pop(request_id, None)
        self._beams.pop(request_id, None)
        self._seq_len.pop(request_id, None)
        self.ledger.remove(request_id)
        self.num_free_blocks += held // self.block_size

    def usage(self, head: KVRequest | None = None, head_hold_tokens: int = 0) -> KVUsage:
        extra = 0
        if self._seq_len:
            w = self.ledger.written_of
            extra = sum((self._beams[r].width if r in self._beams else self._geo[r].n) * n - w(r)
                        for r, n in self._seq_len.items())
        return self.ledger.usage(self.capacity_tokens, 0, unshared_extra_tokens=extra)

    def usage_parts(self, head: KVRequest | None = None) -> UsageSums:
        return UsageSums(self.ledger.sum_held, self.ledger.sum_useful, 0, 0, 0)

    def check_invariants(self) -> None:
        self.ledger.check("paged")
        for r, held in self.ledger.held.items():
            assert held % self.block_size == 0, f"request {r}: held {held} is not whole blocks"
        for r, bt in self._beams.items():
            bt.check(f"paged request {r}")
            assert bt.num_blocks() * self.block_size == self.ledger.held[r], f"request {r}: beams' blocks != held"
        used = self.ledger.sum_held // self.block_size
        assert 0 <= self.num_free_blocks and used + self.num_free_blocks == self.num_blocks, (
            f"free blocks ({self.num_free_blocks}) + owned ({used}) != {self.num_blocks}"
        )


ALLOCATORS.register("paged", PagedAllocatorConfig, PagedAllocator.from_capacity)
