"""What a timing model may know about the deployment when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvsim.hw import GPUSpec, ModelSpec
from kvsim.timing.transfer import HostTransfers


@dataclass(frozen=True)
class TimingContext:
    model: ModelSpec
    gpu: GPUSpec
    kv_dtype: str
    # Under tensor/pipeline parallelism (kvsim/models/parallel.py) these two are ONE tensor rank's
    # share summed over the pipeline stages, which run one after another within a step: the bytes
    # one GPU of each stage reads, in sequence. Without parallelism: the whole model's.
    kv_bytes_per_token: int
    weight_bytes: int
    # The allocator's page size in tokens (one owner: the allocator); None = contiguous KV (the
    # attention kernel has no page table)
    block_size: int | None
    base_dir: Path  # the scenario file's folder, for resolving relative paths
    # -- parallelism (docs/models.md#parallelism) --------------------------------------------------
    tensor_parallel: int = 1  # GPUs sharing each layer: FLOPs split this many ways
    pipeline_parallel: int = 1  # stages (sequential within a step)
    comm_s_per_step: float = 0.0  # all-reduce + stage-send latency per step (0 without parallelism)
    comm_s_per_token: float = 0.0  # all-reduce + stage-send transfer time per token in the step
    # -- host link (docs/transfer_model.md) -------------------------------------------------------
    # None or legacy: swaps cost (bytes in + out) / the timing model's host_link_bandwidth_bytes_per_s
    host_transfers: HostTransfers | None = None

    def comm_s(self, num_tokens):
        """Communication time of a step of ``num_tokens`` (an int, or an array of them)."""
        return self.comm_s_per_step + self.comm_s_per_token * num_tokens
