"""Model and GPU presets, and KV-cache sizing.

KV bytes per token = 2 (K and V) x layers x kv_heads x per-head bytes, where per-head bytes is
``head_dim x bits / 8`` plus the quantisation scales stored with each head's vector. For MLA models
(DeepSeek-V2/V3, ``attention="mla"``) one compressed latent of ``kv_lora_rank + qk_rope_head_dim``
elements per layer is stored instead, shared by every head: layers x vector bytes, no factor 2.
Sliding-window layers are charged for every token (exact up to the window, an upper bound past
it): see :meth:`ModelSpec.kv_bytes_for_context` and docs/models.md.

============  =====  =====================================================================
kv dtype       bits  scale overhead per (token, layer, K|V, kv_head)
============  =====  =====================================================================
fp16, bf16      16   none
fp8             8    none per token: one fp32 scale per tensor (vLLM's ``fp8_e4m3`` default)
int8            8    one fp16 scale per head vector (2 bytes)
int4            4    one fp16 scale + one fp16 zero point per group of 32 elements
============  =====  =====================================================================

Datasheet numbers: memory is the marketed size taken as GiB (vendors' "80GB" A100/H100 expose
81,920 MiB); bandwidth is peak HBM/GDDR bandwidth in bytes/s; ``bf16_flops`` is dense (no
sparsity) tensor-core peak. Sources are named per preset.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

GiB = 1 << 30


@dataclass(frozen=True)
class KVDType:
    name: str
    bits: int
    scale_bytes_per_group: int  # bytes of scale/zero metadata stored per group
    group_elements: int  # elements per scale group; 0 = per-tensor (no per-token overhead)

    def fits(self, head_dim: int) -> bool:
        """Whether a vector of ``head_dim`` elements is a whole number of bytes in this dtype."""
        return head_dim * self.bits % 8 == 0

    def head_bytes(self, head_dim: int) -> int:
        data_bits = head_dim * self.bits
        if data_bits % 8:
            valid = ", ".join(n for n, d in KV_DTYPES.items() if d.fits(head_dim))
            raise ValueError(f"kv_dtype: {self.name} stores a vector of {head_dim} elements in {self.bits}-bit "
                             f"values, not a whole number of bytes; valid for it: {valid}")
        scale = 0 if self.group_elements == 0 else math.ceil(head_dim / self.group_elements) * self.scale_bytes_per_group
        return data_bits // 8 + scale


def experts_problem(num_experts: int, experts_per_token: int) -> str | None:
    """Why a router's top-k cannot pick ``experts_per_token`` of ``num_experts`` (None: it can). The one
    check for a scenario's model section and a config.json (kvsim/models/hf.py)."""
    if experts_per_token > num_experts:
        return f"{experts_per_token} experts per token is more than the {num_experts} experts"
    return None


KV_DTYPES: dict[str, KVDType] = {
    "fp16": KVDType("fp16", 16, 0, 0),
    "bf16": KVDType("bf16", 16, 0, 0),
    "fp8": KVDType("fp8", 8, 0, 0),
    "int8": KVDType("int8", 8, 2, 1 << 30),  # group larger than any head => one scale per head
    "int4": KVDType("int4", 4, 4, 32),
}

WEIGHT_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


ATTENTION_KINDS = ("gqa", "mla")  # gqa covers MHA (kv_heads == heads) and MQA (kv_heads == 1)


