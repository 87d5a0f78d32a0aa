"""What a vLLM V1 engine keeps off its KV cache on one GPU (``kv_budget.activation_reserve_bytes:
vllm``), from the mechanism in vLLM's source and constants read or fitted from public start-up logs.

vLLM V1 (``gpu_worker.determine_available_memory``) sizes the KV cache as::

    KV = total CUDA memory x gpu_memory_utilization - weights - non-torch memory - activation peak
         [- CUDA-graph memory: subtracted by default from vLLM 0.21, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS]

where the activation peak is PyTorch's peak during ``gpu_model_runner.profile_run``: a forward pass
over ``max_num_batched_tokens`` tokens, then a dummy sampler run (temperature, top-p, top-k) over
``min(max_num_seqs, max_num_batched_tokens)`` rows of logits. The two run one after the other, so the
peak is the larger of the two, and a pipeline stage without the sampler has only the forward.

The terms, each fitted by ``kvsim/models/memory_corpus.py`` on the ``fit`` rows of
``kvsim/models/data/vllm_memory_profile.csv`` (vLLM 0.19.0 debug logs on an H100; the ``holdout``
rows are never used) and checked on the rest by ``kvsim memory --check`` (docs/models.md, "The KV
budget: vLLM's memory profile"):

* sampler: ``rows x (vocab x SAMPLER_BYTES_PER_LOGIT + hidden x SAMPLER_BYTES_PER_HIDDEN)``;
* forward: ``tokens x (3 x intermediate / T + 2 x hidden) x activation bytes x FORWARD_FACTOR``
  (the MLP's gate-up output, its activation and the residual stream, the widest point of a
  layer; an MoE model's MLP term is its fused-MoE workspace instead, sized from vLLM's source and
  kept allocated beside the sampler's peak: :func:`moe_workspace_bytes`);
* non-torch memory (CUDA context, NCCL and custom all-reduce buffers): the median printed value
  of the fit rows per kind of plan (one GPU; tensor parallel with peer access; pipeline stages on
  one GPU each); tensor parallelism without peer access has no custom all-reduce and takes the
  one-GPU figure (the dennislee22 rows of the corpus, held out, say so);
* CUDA-graph memory: ``CUDAGRAPH_BASE + layers per stage x CUDAGRAPH_PER_LAYER`` (the printed
  "Graph capturing ... took" figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.hw import GiB, ModelSpec

# fitted by kvsim/models/memory_corpus.py fit() on the corpus's fit rows; tests/models/test_memory.py
# refits and compares (rounded to the digits given here)
SAMPLER_BYTES_PER_LOGIT = 14.682
SAMPLER_BYTES_PER_HIDDEN = 21.80
FORWARD_FACTOR = 1.408
NON_TORCH_BYTES = {"single": int(0.25 * GiB), "tensor": int(2.08 * GiB), "pipeline": int(0.07 * GiB)}
CUDAGRAPH_BASE_BYTES = int(0.3103 * GiB)
CUDAGRAPH_PER_LAYER_BYTES = int(0.01840 * GiB)

# the GPU's total memory as CUDA reports it (torch.cuda.mem_get_info), what vLLM multiplies by
# gpu_memory_utilization; {preset: (bytes, source)}. A GPU without a printed figure keeps its
# nominal gpu.memory_bytes.
_LLMD = ("vLLM 0.19.0 debug logs, 'Free memory on device (77.76/79.19 GiB) on startup', in "
         "github.com/llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs (kvsim/models/data/"
         "vllm_memory_profile.csv)")
CUDA_TOTAL: dict[str, tuple[int, str]] = {
    "A100-40GB": (int(39.38 * GiB), "vllm-project/vllm#16570 (NVIDIA A100-PCIE-40GB, torch OOM: 'a total capacity of "
                                     "39.38 GiB') and #16378 (vLLM V0 'total_gpu_memory (39.38GiB)'); others print "
                                     "39.39-39.56"),
    "A100-80GB": (int(79.15 * GiB), "vLLM V0 log 'total_gpu_memory (79.15GiB)' on an NVIDIA A100-SXM4-80GB in "
                                     "github.com/datawhalechina/self-llm@389f06c models/phi4/06-Phi-4-GRPO; the same "
                                     "in vllm-project/vllm#8903; others print 79.14-79.32"),
    "H100-SXM-80GB": (int(79.19 * GiB), _LLMD + "; SGLang issues print 79.11-79.44 for an NVIDIA H100 80GB HBM3"),
    "H200-141GB": (int(139.72 * GiB), "vllm-project/vllm#15394 (NVIDIA H200, vLLM V0 'total_gpu_memory (139.72GiB)'); "
                                       "a vLLM 0.10.2 log prints 139.81"),
    "L40S": (int(44.31 * GiB), "vllm-project/vllm#15196 (NVIDIA L40S, vLLM V0 'total_gpu_memory (44.31GiB)'); "
                               "another log prints 44.39"),
}

RESERVE_MODELS = ("vllm", "vllm-no-cudagraph")
RESERVE_SOURCE = ("vLLM V1's memory profile (gpu_worker.determine_available_memory, gpu_model_runner.profile_run); "
                  "constants fitted on public vLLM 0.19.0 start-up logs, kvsim/models/data/vllm_memory_profile.csv "
                  "(docs/models.md, 'The KV budget: vLLM's memory profile')")


@dataclass(frozen=True)
class Reserve:
    """One GPU's memory off the KV cache besides the weights, by term (bytes)."""

    non_torch: int
    activation: int  # the profile run's peak: max(forward, sampler) + MoE workspace, on the binding (last) stage
    forward: int
    sampler: int
    moe_workspace: int
    cudagraph: int  # counted in ``total`` only when the engine subtracts it

    @property
    def total(self) -> int:
        return self.non_torch + self.activation + self.cudagraph

    def to_dict(self) -> dict:
        return {"non_torch_bytes": self.non_torch, "activation_bytes": self.activation,
                "forward_bytes": self.forward, "sampler_bytes": self.sampler,
                "moe_workspace_bytes": self.moe_workspace, "cudagraph_bytes": self.cudagraph}


