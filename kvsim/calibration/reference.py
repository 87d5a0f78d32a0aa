"""Torch attention paths: fp32 references, the paged prefill path, and the contiguous baseline.

* :func:`paged_decode_reference` -- gather each sequence's blocks, dequantise, softmax in fp32.
  The correctness oracle for the Triton kernel, and the decode path timed on CPU-only machines.
* :func:`paged_prefill_reference` -- the same for a prefill chunk (causal mask offset by the
  cached length), fp32 with an explicit softmax.
* :func:`paged_prefill` -- the prefill attention kvsim calibrates: per sequence, gather the blocks
  holding ``cached + new`` tokens into a dense [kv_heads, tokens, head_dim] tensor (dequantising
  fp8), then ``scaled_dot_product_attention`` with a boolean causal mask whose diagonal is offset
  by the cached length (query ``i`` sits at absolute position ``cached + i`` and sees keys
  ``0..cached+i``). This is the "chunked prefill over cached blocks" step of vLLM-style engines.
  Without cached context the mask is plain causal and SDPA's flash backend runs with native GQA;
  with cached context the KV heads are expanded for the memory-efficient backend (arbitrary masks).
* :func:`contiguous_decode` -- ``scaled_dot_product_attention`` on a dense, unpaged cache
  [batch, kv_heads, context, head_dim]: the baseline that shows what paging costs.

Shapes follow :mod:`kvsim.calibration.kernels`. Scales are fp32 tensors of 1 or ``kv_heads``
elements (fp8 only).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _dequant(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, head_axis: int) -> torch.Tensor:
    """Cast to ``dtype`` and multiply by a per-tensor or per-head scale (broadcast on ``head_axis``)."""
    y = x.to(dtype)
    if scale is None:
        return y
    shape = [1] * y.dim()
    if scale.numel() > 1:
        shape[head_axis] = scale.numel()
    return y * scale.to(dtype).view(shape)


def gather_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``cache[blocks]`` for any index shape. fp8 caches are gathered through a uint8 view: a
    bit-exact copy that does not depend on indexing kernels being built for float8 types."""
    if cache.element_size() == 1 and cache.dtype != torch.uint8:
        return cache.view(torch.uint8)[blocks].view(cache.dtype)
    return cache[blocks]


def gather_tokens(cache: torch.Tensor, block_row: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first ``num_tokens`` tokens of one sequence: [num_tokens, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    nblocks = -(-num_tokens // block_size)
    blocks = block_row[:nblocks].long()
    return gather_blocks(cache, blocks).reshape(nblocks * block_size, *cache.shape[2:])[:num_tokens]


def paged_decode_reference(q, k_cache, v_cache, block_table, context_lens, *, sm_scale=None,
                           k_scale=None, v_scale=None) -> torch.Tensor:
    """fp32 decode attention, vectorised over the batch; returns [num_seqs, num_q_heads, head_dim].

    Gathers ``max(context_lens)`` tokens for every sequence and masks each one's tail, so it is
    exact for ragged batches (at the cost of reading padding, irrelevant for a reference).
    """
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    lens = context_lens.long()
    max_len = int(lens.max().item())
    nblocks = -(-max_len // block_size)
    blocks = block_table[:, :nblocks].long()  # [S, nb]
    k = _dequant(gather_blocks(k_cache, blocks), k_scale, torch.float32, 3).reshape(num_seqs, nblocks * block_size,
                                                                      num_kv_heads, head_dim)[:, :max_len]
    v = _dequant(gather_blocks(v_cache, blocks), v_scale, torch.float32, 3).reshape(num_seqs, nblocks * block_size,
                                                                      num_kv_heads, head_dim)[:, :max_len]
    qf = q.float().view(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("skgd,stkd->skgt", qf, k) * sm_scale  # [S, Hkv, G, T]
    valid = torch.arange(max_len, device=q.device)[None, :] < lens[:, None]  # [S, T]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    out = torch.einsum("skgt,stkd->skgd", p, v)
    return out.reshape(num_seqs, num_q_heads, head_dim)


def _causal_offset_mask(new_tokens: int, total_tokens: int, device) -> torch.Tensor:
    """[new, total] bool, True where query i (absolute position total-new+i) may attend key j."""
    cached = total_tokens - new_tokens
    q_pos = cached + torch.arange(new_tokens, device=device)
    return torch.arange(total_tokens, device=device)[None, :] <= q_pos[:, None]


def paged_prefill_reference(q, k_cache, v_cache, block_row, cached_len: int, *, sm_scale=None,
                            k_scale=None, v_scale=None) -> torch.Tensor:
    """fp32 attention of one prefill chunk q [new, Hq, D] over ``cached_len + new`` paged tokens."""
    new, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    total = cached_len + new
    k = _dequant(gather_tokens(k_cache, block_row, total), k_scale, torch.float32, 1)
    v = _dequant(gather_tokens(v_cache, block_row, total), v_scale, torch.float32, 1)
    k = k.repeat_interleave(group, dim=1)  # [T, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,thd->hnt", q.float(), k) * sm_scale
    scores = scores.masked_fill(~_causal_offset_mask(new, total, q.device)[None], float("-inf"))
    return torch.einsum("hnt,thd->nhd", torch.softmax(scores, dim=-1), v)


def paged_prefill(q, k_cache, v_cache, block_row, cached_len: int, *, sm_scale=None, k_scale=None,
                  v_scale=None, compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The calibrated prefill path for one sequence: gather + SDPA with an offset causal mask.

    Returns [new, Hq, D] in ``compute_dtype`` (default: q's dtype). fp8 KV is dequantised to the
    compute dtype during the gather, as an engine without an fp8 attention kernel would.
    """
    new, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    dtype = compute_dtype or q.dtype
    total = cached_len + new
    k = _dequant(gather_tokens(k_cache, block_row, total), k_scale, dtype, 1).transpose(0, 1)  # [Hkv, T, D]
    v = _dequant(gather_tokens(v_cache, block_row, total), v_scale, dtype, 1).transpose(0, 1)
    qh = q.to(dtype).transpose(0, 1)  # [Hq, new, D]
    if cached_len == 0:
        # Plain causal: lets SDPA pick its flash backend (no explicit mask tensor).
        out = F.scaled_dot_product_attention(qh[None], k[None], v[None], is_causal=True, scale=sm_scale,
                                             enable_gqa=num_q_heads != num_kv_heads)
    else:
        # An explicit mask rules out the flash backend, and torch's GQA support (enable_gqa) is
        # flash/math only: expand the kv heads so the memory-efficient backend can run.
        group = num_q_heads // num_kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
        mask = _causal_offset_mask(new, total, q.device)
        out = F.scaled_dot_product_attention(qh[None], k[None], v[None], attn_mask=mask[None, None], scale=sm_scale)
    return out[0].transpose(0, 1)


def contiguous_decode(q, k_dense, v_dense, *, sm_scale=None) -> torch.Tensor:
    """Baseline decode on an unpaged cache: q [B, Hq, D], k/v [B, Hkv, T, D] (all sequences T long)."""
    num_q_heads, num_kv_heads = q.shape[1], k_dense.shape[1]
    out = F.scaled_dot_product_attention(q[:, :, None, :], k_dense, v_dense, scale=sm_scale,
                                         enable_gqa=num_q_heads != num_kv_heads)
    return out[:, :, 0, :]