def mla_attention_gemms(hidden: int, heads: int, head_dim: int, rope: int, kv_lora: int, q_lora: int,
                        v_dim: int) -> list[tuple[int, int]]:
    """One MLA layer's attention GEMMs as (n output features, k reduction dim), for ``heads`` query
    heads (one GPU's under tensor parallelism), as vLLM's MLA layer runs a decode step: the fused
    down-projections of the query and the KV latent (``hidden -> q_lora + kv_lora + rope``; without
    query compression the latent's alone and a full query projection), the query up-projection, the
    two absorbed halves of ``kv_b_proj`` (the key's into the query, ``nope -> kv_lora`` per head; the
    value's after attention, ``kv_lora -> v_dim`` per head: batched GEMMs, as one GEMM of the same
    FLOPs and weights) and the output projection. Their weights are the layer's attention parameters
    (kvsim.models.hf counts them so); kvsim.timing.gemm prices them."""
    nope = head_dim - rope
    if q_lora:
        down = [(q_lora + kv_lora + rope, hidden), (heads * head_dim, q_lora)]
    else:
        down = [(kv_lora + rope, hidden), (heads * head_dim, hidden)]
    return down + [(heads * kv_lora, nope), (heads * v_dim, kv_lora), (hidden, heads * v_dim)]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_params: float  # total parameters (every expert of an MoE model): what the weights weigh
    max_model_len_tokens: int
    gated_mlp: bool = True
    source: str = ""
    attention: str = "gqa"  # one of ATTENTION_KINDS
    kv_lora_rank: int = 0  # MLA: the compressed latent's width
    qk_rope_head_dim: int = 0  # MLA: the decoupled RoPE key stored beside the latent
    sliding_window_tokens: int = 0  # 0: no sliding-window layers
    sliding_window_layers: int = 0  # how many of num_layers attend only to the last window tokens
    num_experts: int = 0  # MoE: routed experts per MoE layer (0: dense)
    experts_per_token: int = 0  # MoE: routed experts each token uses
    active_params: float = 0.0  # parameters one token goes through (0: num_params, a dense model)
    q_lora_rank: int = 0  # MLA: the compressed query's width (0: no query compression)
    v_head_dim: int = 0  # MLA: the value head's width (0: head_dim - qk_rope_head_dim)

    def attention_pair_flops(self, decode: bool) -> int:
        """FLOPs of one (query, key) pair in one layer, all query heads: QK dot product plus the
        weighted V sum, ``2 H (d_qk + d_v)``. Dense attention: ``d_qk = d_v = head_dim``. MLA as vLLM
        runs it (``MLACommonImpl``, vllm/v1/attention/backends/mla/common.py; FlashMLA): decode in the
        absorbed form, an MQA over the latent, ``d_qk = kv_lora_rank + qk_rope_head_dim`` (576) and
        ``d_v = kv_lora_rank`` (512); prefill in the MHA form, ``d_qk = head_dim`` (qk_nope +
        qk_rope, 192) and ``d_v = v_head_dim`` (128) -- DeepSeek-V2 paper, section 2.1.2-2.1.3."""
        if self.attention != "mla":
            return 2 * self.num_attention_heads * 2 * self.head_dim
        if decode:
            return 2 * self.num_attention_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        v = self.v_head_dim or self.head_dim - self.qk_rope_head_dim
        return 2 * self.num_attention_heads * (self.head_dim + v)

    @property
    def kv_vector_elements(self) -> int:
        """Elements of one stored vector (one kv head's K or V; MLA: the latent + rope key)."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    def kv_dtype_problem(self, kv_dtype: str) -> str | None:
        """Why ``kv_dtype`` cannot store this model's KV vectors (a sub-byte dtype and an odd vector
        width), naming the field and the valid choices; None when it can."""
        if KV_DTYPES[kv_dtype].fits(self.kv_vector_elements):
            return None
        valid = ", ".join(n for n, d in KV_DTYPES.items() if d.fits(self.kv_vector_elements))
        what = "latent + rope key" if self.attention == "mla" else "head_dim"
        return (f"kv_dtype: {kv_dtype} ({KV_DTYPES[kv_dtype].bits} bits) cannot store {self.name}'s {what} of "
                f"{self.kv_vector_elements} elements in whole bytes; valid for this model: {valid}")

    def kv_vector_bytes(self, kv_dtype: str) -> int:
        """Bytes of one stored vector (one kv head's K or V; MLA: the latent + rope key)."""
        why = self.kv_dtype_problem(kv_dtype)
        if why:
            raise ValueError(why)
        return KV_DTYPES[kv_dtype].head_bytes(self.kv_vector_elements)

    def kv_bytes_per_token_layer(self, kv_dtype: str, kv_heads: int | None = None) -> int:
        """KV bytes one token adds to one layer (``kv_heads``: per GPU under tensor parallelism)."""
        if self.attention == "mla":
            return self.kv_vector_bytes(kv_dtype)  # one latent, shared by all heads (no K/V pair)
        return 2 * (self.num_kv_heads if kv_heads is None else kv_heads) * self.kv_vector_bytes(kv_dtype)

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """Every layer, every token: what the allocator charges per token (window layers included)."""
        return self.num_layers * self.kv_bytes_per_token_layer(kv_dtype)

    def kv_bytes_for_context(self, context_tokens: int, kv_dtype: str) -> int:
        """What one sequence of ``context_tokens`` really holds: window layers keep at most the window."""
        per_layer = self.kv_bytes_per_token_layer(kv_dtype)
        full_layers = self.num_layers - self.sliding_window_layers
        window = min(context_tokens, self.sliding_window_tokens) if self.sliding_window_layers else 0
        return per_layer * (full_layers * context_tokens + self.sliding_window_layers * window)

    @property
    def params_per_token(self) -> float:
        """Parameters a token goes through (MoE: the active experts only)."""
        return self.active_params or self.num_params

    def routed_expert_params(self) -> float:
        """Parameters of one routed expert summed over the MoE layers (0.0: dense, or every expert
        used by every token so nothing is skipped)."""
        E, k = self.num_experts, self.experts_per_token
        if not E or not k or k >= E or not self.active_params:
            return 0.0
        return (self.num_params - self.active_params) / (E - k)

    def expert_intermediate_size(self) -> float:
        """One routed expert's intermediate width, from the totals: ``routed_expert_params`` over
        ``num_layers`` layers of three ``hidden x intermediate`` matrices (0.0: dense)."""
        return self.routed_expert_params() / self.num_layers / (3.0 * self.hidden_size)

    def weight_bytes(self, weight_dtype: str = "bf16") -> int:
        return int(self.num_params * WEIGHT_DTYPE_BYTES[weight_dtype])

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_flops_per_s: float  # dense
    source: str = ""
    # the GPUS preset this GPU is or was derived from ("" = a GPU of your own), set by GPUS and the config
    # layer: measured data follow it, never ``name`` (docs/models.md, "Choosing a GPU")
    preset: str = ""
    # GPU-to-GPU link for tensor/pipeline parallelism: peak bytes/s per GPU in ONE direction (half
    # the bidirectional figure datasheets print); 0 = none known (parallel runs must set it).
    interconnect: str = ""
    interconnect_bandwidth_bytes_per_s: float = 0.0
    allreduce_efficiency: float = 1.0  # measured all-reduce bus bandwidth / peak (1.0: no public number)
    allreduce_latency_s: float = 0.0  # fixed cost of one all-reduce call
    # NCCL's ring latency per ring step, added 2 (T-1) times to allreduce_latency_s (a PCIe preset:
    # NCCL's tuning model, NCCL_PCI_RING; 0 where allreduce_latency_s is a measured all-reduce time)
    allreduce_latency_per_step_s: float = 0.0
    # small all-reduces may take NCCL's LL protocol (NCCL_LL) beside the ring (a PCIe preset: its tuning
    # model picks it; over NVLink the measured times include it)
    allreduce_ll: bool = False
    num_sms: int | None = None  # streaming multiprocessors (kernel parallelism); None = unknown
    # the GPU<->host link preset (kvsim/timing/data/links/<name>.yaml) swaps and tier loads use when a
    # scenario has no host_link: (docs/transfer_model.md, "Host link per GPU"); "" = none known
    host_link: str = ""
    # CUDA compute capability (major.minor, e.g. 9.0 for Hopper): which kernels an engine can run on
    # it (vLLM's FlashAttention backend reads fp8 KV only with FlashAttention-3, on 9.x); None = unknown
    compute_capability: float | None = None

    def through_host(self, copy_rate_bytes_per_s: float, efficiency: float, latency_s: float) -> GPUSpec:
        """This GPU where the GPUs cannot reach each other (``parallel.gpu_p2p: false``): its
        interconnect becomes the host-memory path (NCCL's SHM transport) at the host link's copy
        rate, ``efficiency`` of it and ``latency_s`` per all-reduce with NCCL's ring (Simple) protocol
        (:data:`HOST_PATH_ALLREDUCE`; small all-reduces may take the LL protocol, :data:`NCCL_LL`)."""
        return replace(self, interconnect=HOST_PATH, interconnect_bandwidth_bytes_per_s=copy_rate_bytes_per_s,
                       allreduce_efficiency=efficiency, allreduce_latency_s=latency_s,
                       allreduce_latency_per_step_s=0.0, allreduce_ll=False)

    def to_dict(self) -> dict:
        return asdict(self)


# Public copies of Hugging Face config.json files the presets below were read from.
_LLM_PROF = "config.json as printed in github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md"
_OUMI = "github.com/oumi-ai/oumi configs/recipes/"

# Model families deliberately not presets (name prefix -> why), named in the unknown-preset error.
NOT_PRESETS: dict[str, str] = {
    "Gemma-3": "Gemma 3 is not a preset: 5 of every 6 layers keep only a 512-1024-token window, which kvsim's "
               "allocators would charge for every token (Gemma-3-27B: 3.8x its real KV at 8K tokens, 6x at 128K; "
               "docs/models.md, 'Presets'); give its config.json as model: path/config.json and read the results "
               "as upper bounds",
}

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("OPT-13B", 40, 5120, 40, 40, 128, 20480, 50272, 12.85e9, 2048, gated_mlp=False,
                  source="facebook/opt-13b config.json"),
        ModelSpec("Llama-2-7B", 32, 4096, 32, 32, 128, 11008, 32000, 6.74e9, 4096,
                  source="meta-llama/Llama-2-7b-hf config.json"),
        ModelSpec("Llama-2-13B", 40, 5120, 40, 40, 128, 13824, 32000, 13.02e9, 4096,
                  source="meta-llama/Llama-2-13b-hf config.json"),
        ModelSpec("Llama-3-8B", 32, 4096, 32, 8, 128, 14336, 128256, 8.03e9, 8192,
                  source="meta-llama/Meta-Llama-3-8B config.json"),
        ModelSpec("Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256, 70.55e9, 8192,
                  source="meta-llama/Meta-Llama-3-70B config.json"),
        # The base model's config.json says 131,072 (the -Instruct config says 32,768 and needs YaRN
        # rope_scaling beyond it): docs/models.md, "Presets".
        ModelSpec("Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 7.62e9, 131072,
                  source=_LLM_PROF + " (Qwen2.5-7B; base model, max_position_embeddings 131072)"),
        # The vLLM paper's (Kwon et al., SOSP 2023, Table 1) larger OPT models.
        ModelSpec("OPT-66B", 64, 9216, 72, 72, 128, 36864, 50272, 65.7e9, 2048, gated_mlp=False,
                  source="facebook/opt-66b config.json; 65.7B parameters by the config's shapes"),
        ModelSpec("OPT-175B", 96, 12288, 96, 96, 128, 49152, 50272, 175e9, 2048, gated_mlp=False,
                  source="OPT paper (Zhang et al. 2022) Table 1: 96 layers, 96 heads, d_model 12288"),
        # Sliding window 4096 on every layer (v0.1; v0.2+ dropped the window).
        ModelSpec("Mistral-7B", 32, 4096, 32, 8, 128, 14336, 32000, 7.24e9, 32768,
                  sliding_window_tokens=4096, sliding_window_layers=32,
                  source="mistralai/Mistral-7B-v0.1 config.json (7.24B parameters, model card)"),
        ModelSpec("Mixtral-8x7B", 32, 4096, 32, 8, 128, 14336, 32000, 46.7e9, 32768,
                  num_experts=8, experts_per_token=2, active_params=12.9e9,
                  source="mistralai/Mixtral-8x7B-v0.1 config.json; 46.7B total / 12.9B active (Mistral AI, "
                         "'Mixtral of experts', 2023)"),
        ModelSpec("Qwen2.5-72B", 80, 8192, 64, 8, 128, 29568, 152064, 72.7e9, 32768,
                  source="Qwen/Qwen2.5-72B config.json (72.7B parameters, model card)"),
        # MLA: 512-wide latent + 64 rope dims per layer; head_dim = qk_nope 128 + qk_rope 64 (for FLOPs).
        ModelSpec("DeepSeek-V3", 61, 7168, 128, 128, 192, 18432, 129280, 671e9, 163840,
                  attention="mla", kv_lora_rank=512, qk_rope_head_dim=64, q_lora_rank=1536, v_head_dim=128,
                  num_experts=256, experts_per_token=8, active_params=37e9,
                  source="deepseek-ai/DeepSeek-V3 config.json; 671B total / 37B active (DeepSeek-V3 "
                         "technical report, arXiv:2412.19437)"),
        ModelSpec("Llama-3.1-405B", 126, 16384, 128, 8, 128, 53248, 128256, 405.9e9, 131072,
                  source="meta-llama/Llama-3.1-405B config.json; 405.9B parameters by the config's shapes"),
        # Current models (docs/models.md, "Presets and sources"). Shapes are the models' Hugging Face
        # config.json values as printed in the public sources named; parameters are computed from
        # those shapes by kvsim.models.hf (the same count `model: config.json` gives).
        ModelSpec("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 8.03e9, 131072,
                  source=_LLM_PROF + " (Llama-3.1-8B)"),
        ModelSpec("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, 70.55e9, 131072,
                  source=_OUMI + "llama3_1/README.md (70B model info)"),
        ModelSpec("Llama-3.3-70B", 80, 8192, 64, 8, 128, 28672, 128256, 70.55e9, 131072,
                  source=_OUMI + "llama3_3/README.md (70B model info)"),
        ModelSpec("Llama-3.2-3B", 28, 3072, 24, 8, 128, 8192, 128256, 3.21e9, 131072,
                  source=_LLM_PROF + " (Llama-3.2-3B; tied embeddings)"),
        ModelSpec("Qwen2.5-3B", 36, 2048, 16, 2, 128, 11008, 151936, 3.09e9, 32768,
                  source=_LLM_PROF + " (Qwen2.5-3B; tied embeddings)"),
        ModelSpec("Qwen2.5-14B", 48, 5120, 40, 8, 128, 13824, 152064, 14.77e9, 131072,
                  source=_LLM_PROF + " (Qwen2.5-14B)"),
        ModelSpec("Qwen2.5-32B", 64, 5120, 40, 8, 128, 27648, 152064, 32.76e9, 131072,
                  source=_LLM_PROF + " (Qwen2.5-32B)"),
        ModelSpec("Qwen3-4B", 36, 2560, 32, 8, 128, 9728, 151936, 4.02e9, 40960,
                  source=_LLM_PROF + " (Qwen3-4B; tied embeddings)"),
        ModelSpec("Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 8.19e9, 40960,
                  source=_LLM_PROF + " (Qwen3-8B)"),
        ModelSpec("Qwen3-14B", 40, 5120, 40, 8, 128, 17408, 151936, 14.77e9, 40960,
                  source=_LLM_PROF + " (Qwen3-14B)"),
        ModelSpec("Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, 32.76e9, 40960,
                  source=_LLM_PROF + " (Qwen3-32B)"),
        # Gemma 2: local (window 4096) and global layers alternate, 21 of 42 local (kvsim.models.hf).
        ModelSpec("Gemma-2-9B", 42, 3584, 16, 8, 256, 14336, 256000, 9.24e9, 8192,
                  sliding_window_tokens=4096, sliding_window_layers=21,
                  source="google/gemma-2-9b config.json (tests/data/hf/gemma-2-9b.json); 9.24B by the shapes (tied)"),
        ModelSpec("Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 6144, 151936, 30.53e9, 40960,
                  num_experts=128, experts_per_token=8, active_params=3.35e9,
                  source=_LLM_PROF + " (Qwen3-30B-A3B: 128 experts of moe_intermediate_size 768, 8 per token)"),
        ModelSpec("Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256, 1.24e9, 131072,
                  source="config.json of meta-llama/Llama-3.2-1B as committed in github.com/MatthewGoldsberry/"
                         "LLM-Projects Llama-3.2-1B/config.json (head_dim 64; tied embeddings)"),
        ModelSpec("Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, 0.60e9, 40960,
                  source="github.com/AI-Hypercomputer/maxtext MaxText/utils/ckpt_conversion/utils/"
                         "hf_model_configs.py (qwen3_0_6b_config: the HF Qwen3Config; tied embeddings)"),
        ModelSpec("Qwen3-1.7B", 28, 2048, 16, 8, 128, 6144, 151936, 1.72e9, 40960,
                  source="config.json of Qwen/Qwen3-1.7B as committed in github.com/mephisto1484/Neko-LoRA-Build-"
                         "Your-AI-Catgirl Qwen3-1.7B/config.json; shapes also in maxtext configs/models/qwen3-1.7b.yml"),
        ModelSpec("Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 12288, 151936, 235.09e9, 40960,
                  num_experts=128, experts_per_token=8, active_params=22.19e9,
                  source="github.com/zyzshishui/slime scripts/models/qwen3-235B-A22B.sh (the config's shapes as "
                         "Megatron arguments: 128 experts of 1536, 8 per token, 4 KV heads); 40,960 positions as "
                         "Qwen3-30B-A3B (docs/models.md)"),
        ModelSpec("Mixtral-8x22B", 56, 6144, 48, 8, 128, 16384, 32000, 140.62e9, 65536,
                  num_experts=8, experts_per_token=2, active_params=39.15e9,
                  source="config.json of Mixtral-8x22B-v0.1 as printed in github.com/scaleapi/llm-engine "
                         "model-engine/tests/unit/domain/test_llm_use_cases.py; 141B total / 39B active (Mistral AI)"),
        ModelSpec("Mistral-Nemo-12B", 40, 5120, 32, 8, 128, 14336, 131072, 12.25e9, 128000,
                  source="config.json of mistralai/Mistral-Nemo-Base-2407 as printed in github.com/kevinstephano/"
                         "thunder_model_blocks thunder_model_blocks/mistral/mistral_config.py (head_dim 128, no window)"),
    ]
}

