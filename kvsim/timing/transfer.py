"""GPU <-> host transfers (swap, tier loads, offload, prefetch): per-copy latency + size-dependent DMA rate.

One ``cudaMemcpyAsync`` of ``s`` bytes over a link costs::

    t(s) = per_transfer_latency_s + s / bandwidth

so the bandwidth it achieves is ``bandwidth * s / (s + s_half)`` with ``s_half = per_transfer_latency_s
* bandwidth`` (:func:`half_bandwidth_bytes`): small copies run far below the link's rate, copies of
many times ``s_half`` approach it. ``bandwidth`` is the *sustained* large-copy rate measured by
NVIDIA's nvbandwidth (copy engine), not the PCIe/NVLink signalling rate; the numbers and their
sources are in ``docs/transfer_model.md`` and the profiles are data, one YAML per link under
``kvsim/timing/data/links/``.

``n`` copies moving ``B`` bytes in total cost ``n * per_transfer_latency_s + B / bandwidth``
(:func:`transfer_time_s`): copies are issued one after the other on one stream, as vLLM's
``swap_blocks`` does.

How many copies a set of blocks needs (:func:`count_transfers`) depends on two things:

* ``granularity``: ``block`` -- one copy per block (vLLM's ``swap_blocks``), or ``run`` -- one copy
  per run of consecutive block ids (a copy engine that coalesces contiguous blocks);
* ``layout``: how a block's KV is laid out in memory. ``per_layer_kv`` -- separate K and V tensors per
  layer (vLLM's paged cache: ``2 * num_layers`` copies per block or run), ``per_layer`` -- K and V
  together per layer (``num_layers`` copies), ``contiguous`` -- all layers of a block in one buffer
  (one copy, as LMCache-style chunk buffers do).

The legacy ``timing.host_link_bandwidth_bytes_per_s`` becomes :func:`legacy_link`: zero latency, the
given rate both ways -- exactly the old ``bytes / bandwidth`` pricing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

from kvsim.timing.profile_file import read_params_file
from kvsim.errors import ConfigError, format_choices

DATA_DIR = Path(__file__).parent / "data" / "links"

Direction = Literal["h2d", "d2h"]
Granularity = Literal["block", "run"]
Layout = Literal["per_layer_kv", "per_layer", "contiguous"]
GRANULARITIES = ("block", "run")
LAYOUTS = ("per_layer_kv", "per_layer", "contiguous")

# The one default GPU<->host rate, for a scenario without ``host_link:`` (the legacy size-independent
# link, ``timing.host_link_bandwidth_bytes_per_s``) and for the CPU offload tier's load rate: 64 GB/s,
# PCIe Gen5 x16's nominal unidirectional rate (docs/transfer_model.md).
DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S = 64e9


def null_link_rate_is_unset(data):
    """A timing config's raw mapping with ``host_link_bandwidth_bytes_per_s: null`` (``--set
    timing.host_link_bandwidth_bytes_per_s=null``) left out: the key unset, so swaps use the GPU's
    link (Scenario.default_link_name), not the legacy rate. Other input as given."""
    if isinstance(data, dict) and "host_link_bandwidth_bytes_per_s" in data \
            and data["host_link_bandwidth_bytes_per_s"] is None:
        return {k: v for k, v in data.items() if k != "host_link_bandwidth_bytes_per_s"}
    return data


@dataclass(frozen=True)
class LinkProfile:
    """A GPU<->host link as the copies over it see it."""

    name: str
    h2d_bandwidth_bytes_per_s: float  # sustained host-to-device copy rate (large copies)
    d2h_bandwidth_bytes_per_s: float  # sustained device-to-host copy rate
    per_transfer_latency_s: float  # fixed cost of one copy (issue + DMA setup)
    signalling_bandwidth_bytes_per_s: float = 0.0  # the link's nominal per-direction rate (for reference)
    source: str = ""

    PARAMS = ("h2d_bandwidth_bytes_per_s", "d2h_bandwidth_bytes_per_s", "per_transfer_latency_s")

    def bandwidth(self, direction: Direction = "h2d") -> float:
        if direction == "h2d":
            return self.h2d_bandwidth_bytes_per_s
        if direction == "d2h":
            return self.d2h_bandwidth_bytes_per_s
        raise ValueError(f"direction must be 'h2d' or 'd2h', not {direction!r}")

    def to_dict(self) -> dict:
        return {"name": self.name, "h2d_bandwidth_bytes_per_s": self.h2d_bandwidth_bytes_per_s,
                "d2h_bandwidth_bytes_per_s": self.d2h_bandwidth_bytes_per_s,
                "per_transfer_latency_s": self.per_transfer_latency_s,
                "signalling_bandwidth_bytes_per_s": self.signalling_bandwidth_bytes_per_s, "source": self.source}


def load_link(path: str | Path) -> LinkProfile:
    """Read a link YAML; a missing, non-numeric or out-of-range parameter is a one-line ConfigError."""
    path, raw, _ = read_params_file(path, "link profile")
    vals = {}
    for key in LinkProfile.PARAMS + ("signalling_bandwidth_bytes_per_s",):
        v = raw["params"].get(key, 0.0 if key == "signalling_bandwidth_bytes_per_s" else None)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{path}: params.{key}: missing or not a number (keys: {format_choices(LinkProfile.PARAMS)})")
        if v < 0 or (key.endswith("bytes_per_s") and key != "signalling_bandwidth_bytes_per_s" and v == 0):
            raise ConfigError(f"{path}: params.{key}: must be {'positive' if v == 0 else 'non-negative'} (got {v!r})")
        vals[key] = float(v)
    return LinkProfile(name=str(raw.get("name", path.stem)), source=str(raw.get("source", "")), **vals)


@lru_cache(maxsize=1)
def link_presets() -> dict[str, LinkProfile]:
    """Shipped link profiles by name (``pcie-gen4-x16``, ``pcie-gen5-x16``, ``nvlink-c2c``)."""
    return {p.stem: load_link(p) for p in sorted(DATA_DIR.glob("*.yaml"))}


def get_link(name: str) -> LinkProfile:
    from kvsim.errors import did_you_mean

    presets = link_presets()
    if name not in presets:
        raise ConfigError(f"unknown link {name!r}{did_you_mean(name, presets)}; valid links: {format_choices(presets)}")
    return presets[name]


def legacy_link(bandwidth_bytes_per_s: float) -> LinkProfile:
    """The old model: ``bytes / bandwidth`` both ways, no per-copy cost."""
    return LinkProfile("legacy", bandwidth_bytes_per_s, bandwidth_bytes_per_s, 0.0, bandwidth_bytes_per_s,
                       source="timing.host_link_bandwidth_bytes_per_s (size-independent)")


def half_bandwidth_bytes(link: LinkProfile, direction: Direction = "h2d") -> float:
    """The copy size that achieves half the link's sustained bandwidth."""
    return link.per_transfer_latency_s * link.bandwidth(direction)


