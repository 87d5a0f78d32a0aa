"""Analytical step-time model: fitted GEMMs, a decode-attention kernel model, and a roofline fallback.

``timing.gemm_model: fitted`` (default) -- the kernels of a step run one after another::

    linear_s    = gemm.step_linear_time_s(num_tokens, num_seqs, model_shard, gpu)   (kvsim.timing.gemm;
                  weights are read inside each GEMM's memory term, so there is no separate weights term;
                  an MoE model: its dense GEMMs, + moe_experts_s(num_tokens), its routed experts)
    attention_s = max(decode kernel KV time, decode FLOPs) + max(prefill kernel KV time, fitted prefill attention)
    kv_write_s  = num_tokens * kv_bytes_per_token / (hbm_bandwidth * bandwidth_efficiency)
    duration    = linear_s + attention_s + kv_write_s + overhead_s + swap_s + parallel_comm_s

``timing.gemm_model: roofline`` -- the model before the GEMM fit (one roofline over the step)::

    weights_s  = weight_bytes_read(num_tokens) / (hbm_bandwidth * bandwidth_efficiency)
                 (dense: weight_bytes; MoE: the routed experts the step's tokens touch under uniform
                 routing, kvsim.timing.moe, docs/models.md "MoE weight reads")
    attention_s = kernel.time_s(num_seqs, kv_tokens_read, kv_pages_read)     (kvsim.timing.kernel)
    kv_read_s  = attention_s + num_tokens * kv_bytes_per_token / (hbm_bandwidth * bandwidth_efficiency)
    compute_s  = (2 * params_per_token * num_tokens + layers * pair_flops * attention_pairs)
                 / (peak_flops * compute_efficiency)
                 (pair_flops = 4 * heads * head_dim; MLA: 2 * heads * (2 * kv_lora_rank + rope) for
                 decode queries, 2 * heads * (head_dim + v_head_dim) for prefill chunks:
                 kvsim.hw.ModelSpec.attention_pair_flops)
    duration   = max(weights_s + kv_read_s, compute_s) + overhead_s + swap_s + parallel_comm_s

with, in both, the engine's CPU time ``overhead_s = step_overhead_s + overhead.per_seq_s * num_seqs
+ overhead.per_prefill_token_s * num_prefill_tokens`` (kvsim.timing.overhead; without
``overhead:``, ``step_overhead_s``); under async scheduling the engine loop's part overlaps the rest,
``duration = max(gpu_s, loop_s) + per-request terms`` (kvsim.timing.overhead, ``StepOverhead.step_s``), and
``swap_s = (swap_in_bytes + swap_out_bytes) / host_link_bandwidth + tier_load_s``
without ``host_link:``, and with it ``transfer_time_s(in bytes, in copies, h2d) +
transfer_time_s(out bytes, out copies, d2h) + tier_load_s`` (docs/transfer_model.md).
An MoE model's dense GEMMs (attention, router, shared experts) are fitted too, and its routed
experts, ``moe_experts_s``, are added to ``linear_s`` (the fused MoE kernel, or without one the
larger of the touched experts' weight reads and their FLOPs, plus the MoE layers' fixed time; the
breakdown's ``linear_compute_s`` is the dense GEMMs and LM head, ``moe_experts_s`` beside it, so the
exclusive parts add up to the duration: docs/metrics.md "The step-time identity"); an
MLA model's attention GEMMs are its own shapes (``gemm.attention_shapes``). GPUs without a fitted
profile use the generic one at this config's ``compute_efficiency`` / ``bandwidth_efficiency``
(docs/gemm_model.md).

The attention kernel (backend ``timing.attention_backend``, resolved by
:func:`kvsim.timing.kernel.resolve_backend`; ``auto`` is one kernel for every layout) reads the
run's KV geometry (this GPU's KV and query heads under tensor parallelism) and prices every
scheduled sequence's KV read in one launch per layer, decode and prefill alike: a prefill chunk
reads its cached context and its new tokens through the same paged layout. ``decode_attention_s`` /
``prefill_attention_s`` split the KV time in proportion to the KV tokens each group reads; under ``fitted`` a prefill chunk costs the larger
of its KV-read share and the fitted prefill-attention FLOP time (BatchShape's sums, equal chunks
assumed: :meth:`FittedLinear.prefill_attention_s`). The KV writes of new tokens stream at
``bandwidth_efficiency``. ``attention_backend: roofline`` prices KV reads at
``bandwidth_efficiency`` (block size ignored).

Swaps are serialised with compute (vLLM v0 swaps between steps on the critical path).

Under tensor/pipeline parallelism the bytes are one tensor rank's, the fitted GEMMs are one rank's
column/row shards (roofline: FLOP/s are the tensor ranks' together), and ``parallel_comm_s``
(all-reduces + stage sends, TimingContext.comm_s) is added; 0 on one GPU (docs/models.md).
"""