def activation_bytes_per_element(weight_dtype: str) -> int:
    """Bytes of one activation element: float32 runs in float32, everything else in 16 bits."""
    return 4 if weight_dtype == "fp32" else 2


def forward_peak_bytes(model: ModelSpec, tensor: int, tokens: int, weight_dtype: str) -> int:
    """A dense layer's widest point; an MoE model's MLP is its fused-MoE call, whose buffers are
    :func:`moe_workspace_bytes`, so only the residual stream counts here."""
    mlp = 0.0 if model.expert_intermediate_size() else 3 * model.intermediate_size / tensor
    width = mlp + 2 * model.hidden_size
    return int(tokens * width * activation_bytes_per_element(weight_dtype) * FORWARD_FACTOR)


def moe_workspace_bytes(model: ModelSpec, tensor: int, tokens: int, weight_dtype: str) -> int:
    """The fused-MoE call's buffers for ``tokens`` tokens (0 for a dense model), as vLLM 0.32's
    ``TritonExperts.workspace_shapes`` sizes them (experts/triton_moe.py): ``M x topk x max(N/2, K)``,
    ``M x topk x max(N, K)`` and the ``M x K`` output, with ``N`` = 2 x the expert's intermediate
    width on this GPU and ``K`` = hidden. vLLM's workspace manager keeps them allocated after the
    forward pass, so they add to the sampler's peak. No fitted constant."""
    inter = model.expert_intermediate_size() / tensor
    if not inter:
        return 0
    k, n, h = model.experts_per_token, 2 * inter, model.hidden_size
    elements = tokens * (k * (max(n / 2, h) + max(n, h)) + h)
    return int(elements * activation_bytes_per_element(weight_dtype))


def sampler_peak_bytes(model: ModelSpec, rows: int) -> int:
    return int(rows * (model.vocab_size * SAMPLER_BYTES_PER_LOGIT + model.hidden_size * SAMPLER_BYTES_PER_HIDDEN))


def non_torch_bytes(tensor: int, pipeline: int, gpu_p2p: bool = True) -> int:
    """``tensor``: tensor-parallel GPUs with peer access (vLLM's custom all-reduce and its buffers;
    without peer access vLLM turns it off, and the single-GPU figure stands)."""
    if tensor > 1 and gpu_p2p:
        return NON_TORCH_BYTES["tensor"]
    return NON_TORCH_BYTES["pipeline"] if pipeline > 1 else NON_TORCH_BYTES["single"]


def cudagraph_bytes(layers_per_stage: int) -> int:
    return CUDAGRAPH_BASE_BYTES + layers_per_stage * CUDAGRAPH_PER_LAYER_BYTES


def vllm_reserve(model: ModelSpec, tensor: int, pipeline: int, layers_per_stage: int, max_num_seqs: int,
                 max_num_batched_tokens: int, weight_dtype: str, cudagraphs: bool, gpu_p2p: bool = True) -> Reserve:
    """The binding GPU's reserve (the last pipeline stage: it runs the sampler; vLLM sizes every
    stage's cache by the smallest)."""
    fwd = forward_peak_bytes(model, tensor, max_num_batched_tokens, weight_dtype)
    smp = sampler_peak_bytes(model, min(max_num_seqs, max_num_batched_tokens))
    moe = moe_workspace_bytes(model, tensor, max_num_batched_tokens, weight_dtype)
    return Reserve(non_torch=non_torch_bytes(tensor, pipeline, gpu_p2p), activation=max(fwd, smp) + moe, forward=fwd,
                   sampler=smp, moe_workspace=moe, cudagraph=cudagraph_bytes(layers_per_stage) if cudagraphs else 0)


def cuda_total_bytes(gpu: str, nominal_bytes: int) -> int:
    """``gpu``'s CUDA-visible total (:data:`CUDA_TOTAL`), or ``nominal_bytes`` where none was printed."""
    return CUDA_TOTAL[gpu][0] if gpu in CUDA_TOTAL else nominal_bytes