# Interconnect (docs/models.md#parallelism): NVLink per GPU, one direction = half the datasheet's
# bidirectional total (A100: 600 GB/s NVLink 3; H100/H200 SXM: 900 GB/s NVLink 4); L40S has no
# NVLink: PCIe Gen4 x16, 64 GB/s bidirectional. All-reduce efficiency and latency: Vidur's profiled
# NCCL all-reduce on DGX A100 / DGX H100 (peer-data/vidur/data/profiling/network/*_dgx): bus
# bandwidth of a 64 MiB all-reduce over 8 GPUs (174 GB/s = 0.58 of 300; 365 GB/s = 0.81 of 450),
# and the median time of all-reduces of <= 64 KiB (32.5 us, 35.5 us). The A100 figures serve both
# A100 sizes (same NVLink 3 / NVSwitch); H200 reuses H100's (same NVLink 4); L40S: no public number.
_NVLINK3 = dict(interconnect="NVLink 3", interconnect_bandwidth_bytes_per_s=300e9,
                allreduce_efficiency=0.58, allreduce_latency_s=32.5e-6)
_NVLINK4 = dict(interconnect="NVLink 4", interconnect_bandwidth_bytes_per_s=450e9,
                allreduce_efficiency=0.81, allreduce_latency_s=35.5e-6)

