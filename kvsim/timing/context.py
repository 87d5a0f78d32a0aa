"""What a timing model may know about the deployment when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvsim.hw import GPUSpec, ModelSpec


@dataclass(frozen=True)
class TimingContext:
    model: ModelSpec
    gpu: GPUSpec
    kv_dtype: str
    kv_bytes_per_token: int
    weight_bytes: int
    block_size_tokens: int | None  # None for allocators without fixed blocks
    base_dir: Path  # the scenario file's folder, for resolving relative paths

    @property
    def block_size(self) -> int | None:
        """The allocator's page size in tokens; None = contiguous KV (the attention kernel has no
        page table). The same value as ``block_size_tokens`` (one owner: the allocator)."""
        return self.block_size_tokens
