"""What a timing model may know about the deployment when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvsim.hw import GPUSpec, ModelSpec
from kvsim.models.geometry import KVGeometry
from kvsim.timing.transfer import HostTransfers


@dataclass(frozen=True)
class TimingContext:
    model: ModelSpec
    gpu: GPUSpec
    # The run's one KV geometry (kvsim/models/geometry.py): this GPU's KV heads, the layers of
    # every stage, the KV dtype and the allocator's page size (None = contiguous KV, no page table)
    kv: KVGeometry
    # Under tensor/pipeline parallelism (kvsim/models/parallel.py) ONE tensor rank's share summed
    # over the pipeline stages, which run one after another within a step. Without parallelism: all.
    weight_bytes: int
    base_dir: Path  # the scenario file's folder, for resolving relative paths
    weight_dtype: str = "fp16"  # the checkpoint's weight dtype (kvsim.hw.WEIGHT_DTYPE_BYTES): which MoE kernel runs
    # -- parallelism (docs/models.md#parallelism) --------------------------------------------------
    tensor_parallel: int = 1  # GPUs sharing each layer: FLOPs split this many ways
    pipeline_parallel: int = 1  # stages (sequential within a step)
    comm_s_per_step: float = 0.0  # all-reduce + stage-send latency per step (0 without parallelism)
    comm_s_per_token: float = 0.0  # all-reduce + stage-send transfer time per token in the step
    # the tensor all-reduces within comm_s (ParallelPlan's fields of the same names): an engine with
    # its own small-message all-reduce reprices them (kvsim.timing.allreduce)
    allreduces_per_step: int = 0
    allreduce_bytes_per_token: int = 0
    allreduce_s_per_step: float = 0.0
    allreduce_s_per_token: float = 0.0
    nccl_ll_protocol: bool = False  # small all-reduces may take NCCL's LL protocol (kvsim.timing.allreduce)
    # -- the engine loop -----------------------------------------------------------------------------
    # the scheduler plans step k+1 while the GPU runs step k (scheduler.async_scheduling): the CPU
    # overhead overlaps the GPU's step (kvsim.timing.overhead)
    async_scheduling: bool = False
    # -- host link (docs/transfer_model.md) -------------------------------------------------------
    # None or legacy: swaps cost (bytes in + out) / the timing model's host_link_bandwidth_bytes_per_s
    host_transfers: HostTransfers | None = None

    # -- read-only views of the geometry (the names timing plugins know) ---------------------------
    @property
    def kv_dtype(self) -> str:
        return self.kv.kv_dtype

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes per token a step reads (or writes) along one tensor rank's stages."""
        return self.kv.step_bytes_per_token

    @property
    def block_size(self) -> int | None:
        return self.kv.block_size

    def comm_s(self, num_tokens):
        """NCCL's ring-model communication time of a step of ``num_tokens`` (an int, or an array of
        them); what the timing model charges is kvsim.timing.allreduce.StepComm's."""
        return self.comm_s_per_step + self.comm_s_per_token * num_tokens