# Without GPU peer access (parallel.gpu_p2p: false; docs/models.md#parallelism, "GPUs without peer
# access"), NCCL stages every all-reduce through host memory and vLLM's custom all-reduce is off.
# Bandwidth: the host link's copy rate (min of its h2d/d2h); the efficiency and the latency per
# all-reduce of NCCL's Simple (ring) protocol have no public figure for this path: fitted by
# bench/validate_serving.py --fit on the fit cases of a deployment whose server log says it has no
# P2P (docs/validation.md, "The fit").
# PCIe presets with peer access (P2P over PCIe, no NVLink): no public measured all-reduce time; NCCL's
# own tuning model prices its ring (Simple) protocol at baseLat 8.4 us + hwLat PCI 5.7 us per ring step,
# 2 (T-1) steps (NVIDIA/nccl src/graph/tuning.cc, the same table as NCCL_LL's constants), and lets a
# small all-reduce take the LL protocol (NCCL_LL) instead. Bus bandwidth: the link's, efficiency 1.0
# (no public number). docs/models.md, "Interconnect numbers".
NCCL_PCI_RING = dict(allreduce_latency_s=8.4e-6, allreduce_latency_per_step_s=5.7e-6, allreduce_ll=True)
HOST_PATH = "host memory (no P2P)"
HOST_PATH_ALLREDUCE = dict(efficiency=0.3, latency_s=80e-6)
# NCCL's LL protocol for a ring all-reduce within one node over PCI, from NCCL's own tuning model
# (NVIDIA/nccl src/graph/tuning.cc at commit b6475625: baseLat Ring/LL 6.6 us, hwLat PCI Ring/LL 1.0 us per
# ring step, 2 (T-1) steps; LL's bus bandwidth a quarter of the ring's for an all-reduce), which
# picks the protocol with the least latency + bytes / bandwidth (docs/engine_overhead.md, "All-reduce").
NCCL_LL = dict(base_latency_s=6.6e-6, step_latency_s=1.0e-6, bandwidth_fraction=0.25)

