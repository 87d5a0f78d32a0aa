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