def achieved_bandwidth_bytes_per_s(transfer_bytes, link: LinkProfile, direction: Direction = "h2d"):
    """Bandwidth one copy of ``transfer_bytes`` achieves (vectorised): ``bw * s / (s + s_half)``."""
    s = np.asarray(transfer_bytes, dtype=float)
    bw = link.bandwidth(direction)
    out = bw * s / (s + half_bandwidth_bytes(link, direction))
    return float(out) if out.ndim == 0 else out


def transfer_time_s(total_bytes, num_transfers, link: LinkProfile, direction: Direction = "h2d"):
    """Time to move ``total_bytes`` in ``num_transfers`` copies, issued back to back (vectorised over
    both arguments). Nothing to move costs 0."""
    if isinstance(total_bytes, (int, float)) and isinstance(num_transfers, (int, float)):
        # one step's swap (the per-step path): the same double arithmetic without numpy scalars
        b, n = float(total_bytes), float(num_transfers)
        if b < 0 or n < 0:
            raise ValueError("total_bytes and num_transfers must be non-negative")
        return n * link.per_transfer_latency_s + b / link.bandwidth(direction) if b > 0 else 0.0
    b = np.asarray(total_bytes, dtype=float)
    n = np.asarray(num_transfers, dtype=float)
    if np.any(b < 0) or np.any(n < 0):
        raise ValueError("total_bytes and num_transfers must be non-negative")
    t = np.where(b > 0, n * link.per_transfer_latency_s + b / link.bandwidth(direction), 0.0)
    return float(t) if t.ndim == 0 else t


