"""One MoE layer's fused expert kernel time, fitted to public ``benchmark_moe.py`` readings.

vLLM (and SGLang, whose Triton kernel derives from it) runs an MoE layer's routed experts as one
fused call: the router's top-k, the token-to-expert alignment, the grouped up/gate GEMM over every
touched expert, the activation, the grouped down GEMM and the weighted sum. vLLM's
``benchmarks/kernels/benchmark_moe.py`` times exactly that call (random router logits, so the
routing is close to uniform; ten calls in a CUDA graph, so no launch gaps). Its printed readings
are kvsim's MoE-kernel corpus (``data/moe/moe_kernel.csv``, one row per reading with its thread).

For ``M`` tokens, ``E`` experts on this GPU, ``k`` per token, hidden size ``K`` and this GPU's
shard ``N`` of an expert's intermediate size (``E=..,N=..`` in vLLM's config file names)::

    touched = E * (1 - (1 - k/E)**M)                    # distinct experts the tokens reach (uniform)
    m_e     = M * k / touched                            # tokens per touched expert
    for the two GEMMs (n, r) = (2N, K) and (K, N):       # up+gate, then down
        t_mem = (touched * r * n * weight_bytes + M * k * (r + n) * 2) / (hbm_bandwidth * bw_eff)
        tiles = touched * ceil(m_e / tile_m) * ceil(n / tile_n)
        t_cmp = 2 * r * tile_m * tile_n * tiles / (peak_flops(dtype) * compute_eff)
        t_gemm = (t_mem**q + t_cmp**q) ** (1/q)
    t_layer = fixed_s + t_gemm(up+gate) + t_gemm(down)

* ``fixed_s``: what does not scale with the work (top-k, alignment, activation, sum, the GEMMs'
  prologues); at one token the kernel is this plus two weight streams;
* the tile padding of each expert's tokens (``ceil(m_e / tile_m)``) is why the grouped GEMMs are
  far less efficient than a dense GEMM of the same FLOPs when many experts each get few tokens;
* ``q`` blends the memory and compute bounds as in :mod:`kvsim.timing.gemm`.

``peak_flops(dtype)``: the GPU's dense BF16 peak; for FP8 weights and activations (``fp8``) twice it
on GPUs with FP8 tensor cores (H100, H200, L40S datasheets: FP8 dense = 2x BF16 dense), the BF16
peak elsewhere; weight-only int4/int8 kernels compute in BF16. ``weight_bytes``: 2 (bf16), 1 (fp8,
int8), 0.5 (int4).

Parameters per implementation live in ``data/moe/moe_kernel_fit.yaml`` (fitted by
``python -m kvsim.calibration.moe_fit``, which prints the held-out error; docs/engine_overhead.md,
"MoE layers"). Plain numpy, vectorised over token counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvsim.errors import ConfigError, format_choices
from kvsim.hw import GPUSpec, ModelSpec, WEIGHT_DTYPE_BYTES
from kvsim.timing.profile_file import read_params_file

DATA_DIR = Path(__file__).parent / "data" / "moe"
FIT_FILE = DATA_DIR / "moe_kernel_fit.yaml"
CORPUS_FILE = DATA_DIR / "moe_kernel.csv"
# GPUs whose tensor cores run FP8 at twice the BF16 rate (NVIDIA H100 SXM/PCIe, H200 and L40S
# datasheets: FP8 dense = 2 x BF16 dense), by preset (GPUSpec.preset); others (A100, a GPU of your own)
# run FP8 checkpoints as weight-only kernels.
FP8_TENSOR_GPUS = ("H100-SXM-80GB", "H100-PCIe-80GB", "H200-141GB", "L40S")
PARAMS = ("fixed_s", "bandwidth_efficiency", "compute_efficiency", "overlap_q", "tile_m_tokens", "tile_n")
_INT_PARAMS = ("tile_m_tokens", "tile_n")


@dataclass(frozen=True)
class MoeKernelProfile:
    """Fitted parameters of one fused-MoE implementation (efficiencies relative to each GPU's peaks)."""

    name: str
    fixed_s: float
    bandwidth_efficiency: float
    compute_efficiency: float
    overlap_q: float
    tile_m_tokens: int
    tile_n: int
    provenance: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class MoeShape:
    """One MoE layer as one GPU runs it."""

    num_experts: int
    top_k: int
    hidden_size: int
    shard_intermediate_size: int
    weight_bytes: float  # per weight element
    fp8_compute: bool  # FP8 weights and activations on FP8 tensor cores


def peak_flops_s(gpu: GPUSpec, fp8_compute: bool) -> float:
    return gpu.bf16_flops_per_s * (2.0 if fp8_compute and gpu.preset in FP8_TENSOR_GPUS else 1.0)


def layer_time_s(num_tokens, shape: MoeShape, gpu: GPUSpec, prof: MoeKernelProfile):
    """One MoE layer's fused-kernel time for ``num_tokens`` tokens (int or array; 0 tokens cost 0)."""
    m = np.asarray(num_tokens, dtype=float)
    E, k = float(shape.num_experts), float(shape.top_k)
    touched = E * (1.0 - (1.0 - min(k / E, 1.0)) ** m)
    safe = np.where(touched > 0, touched, 1.0)
    m_e = m * k / safe
    bw = gpu.hbm_bandwidth_bytes_per_s * prof.bandwidth_efficiency
    flops = peak_flops_s(gpu, shape.fp8_compute) * prof.compute_efficiency
    N, K = float(shape.shard_intermediate_size), float(shape.hidden_size)
    q = prof.overlap_q
    total = np.full(m.shape, prof.fixed_s)
    for n, r in ((2.0 * N, K), (K, N)):
        t_mem = (touched * r * n * shape.weight_bytes + m * k * (r + n) * 2.0) / bw
        tiles = touched * np.ceil(m_e / prof.tile_m_tokens) * math.ceil(n / prof.tile_n)
        t_cmp = 2.0 * r * prof.tile_m_tokens * prof.tile_n * tiles / flops
        hi = np.maximum(t_mem, t_cmp)
        div = np.where(hi > 0, hi, 1.0)
        total = total + hi * ((t_mem / div) ** q + (t_cmp / div) ** q) ** (1.0 / q)
    t = np.where(m > 0, total, 0.0)
    return float(t) if t.ndim == 0 else t


@lru_cache(maxsize=4)
def load_profiles(path: Path = FIT_FILE) -> dict[str, MoeKernelProfile]:
    """``implementation -> profile`` from the fit file (one ConfigError line naming file and key)."""
    path, raw, params = read_params_file(path, "MoE kernel profile")
    out = {}
    for name, vals in params.items():
        if not isinstance(vals, dict):
            raise ConfigError(f"{path}: params.{name}: expected a mapping of {format_choices(PARAMS)}")
        got = {}
        for key in PARAMS:
            v = vals.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 and key != "fixed_s" or v < 0:
                raise ConfigError(f"{path}: params.{name}.{key}: missing or not a positive number")
            got[key] = int(v) if key in _INT_PARAMS else float(v)
        out[str(name)] = MoeKernelProfile(name=str(name), provenance=dict(raw.get("provenance") or {}), **got)
    return out


def kernel_choices() -> tuple[str, ...]:
    return ("none", "auto", *sorted(load_profiles()))


def resolve_kernel(kind: str, weight_dtype: str, gpu: GPUSpec) -> str:
    """``auto``: the Triton kernel's profile for bf16/fp16 weights and for FP8 on GPUs with FP8 tensor
    cores. Weight-only kernels (int4/int8 weights; FP8 on a GPU without FP8 tensor cores, where vLLM's
    Fp8MoEMethod runs Marlin below compute capability 8.9) take ``vllm-marlin-moe`` where that profile
    is fitted, else ``none`` (the corpus has no per-layer reading of them: their experts stay in the
    step's roofline). A name: itself."""
    if kind != "auto":
        return kind
    weight_only = weight_dtype in ("int4", "int8") or (weight_dtype == "fp8" and gpu.preset not in FP8_TENSOR_GPUS)
    if weight_only:
        return "vllm-marlin-moe" if "vllm-marlin-moe" in load_profiles() else "none"
    return "vllm-fused-moe-triton"


def model_shape(model: ModelSpec, tensor_parallel: int, weight_dtype: str) -> MoeShape | None:
    """One GPU's MoE layer of ``model`` (None: a dense model). Every expert is split across the
    tensor ranks (its intermediate size / T, as vLLM does without expert parallelism). The expert
    width comes from the model's totals, as the weight-read model takes it (kvsim.timing.moe):
    ``(num_params - active_params) / (E - k)`` parameters per expert over ``num_layers`` layers of
    three ``hidden x intermediate`` matrices."""
    inter = model.expert_intermediate_size()
    if not inter:
        return None
    return MoeShape(num_experts=model.num_experts, top_k=model.experts_per_token, hidden_size=model.hidden_size,
                    shard_intermediate_size=max(1, int(round(inter / tensor_parallel))),
                    weight_bytes=WEIGHT_DTYPE_BYTES[weight_dtype], fp8_compute=weight_dtype == "fp8")


def dense_active_params(model: ModelSpec) -> float:
    """Parameters a token goes through outside the routed experts (attention, shared experts, ...)."""
    from kvsim.timing.moe import routed_expert_params

    return model.params_per_token - model.experts_per_token * routed_expert_params(model)


class MoeExperts:
    """The routed experts' time of a step of ``n`` tokens, ``num_layers x layer_time_s(n)``, defined
    once for every evaluation: a per-token-count table (grown on demand) that the scalar and the array
    lookups read, so both return the same doubles bit for bit. Every layer counts as an MoE layer, as
    the weight-read model counts them (kvsim.timing.moe)."""

    def __init__(self, name: str, shape: MoeShape, gpu: GPUSpec, num_layers: int):
        self.name = name
        self.profile = load_profiles()[name]
        self.shape, self.gpu = shape, gpu
        self.num_layers = num_layers
        self._table = np.zeros(0)
        self._list: list[float] = []

    def _grow(self, n: int) -> None:
        size = max(n + 1, 2 * len(self._table), 1024)
        self._table = self.num_layers * layer_time_s(np.arange(size), self.shape, self.gpu, self.profile)
        self._list = self._table.tolist()

    def scalar_s(self, num_tokens: int) -> float:
        if num_tokens >= len(self._list):
            self._grow(num_tokens)
        return self._list[num_tokens]

    def array_s(self, num_tokens: np.ndarray) -> np.ndarray:
        if len(num_tokens) and int(num_tokens.max()) >= len(self._table):
            self._grow(int(num_tokens.max()))
        return self._table.take(num_tokens)