from __future__ import annotations

import numpy as np

from kvsim.registry import TIMING_MODELS
from kvsim.timing.allreduce import StepComm
from kvsim.timing.analytical_config import ROOFLINE, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape, DecodeParts, StepTiming, split_kv_tokens
from kvsim.timing.fitted_steps import FittedDecodeSteps
from kvsim.timing.fitted_linear import FittedLinear
from kvsim.timing.context import TimingContext
from kvsim.timing.moe import WeightReads, moe_fixed_s, routed_expert_params
from kvsim.timing import moe_kernel
from kvsim.timing.overhead import StepOverhead
from kvsim.timing.transfer import step_transfers
from kvsim.timing.kernel import KernelModel, load_backend, pages_or_estimate, resolve_backend

__all__ = ["ROOFLINE", "AnalyticalTiming", "AnalyticalTimingConfig"]

# decode_durations' matrix rows (fitted GEMM model); without parallelism the comm part is the float 0.0
_FITTED_ROWS = {"kv_read_s": 0, "linear_compute_s": 1, "gemm_s": 2, "lm_head_s": 3, "attention_compute_s": 4,
                "attention_s": 5, "decode_attention_s": 5, "kv_write_s": 6, "parallel_comm_s": 7}
_FITTED_ROWS_NO_COMM = {k: v for k, v in _FITTED_ROWS.items() if k != "parallel_comm_s"}


