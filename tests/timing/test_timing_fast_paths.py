"""The timing model's per-step fast paths equal the formulas they replace, bit for bit.

* KernelModel.time_s (scalar and array paths, per-batch-size tables) against the term-by-term
  formula of kvsim/timing/kernel.py's docstring, written out here the way the model used to
  evaluate it (one generic function for scalars and arrays);
* AnalyticalTiming.decode_durations element j == step_time(decode shape j).duration_s, and every
  breakdown part == step_time's, across GEMM models, parallelism, layouts and tables that grow;
* decode_totals over a DecodeParts matrix == the per-array sums it replaces, for every prefix.
* the stepwise pricer (decode_step_pricer: price, column, parts, totals) == decode_durations and
  decode_totals over the same steps, durations, start times and breakdown sums.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvsim.models.geometry import KVGeometry
from kvsim.hw import GPUS, MODELS
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import SMALL_SUM_STEPS, DecodeParts, decode_shape, decode_totals
from kvsim.timing.context import TimingContext
from kvsim.timing.kernel import KernelModel, KVLayout, load_backend, pages_or_estimate

GPU = GPUS["A100-80GB"]


# -- the reference: the kernel formula as one generic function (scalars or arrays) ------------------
def reference_time_s(km: KernelModel, num_seqs, kv_tokens, kv_pages):
    p, lay = km.profile, km.layout
    P = pages_or_estimate(num_seqs, kv_tokens, kv_pages, lay.block_size)
    if isinstance(num_seqs, np.ndarray):
        n, T, P = num_seqs.astype(np.int64), np.asarray(kv_tokens, dtype=np.int64), np.asarray(P)
        mn, mx = np.minimum, np.maximum

        def where(c, a, z):
            return np.where(c > 0, a, z)
    else:
        n, T = int(num_seqs), int(kv_tokens)
        mn, mx = min, max

        def where(c, a, z):
            return a if c > 0 else z
    n1 = mx(n, 1)
    tokens = P * lay.block_size if km.whole_pages else T
    sb = tokens * km.stream_bytes_per_token
    base = n1 * km.heads_par
    v2 = p.split_kv and p.split_rule != "fill"
    if v2 or (p.split_kv and km.units_sat is not None):
        ctx = T / n1
        if isinstance(base, np.ndarray):
            cap = mx(np.ceil(ctx / p.min_split_tokens), 1.0)
            want = None if v2 else np.ceil(km.units_sat / base)
        else:
            cap = mx(float(math.ceil(ctx / p.min_split_tokens)), 1.0)
            want = None if v2 else float(math.ceil(km.units_sat / base))
        if v2 and p.split_rule == "partition":
            splits = cap
        elif v2:  # vLLM: v1 when one partition, or > 512 (sequence, head) units and context <= 8192
            splits = where((cap > 1.0) & ((base <= 512) | (ctx > 8192)) if isinstance(cap, np.ndarray)
                           else (cap > 1.0 and (base <= 512 or ctx > 8192)), cap, 1.0)
        else:
            splits = mn(mx(want, 1.0), cap)
    else:
        splits = 1.0
    units = base * splits
    if km.round_units is not None:  # rounds of SMs x ctas_per_sm resident units, the last partly filled
        R = km.round_units
        waves = np.ceil(units / R) if isinstance(units, np.ndarray) else float(math.ceil(units / R))
        tail = units - (waves - 1.0) * R

        def cost(u):  # one round's unit-streams under the profile's saturation form
            return u + km.units_half if km.units_half is not None else mx(u, km.units_sat)
        par = units / ((waves - 1.0) * cost(R) + cost(tail))
    elif km.units_half is not None:  # Little's law: units x bytes in flight per unit / DRAM latency
        par = units / (units + km.units_half)
    else:
        par = 1.0 if km.units_sat is None else mn(units / km.units_sat, 1.0)
    if km.dram_eff is None:
        chunk = mx(T / n1, 1.0) * km.head_token_bytes
        eff = chunk / (chunk + p.dram_chunk_half_bytes)
    else:
        eff = km.dram_eff
    fetches = P * lay.num_kv_heads
    stream = sb / (km.bw * par * eff)
    fixed = p.unit_overhead_s * units + p.page_overhead_s * fetches
    t = p.launch_overhead_s + (stream + fixed - p.overlap * mn(stream, fixed))
    if not km.fused:
        t = t + (p.launch_overhead_s + T * km.dequant_bytes_per_token / km.bw)
    return lay.num_layers * where(T, t, 0.0)


def _kernels():
    """Every built-in backend and its flag variants, over layouts, KV dtypes, GQA/MHA and SM counts."""
    out = []
    for backend in ("vllm-paged-v1", "vllm-paged-v2", "flashattention-paged", "flashinfer-paged", "contiguous"):
        base = load_backend(backend)
        variants = [base, replace(base, split_kv=not base.split_kv), replace(base, gqa_grouped=not base.gqa_grouped),
                    replace(base, whole_page_reads=not base.whole_page_reads, page_overhead_s=2.5e-9),
                    replace(base, overlap=0.0 if base.overlap else 0.7),
                    replace(base, bytes_in_flight_per_unit=0.0 if base.bytes_in_flight_per_unit else 1500.0),
                    replace(base, ctas_per_sm=0.0 if base.ctas_per_sm else 2.0),
                    replace(base, ctas_per_sm=0.0 if base.ctas_per_sm else 1.5, bytes_in_flight_per_unit=0.0)]
        if base.split_rule != "fill":
            variants.append(replace(base, split_rule="partition"))
        for prof in variants:
            for model in (MODELS["Llama-2-13B"], MODELS["Llama-3-8B"]):
                for dtype in ("fp16", "fp8"):
                    for block in (None, 1, 16, 256):
                        for sms in (GPU.num_sms, None):
                            out.append(KernelModel(prof, KVLayout.from_model(model, dtype, block),
                                                   GPU.hbm_bandwidth_bytes_per_s, sms))
    return out


def _launches(rng, size, block):
    n = rng.integers(0, 600, size)
    n[:3] = (0, 1, 1)
    ctx = rng.integers(1, 20_000, size)
    T = n * ctx
    T[:3] = (0, 0, 5)  # no KV at all; one sequence of 5 tokens
    if block is None:
        pages = n.copy()
    else:
        pages = n * -(-ctx // block)
        pages[2] = -(-5 // block)
    counted = pages.astype(np.int64)
    pages[rng.random(size) < 0.2] = 0  # unknown: the estimate
    return n.astype(np.int64), T.astype(np.int64), pages.astype(np.int64), counted


def _bits(x):
    return np.asarray(x, dtype=np.float64).tobytes()


def test_kernel_time_equals_the_term_by_term_formula_bit_for_bit():
    rng = np.random.default_rng(7)
    for km in _kernels():
        n, T, pages, counted = _launches(rng, 40, km.layout.block_size)
        # integer page counts (the engines' case) and float ones (after the estimate fills gaps)
        assert _bits(km.time_s(n, T, counted)) == _bits(reference_time_s(km, n, T, counted))
        known = np.where(pages > 0, pages, pages_or_estimate(n, T, None, km.layout.block_size) if km.layout.block_size
                         else pages)
        want = reference_time_s(km, n, T, known)
        assert _bits(km.time_s(n, T, known)) == _bits(want)
        assert _bits(km.evaluate(n, T, known)[0]) == _bits(want)
        assert _bits(km.time_s(n, T, None)) == _bits(reference_time_s(km, n, T, None))
        for j in range(len(n)):
            p = int(pages[j]) or None
            got = km.time_s(int(n[j]), int(T[j]), p)
            assert isinstance(got, float)
            assert got.hex() == float(reference_time_s(km, int(n[j]), int(T[j]), p)).hex()


def test_products_are_bound_only_when_exact():
    from kvsim.timing.kernel import _exact_product

    assert _exact_product(1.8e-9, 32) == 1.8e-9 * 32  # a power of two: exact
    assert _exact_product(0.1, 3) is None  # 0.1 * 3 rounds
    assert _exact_product(16, 8192.0) == 131072.0
    # the kernels above cover both: a bound product and the formula's own two multiplications
    kms = _kernels()
    assert any(km._page_oh_per_page is None and km._page_oh for km in kms)
    assert any(km._page_oh_per_page is not None and km._page_oh for km in kms)
    assert any(km._stream_bytes_per_page is not None for km in kms)


def test_kernel_tables_grow_and_stay_exact():
    km = KernelModel(load_backend("vllm-paged-v1"), KVLayout.from_model(MODELS["Llama-2-7B"], "fp16", 16),
                     GPU.hbm_bandwidth_bytes_per_s, GPU.num_sms)
    for top in (3, 300, 5000, 70_000):  # past the first table (256 rows) and its doublings
        n = np.array([1, top // 2 + 1, top], np.int64)
        T = n * 777
        P = n * 49
        assert _bits(km.time_s(n, T, P)) == _bits(reference_time_s(km, n, T, P))
        assert km.time_s(top, top * 777, top * 49) == reference_time_s(km, top, top * 777, top * 49)


# -- AnalyticalTiming: decode_durations == step_time, part by part ---------------------------------
def _timing(model="Llama-2-7B", block=16, gemm_model="fitted", backend="auto", comm=(0.0, 0.0), tp=1, dtype="fp16",
            gpu="A100-80GB", overhead=None, allreduce="nccl", async_scheduling=False):
    m = MODELS[model]
    ar = {}
    if allreduce != "nccl":  # the plan's all-reduce fields, so a measured custom curve reprices them
        from kvsim.models.parallel import plan

        p = plan(m, GPUS[gpu], dtype, "bf16", tp)
        comm = (p.comm_s_per_step, p.comm_s_per_token)
        ar = dict(allreduces_per_step=p.allreduces_per_step, allreduce_bytes_per_token=p.allreduce_bytes_per_token,
                  allreduce_s_per_step=p.allreduce_s_per_step, allreduce_s_per_token=p.allreduce_s_per_token)
    ctx = TimingContext(m, GPUS[gpu], KVGeometry.for_gpu(m, dtype, tp, block_size=block), m.weight_bytes() // tp,
                        Path("."), tensor_parallel=tp, comm_s_per_step=comm[0], comm_s_per_token=comm[1],
                        async_scheduling=async_scheduling, **ar)
    return AnalyticalTiming(AnalyticalTimingConfig(gemm_model=gemm_model, attention_backend=backend,
                                                   overhead=overhead, allreduce=allreduce), ctx)


TIMINGS = {
    "fitted-paged": dict(),
    "fitted-contiguous": dict(block=None),
    "fitted-flashinfer-gqa": dict(model="Llama-3-8B", backend="flashinfer-paged"),
    "fitted-fp8-unfused": dict(dtype="fp8"),
    "fitted-roofline-attention": dict(backend="roofline"),
    "fitted-tp4-comm": dict(model="Llama-3-70B", gpu="H100-SXM-80GB", tp=4, comm=(2.1e-5, 3.3e-9)),
    "fitted-generic-gpu": dict(gpu="L40S", model="Mistral-7B"),
    "roofline-paged": dict(gemm_model="roofline"),
    "roofline-comm": dict(gemm_model="roofline", comm=(1e-5, 0.0)),
    "moe-roofline": dict(model="Mixtral-8x7B", gpu="H200-141GB", tp=2, comm=(1e-5, 1e-9)),
    "moe-mla-roofline": dict(model="DeepSeek-V3", gpu="H200-141GB", tp=8, comm=(1e-5, 1e-9)),
    # the engine's CPU overhead per sequence (kvsim.timing.overhead): a decode-table row, with and without comm
    "fitted-overhead": dict(overhead={"per_seq_s": 3.7e-6, "per_prefill_token_s": 1.1e-8}),
    "fitted-overhead-comm": dict(model="Llama-3-70B", gpu="H100-SXM-80GB", tp=4, comm=(2.1e-5, 3.3e-9),
                                 overhead={"per_seq_s": 2.9e-6}),
    "roofline-overhead": dict(gemm_model="roofline", overhead={"per_seq_s": 5e-6}),
    # the engine's own all-reduce (kvsim.timing.allreduce): a per-token-count comm table
    "fitted-tp4-custom-allreduce": dict(model="Llama-3-70B", gpu="H100-SXM-80GB", tp=4, allreduce="vllm-custom",
                                        overhead={"per_seq_s": 2.9e-6, "per_prefill_seq_s": 1e-3}),
    "moe-mla-custom-allreduce": dict(model="DeepSeek-V3", gpu="H200-141GB", tp=8, allreduce="sglang-custom"),
    # async scheduling: max(GPU, engine loop) (kvsim.timing.overhead), a constant loop and a per-sequence one;
    # a large per-sequence cost, so that some steps are CPU-bound and some GPU-bound
    "fitted-async": dict(async_scheduling=True),
    "fitted-async-overhead": dict(async_scheduling=True, overhead={"per_seq_s": 6e-5, "per_prefill_seq_s": 1e-3}),
    "fitted-async-comm": dict(model="Llama-3-70B", gpu="H100-SXM-80GB", tp=4, comm=(2.1e-5, 3.3e-9),
                              async_scheduling=True, overhead={"per_seq_s": 9e-5}),
    "fitted-async-custom-allreduce": dict(model="Llama-3-70B", gpu="H100-SXM-80GB", tp=4, allreduce="vllm-custom",
                                          async_scheduling=True, overhead={"per_seq_s": 9e-5}),
    "roofline-async": dict(gemm_model="roofline", async_scheduling=True, overhead={"per_seq_s": 6e-5}),
    "roofline-async-comm": dict(gemm_model="roofline", comm=(1e-5, 0.0), async_scheduling=True),
    "moe-roofline-async": dict(model="Mixtral-8x7B", gpu="H200-141GB", tp=2, comm=(1e-5, 1e-9),
                               async_scheduling=True, overhead={"per_seq_s": 9e-5}),
}


@pytest.mark.parametrize("name", sorted(TIMINGS))
def test_decode_durations_equal_step_time_part_by_part(name):
    timing = _timing(**TIMINGS[name])
    rng = np.random.default_rng(len(name))
    block = timing.block_size
    for size, unknown in ((1, 0.0), (2, 0.25), (31, 0.0), (31, 0.25), (200, 0.0), (200, 0.25)):
        n = rng.integers(1, 300, size).astype(np.int64)
        ctx = rng.integers(1, 8000, size)
        T = (n * ctx).astype(np.int64)
        pages = (n * -(-ctx // block) if block else n).astype(np.int64)
        pages[rng.random(size) < unknown] = 0  # not counted: step_time estimates, so must decode_durations
        durations, parts, kv_bytes = timing.decode_durations(n, T, pages)
        for j in range(size):
            st = timing.step_time(decode_shape(int(n[j]), int(T[j]), int(pages[j])))
            assert durations[j].hex() == st.duration_s.hex()
            assert int(kv_bytes[j]) == st.kv_bytes_read
            assert list(parts) == list(st.breakdown_s)
            for key, v in st.breakdown_s.items():
                got = parts[key][j] if isinstance(parts[key], np.ndarray) else parts[key]
                assert float(got).hex() == float(v).hex(), key
        for k in sorted({0, 1, size // 2, size}):
            totals, kv_sum = decode_totals(parts, kv_bytes, k)
            plain = {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in parts.items()}
            row_sum = _row_sum if isinstance(parts, DecodeParts) else (lambda row, k: float(row[:k].sum()))
            want = {key: (row_sum(np.asarray(v), k) if isinstance(v, np.ndarray) else v * k)
                    for key, v in plain.items()}
            assert totals == want and kv_sum == int(kv_bytes[:k].sum())


@pytest.mark.parametrize("name", sorted(TIMINGS))
def test_decode_step_pricer_equals_decode_durations_step_by_step(name):
    """ScalarDecodeSteps: each step priced on its own in Python floats is decode_durations' element
    for that step (duration and every part, bit for bit), and the breakdown of the steps that ran
    sums to decode_durations' totals over them; only the roofline linear layers have no pricer."""
    timing = _timing(**TIMINGS[name])
    pricer = timing.decode_step_pricer()
    if timing.gemm is None:
        assert pricer is None
        return
    rng = np.random.default_rng(len(name) + 100)
    block = timing.block_size
    for size, unknown in ((1, 0.0), (5, 0.25), (31, 0.25), (200, 0.25)):
        n = rng.integers(1, 300, size).astype(np.int64)
        n[-1] = 1500 if size > 1 else n[-1]  # past the first decode table (1024 batch sizes): it grows
        ctx = rng.integers(1, 8000, size)
        T = (n * ctx).astype(np.int64)
        if size > 2:
            T[1] = 0  # nothing read
        pages = (n * -(-ctx // block) if block else n).astype(np.int64)
        pages[rng.random(size) < unknown] = 0  # not counted: estimated
        want, want_parts, want_kv = timing.decode_durations(n, T, pages)
        columns = []
        for j in range(size):
            d, col = pricer.column(int(n[j]), int(T[j]), int(pages[j]))
            assert d.hex() == want[j].hex()
            columns.append(col)
        got_parts = pricer.parts(columns)
        assert list(got_parts) == list(want_parts)
        assert _bits(got_parts.matrix) == _bits(want_parts.matrix) and got_parts.rows == want_parts.rows
        for key, v in want_parts.items():
            assert _bits(got_parts[key]) == _bits(v), key
        assert _bits(T * pricer.kv_bytes_per_token) == _bits(want_kv)
        for k in sorted({0, 1, size // 2, size}):
            want_totals = decode_totals(want_parts, want_kv, k)
            assert decode_totals(pricer.parts(columns[:k]), want_kv, k) == want_totals
            got_totals = decode_totals(pricer.totals(columns[:k]), want_kv, k)  # summed without the matrix
            assert got_totals == want_totals
            assert [type(v) for v in got_totals[0].values()] == [type(v) for v in want_totals[0].values()]


@pytest.mark.parametrize("name", sorted(TIMINGS))
def test_decode_step_pricer_prices_runs_of_steps_as_the_window_would(name):
    """``price`` over runs of steps (as StepwiseTimes calls it) gives decode_durations' durations and
    the window's start times ``np.add.accumulate([start, d...])``, bit for bit; ``totals`` with the
    steps' KV tokens is decode_totals of the same steps, KV bytes included."""
    timing = _timing(**TIMINGS[name])
    pricer = timing.decode_step_pricer()
    if pricer is None:
        return
    rng = np.random.default_rng(len(name) + 200)
    block = timing.block_size
    size = 30
    n = rng.integers(1, 300, size).astype(np.int64)
    n[7] = 1600  # the decode table grows in the middle of a run
    ctx = rng.integers(1, 8000, size)
    T = (n * ctx).astype(np.int64)
    pages = (n * -(-ctx // block) if block else n).astype(np.int64)
    pages[rng.random(size) < 0.25] = 0
    want, want_parts, want_kv = timing.decode_durations(n, T, pages)
    start = 12.345
    want_times = np.add.accumulate(np.concatenate(([start], want)))
    durations, times, columns = [], [start], []
    t = start
    for lo, hi in ((0, 1), (1, 9), (9, 9), (9, size)):  # runs, as the replay asks for them
        t = pricer.price(n.tolist(), T.tolist(), pages.tolist(), lo, hi, t, durations, times, columns)
        assert t == times[-1]
    assert _bits(durations) == _bits(want) and _bits(times) == _bits(want_times)
    for k in sorted({1, 5, SMALL_SUM_STEPS, size}):
        want_totals = decode_totals(want_parts, want_kv, k)
        got = decode_totals(pricer.totals(columns[:k], T[:k].tolist()), want_kv, k)
        assert got == want_totals
        assert [type(v) for v in got[0].values()] == [type(v) for v in want_totals[0].values()]
        assert type(got[1]) is int


def test_decode_tables_grow_past_their_first_size():
    timing = _timing()
    for top in (5, 1500, 9000):  # first tables hold 1024 batch sizes
        n = np.array([1, top], np.int64)
        T = n * 100
        durations, _, _ = timing.decode_durations(n, T, n * 7)
        assert [d.hex() for d in durations] == [timing.step_time(decode_shape(int(a), int(b), int(a) * 7))
                                                .duration_s.hex() for a, b in zip(n, T)]


def test_empty_decode_window():
    durations, parts, kv_bytes = _timing().decode_durations(*(np.zeros(0, np.int64),) * 3)
    assert len(durations) == 0 and len(kv_bytes) == 0
    totals, kv_sum = decode_totals(parts, kv_bytes, 0)
    assert kv_sum == 0 and totals["kv_read_s"] == 0.0


def _row_sum(row: np.ndarray, k: int) -> float:
    """What decode_totals sums a DecodeParts row's first k steps to: in step order up to
    SMALL_SUM_STEPS steps, else numpy's own sum of the row."""
    return sum(row[:k].tolist()) if k <= SMALL_SUM_STEPS else float(row[:k].sum())


def test_matrix_reduction_equals_row_sums_for_every_prefix():
    rng = np.random.default_rng(3)
    for m in (1, 2, 7, 8, 9, 15, 16, 17, 31, 127, 128, 129, 513, 4096):
        matrix = rng.random((8, m)) * rng.choice([1e-9, 1e-3, 1.0, 1e4], size=(8, m))
        rows = {f"r{i}": i for i in range(8)}
        parts = DecodeParts({**{name: matrix[i] for name, i in rows.items()}, "const": 0.25}, matrix, rows)
        for k in sorted({0, 1, m // 3, m - 1, m}):
            totals, _ = decode_totals(parts, np.zeros(m, np.int64), k)
            assert totals == {**{name: _row_sum(matrix[i], k) for name, i in rows.items()}, "const": 0.25 * k}
            for name, i in rows.items():  # either way, the sum to rounding
                assert totals[name] == pytest.approx(math.fsum(matrix[i][:k].tolist()), rel=1e-13, abs=1e-300)
    # a strided matrix (not C-contiguous) is copied first, so its sums are still the rows' own
    wide = rng.random((16, 300))
    strided = wide[::2, ::2]
    parts = DecodeParts({"a": strided[0]}, strided, {"a": 0})
    assert decode_totals(parts, np.zeros(150, np.int64), 150)[0]["a"] == float(np.ascontiguousarray(strided[0]).sum())