# compute_capability of every preset: NVIDIA, "CUDA GPU Compute Capability" (developer.nvidia.com/cuda-gpus):
# A100 8.0, L40S 8.9, H100 and H200 9.0 (also the A100 and H100 architecture whitepapers: SM80, SM90)
GPUS: dict[str, GPUSpec] = {
    g.name: replace(g, preset=g.name)
    for g in [
        GPUSpec("A100-40GB", 40 * GiB, 1.555e12, 312e12, source="NVIDIA A100 datasheet (SXM4 40GB); 108 SMs: "
                "NVIDIA A100 Tensor Core GPU Architecture whitepaper", num_sms=108, host_link="pcie-gen4-x16",
                compute_capability=8.0, **_NVLINK3),
        GPUSpec("A100-80GB", 80 * GiB, 2.039e12, 312e12, source="NVIDIA A100 datasheet (SXM4 80GB); 108 SMs: "
                "NVIDIA A100 Tensor Core GPU Architecture whitepaper", num_sms=108, host_link="pcie-gen4-x16",
                compute_capability=8.0, **_NVLINK3),
        GPUSpec("A100-PCIe-80GB", 80 * GiB, 1.935e12, 312e12, source="NVIDIA A100 datasheet (80GB PCIe column): "
                "1,935 GB/s HBM2e, BF16 312 TFLOPS dense, PCIe Gen4 64 GB/s (both directions); FlashInfer's launch "
                "post prints the same 1,935 GB/s; 108 SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper",
                num_sms=108, interconnect="PCIe Gen4 x16", interconnect_bandwidth_bytes_per_s=32e9,
                host_link="pcie-gen4-x16", compute_capability=8.0, **NCCL_PCI_RING),
        GPUSpec("H100-SXM-80GB", 80 * GiB, 3.35e12, 989e12, source="NVIDIA H100 datasheet (SXM5); 132 SMs: "
                "NVIDIA H100 Tensor Core GPU Architecture whitepaper", num_sms=132, host_link="pcie-gen5-x16",
                compute_capability=9.0, **_NVLINK4),
        GPUSpec("H100-PCIe-80GB", 80 * GiB, 2.0e12, 756e12, source="NVIDIA H100 PCIe product brief (PB-11133-001) "
                "and H100 datasheet table: 2,000 GB/s HBM2e, BF16 1,513 TFLOPS with sparsity (dense: half), 114 SMs, "
                "PCIe Gen5 128 GB/s (both directions)", num_sms=114, interconnect="PCIe Gen5 x16",
                interconnect_bandwidth_bytes_per_s=64e9, host_link="pcie-gen5-x16", compute_capability=9.0,
                **NCCL_PCI_RING),
        GPUSpec("H200-141GB", 141 * GiB, 4.8e12, 989e12, source="NVIDIA H200 datasheet (SXM); 132 SMs: same "
                "GH100 configuration as H100 SXM5", num_sms=132, host_link="pcie-gen5-x16",
                compute_capability=9.0, **_NVLINK4),
        GPUSpec("L40S", 48 * GiB, 0.864e12, 362.05e12, source="NVIDIA L40S datasheet; 142 SMs (18,176 CUDA "
                "cores / 128 per Ada SM)", num_sms=142, interconnect="PCIe Gen4 x16",
                interconnect_bandwidth_bytes_per_s=32e9, host_link="pcie-gen4-x16", compute_capability=8.9,
                **NCCL_PCI_RING),
    ]
}


def presets_table(models: dict[str, ModelSpec] | None = None) -> dict:
    """Everything ``kvsim models --json`` prints (``models``: instead of the presets, e.g. read
    from Hugging Face config files)."""
    return {
        "kv_dtypes": {k: asdict(v) for k, v in KV_DTYPES.items()},
        "models": {
            name: {**m.to_dict(), "kv_bytes_per_token": {dt: None if m.kv_dtype_problem(dt) else m.kv_bytes_per_token(dt)
                                                 for dt in KV_DTYPES},  # None: the dtype cannot store it
                   "params_per_token": m.params_per_token}
            for name, m in (MODELS if models is None else models).items()
        },
        "gpus": {name: g.to_dict() for name, g in GPUS.items()},
    }
