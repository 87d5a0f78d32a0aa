"""The Triton PagedAttention decode kernel under TRITON_INTERPRET=1 vs the fp32 torch reference.

Every launch writes into an output poisoned with NaN, so an element the kernel fails to write
fails the check (``rel_err`` is NaN for any NaN). Shapes are tiny: the interpreter runs numpy.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvsim.calibration.cases import make_decode_case, rel_err  # noqa: E402
from kvsim.calibration.kernels import choose_num_splits, paged_decode, plan_launch  # noqa: E402
from kvsim.calibration.reference import paged_decode_reference  # noqa: E402
from kvsim.calibration.selfcheck import fp8_supported  # noqa: E402

TOL = 1e-3
RAGGED = [1, 37, 130, 64]  # 1 token, partial blocks, > one 128-block, exact multiples of 16/64

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs Triton's CPU interpreter (TRITON_INTERPRET=1 before import)")


def run_case(*, block_size, kv_dtype="fp16", q_heads=4, kv_heads=4, head_dim=32, lens=RAGGED, num_splits=1,
             per_head_scale=False, use_dot=None, seed=0, out_dtype=torch.float32, workspace=None):
    c = make_decode_case(context_lens=lens, num_q_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim,
                         block_size=block_size, kv_dtype=kv_dtype, per_head_scale=per_head_scale, seed=seed)
    out = torch.full(c.q.shape, float("nan"), dtype=out_dtype)
    res = paged_decode(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens, out=out, num_splits=num_splits,
                       use_dot=use_dot, workspace=workspace, **c.kwargs())
    assert res is out
    ref = paged_decode_reference(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens, **c.kwargs())
    assert torch.isfinite(out).all(), "some output element was not written (NaN poison survived)"
    return out, ref


@pytest.mark.parametrize("block_size", [1, 8, 16, 64, 128])
@pytest.mark.parametrize("gqa,kv_dtype", [(1, "fp16"), (4, "bf16")])
def test_decode_matches_reference(block_size, gqa, kv_dtype):
    out, ref = run_case(block_size=block_size, kv_dtype=kv_dtype, q_heads=2 * gqa, kv_heads=2,
                        seed=block_size * 10 + gqa)
    assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize("gqa,kv_dtype", [(1, "bf16"), (4, "fp16")])
def test_decode_other_dtype_pairing(gqa, kv_dtype):
    out, ref = run_case(block_size=16, kv_dtype=kv_dtype, q_heads=2 * gqa, kv_heads=2, seed=gqa)
    assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize("block_size,gqa,splits", [(1, 1, 3), (16, 4, 3), (128, 4, 2), (8, 1, None), (64, 4, 16)])
def test_split_k_matches_reference(block_size, gqa, splits):
    # splits=None: the heuristic; 16 splits (of 16 tokens) leave most splits of the short sequences empty
    out, ref = run_case(block_size=block_size, kv_dtype="bf16", q_heads=2 * gqa, kv_heads=2, num_splits=splits,
                        lens=[1, 37, 300, 64], seed=7)
    assert rel_err(out, ref) <= TOL


def test_split_k_overwrites_poisoned_workspace():
    part = torch.full((4, 8, 4, 32), float("nan"))
    lse = torch.full((4, 8, 4), float("nan"))
    out, ref = run_case(block_size=16, q_heads=8, kv_heads=2, num_splits=4, lens=[5, 100, 300, 64],
                        workspace=(part, lse))
    assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize("use_dot", [True, False])
def test_gqa_dot_and_broadcast_paths_agree(use_dot):
    out, ref = run_case(block_size=16, kv_dtype="bf16", q_heads=8, kv_heads=2, use_dot=use_dot, seed=3)
    assert rel_err(out, ref) <= TOL


def test_non_power_of_two_block_and_head_dim():
    out, ref = run_case(block_size=24, q_heads=4, kv_heads=4, head_dim=80, seed=5)  # phi-2's head_dim
    assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize("kv_dtype,tol", [("fp16", 1e-3), ("bf16", 4e-3)])
def test_native_output_dtype(kv_dtype, tol):
    """Output stored in the query dtype. The store's rounding is the only extra error: fp16 keeps
    11 significant bits (< 1e-3); bf16 keeps 8, i.e. up to 2^-8 = 3.9e-3 relative per element (and
    the interpreter truncates fp32 -> bf16 where a GPU rounds to nearest)."""
    q_dtype = torch.float16 if kv_dtype == "fp16" else torch.bfloat16
    out, ref = run_case(block_size=16, kv_dtype=kv_dtype, q_heads=8, kv_heads=2, out_dtype=q_dtype)
    assert out.dtype == q_dtype
    assert rel_err(out.float(), ref) <= tol


@pytest.mark.parametrize("per_head,splits", [(False, 1), (True, 1), (True, 3), (False, 3)])
def test_fp8_e4m3_with_scales(per_head, splits):
    ok, why = fp8_supported(torch.device("cpu"))
    if not ok:
        pytest.skip(why)
    try:
        out, ref = run_case(block_size=8, kv_dtype="fp8", q_heads=8, kv_heads=2, per_head_scale=per_head,
                            num_splits=splits, seed=11)
    except Exception as e:  # the interpreter may lack e4m3 conversions on some numpy/triton builds
        if "float8" in str(e).lower() or "fp8" in str(e).lower():
            pytest.skip(f"Triton interpreter cannot run fp8 here: {e}")
        raise
    assert rel_err(out, ref) <= TOL


def test_block_table_tail_is_never_read():
    """Blocks past a sequence's context point at other sequences' data; results must not change
    when those entries change (masked loads)."""
    c = make_decode_case(context_lens=[5, 21], num_q_heads=4, num_kv_heads=4, head_dim=32, block_size=8, seed=2)
    out1 = torch.full(c.q.shape, float("nan"))
    paged_decode(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens, out=out1)
    table = c.block_table.clone()
    table[0, 1:] = 0
    table[1, 3:] = 1
    out2 = torch.full(c.q.shape, float("nan"))
    paged_decode(c.q, c.k_cache, c.v_cache, table, c.context_lens, out=out2)
    assert torch.equal(out1, out2)


def test_input_validation():
    c = make_decode_case(context_lens=[4], num_q_heads=4, num_kv_heads=4, head_dim=32, block_size=4)
    with pytest.raises(ValueError, match="int32"):
        paged_decode(c.q, c.k_cache, c.v_cache, c.block_table.long(), c.context_lens)
    with pytest.raises(ValueError, match="q must be fp16 or bf16"):
        paged_decode(c.q.float(), c.k_cache, c.v_cache, c.block_table, c.context_lens)
    with pytest.raises(ValueError, match="exceeds the block table"):
        paged_decode(c.q, c.k_cache, c.v_cache, c.block_table, c.context_lens + 100)
    with pytest.raises(ValueError, match="head geometry"):
        paged_decode(c.q[:, :3], c.k_cache, c.v_cache, c.block_table, c.context_lens)


def test_split_heuristic():
    assert choose_num_splits(256, 8, 8192, sms=132) == 1  # grid already fills the GPU
    assert choose_num_splits(1, 8, 8192, sms=132) == 32  # 2 waves: ceil(264 / 8) = 33, capped by 8192 // 256
    assert choose_num_splits(1, 8, 300, sms=132) == 1  # too short to split
    q = torch.zeros(1, 8, 32, dtype=torch.float16)
    k = torch.zeros(4, 16, 2, 32, dtype=torch.float16)
    launch = plan_launch(q, k, max_context_len=100, num_splits=64, block_n=16, use_dot=None)
    # splits are BLOCK_N-aligned and none is empty for the longest sequence
    assert launch.tokens_per_split % 16 == 0
    assert (launch.num_splits - 1) * launch.tokens_per_split < 100 <= launch.num_splits * launch.tokens_per_split
    assert launch.use_dot  # GQA group of 4
