"""Per-GPU DRAM latency (kvsim/timing/data/kernels/gpu_memory.csv, one row per GPU preset with its
source): the memory latency of the kernel model's Little's-law saturation (docs/kernel_model.md)."""

from __future__ import annotations

import csv
from functools import lru_cache
from importlib import resources

from kvsim.errors import ConfigError

GPU_MEMORY_FILE = "kvsim/timing/data/kernels/gpu_memory.csv"
COLUMNS = ("gpu_preset", "dram_latency_cycles", "clock_mhz", "source", "source_url", "note")
# A GPU without a row (L40S, a user's GPU) has no public latency figure in the table: the model uses
# the A100's (docs/kernel_model.md says so; the number is not that GPU's own).
FALLBACK_GPU = "A100-80GB"


@lru_cache(maxsize=1)
def gpu_latencies() -> dict[str, float]:
    """DRAM latency in seconds per GPU preset name (cycles / clock)."""
    text = (resources.files("kvsim.timing") / "data" / "kernels" / "gpu_memory.csv").read_text()
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{GPU_MEMORY_FILE}: key '{missing[0]}' is missing from the header")
    out = {}
    for i, rec in enumerate(reader, start=2):
        try:
            cycles, mhz = float(rec["dram_latency_cycles"]), float(rec["clock_mhz"])
        except (TypeError, ValueError):
            raise ConfigError(f"{GPU_MEMORY_FILE} row {i}: keys 'dram_latency_cycles' and 'clock_mhz' must be "
                              f"numbers") from None
        if cycles <= 0 or mhz <= 0 or not rec["source"]:
            raise ConfigError(f"{GPU_MEMORY_FILE} row {i}: latency and clock must be > 0 and 'source' given")
        out[rec["gpu_preset"]] = cycles / (mhz * 1e6)
    return out


def dram_latency_s(gpu_preset: str) -> float:
    """The DRAM latency (s) of a GPU preset (``GPUSpec.preset``, not its display name); a preset
    without a row, or a GPU of your own (""), gets :data:`FALLBACK_GPU`'s."""
    table = gpu_latencies()
    return table.get(gpu_preset, table[FALLBACK_GPU])
