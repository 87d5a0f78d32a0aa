"""Decode-attention kernel model: how long one attention launch per layer takes to read the KV cache.

Plain Python + numpy; every function works elementwise on scalars or on numpy arrays (one element
per engine step), with the same IEEE operations in the same order, so a vectorised evaluation equals
the scalar one bit for bit. The terms (parameters in a :class:`BackendProfile`, sources in
docs/kernel_model.md)::

    per layer launch, for a batch of n sequences with T KV tokens and P pages (sum of ceil(c_i / block)):
      tokens_read  = P * block_size            if the backend reads whole last pages (and is paged)
                   = T                          otherwise
      rereads      = 1 + query_head_reads * (query heads / kv heads - 1)   without gqa_grouped
                     (each query head's work unit reads its KV head again; query_head_reads is the
                     share of those extra reads that reach HBM rather than L2), 1 with gqa_grouped
      bytes        = tokens_read * stream bytes per token * rereads
      heads_par    = kv_heads if gqa_grouped else query heads   (one CTA per head and sequence)
      splits       = split-KV partitions per (sequence, head): enough to give every SM
                     units_per_sm_to_saturate work units, at most ceil((T/n) / min_split_tokens)
                     (1 without split_kv)
      units        = n * heads_par * splits                     (parallel work units)
      parallelism  = units / (units + units_half)   with bytes_in_flight_per_unit q > 0 (Little's law:
                     units x q bytes in flight over the GPU's DRAM latency, combined harmonically with
                     the cap: units_half = peak_hbm_bw * max_bandwidth_utilisation * dram_latency / q)
                   = min(1, units / (num_sms * units_per_sm_to_saturate))   with q = 0 (1 if num_sms unknown)
                     with ctas_per_sm > 0 (rounds): the launch runs in rounds of R = num_sms * ctas_per_sm
                     units, waves = ceil(units / R), the last one holding tail = units - (waves - 1) * R;
                     a round of u units costs c(u) = u + units_half (Little's law) or max(u, num_sms *
                     units_per_sm_to_saturate) (sharp cap) unit-streams, and
                     parallelism = units / ((waves - 1) * c(R) + c(tail))   (one round: the forms above)
      chunk_bytes  = block_size * head_dim * elem_bytes           contiguous bytes per page fetch
                   = (T/n) * head_dim * elem_bytes               contiguous KV: one run per sequence
      dram_eff     = chunk_bytes / (chunk_bytes + dram_chunk_half_bytes)
      fetches      = P * kv_heads                                (page, kv head) pairs fetched
      stream_s     = bytes / (peak_hbm_bw * max_bandwidth_utilisation * parallelism * dram_eff)
      fixed_s      = unit_overhead_s * units + page_overhead_s * fetches   (per-unit and per-page work)
      time_layer   = launch_overhead_s + (stream_s + fixed_s - overlap * min(stream_s, fixed_s))
                     [+ dequant_s: an unfused fp8/int8 KV is first converted to fp16 by a separate
                      pass reading the quantised bytes and writing fp16 ones; attention then streams
                      the fp16 bytes]
    kernel time = layers * time_layer

``overlap`` in [0, 1] is how much of the per-unit and per-page work the kernel hides under its
memory traffic: 0 adds it to the streaming time (the original form), 1 takes the larger of the two
(a kernel whose loads are always in flight while it does the work). ``split_rule`` says how a
split-KV backend partitions: ``fill`` (enough partitions to give every SM its work units, at most
one per ``min_split_tokens``; Flash-Decoding / FlashInfer), ``partition`` (always partitions of
``min_split_tokens`` tokens: the PagedAttention v2 kernel itself) or ``vllm-v2`` (the same
partitions under vLLM's dispatch, which runs the unsplit v1 kernel instead when there is one
partition, or when ``n * query heads > 512`` and the context is <= 8,192 tokens).

Launch-size saturation is the sum of the fixed terms (launch, per unit) and the parallelism cap:
achieved bandwidth ``bytes / time`` rises with the bytes one launch reads and saturates at
``max_bandwidth_utilisation`` (< 1) of peak. The per-page cost is ``page_overhead_s`` (indirection:
the block-table load each page fetch depends on) plus the DRAM efficiency of short contiguous runs.
A contiguous allocator (``block_size`` None) is one run per sequence: P = n and chunk_bytes is the
whole context of a head.

``pages`` may be 0 with ``tokens`` > 0 on a paged layout when the caller does not know the page
count (an engine that predates ``BatchShape.kv_pages_read``): :func:`pages_or_estimate` then uses
``T / block + n * (block - 1) / (2 * block)`` (each sequence's last page half full on average). The
step engines fill ``kv_pages_read`` exactly, so the estimate is a fallback only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from kvsim.models.geometry import KVGeometry
from kvsim.timing.gpu_memory import FALLBACK_GPU, dram_latency_s
from kvsim.timing.backend_profile import (  # noqa: F401  (re-exported: callers import them from here)
    BACKEND_ALIASES, BACKENDS_PACKAGE, SPLIT_RULES, BackendProfile, backend_choices, builtin_backends, load_backend,
    load_profile_file, parse_profile, unknown_backend)

FP16_BYTES = 2
V2_MAX_UNITS_FOR_SPLIT = 512  # vLLM: use_v1 when num_seqs * num_heads > 512 (PR #1348)
V2_ALWAYS_SPLIT_ABOVE_TOKENS = 8192  # vLLM >= 0.3: contexts over 8,192 tokens always take v2

# ``attention_backend: auto``: one kernel generation for every layout (paged, radix, contiguous,
# buddy), so an allocator or page-size comparison is not a kernel comparison (docs/kernel_model.md,
# "Selecting a backend", gives the sources for the choice).
AUTO = "auto"
AUTO_BACKEND = "flashinfer-paged"
# ... except for a model with multi-head latent attention (DeepSeek-V2/V3): its one latent per token
# is read by an MLA kernel (FlashMLA: vLLM's FLASHMLA and SGLang's flashmla backends on Hopper)
AUTO_MLA_BACKEND = "flashmla"
# ``attention_backend: auto-2023``: the rule ``auto`` followed before issue 23 -- paged layouts read
# by the vLLM paper's 2023 kernel, contiguous ones by FlashAttention-2 (a kernel comparison).
AUTO_2023 = "auto-2023"
PAGED_2023_BACKEND = "vllm-paged-v1"  # the 2023 kernel (old name vllm-2023-paged)
CONTIGUOUS_BACKEND = "contiguous"
# ``attention_backend: auto-flashattention``: vLLM v1's choice on NVIDIA A100/H100/H200 -- the
# FlashAttention paged kernel for every layout, an MLA kernel for MLA models (the vllm-v1 engine
# profile fills it; its sources are in kvsim/config/profiles.py and docs/conformance.md).
AUTO_FA = "auto-flashattention"
FA_BACKEND = "flashattention-paged"
# ... and for fp8 KV, vLLM's selector skips FLASH_ATTN unless FlashAttention-3 reads fp8 in the kernel
# (FlashAttentionBackend.supports_kv_cache_dtype -> flash_attn_supports_fp8: compute capability 9.x) and
# takes the next backend of _get_backend_priorities that reads it, FLASHINFER (docs/kernel_model.md)
FA3_FP8_BACKEND = "flashattention3-paged"
FP8_FALLBACK_BACKEND = "flashinfer-paged"
# ``attention_backend: auto-vllm-v0``: vLLM 0.4-0.6's selector (vllm/attention/selector.py, what the vllm-v0.6
# engine profile fills): FLASH_ATTN on compute capability >= 8 with 16-bit KV, XFORMERS -- whose decode is
# the PagedAttention v1/v2 kernels with vLLM's dispatch, reading fp8 KV in the kernel since vLLM 0.3
# (vllm-project/vllm#2279) -- for fp8 KV or a GPU below 8.0
AUTO_V0 = "auto-vllm-v0"
V0_PAGED_BACKEND = "vllm-paged-v2"
AUTO_NAMES = (AUTO, AUTO_2023, AUTO_FA, AUTO_V0)

# The static geometry one launch reads is the run's KV geometry (one GPU's heads and layers).
KVLayout = KVGeometry


def resolve_backend(name: str, block_size: int | None, attention: str = "gqa", kv_dtype: str = "fp16",
                    compute_capability: float | None = None) -> str:
    """The backend a run uses for ``timing.attention_backend: name`` on a layout of ``block_size``
    (None: contiguous KV) for a model of ``attention`` kind (``gqa`` or ``mla``) with ``kv_dtype`` KV on
    a GPU of ``compute_capability`` (None: unknown): ``auto`` -> :data:`AUTO_BACKEND` for every layout
    (:data:`AUTO_MLA_BACKEND` for MLA); ``auto-2023`` -> the 2023 paged kernel for paged layouts and
    ``contiguous`` for contiguous ones; ``auto-flashattention`` -> ``flashattention-paged`` for every
    layout (MLA: as ``auto``) but with fp8 KV on a known 8.x or 9.x GPU, where vLLM runs
    :data:`FP8_FALLBACK_BACKEND` (8.x) or FlashAttention-3 (9.x, :data:`FA3_FP8_BACKEND`); ``auto-vllm-v0``
    -> ``flashattention-paged``, but ``vllm-paged-v2`` for fp8 KV or a GPU below 8.0 (vLLM 0.4-0.6); an old name
    -> its backend's name (``vllm-2023-paged`` -> ``vllm-paged-v1``); else ``name``."""
    if name == AUTO:
        return AUTO_MLA_BACKEND if attention == "mla" else AUTO_BACKEND
    if name == AUTO_FA:
        if attention == "mla":
            return AUTO_MLA_BACKEND
        if kv_dtype == "fp8" and compute_capability is not None:
            major = int(compute_capability)
            if major == 9:
                return FA3_FP8_BACKEND
            if major == 8:
                return FP8_FALLBACK_BACKEND
        return FA_BACKEND
    if name == AUTO_V0:
        if attention == "mla":
            return AUTO_MLA_BACKEND
        old_gpu = compute_capability is not None and compute_capability < 8.0
        return V0_PAGED_BACKEND if kv_dtype == "fp8" or old_gpu else FA_BACKEND
    if name == AUTO_2023:
        return PAGED_2023_BACKEND if block_size else CONTIGUOUS_BACKEND
    return BACKEND_ALIASES.get(name, name)