def copies_per_unit(layout: Layout, num_layers: int) -> int:
    """Copies one block (or one run of blocks) takes in a given KV memory layout."""
    if layout == "per_layer_kv":
        return 2 * num_layers
    if layout == "per_layer":
        return num_layers
    if layout == "contiguous":
        return 1
    raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")


def count_runs(block_ids: Sequence[int] | np.ndarray) -> int:
    """Maximal runs of consecutive ids, in the order given (``[4, 5, 6, 9, 10, 2]`` -> 3)."""
    ids = np.asarray(block_ids, dtype=np.int64)
    if ids.size == 0:
        return 0
    return int(1 + np.count_nonzero(np.diff(ids) != 1))


def count_transfers(block_ids: Sequence[int] | np.ndarray, granularity: Granularity = "block",
                    layout: Layout = "per_layer_kv", num_layers: int = 1) -> int:
    """Copies needed to move these blocks (ids in the order they are copied): one per block, or one
    per run of consecutive ids, times :func:`copies_per_unit` for the layout."""
    if granularity == "block":
        units = len(block_ids)
    elif granularity == "run":
        units = count_runs(block_ids)
    else:
        raise ValueError(f"granularity must be 'block' or 'run', not {granularity!r}")
    return units * copies_per_unit(layout, num_layers)


def blocks_transfer_time_s(block_ids: Sequence[int] | np.ndarray, block_bytes: int, link: LinkProfile,
                           direction: Direction = "h2d", granularity: Granularity = "block",
                           layout: Layout = "per_layer_kv", num_layers: int = 1) -> float:
    """Convenience: the time to move whole blocks (``block_bytes`` each, all layers) over ``link``."""
    n = count_transfers(block_ids, granularity, layout, num_layers)
    return transfer_time_s(len(block_ids) * block_bytes, n, link, direction)


