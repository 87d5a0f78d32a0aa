"""Model and GPU presets, and KV-cache sizing.

KV bytes per token = 2 (K and V) x layers x kv_heads x per-head bytes, where per-head bytes is
``head_dim x bits / 8`` plus the quantisation scales stored with each head's vector:

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
from dataclasses import asdict, dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class KVDType:
    name: str
    bits: int
    scale_bytes_per_group: int  # bytes of scale/zero metadata stored per group
    group_elements: int  # elements per scale group; 0 = per-tensor (no per-token overhead)

    def head_bytes(self, head_dim: int) -> int:
        data_bits = head_dim * self.bits
        if data_bits % 8:
            raise ValueError(f"head_dim {head_dim} x {self.bits} bits is not a whole number of bytes")
        scale = 0 if self.group_elements == 0 else math.ceil(head_dim / self.group_elements) * self.scale_bytes_per_group
        return data_bits // 8 + scale


KV_DTYPES: dict[str, KVDType] = {
    "fp16": KVDType("fp16", 16, 0, 0),
    "bf16": KVDType("bf16", 16, 0, 0),
    "fp8": KVDType("fp8", 8, 0, 0),
    "int8": KVDType("int8", 8, 2, 1 << 30),  # group larger than any head => one scale per head
    "int4": KVDType("int4", 4, 4, 32),
}

WEIGHT_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


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
    num_params: float  # total parameters
    max_model_len_tokens: int
    gated_mlp: bool = True
    source: str = ""

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        dt = KV_DTYPES[kv_dtype]
        return 2 * self.num_layers * self.num_kv_heads * dt.head_bytes(self.head_dim)

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
    num_sms: int | None = None  # streaming multiprocessors (kernel parallelism); None = unknown

    def to_dict(self) -> dict:
        return asdict(self)


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
        ModelSpec("Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 7.62e9, 32768,
                  source="Qwen/Qwen2.5-7B config.json"),
    ]
}

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("A100-40GB", 40 * GiB, 1.555e12, 312e12, source="NVIDIA A100 datasheet (SXM4 40GB); 108 SMs: "
                "NVIDIA A100 Tensor Core GPU Architecture whitepaper", num_sms=108),
        GPUSpec("A100-80GB", 80 * GiB, 2.039e12, 312e12, source="NVIDIA A100 datasheet (SXM4 80GB); 108 SMs: "
                "NVIDIA A100 Tensor Core GPU Architecture whitepaper", num_sms=108),
        GPUSpec("H100-SXM-80GB", 80 * GiB, 3.35e12, 989e12, source="NVIDIA H100 datasheet (SXM5); 132 SMs: "
                "NVIDIA H100 Tensor Core GPU Architecture whitepaper", num_sms=132),
        GPUSpec("H200-141GB", 141 * GiB, 4.8e12, 989e12, source="NVIDIA H200 datasheet (SXM); 132 SMs: same "
                "GH100 configuration as H100 SXM5", num_sms=132),
        GPUSpec("L40S", 48 * GiB, 0.864e12, 362.05e12, source="NVIDIA L40S datasheet; 142 SMs (18,176 CUDA "
                "cores / 128 per Ada SM)", num_sms=142),
    ]
}


def presets_table() -> dict:
    """Everything ``kvsim models --json`` prints."""
    return {
        "kv_dtypes": {k: asdict(v) for k, v in KV_DTYPES.items()},
        "models": {
            name: {**m.to_dict(), "kv_bytes_per_token": {dt: m.kv_bytes_per_token(dt) for dt in KV_DTYPES}}
            for name, m in MODELS.items()
        },
        "gpus": {name: g.to_dict() for name, g in GPUS.items()},
    }