def default_backend(block_size: int | None) -> str:
    """What ``auto`` resolves to on a layout of ``block_size`` (the same for every layout)."""
    return resolve_backend(AUTO, block_size)


def pages_or_estimate(num_seqs, kv_tokens, kv_pages, block_size: int | None):
    """Pages attention reads. Contiguous KV: one run per sequence. Paged: ``kv_pages`` when known;
    ``kv_pages`` None (a caller that does not know the page count) -> ``T/b + n(b-1)/(2b)``."""
    if block_size is None:
        return num_seqs
    if kv_pages is None:
        return kv_tokens / block_size + num_seqs * ((block_size - 1) / (2 * block_size))
    return kv_pages


def overlapped_time(launch, fixed, stream, overlap: float, minimum):
    """time_layer before a dequant pass: ``launch + (stream + fixed - overlap * min(stream, fixed))``,
    the one definition the scalar and array paths use (``minimum``: ``min`` or ``np.minimum``). With
    overlap 0 the subtracted term is +0.0, which leaves the sum unchanged: it is skipped."""
    if overlap == 0.0:
        return launch + (stream + fixed)
    return launch + (stream + fixed - overlap * minimum(stream, fixed))


def _fceil(x: float) -> float:
    """math.ceil as a double (exact: the counts are far below 2**53), as np.ceil gives for arrays."""
    return float(math.ceil(x))


