"""Linear-layer (GEMM) and prefill-attention time with token-count-dependent efficiency.

Fitted per GPU to Microsoft Vidur's published per-layer profiles (MIT; see docs/gemm_model.md for
the data, the fit and the measured error). Plain numpy, vectorised over token counts.

One GEMM ``Y[m, n] = X[m, k] @ W[k, n]`` in fp16/bf16 (``m`` = tokens in the step)::

    t_mem = (m*k + k*n + m*n) * element_bytes / (hbm_bandwidth * bandwidth_efficiency)
    tiles = ceil(m / tile_m) * ceil(n / tile_n)                  # output tiles
    waves = ceil(tiles / num_sms)                                 # rounds of one tile per SM
    t_cmp = 2 * k * tile_m * tile_n * ((1 - wave_weight) * tiles + wave_weight * waves * num_sms)
            / (peak_flops * compute_efficiency)
    t     = launch_s + (t_mem**q + t_cmp**q) ** (1/q)

* ``launch_s``: the fixed cost of one kernel (launch, prologue, tail);
* the tile padding is why efficiency depends on the token count: a step of 1..tile_m tokens costs
  the same compute as tile_m tokens, and compute efficiency climbs with ``m`` up to
  ``compute_efficiency`` (tile quantisation);
* wave quantisation makes it depend on the matrix shape too: the last wave of tiles leaves SMs idle
  (``wave_weight`` is the fitted share of the work that pays for whole waves);
* ``q`` blends the memory and compute bounds (a roofline ``max`` when ``q`` is large; a small ``q``
  says they overlap imperfectly near the ridge point).

Prefill attention for one sequence, one layer (``c`` new tokens over ``p`` cached ones, ``H`` query
heads of dimension ``D``)::

    pairs_eff = c*p + causal_factor * c*c / 2
    t = attn_launch_s + 4*H*D * pairs_eff * (1 + attn_half_tokens / c) / (peak_flops * attn_compute_efficiency)

``causal_factor`` > 1 is the work a tiled causal kernel wastes on the diagonal; ``attn_half_tokens``
is the chunk size at which the kernel reaches half of ``attn_compute_efficiency`` (few query tiles
cannot fill the GPU).

Profiles live in ``kvsim/timing/data/gemm/<gpu>.yaml`` (parameters + provenance). GPUs without
Vidur data get the profile of the same silicon where one exists (A100-40GB -> a100, H200 -> h100;
efficiencies are relative to each GPU's own peaks) and otherwise :data:`GENERIC`, the plain roofline
with the analytical model's default efficiencies. A GPU is looked up by its preset (``GPUSpec.preset``),
never its name: a renamed preset, or one with overridden fields, keeps its preset's profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvsim.timing.profile_file import read_params_file
from kvsim.errors import ConfigError, format_choices
from kvsim.hw import GPUSpec, ModelSpec, mla_attention_gemms

DATA_DIR = Path(__file__).parent / "data" / "gemm"
INT_PARAMS = ("tile_m_tokens", "tile_n", "num_sms")

# Which fitted profile a GPU preset uses (see docs/gemm_model.md, "GPUs without Vidur data").
PROFILE_FOR_GPU = {
    "A100-80GB": "a100",
    "A100-40GB": "a100",  # same GA100 die and tensor cores; its own (lower) HBM bandwidth
    "A100-PCIe-80GB": "a100",  # the same, as a PCIe card (its own 1,935 GB/s)
    "H100-SXM-80GB": "h100",
    "H100-PCIe-80GB": "h100",  # GH100 as a PCIe card: its own 2.0 TB/s and 756 TFLOP/s (114 SMs)
    "H200-141GB": "h100",  # same GH100 die, same 989 TFLOP/s; its own 4.8 TB/s HBM3e
    "A40": "a40",
}


@dataclass(frozen=True)
class GemmProfile:
    """Fitted efficiency parameters of one GPU (dimensionless except where the name says)."""

    name: str
    launch_s: float
    bandwidth_efficiency: float
    compute_efficiency: float
    overlap_q: float
    tile_m_tokens: int
    tile_n: int
    num_sms: int
    wave_weight: float
    attn_launch_s: float
    attn_compute_efficiency: float
    attn_causal_factor: float
    attn_half_tokens: float
    source: str = ""
    provenance: dict = field(default_factory=dict, compare=False)

    PARAMS = ("launch_s", "bandwidth_efficiency", "compute_efficiency", "overlap_q", "tile_m_tokens", "tile_n",
              "num_sms", "wave_weight", "attn_launch_s", "attn_compute_efficiency", "attn_causal_factor",
              "attn_half_tokens")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# The plain roofline the analytical model used before (compute 0.7, bandwidth 0.85, no launch cost,
# hard max (overlap_q = inf), no tiles); prefill attention at the same compute efficiency with no causal waste.
GENERIC = GemmProfile(
    name="generic", launch_s=0.0, bandwidth_efficiency=0.85, compute_efficiency=0.7, overlap_q=float("inf"),
    tile_m_tokens=1, tile_n=1, num_sms=1, wave_weight=0.0, attn_launch_s=0.0, attn_compute_efficiency=0.7,
    attn_causal_factor=1.0,
    attn_half_tokens=0.0,
    source="kvsim timing.analytical defaults (no public number for this GPU; see docs/gemm_model.md)")


def load_profile(path: str | Path) -> GemmProfile:
    """Read a profile YAML; a missing, non-numeric or negative parameter is a one-line ConfigError."""
    path, raw, params = read_params_file(path, "GEMM profile")
    vals: dict = {}
    for key in GemmProfile.PARAMS:
        v = params.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{path}: params.{key}: missing or not a number (keys: {format_choices(GemmProfile.PARAMS)})")
        if v < 0 or (key in ("compute_efficiency", "bandwidth_efficiency", "attn_compute_efficiency", "overlap_q",
                             "tile_m_tokens", "tile_n", "num_sms") and v <= 0):
            raise ConfigError(f"{path}: params.{key}: must be positive (got {v!r})")
        if key in ("compute_efficiency", "bandwidth_efficiency", "attn_compute_efficiency", "wave_weight") and v > 1:
            raise ConfigError(f"{path}: params.{key}: must be at most 1 (got {v!r})")
        vals[key] = int(v) if key in INT_PARAMS else float(v)
    return GemmProfile(name=str(raw.get("name", path.stem)), source=str(raw.get("source", "")),
                       provenance=dict(raw.get("provenance") or {}), **vals)


@lru_cache(maxsize=None)
def _shipped(name: str) -> GemmProfile:
    return load_profile(DATA_DIR / f"{name}.yaml")


def profile_for(gpu: GPUSpec | str) -> GemmProfile:
    """The fitted profile for a GPU preset name, or for a spec's ``preset`` (the part it is, whatever
    its name or overridden fields: the profile measured on that part), else :data:`GENERIC`."""
    key = PROFILE_FOR_GPU.get(gpu if isinstance(gpu, str) else gpu.preset)
    return _shipped(key) if key is not None else GENERIC


def linear_time_s(num_tokens, n: int, k: int, gpu: GPUSpec, profile: GemmProfile | None = None,
                  element_bytes: int = 2):
    """Time of one ``[num_tokens, k] x [k, n]`` GEMM. ``num_tokens``: int or array (vectorised);
    0 tokens cost 0. Returns a float for a scalar input, else an array."""
    prof = profile or profile_for(gpu)
    m = np.asarray(num_tokens, dtype=float)
    t_mem = (m * k + float(k) * n + m * n) * element_bytes / (gpu.hbm_bandwidth_bytes_per_s * prof.bandwidth_efficiency)
    tiles = np.ceil(m / prof.tile_m_tokens) * np.ceil(n / prof.tile_n)
    if prof.wave_weight > 0:
        waves = np.ceil(tiles / prof.num_sms)
        tiles = (1.0 - prof.wave_weight) * tiles + prof.wave_weight * waves * prof.num_sms
    t_cmp = 2.0 * k * prof.tile_m_tokens * prof.tile_n * tiles / (gpu.bf16_flops_per_s * prof.compute_efficiency)
    q = prof.overlap_q
    hi = np.maximum(t_mem, t_cmp)
    safe = np.where(hi > 0, hi, 1.0)
    if np.isinf(q):
        both = hi
    else:
        both = hi * ((t_mem / safe) ** q + (t_cmp / safe) ** q) ** (1.0 / q)  # scaled: no overflow for big q
    t = np.where(m > 0, prof.launch_s + both, 0.0)
    return float(t) if t.ndim == 0 else t


def gemm_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """The four per-layer GEMMs as (n output features, k reduction dim), plus ``lm_head``."""
    q_dim = model.num_attention_heads * model.head_dim
    kv_dim = model.num_kv_heads * model.head_dim
    return {
        "qkv": (q_dim + 2 * kv_dim, model.hidden_size),
        "attn_out": (model.hidden_size, q_dim),
        "mlp_up": ((2 if model.gated_mlp else 1) * model.intermediate_size, model.hidden_size),
        "mlp_down": (model.hidden_size, model.intermediate_size),
        "lm_head": (model.vocab_size, model.hidden_size),
    }


def attention_shapes(shard: ModelSpec) -> list[tuple[int, int]]:
    """One layer's attention GEMMs on one GPU, as (n, k), for ``shard`` the model as that GPU sees it
    (its query heads). GQA/MHA: QKV and output (:func:`gemm_shapes`). MLA (DeepSeek-V2/V3):
    :func:`kvsim.hw.mla_attention_gemms` (the down-projections replicated on every rank, the rest
    split by heads)."""
    if shard.attention != "mla":
        s = gemm_shapes(shard)
        return [s["qkv"], s["attn_out"]]
    m = shard
    return mla_attention_gemms(m.hidden_size, m.num_attention_heads, m.head_dim, m.qk_rope_head_dim, m.kv_lora_rank,
                               m.q_lora_rank, m.v_head_dim or m.head_dim - m.qk_rope_head_dim)


def layer_shapes(shard: ModelSpec, shared_params: float, tensor: int = 1) -> list[tuple[int, int]]:
    """One layer's GEMMs on one GPU, as (n, k), for a model that is not a dense GQA/MHA one (that is
    :func:`layer_linear_time_s`'s four): its attention (:func:`attention_shapes`), then an MoE
    model's router (``hidden -> num_experts``, replicated on every rank, as vLLM's
    ``ReplicatedLinear`` gate) and, with ``shared_params`` per layer (:func:`shared_params_per_layer`
    of the whole model), its shared experts and dense layers as one gated MLP per layer of those
    weights, its width split over the ranks; a dense MLA model's MLP. The routed experts are not here:
    they are the MoE kernel's, or their weight reads (kvsim.timing.moe_kernel, kvsim.timing.moe)."""
    shapes = attention_shapes(shard)
    if not shard.num_experts:
        s = gemm_shapes(shard)
        return shapes + [s["mlp_up"], s["mlp_down"]]
    shapes.append((shard.num_experts, shard.hidden_size))
    if shared_params:
        width = -(-int(round(shared_params / (3 * shard.hidden_size))) // max(int(tensor), 1))
        shapes += [(2 * width, shard.hidden_size), (shard.hidden_size, width)]
    return shapes


SHARED_MIN_SHARE = 0.05  # below this share of a layer's attention weights the remainder is rounding


def shared_params_per_layer(model: ModelSpec) -> float:
    """Parameters per layer that every token of an MoE model goes through outside attention, the
    router, the embeddings and the LM head (shared experts; dense layers spread over all layers):
    what is left of the active parameters. 0.0 when that is under :data:`SHARED_MIN_SHARE` of the
    layer's attention weights (the non-MLA presets' published totals are rounded; none of them has
    shared experts), and for a dense model."""
    from kvsim.timing.moe_kernel import dense_active_params

    if not model.num_experts:
        return 0.0
    h, L = model.hidden_size, model.num_layers
    attn = float(sum(n * k for n, k in attention_shapes(model)))
    rest = (dense_active_params(model) - 2.0 * model.vocab_size * h) / L - attn - h * model.num_experts
    return rest if rest > SHARED_MIN_SHARE * attn else 0.0


def layer_linear_time_s(num_tokens, model: ModelSpec, gpu: GPUSpec, profile: GemmProfile | None = None,
                        element_bytes: int = 2):
    """One decoder layer's four GEMMs (QKV, attention output, MLP up(+gate), MLP down)."""
    shapes = gemm_shapes(model)
    return sum(linear_time_s(num_tokens, *shapes[op], gpu, profile, element_bytes)
               for op in ("qkv", "attn_out", "mlp_up", "mlp_down"))


def step_linear_time_s(num_tokens, num_seqs, model: ModelSpec, gpu: GPUSpec, profile: GemmProfile | None = None,
                       element_bytes: int = 2):
    """All linear layers of one engine step: ``num_layers`` x the layer GEMMs over ``num_tokens``,
    plus the LM head over ``num_seqs`` rows (serving engines compute logits only for the last token
    of each scheduled sequence). Vectorised over both arguments."""
    lm_n, lm_k = gemm_shapes(model)["lm_head"]
    return (model.num_layers * layer_linear_time_s(num_tokens, model, gpu, profile, element_bytes)
            + linear_time_s(num_seqs, lm_n, lm_k, gpu, profile, element_bytes))


def prefill_attention_time_s(chunk_tokens, context_tokens, model: ModelSpec, gpu: GPUSpec,
                             profile: GemmProfile | None = None):
    """One layer of prefill attention for one sequence: ``chunk_tokens`` new tokens attending to
    ``context_tokens`` cached ones and causally to each other. Vectorised; 0 new tokens cost 0.
    Multiply by ``model.num_layers`` for the whole model; sum over the sequences of a step."""
    prof = profile or profile_for(gpu)
    c = np.asarray(chunk_tokens, dtype=float)
    p = np.asarray(context_tokens, dtype=float)
    pairs = c * p + prof.attn_causal_factor * c * c / 2.0
    safe_c = np.where(c > 0, c, 1.0)
    flops = float(model.attention_pair_flops(decode=False)) * pairs * (1.0 + prof.attn_half_tokens / safe_c)
    t = np.where(c > 0, prof.attn_launch_s + flops / (gpu.bf16_flops_per_s * prof.attn_compute_efficiency), 0.0)
    return float(t) if t.ndim == 0 else t


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.yaml"))
