"""What ``kvsim calibrate`` measures: the grid, and its pruning to what fits the device.

Pure Python (no torch), so the grid can be printed, tested and stored in ``meta.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from kvsim.calibration_data import schema as S
from kvsim.hw import KV_DTYPES, ModelSpec

# Bytes per element of each KV dtype the kernels support (fp8 = e4m3 with fp32 scales).
KV_ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1}
MAX_BLOCK_SIZE = 512


@dataclass(frozen=True)
class Grid:
    batch_sizes: tuple[int, ...]
    context_lens: tuple[int, ...]
    block_sizes: tuple[int, ...]
    kv_dtypes: tuple[str, ...]
    gemm_tokens: tuple[int, ...]  # token counts a step's GEMMs see (prefill + decode tokens)
    lm_head_tokens: tuple[int, ...]  # sequences sampled per step
    prefill_new_tokens: tuple[int, ...]  # chunk lengths
    prefill_cached_tokens: tuple[int, ...]  # context already cached before the chunk
    prefill_block_sizes: tuple[int, ...]
    contiguous_dtypes: tuple[str, ...]  # baseline SDPA dtypes (fp8 has no dense SDPA)
    warmup: int
    repeats: int
    copy_bytes: int

    def validate(self) -> None:
        for bs in (*self.block_sizes, *self.prefill_block_sizes):
            if not 1 <= bs <= MAX_BLOCK_SIZE:
                raise ValueError(f"block size {bs} outside 1..{MAX_BLOCK_SIZE}")
        for dt in (*self.kv_dtypes, *self.contiguous_dtypes):
            if dt not in KV_ELEMENT_BYTES:
                raise ValueError(f"KV dtype {dt!r} not supported by the kernels; choose from "
                                 f"{', '.join(KV_ELEMENT_BYTES)}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


GPU_GRID = Grid(
    batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    context_lens=(128, 256, 512, 1024, 2048, 4096, 8192),
    block_sizes=(16, 1, 512, 64, 8, 128, 32, 256),  # coarse-to-fine: a truncated run still spans the range
    kv_dtypes=("fp16", "fp8", "bf16"),  # fp16 first: kvsim's default KV dtype
    gemm_tokens=(1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                 6144, 8192),
    lm_head_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    prefill_new_tokens=(16, 64, 256, 1024, 2048, 4096),
    prefill_cached_tokens=(0, 512, 2048, 4096),
    prefill_block_sizes=(16, 1, 128),
    contiguous_dtypes=("fp16", "bf16"),
    warmup=3,
    repeats=20,
    copy_bytes=1 << 30,
)

CPU_GRID = Grid(  # plumbing only: small enough for CI, wide enough for every table to interpolate
    batch_sizes=(1, 4),
    context_lens=(16, 256),
    block_sizes=(16, 1, 64),
    kv_dtypes=("fp16", "fp8"),
    gemm_tokens=(1, 16, 64),
    lm_head_tokens=(1, 8),
    prefill_new_tokens=(16, 64),
    prefill_cached_tokens=(0, 64),
    prefill_block_sizes=(16, 1),
    contiguous_dtypes=("fp16",),
    warmup=1,
    repeats=3,
    copy_bytes=32 << 20,
)


def kv_bytes_per_token_layer(model: ModelSpec, kv_dtype: str) -> int:
    """K + V bytes one token occupies in one layer (fp8 scales are per tensor/head: no per-token cost)."""
    return 2 * model.num_kv_heads * model.head_dim * KV_ELEMENT_BYTES[kv_dtype]


def gemm_shapes(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """op -> (N output features, K reduction dim) of each weight, as ``F.linear(x[T,K], W[N,K])``."""
    q_dim = model.num_attention_heads * model.head_dim
    kv_dim = model.num_kv_heads * model.head_dim
    up = (2 if model.gated_mlp else 1) * model.intermediate_size
    return {
        S.GEMM_QKV: (q_dim + 2 * kv_dim, model.hidden_size),
        S.GEMM_OUT: (model.hidden_size, q_dim),
        S.GEMM_MLP_UP: (up, model.hidden_size),
        S.GEMM_MLP_DOWN: (model.hidden_size, model.intermediate_size),
        S.GEMM_LM_HEAD: (model.vocab_size, model.hidden_size),
    }


def decode_points(grid: Grid, model: ModelSpec, kv_dtype: str, mem_budget_bytes: int) -> tuple[list, list]:
    """(kept, dropped) (batch, context) points.

    A point is dropped when its context exceeds the model's ``max_model_len_tokens``, or when two
    copies of its KV (the minimum rotation), padded to the largest block size, exceed the budget.
    """
    per_token = kv_bytes_per_token_layer(model, kv_dtype)
    pad = max(grid.block_sizes)
    kept, dropped = [], []
    for b in grid.batch_sizes:
        for c in grid.context_lens:
            if c > model.max_model_len_tokens:
                dropped.append((b, c, "context > max_model_len"))
            elif 2 * b * (c + pad) * per_token > mem_budget_bytes:
                dropped.append((b, c, "memory"))
            else:
                kept.append((b, c))
    return kept, dropped


def prefill_points(grid: Grid, model: ModelSpec) -> list[tuple[int, int]]:
    """(new, cached) points within the model's context window."""
    return [(n, c) for n in grid.prefill_new_tokens for c in grid.prefill_cached_tokens
            if n + c <= model.max_model_len_tokens]


def restrict(grid: Grid, *, kv_dtypes=None, block_sizes=None, repeats=None, warmup=None) -> Grid:
    """A copy of ``grid`` with command-line overrides applied (None keeps the grid's value)."""
    changes = {}
    if kv_dtypes:
        changes["kv_dtypes"] = tuple(kv_dtypes)
        changes["contiguous_dtypes"] = tuple(d for d in kv_dtypes if d != "fp8") or grid.contiguous_dtypes[:0]
    if block_sizes:
        changes["block_sizes"] = tuple(block_sizes)
        changes["prefill_block_sizes"] = tuple(b for b in grid.prefill_block_sizes if b in block_sizes) or (
            tuple(block_sizes)[:1])
    if repeats is not None:
        changes["repeats"] = repeats
    if warmup is not None:
        changes["warmup"] = warmup
    g = replace(grid, **changes)
    g.validate()
    return g


assert set(KV_ELEMENT_BYTES) <= set(KV_DTYPES)