def _exact_product(a: float, b: float) -> float | None:
    """``a * b`` when that double is the exact product, else None."""
    prod = float(a) * float(b)
    return prod if math.isfinite(prod) and Fraction(a) * Fraction(b) == Fraction(prod) else None


@dataclass(frozen=True)
class KernelResult:
    time_s: object  # float or array: all layers
    bytes_read: object  # HBM bytes the attention kernel (and an unfused dequant pass) reads, all layers
    pages_fetched: object  # (page, kv head, layer) fetches; contiguous: one run per (sequence, head, layer)
    bandwidth_utilisation: object  # useful KV bytes / time / peak HBM bandwidth


class KernelModel:
    """A backend profile bound to a KV layout and a GPU. ``time_s`` is the hot path."""

    def __init__(self, profile: BackendProfile, layout: KVLayout, hbm_bandwidth_bytes_per_s: float,
                 num_sms: int | None, memory_latency_s: float | None = None):
        from kvsim.hw import KV_DTYPES

        self.profile = profile
        self.layout = layout
        self.peak_bw = float(hbm_bandwidth_bytes_per_s)
        p, lay = profile, layout
        self.fused = lay.kv_dtype in p.fused_dequant_kv_dtypes or KV_DTYPES[lay.kv_dtype].bits >= 16
        fp16_layer = 2 * lay.num_kv_heads * lay.head_dim * FP16_BYTES  # per token per layer
        # bytes per token the attention loop streams: stored bytes when fused, fp16 after a dequant pass,
        # times the re-reads of a kernel with one work unit per query head
        group = lay.num_query_heads / lay.num_kv_heads
        self.rereads = 1.0 if p.gqa_grouped else 1.0 + p.query_head_reads * (group - 1.0)
        once = lay.kv_bytes_per_token_layer if self.fused else float(fp16_layer)
        self.stream_bytes_per_token = once * self.rereads
        self.dequant_bytes_per_token = 0.0 if self.fused else lay.kv_bytes_per_token_layer + fp16_layer
        elem_bytes = once / (2 * lay.num_kv_heads * lay.head_dim)
        self.head_token_bytes = lay.head_dim * elem_bytes  # one head's K (or V) of one token
        self.heads_par = lay.num_kv_heads if p.gqa_grouped else lay.num_query_heads
        self.units_sat = None if num_sms is None else num_sms * p.units_per_sm_to_saturate
        self.bw = self.peak_bw * p.max_bandwidth_utilisation
        # Little's law saturation (bytes_in_flight_per_unit > 0): units at which half of self.bw is reached
        self.units_half = None
        if p.bytes_in_flight_per_unit > 0.0:
            if memory_latency_s is None:  # a caller without a GPU preset: the fallback GPU's (gpu_memory.py)
                memory_latency_s = dram_latency_s(FALLBACK_GPU)
            self.units_half = self.bw * memory_latency_s / p.bytes_in_flight_per_unit
        # rounds of resident work units (ctas_per_sm > 0 and a known SM count): R and c(R), bound once
        self.round_units = None
        if p.ctas_per_sm > 0.0 and num_sms is not None:
            self.round_units = float(num_sms * p.ctas_per_sm)
            self.full_round_cost = self._round_cost(self.round_units, max)
        self.whole_pages = p.whole_page_reads and lay.block_size is not None
        if lay.block_size is not None:
            chunk = lay.block_size * self.head_token_bytes
            self.dram_eff = chunk / (chunk + p.dram_chunk_half_bytes)
        else:
            self.dram_eff = None  # per launch: the mean context is the run length
        self._bind()

    @classmethod
    def for_gpu(cls, profile: BackendProfile, layout: KVLayout, gpu) -> "KernelModel":
        """The model on a GPU (a ``kvsim.hw.GPUSpec``): its peak bandwidth and SMs, and its preset's
        DRAM latency (``gpu.preset``, whatever the GPU is called)."""
        return cls(profile, layout, gpu.hbm_bandwidth_bytes_per_s, gpu.num_sms, dram_latency_s(gpu.preset))

    # -- the model ---------------------------------------------------------------------------------
    # ``time_s`` is called once per engine step (scalars) and once per decode window (arrays), so
    # the two paths below are written out separately with the per-run constants bound at
    # construction. They perform the module docstring's IEEE operations in the same order; integer
    # operands enter as exact doubles (counts far below 2**53), which is how numpy and Python
    # convert them in mixed arithmetic anyway. tests/timing/test_timing_fast_paths.py checks both
    # against the term-by-term formula bit for bit over many shapes, backends and layouts.
    def _bind(self) -> None:
        p, lay = self.profile, self.layout
        self._L = lay.num_layers
        self._block = lay.block_size
        self._tail_pages = None if lay.block_size is None else (lay.block_size - 1) / (2 * lay.block_size)
        self._kvh = lay.num_kv_heads
        self._v2 = p.split_kv and p.split_rule != "fill"  # fixed partitions (no SM count needed)
        self._dispatch = p.split_rule == "vllm-v2"  # vLLM's v1/v2 choice on top of them
        self._split = p.split_kv and (self._v2 or self.units_sat is not None)
        self._min_split = p.min_split_tokens
        self._launch = p.launch_overhead_s
        self._unit_oh = p.unit_overhead_s
        self._page_oh = p.page_overhead_s
        self._overlap = p.overlap
        self._half = p.dram_chunk_half_bytes
        self._dequant_bytes = None if self.fused else self.dequant_bytes_per_token
        self._n_size = 0
        # products of two per-run constants, bound only when the double product is exact (see _time_array)
        self._stream_bytes_per_page = (_exact_product(lay.block_size, self.stream_bytes_per_token)
                                       if self.whole_pages else None)
        self._page_oh_per_page = _exact_product(p.page_overhead_s, lay.num_kv_heads)
        self._needs_float_tokens = (not self.whole_pages or self._split or self.dram_eff is None
                                    or self._dequant_bytes is not None)
        self._n_table = np.zeros((3, 0))
        self._n_lists: list[list[float]] = []
        self._bw_of_units: dict[float, float] = {}  # split-KV launches: units -> _parallel_bw(units) (time_scalar)

    def time_s(self, num_seqs, kv_tokens, kv_pages):
        """All layers' attention-kernel time. Scalars (python ints/floats) or numpy arrays;
        ``kv_pages`` None = unknown (see :func:`pages_or_estimate`)."""
        if isinstance(num_seqs, np.ndarray):
            return self._time_array(num_seqs, kv_tokens, kv_pages)
        return self.time_scalar(num_seqs, kv_tokens, kv_pages)

    # Without split-KV the terms that depend on the batch size alone are tabulated by n (grown on
    # demand, like the GEMM tables): unit[n] = unit_overhead * units(n), bwpar[n] = peak *
    # utilisation * parallelism(n) and, with a fixed DRAM efficiency (paged), den[n] = bwpar[n] *
    # dram_eff. A lookup returns the very double the formula gives.
    def _grow_n_table(self, top: int) -> None:
        size = max(top + 1, 2 * self._n_size, 256)
        n1 = np.maximum(np.arange(size, dtype=np.float64), 1.0)
        units = n1 * self.heads_par
        if self._split:
            # split-KV: units depend on the tokens too; the batch-size terms are tabulated (the
            # same doubles _time_array computed from them: n1, base = n1 * heads_par and
            # want = max(ceil(units_sat / base), 1); vllm-v2 does not use want)
            want = units if self._v2 else np.maximum(np.ceil(self.units_sat / units), 1.0)
            self._n_table = np.array([n1, units, want])
            self._n_lists = self._n_table.tolist()  # time_scalar reads base and want from these
            self._n_size = size
            return
        unit = self._unit_oh * units
        bwpar = self._parallel_bw(units, np.minimum, np.maximum, np.ceil)
        rows = [unit, bwpar] if self.dram_eff is None else [unit, bwpar, bwpar * self.dram_eff]
        self._n_table = np.array(rows)
        self._n_lists = [row.tolist() for row in rows]  # Python floats: the same doubles, cheaper to index
        self._n_size = size

    def _parallel_bw(self, units, minimum, maximum=max, ceil=None):
        """Launch-size saturation: peak x utilisation x units / (units + units_half) (Little's law), or
        x min(1, units / units to saturate) (the sharp cap), or, with rounds of resident units, x units
        over the rounds' cost (module docstring); ``minimum``/``maximum``/``ceil`` are the scalar
        functions for numbers (``ceil`` None: math.ceil as a float), numpy's for arrays (the same doubles)."""
        if self.round_units is not None:
            waves = _fceil(units / self.round_units) if ceil is None else ceil(units / self.round_units)
            tail = units - (waves - 1.0) * self.round_units
            return self.bw * (units / ((waves - 1.0) * self.full_round_cost + self._round_cost(tail, maximum)))
        if self.units_half is not None:
            return self.bw * (units / (units + self.units_half))
        if self.units_sat is None:
            return self.bw * (units * 0.0 + 1.0)
        return self.bw * minimum(units / self.units_sat, 1.0)

    def _round_cost(self, units, maximum):
        """Unit-streams one round of ``units`` concurrent work units costs: units + units_half (Little's
        law), max(units, units to saturate) (sharp cap) -- the saturation forms above, per round."""
        if self.units_half is not None:
            return units + self.units_half
        return maximum(units, self.units_sat)

    def _pages(self, num_seqs, kv_tokens, kv_pages):
        """Pages a launch fetches (numbers or arrays): one per sequence for a contiguous kernel, the
        counted ``kv_pages`` when given, else the expected count from the token total."""
        bs = self._block
        if bs is None:
            return num_seqs
        if kv_pages is None:
            return kv_tokens / bs + num_seqs * self._tail_pages
        return kv_pages

    def _v2_splits(self, base, cap, ctx):
        """vLLM's dispatch: v2 (``cap`` partitions) unless one partition suffices, or there are more than
        512 (sequence, head) units and the context fits v1's 8,192 tokens."""
        if not self._dispatch:  # split_rule partition: the v2 kernel, always
            return cap
        if isinstance(cap, np.ndarray):
            use_v2 = (cap > 1.0) & ((base <= V2_MAX_UNITS_FOR_SPLIT) | (ctx > V2_ALWAYS_SPLIT_ABOVE_TOKENS))
            return np.where(use_v2, cap, 1.0)
        use_v2 = cap > 1.0 and (base <= V2_MAX_UNITS_FOR_SPLIT or ctx > V2_ALWAYS_SPLIT_ABOVE_TOKENS)
        return cap if use_v2 else 1.0

    def time_scalar(self, num_seqs, kv_tokens, kv_pages) -> float:
        """``time_s`` of one launch (Python numbers): the engine's per-step hot path."""
        bs = self._block
        P = self._pages(num_seqs, kv_tokens, kv_pages)
        T = int(kv_tokens)
        if T <= 0:  # nothing to read costs nothing (no KV tokens: no kernel)
            return 0.0
        n1 = int(num_seqs)
        if n1 < 1:
            n1 = 1
        sb = (P * bs if self.whole_pages else T) * self.stream_bytes_per_token
        if self._split:
            if n1 >= self._n_size:
                self._grow_n_table(n1)
            lists = self._n_lists  # base = n1 * heads_par and want = max(ceil(units_sat / base), 1), tabulated
            base = lists[1][n1]
            ctx = T / n1
            cap = float(math.ceil(ctx / self._min_split))
            if cap < 1.0:
                cap = 1.0
            if self._v2:
                splits = self._v2_splits(base, cap, ctx)
            else:
                want = lists[2][n1]
                splits = cap if cap < want else want
            units = base * splits
            unit = self._unit_oh * units
            bwpar = self._bw_of_units.get(units)  # _parallel_bw's double, remembered per unit count
            if bwpar is None:
                bwpar = self._bw_of_units[units] = self._parallel_bw(units, min)
        else:
            if n1 >= self._n_size:
                self._grow_n_table(n1)
            lists = self._n_lists
            unit, bwpar = lists[0][n1], lists[1][n1]
        eff = self.dram_eff
        if eff is None:
            r = T / n1
            chunk = (r if r > 1.0 else 1.0) * self.head_token_bytes
            den = bwpar * (chunk / (chunk + self._half))
        elif self._split:
            den = bwpar * eff
        else:
            den = self._n_lists[2][n1]
        t = overlapped_time(self._launch, unit + self._page_oh * (P * self._kvh), sb / den, self._overlap, min)
        if self._dequant_bytes is not None:
            t = t + (self._launch + T * self._dequant_bytes / self.bw)
        return self._L * t

    def _time_array(self, num_seqs: np.ndarray, kv_tokens, kv_pages) -> np.ndarray:
        """``time_s`` of many launches: counts are turned into doubles once, then float ops only."""
        P = self._pages(num_seqs, kv_tokens, kv_pages)
        n = num_seqs if num_seqs.dtype.kind in "iu" else num_seqs.astype(np.int64)
        T = np.asarray(kv_tokens, dtype=np.int64)
        if self._needs_float_tokens:
            Tf = T.astype(np.float64)
        P = np.asarray(P)
        # Whole page counts (integers): P * block and P * kv_heads are exact, so when block x
        # stream bytes (and page cost x kv heads) are exact doubles too, one multiplication by the
        # bound product rounds the same real number once, exactly as the formula's two do.
        counted = P.dtype.kind in "iu"
        if counted and self._stream_bytes_per_page is not None:
            sb = P * self._stream_bytes_per_page
        elif self.whole_pages:
            sb = np.asarray(P, dtype=np.float64) * self._block * self.stream_bytes_per_token
        else:
            sb = Tf * self.stream_bytes_per_token
        eff = self.dram_eff
        if self._split:
            ni = np.maximum(n, 1)
            try:
                n1, base, want = self._n_table.take(ni, axis=1)
            except IndexError:
                self._grow_n_table(int(ni.max()))
                n1, base, want = self._n_table.take(ni, axis=1)
            ctx = Tf / n1
            cap = np.maximum(np.ceil(ctx / self._min_split), 1.0)
            splits = self._v2_splits(base, cap, ctx) if self._v2 else np.minimum(want, cap)
            units = base * splits
            unit = self._unit_oh * units
            bwpar = self._parallel_bw(units, np.minimum, np.maximum, np.ceil)
        else:
            n1 = np.maximum(n, 1)
            try:
                rows = self._n_table.take(n1, axis=1)
            except IndexError:
                self._grow_n_table(int(n1.max()))
                rows = self._n_table.take(n1, axis=1)
            unit, bwpar = rows[0], rows[1]
        if eff is None:
            chunk = np.maximum(Tf / n1, 1.0) * self.head_token_bytes
            den = bwpar * (chunk / (chunk + self._half))
        elif self._split:
            den = bwpar * eff
        else:
            den = rows[2]
        fixed = unit
        if self._page_oh != 0.0:  # else the term is +0.0, which leaves fixed (>= +0.0) unchanged
            if counted and self._page_oh_per_page is not None:
                fixed = fixed + P * self._page_oh_per_page
            else:
                fixed = fixed + self._page_oh * (np.asarray(P, dtype=np.float64) * self._kvh)
        t = overlapped_time(self._launch, fixed, sb / den, self._overlap, np.minimum)
        if self._dequant_bytes is not None:
            t += self._launch + Tf * self._dequant_bytes / self.bw
        if len(T) and np.minimum.reduce(T) <= 0:
            t = np.where(T > 0, t, 0.0)
        return self._L * t

    def evaluate(self, num_seqs, kv_tokens, kv_pages):
        """(time_s, bytes_read, pages_fetched) over all layers; ``kv_pages`` None = unknown
        (see :func:`pages_or_estimate`)."""
        lay = self.layout
        P = pages_or_estimate(num_seqs, kv_tokens, kv_pages, lay.block_size)
        if isinstance(num_seqs, np.ndarray):
            T = np.asarray(kv_tokens, dtype=np.int64)
            P = np.asarray(P)
        else:
            T = int(kv_tokens)
        tokens = P * lay.block_size if self.whole_pages else T
        sb = tokens * self.stream_bytes_per_token
        b = sb + (0.0 if self.fused else T * self.dequant_bytes_per_token)
        f = P * lay.num_kv_heads
        L = lay.num_layers
        return self.time_s(num_seqs, kv_tokens, kv_pages), L * b, L * f

    def result(self, num_seqs, kv_tokens, kv_pages) -> KernelResult:
        t, b, f = self.evaluate(num_seqs, kv_tokens, kv_pages)
        useful = self.layout.num_layers * kv_tokens * self.layout.kv_bytes_per_token_layer
        if isinstance(t, np.ndarray):
            util = np.where(t > 0, useful / np.where(t > 0, t, 1.0) / self.peak_bw, 0.0)
        else:
            util = useful / t / self.peak_bw if t > 0 else 0.0
        return KernelResult(time_s=t, bytes_read=b, pages_fetched=f, bandwidth_utilisation=util)