class AnalyticalTiming:
    def __init__(self, cfg: AnalyticalTimingConfig, ctx: TimingContext):
        m = ctx.model
        self.cfg = cfg
        self.kv_bytes_per_token = ctx.kv_bytes_per_token
        self.bandwidth_bytes_per_s = ctx.gpu.hbm_bandwidth_bytes_per_s * cfg.bandwidth_efficiency
        self.flops_per_s = ctx.gpu.bf16_flops_per_s * cfg.compute_efficiency * ctx.tensor_parallel
        # MoE with timing.moe_kernel: the routed experts are a fused kernel of their own, after the
        # rest of the step's roofline; its measured time holds the routing and alignment, so neither
        # moe_align_kernel nor moe_layer_s is added (they price MoE layers without a kernel profile)
        shape = moe_kernel.model_shape(m, ctx.tensor_parallel, ctx.weight_dtype)
        # MoeKernelNamed (kvsim.timing.base): the summary's record; None for a dense model
        self.moe_kernel = moe_kernel.resolve_kernel(cfg.moe_kernel, ctx.weight_dtype, ctx.gpu) if shape else None
        self.experts: moe_kernel.MoeExperts | None = None
        if self.moe_kernel not in (None, "none"):
            self.experts = moe_kernel.MoeExperts(self.moe_kernel, shape, ctx.gpu, m.num_layers)
            self.weights = WeightReads(m, ctx.weight_bytes, self.bandwidth_bytes_per_s, routed_experts=False)
            self.linear_flops_per_token = 2.0 * moe_kernel.dense_active_params(m)
        else:
            self.weights = WeightReads(m, ctx.weight_bytes, self.bandwidth_bytes_per_s,  # + MoE layers' fixed time
                                       moe_fixed_s(m, cfg.moe_align_kernel, cfg.moe_layer_s))
            self.linear_flops_per_token = 2.0 * m.params_per_token  # MoE: the active experts only
        # parallel communication (kvsim.timing.allreduce, its one definition; 0.0 on one GPU): the
        # linear NCCL form is inlined in the hot paths, a custom all-reduce is self.comm's table
        self.comm = StepComm(ctx, cfg.allreduce)
        self._comm_linear = self.comm.linear
        self._comm_s_per_step = ctx.comm_s_per_step
        self._comm_s_per_token = ctx.comm_s_per_token
        self._no_comm = self.comm.none
        # the engine's CPU time per step (kvsim.timing.overhead: its one definition); a constant stays
        # the float step_overhead_s, else it is a row of the decode table after the comm row
        self.overhead = StepOverhead(cfg.step_overhead_s, cfg.overhead, ctx.async_scheduling and cfg.async_overlap)
        self._overlap = self.overhead.overlapped  # async scheduling: max(GPU, engine loop), StepOverhead.step_s
        self.prices_arrivals = self.overhead.per_arrival_s > 0  # PricesArrivals (kvsim.timing.base)
        self._overhead_row = None if self.overhead.constant else (7 if self._no_comm else 8)
        rows = dict(_FITTED_ROWS_NO_COMM if self._no_comm else _FITTED_ROWS)
        if self._overhead_row is not None:
            rows["overhead_s"] = self._overhead_row
        self._fitted_rows = rows
        self.transfers = step_transfers(ctx.host_transfers, cfg.host_link_bandwidth_bytes_per_s)
        # FLOPs per (query, key) pair over all layers: decode queries and prefill chunks (they differ
        # for MLA, absorbed vs MHA form; kvsim.hw.ModelSpec.attention_pair_flops)
        self.attention_flops_per_pair = float(m.num_layers * m.attention_pair_flops(decode=True))
        self.prefill_attention_flops_per_pair = float(m.num_layers * m.attention_pair_flops(decode=False))
        self.block_size = ctx.block_size
        self.peak_hbm_bandwidth_bytes_per_s = ctx.gpu.hbm_bandwidth_bytes_per_s
        name = resolve_backend(cfg.attention_backend, ctx.block_size, m.attention, ctx.kv.kv_dtype,
                               ctx.gpu.compute_capability)
        self.kernel: KernelModel | None = None
        if name != ROOFLINE:
            profile = load_backend(name, ctx.base_dir)
            profile.check_reads(m.attention, m.name, "timing.attention_backend")
            # the run's geometry: this GPU's KV and query heads, every stage's layers, the page size
            self.kernel = KernelModel.for_gpu(profile, ctx.kv, ctx.gpu)
            if name.endswith((".yaml", ".yml")):
                name = f"{profile.name} ({name})"
        self.attention_backend = name  # AttentionBackendNamed (kvsim.timing.base): the summary's record
        # -- linear layers: the fitted GEMM model (docs/gemm_model.md) or the roofline ------------
        self.gemm_model = cfg.gemm_model
        self.gemm: FittedLinear | None = FittedLinear(cfg, ctx) if cfg.gemm_model == "fitted" else None
        # fitted GEMMs of an MoE model: its routed experts per step beside them, the MoE kernel or,
        # without one, their weight reads plus the MoE layers' fixed time (kvsim.timing.moe)
        self.routed: moe_kernel.MoeExperts | WeightReads | None = None
        self._experts_row: int | None = None
        if self.gemm is not None and routed_expert_params(m):
            # without a kernel: the roofline of the touched experts' bytes and the k experts' FLOPs a token
            # goes through (as the roofline step prices them), plus the MoE layers' fixed time
            self.routed = self.experts if self.experts is not None else WeightReads(
                m, ctx.weight_bytes, self.bandwidth_bytes_per_s, moe_fixed_s(m, cfg.moe_align_kernel, cfg.moe_layer_s),
                only_routed=True,
                compute_s_per_token=2.0 * m.experts_per_token * routed_expert_params(m) / self.flops_per_s)
            # after the KV-write row (6) and the comm and overhead rows where the table has them
            self._experts_row = 7 + (not self._no_comm) + (self._overhead_row is not None)
            rows["moe_experts_s"] = self._experts_row
            # linear_compute_s is the dense GEMMs + LM head (the experts are moe_experts_s); row 1, the
            # linear layers with the experts, stays the duration's term (the same doubles as before)
            rows["linear_compute_s"] = self._experts_row + 1
        # the decode table's rows: _FITTED_ROWS' seven, then comm, overhead and, for an MoE model, the
        # experts and the dense linear layers (linear_compute_s) where this model has them
        self._decode_rows = (7 + (not self._no_comm) + (self._overhead_row is not None)
                             + 2 * (self._experts_row is not None))
        self._decode_table = np.zeros((self._decode_rows, 0))  # grown by _grow_decode_table on first use

    def _fitted_parts(self, matrix: np.ndarray) -> DecodeParts:
        """The breakdown of fitted decode steps whose per-step parts are the columns of ``matrix``
        (the rows of :data:`_FITTED_ROWS`, as :meth:`decode_durations` fills them)."""
        return DecodeParts(self._fitted_map(matrix.__getitem__), matrix, self._fitted_rows)

    def _fitted_map(self, row) -> dict:
        """The fitted decode breakdown by name: ``row(i)`` for the parts that are row ``i`` of the
        parts matrix (its per-step values, or their sum), floats for the parts constant per step."""
        no_comm = self._no_comm
        return {
            "weights_read_s": 0.0,
            "kv_read_s": row(0),
            "linear_compute_s": row(1 if self._experts_row is None else self._experts_row + 1),
            "gemm_s": row(2),
            "lm_head_s": row(3),
            "attention_compute_s": row(4),
            "attention_s": row(5),
            "decode_attention_s": row(5),
            "prefill_attention_s": 0.0,
            "overhead_s": self.cfg.step_overhead_s if self._overhead_row is None else row(self._overhead_row),
            "swap_s": 0.0,
            "kv_write_s": row(6),
            "parallel_comm_s": 0.0 if no_comm else row(7),
        } | ({} if self._experts_row is None else {"moe_experts_s": row(self._experts_row)})

    def decode_step_pricer(self) -> FittedDecodeSteps | None:
        """:class:`~kvsim.timing.base.ScalarDecodeSteps`: decode steps priced one at a time, in
        Python floats (with the fitted GEMM model; None with the roofline's linear layers)."""
        return FittedDecodeSteps(self) if self.gemm is not None else None

    def _grow_decode_table(self, top: int) -> None:
        """Per-batch-size rows for decode_durations (fitted GEMM model), n = 0 .. at least ``top``:
        the rows of :data:`_FITTED_ROWS` (placeholders where a part depends on the KV read), then
        the KV-write time ``n * kv_bytes_per_token / bandwidth``, under parallelism the
        communication ``comm_s(n)`` and, with a batch-dependent overhead, ``overhead.time_s(n, 0)``;
        each the double step_time computes for a batch of n."""
        g = self.gemm
        size = max(top + 1, 2 * self._decode_table.shape[1], 1024)
        if size > g._size:
            g._grow(size - 1)
        n = np.arange(size, dtype=np.int64)
        layers, lm = g._layers[:size], g._lm[:size]
        linear = layers + lm
        if self.routed is not None:  # MoE: the routed experts, in the linear layers' time
            experts = self.routed.array_s(n)
            linear = linear + experts
        rows = [np.zeros(size), linear, layers, lm, np.zeros(size), np.zeros(size),
                n * self.kv_bytes_per_token / self.bandwidth_bytes_per_s]
        if not self._no_comm:
            rows.append(self._comm_s_per_step + self._comm_s_per_token * n if self._comm_linear
                        else self.comm.array_s(n))
        if self._overhead_row is not None:
            rows.append(self.overhead.decode_row(n))
        if self._experts_row is not None:
            rows.append(experts)
            rows.append(layers + lm)  # linear_compute_s: the dense GEMMs and the LM head
        assert len(rows) == self._decode_rows, "decode table rows out of step with _decode_rows"
        self._decode_table = np.array(rows)

    def _attention_s(self, num_seqs, kv_tokens, kv_pages):
        if self.kernel is None:
            return kv_tokens * self.kv_bytes_per_token / self.bandwidth_bytes_per_s
        return self.kernel.time_s(num_seqs, kv_tokens, kv_pages)

    # step_time runs once per engine step and decode_durations once per decode window: both are hot.
    # They read per-run constants bound in __init__ and skip no-op terms only where IEEE arithmetic
    # makes the skip exact (x + 0.0 == x for every x >= +0.0, and every duration term is >= 0).
    def step_time(self, shape: BatchShape) -> StepTiming:
        kvb = self.kv_bytes_per_token
        T = shape.kv_tokens_read
        num_pre = shape.num_prefill_seqs
        num_tokens = shape.num_prefill_tokens + shape.num_decode_tokens
        kv_read = T * kvb
        kv_write = num_tokens * kvb
        # sequences in the launch: every sample of a parallel-sampling request reads its own context
        seqs = num_pre + shape.num_decode_seqs
        if self.kernel is None:
            attn_kv_s = T * kvb / self.bandwidth_bytes_per_s
        else:
            attn_kv_s = self.kernel.time_scalar(seqs, T, shape.kv_pages_read or None)
        swap_s = self.transfers.swap_s(shape.swap_in_bytes, shape.swap_in_copies,
                                       shape.swap_out_bytes, shape.swap_out_copies) + shape.tier_load_s
        # parallelism: StepComm (the same doubles as decode_durations' comm row)
        comm_s = (self._comm_s_per_step + self._comm_s_per_token * num_tokens if self._comm_linear
                  else self.comm.scalar_s(num_tokens))
        if self._overhead_row is None and not shape.round_continuation:
            overhead_s = self.cfg.step_overhead_s
        else:  # kvsim.timing.overhead: its one definition (batch, arrivals, multi-step rounds)
            overhead_s = self.overhead.of_shape(seqs, shape)
        if num_pre and T:
            pre_kv, _ = split_kv_tokens(shape)
            pre_att = attn_kv_s * (pre_kv / T)
        else:
            pre_kv, pre_att = 0.0, 0.0
        if self.gemm is not None:
            return self._fitted_step(shape, num_tokens, seqs, kv_read, kv_write, attn_kv_s, pre_kv, pre_att,
                                     swap_s, comm_s, overhead_s)
        weights_s = self.weights.scalar_s(num_tokens)
        kv_write_s = kv_write / self.bandwidth_bytes_per_s
        kv_s = attn_kv_s + kv_write_s
        linear_s = self.linear_flops_per_token * num_tokens / self.flops_per_s
        if pre_kv and self.prefill_attention_flops_per_pair != self.attention_flops_per_pair:
            dec_pairs = T - pre_kv  # MLA: the decode queries' pairs and the prefill chunks' priced apart
            attn_s = (self.attention_flops_per_pair * dec_pairs + self.prefill_attention_flops_per_pair
                      * (shape.attention_pairs - dec_pairs)) / self.flops_per_s
        else:
            attn_s = self.attention_flops_per_pair * shape.attention_pairs / self.flops_per_s
        duration = max(weights_s + kv_s, linear_s + attn_s)
        if self.experts is not None:
            experts_s = self.experts.scalar_s(num_tokens)
            duration = duration + experts_s
        if self._overlap:  # the engine loop runs beside the GPU (kvsim.timing.overhead)
            gpu_s = duration + swap_s
            gpu_s = gpu_s + comm_s
            duration = self.overhead.step_s(gpu_s, seqs, shape)
            overhead_s = duration - gpu_s
        else:
            duration = duration + overhead_s + swap_s
            duration = duration + comm_s
        breakdown = {
            "weights_read_s": weights_s,
            "kv_read_s": kv_s,
            "linear_compute_s": linear_s,
            "attention_compute_s": attn_s,
            "attention_s": attn_kv_s,
            "decode_attention_s": attn_kv_s - pre_att,
            "prefill_attention_s": pre_att,
            "overhead_s": overhead_s,
            "swap_s": swap_s,
            "kv_write_s": kv_write_s,
            "parallel_comm_s": comm_s,
        }
        if self.experts is not None:
            breakdown["moe_experts_s"] = experts_s
        return StepTiming(duration_s=duration, breakdown_s=breakdown, kv_bytes_read=kv_read)

    def _fitted_step(self, shape, num_tokens, seqs, kv_read, kv_write, attn_kv_s, pre_kv, pre_att, swap_s,
                     comm_s, overhead_s) -> StepTiming:
        g = self.gemm
        # LM head: one row per scheduled sequence (every sample of a parallel-sampling request)
        if (num_tokens if num_tokens > seqs else seqs) >= g._size:
            g._grow(num_tokens if num_tokens > seqs else seqs)
        layers_s, lm_s = g._layers_list[num_tokens], g._lm_list[seqs]  # = g.linear_s(num_tokens, seqs)
        linear_s = dense_s = layers_s + lm_s
        if self.routed is not None:  # MoE: the routed experts (the decode table's linear row holds them too)
            experts_s = self.routed.scalar_s(num_tokens)
            linear_s = linear_s + experts_s
        dec_att = attn_kv_s - pre_att
        # decode queries: the kernel's KV-read time, or their FLOPs if that were larger
        dec_pairs = shape.kv_tokens_read - pre_kv  # one query per decode sequence: pairs = its KV tokens
        dec_flops_s = self.attention_flops_per_pair * dec_pairs / self.flops_per_s
        dec_s = dec_flops_s if dec_flops_s > dec_att else dec_att  # max(): the first argument on ties
        if shape.num_prefill_seqs and shape.attention_pairs:  # no (query, key) pairs: no attention FLOPs
            pre_fit = g.prefill_attention_s(shape, dec_pairs)
            pre_s = pre_fit if pre_fit > pre_att else pre_att
            attn_flops_s = dec_flops_s + pre_fit
        else:
            pre_s = 0.0
            attn_flops_s = dec_flops_s
        attention_s = dec_s + pre_s
        kv_write_s = kv_write / self.bandwidth_bytes_per_s
        if self._overlap:  # the engine loop runs beside the GPU (kvsim.timing.overhead)
            gpu_s = linear_s + attention_s + kv_write_s + swap_s
            gpu_s = gpu_s + comm_s
            duration = self.overhead.step_s(gpu_s, seqs, shape)
            overhead_s = duration - gpu_s
        else:
            duration = linear_s + attention_s + kv_write_s + overhead_s + swap_s
            duration = duration + comm_s
        breakdown = {
            "weights_read_s": 0.0,
            "kv_read_s": attn_kv_s + kv_write_s,
            "linear_compute_s": dense_s,
            "gemm_s": layers_s,
            "lm_head_s": lm_s,
            "attention_compute_s": attn_flops_s,
            "attention_s": attention_s,
            "decode_attention_s": dec_s,
            "prefill_attention_s": pre_s,
            "overhead_s": overhead_s,
            "swap_s": swap_s,
            "kv_write_s": kv_write_s,
            "parallel_comm_s": comm_s,
        }
        if self.routed is not None:
            breakdown["moe_experts_s"] = experts_s
        return StepTiming(duration_s=duration, breakdown_s=breakdown, kv_bytes_read=kv_read)

    def decode_durations(self, num_seqs: np.ndarray, kv_tokens_read: np.ndarray,
                         kv_pages_read: np.ndarray | None = None):
        """Vectorised ``step_time`` for decode-only steps (one new token per sequence, no swaps).

        Element j equals ``step_time(shape_j).duration_s`` bit for bit: the same IEEE operations in
        the same order (the fast engine relies on it). ``kv_pages_read`` None (an engine that does
        not count pages) or a 0 element means "not known", as ``BatchShape.kv_pages_read == 0``
        does. Returns (durations, breakdown parts per step -- an array, or a float that is the same
        every step --, KV bytes read per step); see :func:`kvsim.timing.base.decode_totals`.

        step_time's no-op terms are left out, each exact because the term it adds to is >= +0.0:
        ``+ swap_s`` (0.0: no swaps in a decode window), ``- pre_att`` / ``+ pre_s`` (0.0: no
        prefill) and, on one GPU, ``+ parallel_comm_s`` (0.0; its breakdown part is the float 0.0).
        """
        kvb = self.kv_bytes_per_token
        kv_read = kv_tokens_read * kvb
        bs = self.block_size
        if (kv_pages_read is not None and bs is not None and len(kv_pages_read)
                and np.minimum.reduce(kv_pages_read) <= 0):
            est = pages_or_estimate(num_seqs, kv_tokens_read, None, bs)
            kv_pages_read = np.where(kv_pages_read > 0, kv_pages_read, est)
        attn_kv_s = self._attention_s(num_seqs, kv_tokens_read, kv_pages_read)
        no_comm = self._no_comm
        comm_s = 0.0
        overhead_s = self.cfg.step_overhead_s
        ov_row = self._overhead_row
        if self.gemm is not None:
            # One lookup in the per-batch-size table gives a matrix whose rows are the per-step
            # parts (decode_totals sums them in one reduction): the linear layers, the KV writes and
            # the communication are read from it, the other rows are filled in place.
            try:
                matrix = self._decode_table.take(num_seqs, axis=1)
            except IndexError:
                self._grow_decode_table(int(num_seqs.max()))
                matrix = self._decode_table.take(num_seqs, axis=1)
            kv_read_s, linear_s, dec_flops_s, dec_s, kv_write_s = matrix[0], matrix[1], matrix[4], matrix[5], matrix[6]
            np.multiply(self.attention_flops_per_pair, kv_tokens_read, out=dec_flops_s)
            dec_flops_s /= self.flops_per_s
            np.maximum(attn_kv_s, dec_flops_s, out=dec_s)
            np.add(attn_kv_s, kv_write_s, out=kv_read_s)
            duration = linear_s + dec_s
            duration += kv_write_s
            if self._overlap:  # max(GPU, engine loop); the overhead row becomes the part not hidden
                if not no_comm:
                    duration += matrix[7]
                gpu_s = duration
                duration = self.overhead.decode_steps_s(gpu_s, matrix[ov_row])
                np.subtract(duration, gpu_s, out=matrix[ov_row])
                return duration, self._fitted_parts(matrix), kv_read
            duration += overhead_s if ov_row is None else matrix[ov_row]
            if not no_comm:
                duration += matrix[7]
            return duration, self._fitted_parts(matrix), kv_read
        if ov_row is not None:
            overhead_s = self.overhead.decode_row(num_seqs)
        if not no_comm:
            comm_s = (self._comm_s_per_step + self._comm_s_per_token * num_seqs if self._comm_linear
                      else self.comm.array_s(num_seqs))
        weights_s = self.weights.array_s(num_seqs)
        kv_write_s = num_seqs * kvb / self.bandwidth_bytes_per_s
        kv_s = attn_kv_s + kv_write_s
        linear_s = self.linear_flops_per_token * num_seqs / self.flops_per_s
        attn_s = self.attention_flops_per_pair * kv_tokens_read / self.flops_per_s
        duration = np.maximum(weights_s + kv_s, linear_s + attn_s)
        if self.experts is not None:
            experts_s = self.experts.array_s(num_seqs)
            duration += experts_s
        if self._overlap:  # max(GPU, engine loop); the overhead part is what the GPU did not hide
            if not no_comm:
                duration += comm_s
            gpu_s = duration
            duration = self.overhead.decode_steps_s(gpu_s, overhead_s)
            overhead_s = duration - gpu_s
        else:
            duration += overhead_s
            if not no_comm:
                duration += comm_s
        parts = {
            "weights_read_s": weights_s,
            "kv_read_s": kv_s,
            "linear_compute_s": linear_s,
            "attention_compute_s": attn_s,
            "attention_s": attn_kv_s,
            "decode_attention_s": attn_kv_s,
            "prefill_attention_s": 0.0,
            "overhead_s": overhead_s,
            "swap_s": 0.0,
            "kv_write_s": kv_write_s,
            "parallel_comm_s": comm_s,
        }
        if self.experts is not None:
            parts["moe_experts_s"] = experts_s
        return duration, parts, kv_read


TIMING_MODELS.register("analytical", AnalyticalTimingConfig, AnalyticalTiming)
