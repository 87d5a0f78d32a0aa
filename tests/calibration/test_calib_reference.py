"""The torch attention paths: reference decode vs a naive per-sequence loop, the calibrated prefill
path (gather + SDPA, offset causal mask) vs the fp32 prefill reference, and the contiguous baseline."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kvsim.calibration.cases import make_decode_case, quantize_fp8, rel_err  # noqa: E402
from kvsim.calibration.reference import (  # noqa: E402
    contiguous_decode,
    gather_tokens,
    paged_decode_reference,
    paged_prefill,
    paged_prefill_reference,
)


def naive_decode(c):
    """Token by token, head by head: the definition of attention, no vectorisation tricks."""
    num_seqs, hq, d = c.q.shape
    hkv = c.k_cache.shape[2]
    out = torch.empty(num_seqs, hq, d, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(c.context_lens[s])
        k = gather_tokens(c.k_cache, c.block_table[s], n).double()
        v = gather_tokens(c.v_cache, c.block_table[s], n).double()
        for h in range(hq):
            kv_h = h // (hq // hkv)
            scores = (k[:, kv_h] @ c.q[s, h].double()) / math.sqrt(d)
            out[s, h] = torch.softmax(scores, 0) @ v[:, kv_h]
    return out


@pytest.mark.parametrize("block_size,gqa", [(1, 1), (16, 4), (5, 2)])
def test_reference_decode_is_attention(block_size, gqa):
    c = make_decode_case(context_lens=[3, 40, 17], num_q_heads=2 * gqa, num_kv_heads=2, head_dim=16,
                         block_size=block_size, kv_dtype="fp16", seed=4)
    ref = paged_decode_reference(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens)
    assert rel_err(ref, naive_decode(c)) <= 1e-6


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("cached", [0, 40])
@pytest.mark.parametrize("gqa", [1, 4])
def test_prefill_path_matches_reference(block_size, cached, gqa):
    new = 9
    c = make_decode_case(context_lens=[cached + new], num_q_heads=2 * gqa, num_kv_heads=2, head_dim=16,
                         block_size=block_size, kv_dtype="bf16", seed=cached + gqa)
    q = torch.randn(new, 2 * gqa, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = paged_prefill_reference(q, c.k_cache, c.v_cache, c.block_table[0], cached)
    out = paged_prefill(q, c.k_cache, c.v_cache, c.block_table[0], cached, compute_dtype=torch.float32)
    assert out.shape == (new, 2 * gqa, 16)
    assert rel_err(out, ref) <= 1e-5
    out16 = paged_prefill(q, c.k_cache, c.v_cache, c.block_table[0], cached)  # bf16 compute
    assert rel_err(out16.float(), ref) <= 1e-2


def test_prefill_last_query_equals_decode():
    """The last query of a chunk sees the whole context: it must equal a decode over that context."""
    cached, new = 30, 6
    c = make_decode_case(context_lens=[cached + new], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                         seed=9)
    q = torch.randn(new, 4, 16, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    pre = paged_prefill_reference(q, c.k_cache, c.v_cache, c.block_table[0], cached)
    dec = paged_decode_reference(q[-1:], c.k_cache, c.v_cache, c.block_table, c.context_lens)
    assert rel_err(pre[-1:], dec) <= 1e-6


def test_prefill_fp8_dequantises():
    c = make_decode_case(context_lens=[20], num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
                         kv_dtype="fp8", per_head_scale=True, seed=3)
    q = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref = paged_prefill_reference(q, c.k_cache, c.v_cache, c.block_table[0], 15, **c.kwargs())
    out = paged_prefill(q, c.k_cache, c.v_cache, c.block_table[0], 15, compute_dtype=torch.float32, **c.kwargs())
    assert rel_err(out, ref) <= 1e-5


def test_quantize_fp8_round_trip():
    x = torch.randn(10, 3, 2, 16, generator=torch.Generator().manual_seed(0))
    for per_head in (False, True):
        q, scale = quantize_fp8(x, per_head)
        assert q.dtype == torch.float8_e4m3fn and scale.numel() == (2 if per_head else 1)
        back = q.float() * (scale.view(1, 1, -1, 1) if per_head else scale)
        assert rel_err(back, x) < 0.05  # e4m3: 3 mantissa bits


def test_contiguous_baseline_matches_paged_reference():
    b, ctx, hq, hkv, d = 3, 25, 8, 2, 16
    c = make_decode_case(context_lens=[ctx] * b, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=4,
                         kv_dtype="fp16", seed=6)
    dense_k = torch.stack([gather_tokens(c.k_cache, c.block_table[i], ctx) for i in range(b)]).transpose(1, 2)
    dense_v = torch.stack([gather_tokens(c.v_cache, c.block_table[i], ctx) for i in range(b)]).transpose(1, 2)
    out = contiguous_decode(c.q.float(), dense_k.float().contiguous(), dense_v.float().contiguous())
    ref = paged_decode_reference(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens)
    assert rel_err(out, ref) <= 1e-5
