"""Lower KV tiers of the paged allocator with prefix caching: cached blocks evicted from GPU memory
go to CPU DRAM, then SSD (``allocator.offload``), and optionally a prefix store shared by replicas
(``replicas.shared_prefix_store``); an admission loads the leading blocks it finds there back.

:class:`LowerTiers` owns the tiers and the offload counter; the allocator tells it which key was
evicted, which keys were recomputed, and asks which tier holds a request's next blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from pydantic import Field, model_validator

from kvsim.config_base import Bytes, ByteRate, StrictModel
from kvsim.kv.base import Allocation
from kvsim.timing.transfer import DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S, HostTransfers, tier_block_load_s


class TierConfig(StrictModel):
    """One lower tier. The CPU tier's load bandwidth may be left out: then its loads go over the host
    link (the scenario's ``host_link:`` or its GPU preset's: per block, with the per-copy latency), or
    at the default rate on the legacy link. The SSD tier needs one."""

    capacity_bytes: Bytes = Field(gt=0)
    bandwidth_bytes_per_s: ByteRate | None = Field(
        None, gt=0, description="load bandwidth back to GPU memory (cpu only: absent = the host link prices loads)")


class OffloadConfig(StrictModel):
    """Lower KV tiers for evicted prefix blocks: CPU DRAM (over the host link) and optionally SSD."""

    cpu: TierConfig = Field(default_factory=lambda: TierConfig(capacity_bytes=64 << 30))
    ssd: TierConfig | None = None

    @model_validator(mode="after")
    def _ssd_bandwidth(self):
        if self.ssd is not None and self.ssd.bandwidth_bytes_per_s is None:
            raise ValueError("ssd.bandwidth_bytes_per_s: required (the SSD tier is not priced by the host link)")
        return self


class LowerTier:
    """An LRU set of block keys held outside GPU memory. Private tiers (cpu, ssd) are exclusive: a
    key lives in one of them or in GPU memory. A ``shared`` tier (a store shared by replicas) keeps
    its copy when a replica loads a block back."""

    def __init__(self, name: str, capacity_blocks: int, bandwidth_bytes_per_s: float, shared: bool = False):
        self.shared = shared
        self.own_bandwidth = True  # False: a CPU tier without a bandwidth of its own (the host link prices it)
        # seconds to load one block back when priced by the host link (kvsim.timing.transfer); None:
        # at the tier's own bandwidth (kvsim.timing.transfer.tier_block_load_s)
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


class LowerTiers:
    """The tiers below GPU memory, top first, and what moved through them."""

    def __init__(self, offload: OffloadConfig | None, bytes_per_token: int, block_size: int):
        self.tiers: list[LowerTier] = []
        self.offloaded_blocks = 0  # evicted GPU blocks whose content went down a tier
        self.bytes_per_token = bytes_per_token
        self.block_bytes = bytes_per_token * block_size
        if offload is not None:
            if bytes_per_token <= 0:
                raise ValueError("offload tiers need bytes_per_token")
            cpu_bw = offload.cpu.bandwidth_bytes_per_s
            tier = LowerTier("cpu", offload.cpu.capacity_bytes // self.block_bytes,
                             DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S if cpu_bw is None else cpu_bw)
            tier.own_bandwidth = cpu_bw is not None
            self.tiers.append(tier)
            if offload.ssd is not None:
                self.tiers.append(LowerTier("ssd", offload.ssd.capacity_bytes // self.block_bytes,
                                            offload.ssd.bandwidth_bytes_per_s))

    def __bool__(self) -> bool:
        return bool(self.tiers)

    def attach(self, store: LowerTier) -> None:
        """Add a store shared with other replicas as the last tier."""
        if self.bytes_per_token <= 0:
            raise ValueError("a shared prefix store needs bytes_per_token")
        self.tiers.append(store)

    def offload(self, key) -> None:
        """``key``'s block was evicted from GPU memory: it goes into the top tier, pushing the
        least recent key of each full tier one tier down (the last tier drops it)."""
        self.offloaded_blocks += 1
        for tier in self.tiers:
            if tier.shared and key in tier:
                break  # the store already has it
            key = tier.insert(key)
            if key is None:
                break

    def hits(self, key_of: Callable[[int], object], start: int, stop: int) -> list[LowerTier]:
        """Tier of each block ``start, start + 1, ... < stop`` found in a lower tier (leading run);
        ``key_of(k)`` is block ``k``'s cache key."""
        out: list[LowerTier] = []
        for k in range(start, stop):
            key = key_of(k)
            tier = next((t for t in self.tiers if key in t), None)
            if tier is None:
                break
            out.append(tier)
        return out

    @staticmethod
    def load(tier: LowerTier, key) -> None:
        """``key`` is loaded back to GPU memory: a private tier gives it up (tiers are exclusive)."""
        if not tier.shared:
            tier.remove(key)

    def recomputed(self, key) -> None:
        """Recomputed content supersedes an offloaded copy (private tiers are exclusive)."""
        for tier in self.tiers:
            if key in tier and not tier.shared:
                tier.remove(key)
                break

    def load_s(self, tiers: list[LowerTier]) -> float:
        """Seconds to load one block from each of ``tiers`` (each priced by kvsim.timing.transfer)."""
        block_bytes = self.block_bytes
        return sum(tier_block_load_s(block_bytes, t.bandwidth_bytes_per_s) if t.block_load_s is None
                   else t.block_load_s for t in tiers)

    def allocation(self, cached_tokens: int, block_size: int, tier_hits: list[LowerTier]) -> Allocation:
        """The admission's result when some of its cached blocks came from lower tiers."""
        return Allocation(cached_tokens, cpu_tokens=block_size * sum(1 for t in tier_hits if t.name == "cpu"),
                          ssd_tokens=block_size * sum(1 for t in tier_hits if t.name == "ssd"),
                          remote_tokens=block_size * sum(1 for t in tier_hits if t.name == "remote"),
                          load_s=self.load_s(tier_hits))

    def use_host_link(self, transfers: HostTransfers) -> None:
        """Price loads from the CPU tier with the host link: one block at a time,
        ``transfers.copies_per_unit`` copies of its bytes each, per-copy latency included -- unless
        the scenario gave the CPU tier a bandwidth of its own. The SSD tier and a shared store keep
        their own bandwidth (their bottleneck is not the link)."""
        for t in self.tiers:
            if t.name == "cpu" and not t.own_bandwidth:
                t.block_load_s = transfers.copy_s(self.block_bytes, transfers.copies_per_unit, "h2d")

    def check(self, gpu_keys) -> None:
        """Private tiers are exclusive (with GPU memory, ``gpu_keys``, and with each other) and within capacity."""
        private = [t for t in self.tiers if not t.shared]
        for key in gpu_keys:
            assert not any(key in t for t in private), f"key {key!r} of a GPU block is also in a lower tier"
        for i, t in enumerate(private):
            assert len(t.keys) <= t.capacity_blocks, f"tier {t.name} over capacity"
            for u in private[i + 1:]:
                assert not (set(t.keys) & set(u.keys)), f"a key is in both tiers {t.name} and {u.name}"