@dataclass(frozen=True)
class HostTransfers:
    """The host link as the simulator prices copies over it (one owner, built once per run from the
    scenario's ``host_link:``; shared by the scheduler, the timing model and the paged allocator).

    ``legacy``: no ``host_link:`` in the scenario -- every price is the old ``bytes / bandwidth``
    arithmetic, operation for operation, so legacy result tables stay byte-identical."""

    link: LinkProfile
    granularity: Granularity = "block"
    layout: Layout = "per_layer_kv"
    num_layers: int = 1
    legacy: bool = True

    @property
    def copies_per_unit(self) -> int:
        """Copies one block (or one run of blocks) takes in this KV layout."""
        return copies_per_unit(self.layout, self.num_layers)

    def copy_s(self, nbytes: int, num_copies: int, direction: Direction = "h2d") -> float:
        """Time of ``num_copies`` copies moving ``nbytes`` (legacy: ``nbytes / bandwidth``)."""
        if self.legacy:
            return nbytes / self.link.h2d_bandwidth_bytes_per_s
        return transfer_time_s(nbytes, num_copies, self.link, direction)

    def swap_s(self, in_bytes: int, in_copies: int, out_bytes: int, out_copies: int) -> float:
        """A step's swap time: swap-in (host to device) then swap-out (device to host), serial.
        Legacy: ``(in_bytes + out_bytes) / bandwidth`` exactly as before."""
        if self.legacy:
            return (in_bytes + out_bytes) / self.link.h2d_bandwidth_bytes_per_s
        if not in_bytes and not out_bytes:  # most steps: nothing moves, and transfer_time_s is 0.0 both ways
            return 0.0
        return (transfer_time_s(in_bytes, in_copies, self.link, "h2d")
                + transfer_time_s(out_bytes, out_copies, self.link, "d2h"))


    def load_charge(self, tier_load_s: float, prefetched_s: float | None) -> LoadCharge:
        """A request's loads of offloaded prefix blocks (``tier_load_s``, priced by
        :func:`tier_block_load_s` or :meth:`copy_s`) at admission, after ``prefetched_s`` of prefetch
        (None: prefetch off): what is not hidden is paid this step as tier-load time."""
        hidden = min(tier_load_s, prefetched_s) if prefetched_s is not None else 0.0
        return LoadCharge(tier_load_s, hidden, 0, 0, tier_load_s - hidden)

    def swap_in_charge(self, nbytes: int, num_copies: int, tier_load_s: float,
                       prefetched_s: float | None) -> LoadCharge:
        """A swapped-out request comes back: ``nbytes`` in ``num_copies`` host-to-device copies, plus
        its prefix blocks found in lower tiers (``tier_load_s``). Prefetch (``prefetched_s`` of link
        time credited while it waited; None: off) hides the first part; the rest is paid this step:
        swap bytes and copies for the timing model to price again, the tier loads as seconds.

        Legacy link: the unhidden seconds go back to bytes at the link's rate (truncated), the rest
        as tier-load time. Priced link: prefetch issued the first copies while the link was idle;
        the copies not finished when the step starts are paid whole (a copy in flight is waited
        for), with their share of the bytes."""
        if self.legacy:
            bw = self.link.h2d_bandwidth_bytes_per_s
            need = nbytes / bw + tier_load_s
            hidden = min(need, prefetched_s) if prefetched_s is not None else 0.0
            unhidden = need - hidden
            return LoadCharge(need, hidden, min(nbytes, int(unhidden * bw)), 0, max(0.0, unhidden - nbytes / bw))
        swap_s = self.copy_s(nbytes, num_copies, "h2d")
        need = swap_s + tier_load_s
        hidden = min(need, prefetched_s) if prefetched_s is not None else 0.0
        unhidden = need - hidden
        paid_s = min(unhidden, swap_s)
        if paid_s >= swap_s or num_copies == 0:
            left = num_copies
        elif paid_s <= 0.0:
            left = 0
        else:
            left = num_copies - int((swap_s - paid_s) / (swap_s / num_copies))
        paid_bytes = nbytes if left == num_copies else nbytes * left // num_copies
        return LoadCharge(need, hidden, paid_bytes, left, max(0.0, unhidden - swap_s))


@dataclass(frozen=True, slots=True)
class LoadCharge:
    """What one request's loads back to GPU memory cost (:meth:`HostTransfers.swap_in_charge`,
    :meth:`HostTransfers.load_charge`): ``need_s`` in all, ``hidden_s`` of it hidden by prefetch; the
    rest is this step's: ``swap_in_bytes`` in ``swap_in_copies`` copies (the timing model prices
    them) and ``tier_load_s`` of tier loads."""

    need_s: float
    hidden_s: float
    swap_in_bytes: int
    swap_in_copies: int
    tier_load_s: float


def tier_block_load_s(block_bytes: int, bandwidth_bytes_per_s: float) -> float:
    """Seconds to load one block from a lower tier priced at its own bandwidth (SSD, a shared store,
    a CPU tier without ``host_link:``): ``block_bytes / bandwidth``, no per-copy cost."""
    return block_bytes / bandwidth_bytes_per_s


def legacy_transfers(bandwidth_bytes_per_s: float = DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S) -> HostTransfers:
    """:class:`HostTransfers` of the legacy size-independent rate (no ``host_link:``)."""
    return HostTransfers(legacy_link(bandwidth_bytes_per_s))


def step_transfers(host_transfers: HostTransfers | None, legacy_bandwidth_bytes_per_s: float) -> HostTransfers:
    """What a timing model prices swaps with: the scenario's link, or (no ``host_link:``) the
    legacy rate of the timing model's own ``host_link_bandwidth_bytes_per_s``."""
    if host_transfers is None or host_transfers.legacy:
        return legacy_transfers(legacy_bandwidth_bytes_per_s)
    return host_transfers
