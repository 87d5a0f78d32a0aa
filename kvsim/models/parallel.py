"""Tensor and pipeline parallelism: what each GPU holds, and what the GPUs say to each other.

One kvsim replica is ``tensor x pipeline`` GPUs serving one copy of the model (vLLM's
``tensor_parallel_size`` x ``pipeline_parallel_size``):

* **Layers per pipeline stage** as vLLM's ``get_pp_indices`` splits them: ``layers // P`` each,
  the remainder given one layer at a time to the stages before the last. The stage with the most
  layers sets the KV capacity (every stage holds every token of its layers).
* **KV heads per GPU** as vLLM's ``ModelConfig.get_num_kv_heads``: ``max(1, kv_heads // T)``; when
  ``kv_heads < T`` the heads are replicated so that each GPU holds one. MLA models hold their one
  latent on every GPU (vLLM returns 1 KV head for MLA: "during decode it becomes MQA"). Head
  counts must divide as vLLM's ``QKVParallelLinear`` requires: ``heads % T == 0`` and
  ``kv_heads % T == 0`` or ``T % kv_heads == 0``.
* **Weights per GPU**: ``num_params x bytes / (T x P)`` (an even split; vLLM keeps the embedding
  on the first stage and the LM head on the last, a few % more there).
* **Communication per step** of ``n`` tokens (Megatron-LM tensor parallelism, Shoeybi et al. 2019:
  two all-reduces of the ``n x hidden`` activations per layer in the forward pass), each a ring
  all-reduce: ``2 (T-1)/T x bytes / (bandwidth x efficiency) + latency`` (the bus-bandwidth factor
  of NCCL's tests, nccl-tests doc/PERFORMANCE.md); plus ``P-1`` stage-to-stage sends of the same
  activations. Serialised with compute (vLLM does not overlap them). Pipeline stages run one after
  another for a step: there is no micro-batch overlap between stages (see docs/models.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.hw import WEIGHT_DTYPE_BYTES, GPUSpec, ModelSpec
from kvsim.models.geometry import KVGeometry

ACTIVATION_BYTES = 2  # fp16/bf16 activations, whatever the weight/KV dtype


def layers_per_stage(num_layers: int, pipeline: int) -> tuple[int, ...]:
    """vLLM's even split (vllm/distributed/utils.py get_pp_indices without a custom partition)."""
    base, extra = divmod(num_layers, pipeline)
    parts = [base] * pipeline
    for i in range(2, extra + 2):
        parts[-i] += 1
    return tuple(parts)


def kv_heads_per_gpu(model: ModelSpec, tensor: int) -> int:
    return KVGeometry.for_gpu(model, "fp16", tensor).num_kv_heads


def check_split(model: ModelSpec, tensor: int, pipeline: int) -> str | None:
    """Why this model cannot be split this way (None when it can)."""
    if model.num_attention_heads % tensor:
        return (f"parallel.tensor: {tensor} does not divide {model.name}'s {model.num_attention_heads} attention "
                f"heads (vLLM requires it)")
    kvh = model.num_kv_heads
    if model.attention != "mla" and (kvh % tensor if kvh >= tensor else tensor % kvh):
        return (f"parallel.tensor: {tensor} and {model.name}'s {kvh} KV heads: one must divide the other "
                f"(vLLM replicates KV heads only by whole copies)")
    if pipeline > model.num_layers:
        return f"parallel.pipeline: {pipeline} stages for {model.name}'s {model.num_layers} layers"
    return None


@dataclass(frozen=True)
class ParallelPlan:
    tensor: int
    pipeline: int
    kv: KVGeometry  # one GPU's KV (no page size yet: the allocator owns it; KVGeometry.with_block_size)
    weight_bytes_per_gpu: int
    weight_bytes_per_rank: int  # one tensor rank's share summed over the stages (timing)
    comm_s_per_step: float  # fixed latency of a step's all-reduces and stage sends
    comm_s_per_token: float  # + this per token in the step
    # the tensor all-reduces alone (the rest of comm_s is the stage sends): how many a step makes,
    # the bytes each carries per token, and their part of comm_s_per_step / comm_s_per_token (NCCL's
    # ring model); an engine with its own small-message all-reduce reprices them (kvsim.timing.allreduce)
    allreduces_per_step: int = 0
    allreduce_bytes_per_token: int = 0
    allreduce_s_per_step: float = 0.0
    allreduce_s_per_token: float = 0.0
    # small all-reduces may take NCCL's LL protocol (the host-memory path; kvsim.timing.allreduce)
    nccl_ll: bool = False

    def comm_s(self, num_tokens: int) -> float:
        """NCCL's ring model alone (linear); kvsim.timing.allreduce.StepComm prices a step's
        communication as the timing model charges it (custom curves, NCCL's LL protocol)."""
        return self.comm_s_per_step + self.comm_s_per_token * num_tokens


def plan(model: ModelSpec, gpu: GPUSpec, kv_dtype: str, weight_dtype: str, tensor: int = 1,
         pipeline: int = 1, nccl_ll: bool = False) -> ParallelPlan:
    """The per-GPU view of one replica. Raises ValueError (the message names the key) when the
    model cannot be split so or the GPU has no interconnect to split it over."""
    why = check_split(model, tensor, pipeline)
    if why:
        raise ValueError(why)
    kv = KVGeometry.for_gpu(model, kv_dtype, tensor, layers_per_stage(model.num_layers, pipeline))
    weights = model.num_params * WEIGHT_DTYPE_BYTES[weight_dtype]
    comm_step = comm_token = ar_step = ar_token = 0.0
    allreduces = act = 0
    if tensor > 1 or pipeline > 1:
        bw = gpu.interconnect_bandwidth_bytes_per_s * gpu.allreduce_efficiency
        if bw <= 0:
            raise ValueError(f"gpu.interconnect_bandwidth_bytes_per_s: GPU {gpu.name} has no interconnect bandwidth; "
                             f"set it to split the model over {tensor * pipeline} GPUs")
        act = model.hidden_size * ACTIVATION_BYTES
        allreduces = 2 * model.num_layers if tensor > 1 else 0
        ring = 2 * (tensor - 1) / tensor
        comm_token = (allreduces * ring + (pipeline - 1)) * act / bw
        # one all-reduce: the GPU's latency, plus NCCL's per-ring-step latency over 2 (T-1) steps where the
        # preset prices it by NCCL's model (PCIe); a pipeline send is one hop: the base latency
        ar_latency = gpu.allreduce_latency_s + 2 * (tensor - 1) * gpu.allreduce_latency_per_step_s
        comm_step = allreduces * ar_latency + (pipeline - 1) * gpu.allreduce_latency_s
        ar_token = allreduces * ring * act / bw
        ar_step = allreduces * ar_latency
    return ParallelPlan(
        tensor=tensor, pipeline=pipeline, kv=kv,
        weight_bytes_per_gpu=int(weights / (tensor * pipeline)),
        weight_bytes_per_rank=int(weights / tensor),
        comm_s_per_step=comm_step, comm_s_per_token=comm_token,
        allreduces_per_step=allreduces, allreduce_bytes_per_token=act if allreduces else 0,
        allreduce_s_per_step=ar_step, allreduce_s_per_token=ar_token,
        nccl_ll=(nccl_ll or gpu.allreduce_ll) and allreduces > 0,
    )
