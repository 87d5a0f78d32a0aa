"""The measured operations: each ``measure_*`` times one op over its grid and returns CSV rows.

Every row describes one layer at tensor-parallel degree 1 (see :mod:`kvsim.calibration_data.schema`).
Inputs are random (never zeros: zeros can run faster than real data), seeded, and rotated so a
timed call does not find its inputs in cache (:func:`kvsim.calibration.timer.rotations_for`).
``out_of_time()`` is polled before each point; a phase that runs out stops cleanly and reports the
points it skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kvsim.calibration_data import schema as S
from kvsim.calibration.cases import TORCH_KV_DTYPES
from kvsim.calibration.grid import KV_ELEMENT_BYTES, gemm_shapes, kv_bytes_per_token_layer
from kvsim.calibration.reference import contiguous_decode, paged_decode_reference, paged_prefill
from kvsim.calibration.timer import Timer, Timing, rotations_for
from kvsim.hw import ModelSpec

_TORCH_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
                torch.float8_e4m3fn: "fp8", torch.uint8: "u8"}


@dataclass
class BenchEnv:
    device: torch.device
    model: ModelSpec
    timer: Timer
    cache_bytes: int  # last-level cache to defeat (GPU L2)
    mem_budget_bytes: int  # for one phase's buffers
    decode_impl: str  # schema.IMPL_TRITON | IMPL_TORCH_REFERENCE | IMPL_TRITON_INTERPRETER
    act_dtype: torch.dtype  # activations/weights of the GEMMs (bf16)
    seed: int = 0
    log: Callable[[str], None] = print
    skipped: list[str] = field(default_factory=list)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def generator(self, salt: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + salt)

    def attn_compute_dtype(self, kv_dtype: str) -> torch.dtype:
        """Dtype of torch attention arithmetic: the query dtype on a GPU; fp32 on CPU, where 16-bit
        SDPA kernels are slow enough to distort even plumbing runs."""
        if not self.is_cuda:
            return torch.float32
        return torch.bfloat16 if kv_dtype == "fp8" else TORCH_KV_DTYPES[kv_dtype]


def fill_random(numel: int, dtype: torch.dtype, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """A 1-D tensor of N(0,1) values (cast to ``dtype``); beyond 1M elements the random prefix is
    tiled by doubling copies, which is as good as fresh randomness for timing and far cheaper."""
    chunk = min(numel, 1 << 20)
    out = torch.empty(numel, dtype=dtype, device=device)
    if dtype == torch.uint8:
        base = torch.randint(0, 256, (chunk,), generator=gen, device=device, dtype=torch.int32).to(dtype)
    else:
        base = torch.randn(chunk, generator=gen, device=device, dtype=torch.float32).to(dtype)
    out[:chunk] = base
    filled = chunk
    while filled < numel:
        n = min(filled, numel - filled)
        out[filled:filled + n] = out[:n]
        filled += n
    return out


def _row(env: BenchEnv, op: str, impl: str, t: Timing, **kw) -> dict:
    r = {c: 0 for c in S.COLUMNS}
    r.update(op=op, impl=impl, device=env.device.type, splits=1, median_s=t.median_s, p10_s=t.p10_s,
             p90_s=t.p90_s, mean_s=t.mean_s, repeats=t.repeats)
    r.update(kw)
    if r["kv_bytes"]:
        r["achieved_bandwidth_bytes_per_s"] = r["kv_bytes"] / t.median_s
    elif r["bytes_moved"]:
        r["achieved_bandwidth_bytes_per_s"] = r["bytes_moved"] / t.median_s
    if r["flops"]:
        r["achieved_flops_per_s"] = r["flops"] / t.median_s
    return r


def _free(env: BenchEnv) -> None:
    if env.is_cuda:
        torch.cuda.synchronize(env.device)
        torch.cuda.empty_cache()


# -- copy ------------------------------------------------------------------------------------------
def measure_copy(env: BenchEnv, nbytes: int) -> dict:
    src = fill_random(nbytes, torch.uint8, env.device, env.generator(1))
    dst = torch.empty_like(src)
    t = env.timer.measure(lambda i: dst.copy_(src))
    row = _row(env, S.COPY, "tensor.copy_", t, dtype="u8", compute_dtype="u8", bytes_moved=2 * nbytes,
               tokens=0, batch=0)
    del src, dst
    _free(env)
    return row


# -- GEMMs and elementwise ------------------------------------------------------------------------------
def measure_gemms(env: BenchEnv, tokens: tuple[int, ...], lm_head_tokens: tuple[int, ...],
                  out_of_time: Callable[[], bool], done: frozenset = frozenset()) -> list[dict]:
    """Each GEMM weight over its token counts, leaving out the (op, tokens) pairs in ``done``."""
    rows: list[dict] = []
    dt = env.act_dtype
    el = torch.tensor([], dtype=dt).element_size()
    for salt, (op, (n, k)) in enumerate(gemm_shapes(env.model).items()):
        ms = [m for m in (lm_head_tokens if op == S.GEMM_LM_HEAD else tokens) if (op, m) not in done]
        if not ms:
            continue
        if out_of_time():  # no weights allocated for points that will not run
            env.skipped += [f"{op} tokens={m}" for m in ms]
            continue
        w_bytes = n * k * el
        n_rot = rotations_for(w_bytes, max(1, env.mem_budget_bytes // w_bytes), env.timer.calls, env.cache_bytes)
        gen = env.generator(100 + salt)
        weights = [fill_random(n * k, dt, env.device, gen).view(n, k) for _ in range(n_rot)]
        for m in ms:
            if out_of_time():
                env.skipped.append(f"{op} tokens={m}")
                continue
            x = fill_random(m * k, dt, env.device, gen).view(m, k) * 0.05
            t = env.timer.measure(lambda i: F.linear(x, weights[i % n_rot]))
            rows.append(_row(env, op, "torch.nn.functional.linear", t, dtype=_TORCH_NAMES[dt],
                             compute_dtype=_TORCH_NAMES[dt], tokens=m, batch=m, gemm_n=n, gemm_k=k,
                             rotations=n_rot, flops=2 * m * n * k, bytes_moved=(m * k + n * k + m * n) * el))
        del weights
        _free(env)
        env.log(f"  {op}: {sum(r['op'] == op for r in rows)} points")
    return rows


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def measure_elementwise(env: BenchEnv, tokens: tuple[int, ...], out_of_time: Callable[[], bool],
                        done: frozenset = frozenset()) -> list[dict]:
    """Per layer: RMSNorm before attention and MLP, RoPE on q and k, SiLU(gate)*up, two residual
    adds -- the non-GEMM, non-attention work, as separate eager torch kernels."""
    m, dt = env.model, env.act_dtype
    h, d, i_dim = m.hidden_size, m.head_dim, m.intermediate_size
    gen = env.generator(200)
    w1 = torch.ones(h, dtype=dt, device=env.device)
    w2 = torch.ones(h, dtype=dt, device=env.device)
    rows = []
    el = torch.tensor([], dtype=dt).element_size()
    for tok in tokens:
        if (S.ELEMENTWISE, tok) in done:
            continue
        if out_of_time():
            env.skipped.append(f"elementwise tokens={tok}")
            continue
        rnd = lambda *shape: fill_random(int(torch.Size(shape).numel()), dt, env.device, gen).view(*shape)  # noqa: E731
        x, res = rnd(tok, h), rnd(tok, h)
        q, k = rnd(tok, m.num_attention_heads, d), rnd(tok, m.num_kv_heads, d)
        cos, sin = rnd(tok, 1, d), rnd(tok, 1, d)
        gu = rnd(tok, (2 if m.gated_mlp else 1) * i_dim)

        def layer(_i):
            F.rms_norm(x, (h,), w1, 1e-5)
            q * cos + _rotate_half(q) * sin
            k * cos + _rotate_half(k) * sin
            r = x + res
            F.rms_norm(r, (h,), w2, 1e-5)
            if m.gated_mlp:
                F.silu(gu[:, :i_dim]) * gu[:, i_dim:]
            else:
                F.gelu(gu)
            return r + x

        t = env.timer.measure(layer)
        act = tok * (6 * h + 2 * (m.num_attention_heads + m.num_kv_heads) * d + 2 * gu.shape[1]) * el
        rows.append(_row(env, S.ELEMENTWISE, "torch_eager", t, dtype=_TORCH_NAMES[dt], compute_dtype=_TORCH_NAMES[dt],
                         tokens=tok, batch=tok, bytes_moved=act))
    _free(env)
    return rows


# -- attention -----------------------------------------------------------------------------------------
class _KVPool:
    """One flat K and one flat V buffer of ``pool_tokens`` tokens, viewed as a paged cache for any
    block size (blocks cover a prefix of the buffer). Values N(0,1); fp8 with a per-tensor scale."""

    def __init__(self, env: BenchEnv, kv_dtype: str, pool_tokens: int, salt: int):
        m = env.model
        self.num_kv_heads, self.head_dim = m.num_kv_heads, m.head_dim
        self.per_token = m.num_kv_heads * m.head_dim
        self.tokens = pool_tokens
        self.dtype = TORCH_KV_DTYPES[kv_dtype]
        gen = env.generator(salt)
        self.k = fill_random(pool_tokens * self.per_token, self.dtype, env.device, gen)
        self.v = fill_random(pool_tokens * self.per_token, self.dtype, env.device, gen)
        if kv_dtype == "fp8":
            self.k_scale = torch.tensor([0.05], dtype=torch.float32, device=env.device)
            self.v_scale = torch.tensor([0.05], dtype=torch.float32, device=env.device)
        else:
            self.k_scale = self.v_scale = None

    def view(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        m_blocks = self.tokens // block_size
        n = m_blocks * block_size * self.per_token
        shape = (m_blocks, block_size, self.num_kv_heads, self.head_dim)
        return self.k[:n].view(shape), self.v[:n].view(shape), m_blocks


def _pool_tokens(env: BenchEnv, kv_dtype: str, max_point_tokens: int) -> int:
    """Twice the largest point (two rotations), raised towards 8x the cache size so small grids can
    rotate too, capped by the memory budget."""
    per_token = kv_bytes_per_token_layer(env.model, kv_dtype)
    budget_tokens = env.mem_budget_bytes // per_token
    want = max(2 * max_point_tokens, min(budget_tokens, 8 * env.cache_bytes // per_token))
    return int(min(want, budget_tokens))


def _decode_impls(env: BenchEnv) -> list[tuple[str, int | None]]:
    if env.decode_impl == S.IMPL_TRITON:
        return [(S.IMPL_TRITON, 1), (S.IMPL_TRITON_SPLITK, None)]
    if env.decode_impl == S.IMPL_TRITON_INTERPRETER:
        return [(S.IMPL_TRITON_INTERPRETER, 1)]
    return [(S.IMPL_TORCH_REFERENCE, None)]


def _attn_geometry(model: ModelSpec) -> dict:
    return {"heads": model.num_attention_heads, "kv_heads": model.num_kv_heads, "head_dim": model.head_dim}


def _paged_pool(env: BenchEnv, kv_dtype: str, tokens_needed: int, salt: int):
    """(KV bytes per token per layer, a paged KV pool of at least ``tokens_needed`` tokens)."""
    return (kv_bytes_per_token_layer(env.model, kv_dtype),
            _KVPool(env, kv_dtype, _pool_tokens(env, kv_dtype, tokens_needed), salt=salt))


def measure_decode_paged(env: BenchEnv, kv_dtype: str, block_sizes: tuple[int, ...],
                         points: list[tuple[int, int]], out_of_time: Callable[[], bool]) -> list[dict]:
    """Decode attention over a paged cache, every (block size, batch, context) point."""
    if not points or not block_sizes:
        return []
    m = env.model
    hq, d = m.num_attention_heads, m.head_dim
    pad = max(block_sizes)
    per_token_layer, pool = _paged_pool(env, kv_dtype, max(b * (c + pad) for b, c in points), salt=300)
    q_dtype = torch.bfloat16 if kv_dtype == "fp8" else TORCH_KV_DTYPES[kv_dtype]
    gen = env.generator(301)
    rows: list[dict] = []
    if env.decode_impl != S.IMPL_TORCH_REFERENCE:
        from kvsim.calibration.kernels import paged_decode, plan_launch
    for bs in block_sizes:
        k_cache, v_cache, num_blocks = pool.view(bs)
        for b, c in points:
            if out_of_time():
                env.skipped.append(f"decode_paged {kv_dtype} block={bs} batch={b} context={c}")
                continue
            nblk = -(-c // bs)
            need = b * nblk
            if need > num_blocks:
                env.skipped.append(f"decode_paged {kv_dtype} block={bs} batch={b} context={c} (pool too small)")
                continue
            n_rot = rotations_for(b * c * per_token_layer, num_blocks // need, env.timer.calls, env.cache_bytes)
            perm = torch.randperm(num_blocks, generator=gen, device=env.device)[: n_rot * need]
            tables = perm.to(torch.int32).view(n_rot, b, nblk)
            ctx = torch.full((b,), c, dtype=torch.int32, device=env.device)
            q = (torch.randn((b, hq, d), generator=gen, device=env.device) * 0.5).to(q_dtype)
            out = torch.empty_like(q)
            common = dict(dtype=kv_dtype, block_size=bs, batch=b, context_len=c, new_tokens=1,
                          cached_tokens=c - 1, tokens=b, rotations=n_rot, kv_bytes=b * c * per_token_layer,
                          bytes_moved=b * c * per_token_layer + 2 * q.numel() * q.element_size() + 4 * need,
                          flops=4 * b * hq * d * c, **_attn_geometry(m))
            for impl, splits in _decode_impls(env):
                if impl == S.IMPL_TORCH_REFERENCE:
                    fn = (lambda i: paged_decode_reference(q, k_cache, v_cache, tables[i % n_rot], ctx,
                                                           k_scale=pool.k_scale, v_scale=pool.v_scale))
                    n_splits, cdt = 1, "fp32"
                else:
                    launch = plan_launch(q, k_cache, c, splits, None, None)
                    if impl == S.IMPL_TRITON_SPLITK and launch.num_splits == 1:
                        continue  # the heuristic would not split here: same kernel as "triton"
                    n_splits = launch.num_splits
                    ws = None
                    if n_splits > 1:
                        ws = (torch.empty((b, hq, n_splits, d), dtype=torch.float32, device=env.device),
                              torch.empty((b, hq, n_splits), dtype=torch.float32, device=env.device))
                    fn = (lambda i, ns=n_splits, ws=ws: paged_decode(
                        q, k_cache, v_cache, tables[i % n_rot], ctx, out=out, num_splits=ns, max_context_len=c,
                        k_scale=pool.k_scale, v_scale=pool.v_scale, workspace=ws))
                    cdt = "fp32" if launch.dot_fp32 else _TORCH_NAMES[q_dtype]
                t = env.timer.measure(fn)
                rows.append(_row(env, S.DECODE_PAGED, impl, t, compute_dtype=cdt, splits=n_splits, **common))
            del tables, perm
        env.log(f"  decode_paged {kv_dtype} block={bs}: {sum(r['block_size'] == bs for r in rows)} rows")
    del pool
    _free(env)
    return rows


def measure_prefill(env: BenchEnv, kv_dtype: str, block_sizes: tuple[int, ...], points: list[tuple[int, int]],
                    out_of_time: Callable[[], bool]) -> list[dict]:
    """One prefill chunk (batch 1) of ``new`` tokens over ``cached`` tokens already in the cache."""
    if not points or not block_sizes:
        return []
    m = env.model
    hq, d = m.num_attention_heads, m.head_dim
    pad = max(block_sizes)
    per_token_layer, pool = _paged_pool(env, kv_dtype, max(n + c + pad for n, c in points), salt=400)
    cdt = env.attn_compute_dtype(kv_dtype)
    q_dtype = cdt
    gen = env.generator(401)
    rows = []
    for bs in block_sizes:
        k_cache, v_cache, num_blocks = pool.view(bs)
        for n, c in points:
            if out_of_time():
                env.skipped.append(f"prefill_paged {kv_dtype} block={bs} new={n} cached={c}")
                continue
            total = n + c
            nblk = -(-total // bs)
            n_rot = rotations_for(total * per_token_layer, num_blocks // nblk, env.timer.calls, env.cache_bytes)
            tables = torch.randperm(num_blocks, generator=gen, device=env.device)[: n_rot * nblk].to(
                torch.int32).view(n_rot, nblk)
            q = (torch.randn((n, hq, d), generator=gen, device=env.device) * 0.5).to(q_dtype)
            t = env.timer.measure(lambda i: paged_prefill(q, k_cache, v_cache, tables[i % n_rot], c,
                                                          k_scale=pool.k_scale, v_scale=pool.v_scale,
                                                          compute_dtype=cdt))
            pairs = n * c + n * (n + 1) // 2
            rows.append(_row(env, S.PREFILL_PAGED, "torch_gather_sdpa", t, dtype=kv_dtype,
                             compute_dtype=_TORCH_NAMES[cdt], block_size=bs, batch=1, context_len=total,
                             new_tokens=n, cached_tokens=c, tokens=n, rotations=n_rot,
                             kv_bytes=total * per_token_layer,
                             bytes_moved=total * per_token_layer + 2 * q.numel() * q.element_size(),
                             flops=4 * hq * d * pairs, **_attn_geometry(m)))
        env.log(f"  prefill_paged {kv_dtype} block={bs}: {sum(r['block_size'] == bs for r in rows)} rows")
    del pool
    _free(env)
    return rows


def measure_contiguous(env: BenchEnv, kv_dtype: str, points: list[tuple[int, int]],
                       out_of_time: Callable[[], bool]) -> list[dict]:
    """Baseline: SDPA decode over dense [batch, kv_heads, context, head_dim] K/V (no block table)."""
    if not points:
        return []
    m = env.model
    hq, hkv, d = m.num_attention_heads, m.num_kv_heads, m.head_dim
    cdt = env.attn_compute_dtype(kv_dtype)
    per_token_layer = 2 * hkv * d * torch.tensor([], dtype=cdt).element_size()
    pool_tokens = int(min(max(2 * max(b * c for b, c in points), 8 * env.cache_bytes // per_token_layer),
                          env.mem_budget_bytes // per_token_layer))
    gen = env.generator(500)
    k_flat = fill_random(pool_tokens * hkv * d, cdt, env.device, gen)
    v_flat = fill_random(pool_tokens * hkv * d, cdt, env.device, gen)
    rows = []
    for b, c in points:
        if out_of_time():
            env.skipped.append(f"decode_contiguous {kv_dtype} batch={b} context={c}")
            continue
        elems = b * hkv * c * d
        n_rot = rotations_for(b * c * per_token_layer, pool_tokens // (b * c), env.timer.calls, env.cache_bytes)
        if n_rot < 1 or elems > k_flat.numel():
            env.skipped.append(f"decode_contiguous {kv_dtype} batch={b} context={c} (pool too small)")
            continue
        ks = [k_flat[r * elems:(r + 1) * elems].view(b, hkv, c, d) for r in range(n_rot)]
        vs = [v_flat[r * elems:(r + 1) * elems].view(b, hkv, c, d) for r in range(n_rot)]
        q = (torch.randn((b, hq, d), generator=gen, device=env.device) * 0.5).to(cdt)
        t = env.timer.measure(lambda i: contiguous_decode(q, ks[i % n_rot], vs[i % n_rot]))
        rows.append(_row(env, S.DECODE_CONTIGUOUS, "torch_sdpa", t, dtype=kv_dtype, compute_dtype=_TORCH_NAMES[cdt],
                         block_size=0, batch=b, context_len=c, new_tokens=1, cached_tokens=c - 1, tokens=b,
                         rotations=n_rot, kv_bytes=b * c * per_token_layer,
                         bytes_moved=b * c * per_token_layer + 2 * q.numel() * q.element_size(),
                         flops=4 * b * hq * d * c, **_attn_geometry(m)))
    del k_flat, v_flat
    _free(env)
    return rows


assert set(KV_ELEMENT_BYTES) == set(TORCH_KV_DTYPES)
