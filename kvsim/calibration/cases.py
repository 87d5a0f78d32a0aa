"""Random paged-attention inputs (seeded) for correctness checks on any device.

:func:`make_decode_case` builds a paged cache whose blocks are scattered in random physical order
(as after allocator churn), a block table with one spare column (so reading past a sequence's
last block would hit a real but wrong block, not unmapped memory), and optional fp8 data with
per-tensor or per-head scales chosen so values use the e4m3 range.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

TORCH_KV_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
FP8_MAX = 448.0


@dataclass
class DecodeCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    context_lens: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None

    def kwargs(self) -> dict:
        return {"k_scale": self.k_scale, "v_scale": self.v_scale}


def quantize_fp8(x: torch.Tensor, per_head: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., Hkv, D] float -> (e4m3 tensor, fp32 scale [1] or [Hkv]) with x ~= q * scale."""
    if per_head:
        amax = x.abs().amax(dim=tuple(i for i in range(x.dim()) if i != x.dim() - 2)).float()
    else:
        amax = x.abs().amax().float().reshape(1)
    scale = (amax / FP8_MAX).clamp_min(1e-12)
    shape = [1] * x.dim()
    if per_head:
        shape[-2] = scale.numel()
    return (x.float() / scale.view(shape)).to(torch.float8_e4m3fn), scale.contiguous()


def make_decode_case(*, context_lens: list[int], num_q_heads: int, num_kv_heads: int, head_dim: int,
                     block_size: int, kv_dtype: str = "fp16", q_dtype: torch.dtype | None = None,
                     per_head_scale: bool = False, seed: int = 0, device: str | torch.device = "cpu",
                     extra_blocks: int = 3) -> DecodeCase:
    """A ragged batch over a randomly scattered paged cache. Values ~ N(0, 1) (never zeros)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    num_seqs = len(context_lens)
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    max_blocks = max(blocks_per_seq) + 1
    num_blocks = sum(blocks_per_seq) + extra_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.zeros((num_seqs, max_blocks), dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        table[i, :nb] = perm[used:used + nb].to(torch.int32)
        used += nb
        # Spare column points at some other sequence's block: an unmasked over-read gives wrong numbers.
        table[i, nb:] = perm[(used + i) % num_blocks].to(torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    if q_dtype is None:
        q_dtype = torch.bfloat16 if kv_dtype == "fp8" else TORCH_KV_DTYPES[kv_dtype]
    q = torch.randn((num_seqs, num_q_heads, head_dim), generator=gen).to(q_dtype)
    k_scale = v_scale = None
    if kv_dtype == "fp8":
        k, k_scale = quantize_fp8(k, per_head_scale)
        v, v_scale = quantize_fp8(v, per_head_scale)
    else:
        k, v = k.to(TORCH_KV_DTYPES[kv_dtype]), v.to(TORCH_KV_DTYPES[kv_dtype])
    dev = torch.device(device)
    move = (lambda t: None if t is None else t.to(dev))
    return DecodeCase(move(q), move(k), move(v), move(table), move(torch.tensor(context_lens, dtype=torch.int32)),
                      move(k_scale), move(v_scale))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error ||out - ref|| / ||ref|| in fp64 (NaN if out has any NaN)."""
    out64, ref64 = out.double(), ref.double()
    if torch.isnan(out64).any():
        return float("nan")
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30))
