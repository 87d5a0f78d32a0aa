"""PagedAttention decode in Triton: one query token per sequence against a paged KV cache.

Layout (vLLM's "NHD" paged layout, one layer)::

    q            [num_seqs, num_q_heads, head_dim]            fp16 | bf16
    k_cache      [num_blocks, block_size, num_kv_heads, head_dim]  fp16 | bf16 | float8_e4m3fn
    v_cache      same as k_cache
    block_table  [num_seqs, max_blocks_per_seq] int32: logical block j of sequence i lives in
                 physical block ``block_table[i, j]``
    context_lens [num_seqs] int32, >= 1: tokens of KV each sequence attends to (ragged)
    k_scale/v_scale  fp32, shape [1] (per tensor) or [num_kv_heads] (per head); fp8 only

Design
------
* One program per (sequence, kv head[, split]). It loads the whole query *group* (the
  ``num_q_heads / num_kv_heads`` query heads that share the kv head, padded to ``BLOCK_G``) so each
  K/V tile is read from memory once per group: that is what GQA saves.
* The token loop walks ``BLOCK_N`` tokens at a time, independent of the block size. Each token's
  physical address is ``block_table[seq, t // block_size] * stride_block + (t % block_size) *
  stride_token``, so any block size >= 1 works (no power-of-two requirement), and a tile may span
  several small blocks or be a slice of one large block.
* Online softmax in fp32 (running max ``m``, normaliser ``l``, accumulator ``acc``), base-2
  exponentials with ``log2(e)`` folded into the score scale.
* fp8: the per-tensor / per-head K scale is folded into the score scale and the V scale into the
  output, so dequantisation costs no per-element multiply.
* Split-K (flash-decoding): with ``num_splits > 1`` the context is cut into equal, ``BLOCK_N``-
  aligned token ranges; each program writes a normalised partial output and its log2-sum-exp into
  an fp32 workspace, and :func:`_split_reduce_kernel` combines them. Splits that start past a
  short sequence's end write ``lse = -inf`` and a zero output, which the reduce weights by zero.
* Two ways to form ``q.k`` and ``p.v``: ``USE_DOT`` (tensor cores, for GQA groups; the group is
  padded to 16 rows) or a broadcast multiply + sum (MHA, where a 1-row dot would waste the unit).
  In Triton's CPU interpreter ``tl.dot`` on bf16 operands is wrong, so there ``DOT_FP32`` casts the
  operands to fp32 first; on a GPU the operands stay 16-bit with fp32 accumulation.
* Every load is masked (the interpreter does not catch out-of-bounds reads; a GPU would read
  garbage): tokens past ``end``, padded query rows and padded head-dim lanes.

Invariant: every element of ``out[:num_seqs, :num_q_heads, :head_dim]`` is written by one launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvsim.calibration._deps import interpreter_requested

LOG2E = 1.4426950408889634
MAX_SPLITS = 64
FP8_DTYPES = (torch.float8_e4m3fn,)


# Longer than a screen on purpose: a Triton kernel body is one compiled program (a helper would be
# another @triton.jit function inlined into it, splitting one loop's state across signatures);
# its steps are commented in order below.
@triton.jit
def _paged_decode_kernel(
    Q, K_cache, V_cache, Block_table, Context_lens, K_scale, V_scale,
    Out, Lse,
    score_scale_log2,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_tok, stride_k_head,
    stride_v_block, stride_v_tok, stride_v_head,
    stride_bt_seq,
    stride_o_seq, stride_o_head, stride_o_split,
    stride_l_seq, stride_l_head,
    block_size, tokens_per_split,
    QUERY_GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr,
    HAS_SCALE: tl.constexpr, SCALE_PER_HEAD: tl.constexpr, SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq64 = seq.to(tl.int64)

    ctx_len = tl.load(Context_lens + seq)
    start = split * tokens_per_split
    end = tl.minimum(ctx_len, start + tokens_per_split)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < QUERY_GROUP
    d_mask = offs_d < HEAD_DIM
    q_heads = kv_head * QUERY_GROUP + offs_g
    q = tl.load(Q + seq64 * stride_q_seq + q_heads[:, None] * stride_q_head + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    score_scale = score_scale_log2
    if HAS_SCALE:
        if SCALE_PER_HEAD:
            k_scale = tl.load(K_scale + kv_head)
            v_scale = tl.load(V_scale + kv_head)
        else:
            k_scale = tl.load(K_scale)
            v_scale = tl.load(V_scale)
        score_scale = score_scale * k_scale

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)

    k_base = K_cache + kv_head * stride_k_head
    v_base = V_cache + kv_head * stride_v_head
    bt_base = Block_table + seq64 * stride_bt_seq
    for tile_start in range(start, end, BLOCK_N):
        offs_t = tile_start + tl.arange(0, BLOCK_N)
        t_mask = offs_t < end
        block_ids = tl.load(bt_base + offs_t // block_size, mask=t_mask, other=0).to(tl.int64)
        in_block = (offs_t % block_size).to(tl.int64)
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + block_ids[:, None] * stride_k_block + in_block[:, None] * stride_k_tok
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        if USE_DOT:
            if DOT_FP32:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k.to(q.dtype)))
        else:
            s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        s = tl.where(t_mask[None, :], s * score_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + block_ids[:, None] * stride_v_block + in_block[:, None] * stride_v_tok
                    + offs_d[None, :], mask=kv_mask, other=0.0)
        if USE_DOT:
            if DOT_FP32:
                pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
        else:
            pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # An empty split (start >= ctx_len) has l_i == 0: write 0 and lse = -inf (weight 0).
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_safe[:, None]
        if HAS_SCALE:
            out = out * v_scale
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(Out + seq64 * stride_o_seq + q_heads[:, None] * stride_o_head + split * stride_o_split
                 + offs_d[None, :], out, mask=out_mask)
        tl.store(Lse + seq64 * stride_l_seq + q_heads * stride_l_head + split, lse, mask=g_mask)
    else:
        out = acc / l_i[:, None]
        if HAS_SCALE:
            out = out * v_scale
        tl.store(Out + seq64 * stride_o_seq + q_heads[:, None] * stride_o_head + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=out_mask)


@triton.jit
def _split_reduce_kernel(
    Part, Lse, Out, num_splits,
    stride_p_seq, stride_p_head, stride_p_split,
    stride_l_seq, stride_l_head,
    stride_o_seq, stride_o_head,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """out = sum_j 2^(lse_j - m) o_j / sum_j 2^(lse_j - m): exact merge of normalised partials."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(Lse + seq * stride_l_seq + head * stride_l_head + offs_s, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.where(s_mask, tl.exp2(lse - m), 0.0)
    part = tl.load(Part + seq * stride_p_seq + head * stride_p_head + offs_s[:, None] * stride_p_split
                   + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
    tl.store(Out + seq * stride_o_seq + head * stride_o_head + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


@dataclass(frozen=True)
class DecodeLaunch:
    """The launch parameters :func:`paged_decode` chose (recorded in benchmark rows)."""

    num_splits: int
    tokens_per_split: int
    block_n: int
    use_dot: bool
    dot_fp32: bool


def _is_interpreted(t: torch.Tensor) -> bool:
    """CPU tensors only run in the interpreter; with TRITON_INTERPRET=1 even CUDA tensors do."""
    return t.device.type == "cpu" or interpreter_requested()


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8  # the interpreter has no SMs; any small number exercises the split heuristic


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, sms: int,
                      min_tokens_per_split: int = 256, max_splits: int = MAX_SPLITS) -> int:
    """Flash-decoding heuristic: split only when (seq, kv head) programs cannot fill the GPU twice
    over, and never into splits shorter than ``min_tokens_per_split`` tokens."""
    programs = num_seqs * num_kv_heads
    if programs >= 2 * sms:
        return 1
    want = -(-2 * sms // programs)
    by_len = max(1, max_context_len // min_tokens_per_split)
    return max(1, min(want, by_len, max_splits))


def plan_launch(q: torch.Tensor, k_cache: torch.Tensor, max_context_len: int, num_splits: int | None,
                block_n: int | None, use_dot: bool | None) -> DecodeLaunch:
    num_seqs, num_q_heads, _ = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    interp = _is_interpreted(q)
    if use_dot is None:
        use_dot = group > 1
    if block_n is None:
        block_n = 16 if interp else 64  # small tiles keep interpreter runs fast
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16 (tl.dot minimum), got {block_n}")
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_context_len, num_sms(q.device))
    num_splits = max(1, min(int(num_splits), MAX_SPLITS))
    tokens_per_split = -(-max(1, -(-max_context_len // num_splits)) // block_n) * block_n
    if num_splits > 1:
        num_splits = max(1, -(-max_context_len // tokens_per_split))  # drop splits that are empty for all
    return DecodeLaunch(num_splits, tokens_per_split, block_n, bool(use_dot), interp)


def _check_inputs(q, k_cache, v_cache, block_table, context_lens, k_scale, v_scale) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"expected q [S,Hq,D] and k/v cache [blocks,block_size,Hkv,D]; got "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or num_q_heads % num_kv_heads:
        raise ValueError(f"head geometry mismatch: q heads {num_q_heads}, kv heads {num_kv_heads}, "
                         f"head_dim q {head_dim} vs cache {k_cache.shape[3]}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"q must be fp16 or bf16, got {q.dtype}")
    if k_cache.dtype not in (torch.float16, torch.bfloat16, *FP8_DTYPES):
        raise ValueError(f"unsupported KV dtype {k_cache.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")
    if block_table.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError("block_table and context_lens must be int32")
    if block_table.shape[0] != num_seqs or context_lens.shape != (num_seqs,):
        raise ValueError("block_table / context_lens must have one row per sequence")
    if block_table.stride(-1) != 1:
        raise ValueError("block_table must be contiguous along blocks")
    if k_cache.dtype in FP8_DTYPES:
        if k_scale is None or v_scale is None:
            raise ValueError("fp8 KV needs k_scale and v_scale")
        if q.device.type == "cuda" and torch.cuda.get_device_capability(q.device) < (8, 9):
            raise NotImplementedError("fp8 e4m3 KV needs compute capability >= 8.9 (Ada/Hopper)")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is not None and (s.dtype != torch.float32 or s.numel() not in (1, num_kv_heads)):
            raise ValueError(f"{name} must be fp32 with 1 (per tensor) or {num_kv_heads} (per head) elements")
    if q.device.type == "cpu" and not interpreter_requested():
        raise RuntimeError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")


# Longer than a screen: a long docstring (the calling contract), then the launch: work buffers
# and two kernel launches whose ~30 positional strides and constexprs must line up with the
# kernels' signatures, kept in one place (a helper would pass them all a second time).
def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    sm_scale: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = 1,
    max_context_len: int | None = None,
    block_n: int | None = None,
    use_dot: bool | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Decode attention over a paged cache; returns ``out`` ([num_seqs, num_q_heads, head_dim]).

    ``num_splits=1`` is the single-pass kernel; ``None`` picks a split count with
    :func:`choose_num_splits`; ``> 1`` forces split-K. ``max_context_len`` (a host int, >= every
    context length) sizes the splits; pass it when timing, since computing it reads the GPU and
    synchronises. ``out`` may be any float dtype (fp32 for exact comparisons). ``workspace`` is
    ``(partial [S, Hq, >=splits, D] fp32, lse [S, Hq, >=splits] fp32)`` for split-K; allocated if
    omitted.
    """
    _check_inputs(q, k_cache, v_cache, block_table, context_lens, k_scale, v_scale)
    num_seqs, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if max_context_len is None:
        max_context_len = int(context_lens.max().item()) if num_seqs else 0
        if num_seqs and int(context_lens.min().item()) < 1:
            raise ValueError("every context length must be >= 1")
        if max_context_len > block_table.shape[1] * block_size:
            raise ValueError(f"context length {max_context_len} exceeds the block table's "
                             f"{block_table.shape[1]} blocks x {block_size} tokens")
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if out.shape != q.shape or out.stride(-1) != 1:
        raise ValueError(f"out must have shape {tuple(q.shape)} and be contiguous in head_dim")
    launch = plan_launch(q, k_cache, max_context_len, num_splits, block_n, use_dot)
    group = num_q_heads // num_kv_heads
    block_g = max(16 if launch.use_dot else 1, triton.next_power_of_2(group))
    block_d = max(16, triton.next_power_of_2(head_dim))
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    has_scale = k_scale is not None
    scale_dummy = k_scale if has_scale else context_lens  # never read when HAS_SCALE is False
    per_head = bool(has_scale and k_scale.numel() == num_kv_heads and num_kv_heads > 1)
    split = launch.num_splits > 1
    if split:
        if workspace is None:
            part = torch.empty((num_seqs, num_q_heads, launch.num_splits, head_dim), dtype=torch.float32,
                               device=q.device)
            lse = torch.empty((num_seqs, num_q_heads, launch.num_splits), dtype=torch.float32, device=q.device)
        else:
            part, lse = workspace
            if part.shape[2] < launch.num_splits or lse.shape[2] < launch.num_splits:
                raise ValueError(f"workspace has {part.shape[2]} splits, launch needs {launch.num_splits}")
        dst, dst_strides = part, (part.stride(0), part.stride(1), part.stride(2))
        lse_strides = (lse.stride(0), lse.stride(1))
    else:
        dst, dst_strides = out, (out.stride(0), out.stride(1), 0)
        lse, lse_strides = out, (0, 0)  # unused placeholder
    extra = {} if launch.dot_fp32 else {"num_warps": 4, "num_stages": 2}
    grid = (num_seqs, num_kv_heads, launch.num_splits)
    _paged_decode_kernel[grid](
        q, k_cache, v_cache, block_table, context_lens,
        scale_dummy, v_scale if has_scale else scale_dummy,
        dst, lse,
        sm_scale * LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        *dst_strides, *lse_strides,
        block_size, launch.tokens_per_split,
        QUERY_GROUP=group, BLOCK_G=block_g, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_N=launch.block_n,
        USE_DOT=launch.use_dot, DOT_FP32=launch.dot_fp32,
        HAS_SCALE=has_scale, SCALE_PER_HEAD=per_head, SPLIT=split,
        **extra,
    )
    if split:
        _split_reduce_kernel[(num_seqs, num_q_heads)](
            part, lse, out, launch.num_splits,
            part.stride(0), part.stride(1), part.stride(2),
            lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_S=max(2, triton.next_power_of_2(launch.num_splits)),
            **({} if launch.dot_fp32 else {"num_warps": 4}),
        )
    return out
