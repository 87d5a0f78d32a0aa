"""The fitted GEMM model of one deployment's linear layers, tabulated by token count
(kvsim.timing.gemm; used by :class:`kvsim.timing.analytical.AnalyticalTiming`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvsim.timing.base import BatchShape
from kvsim.timing.context import TimingContext


class FittedLinear:
    """The fitted GEMM model for one deployment, tabulated by token count.

    ``linear_s(num_tokens, num_seqs)`` returns (all layers' four GEMMs over ``num_tokens`` rows, the
    LM head over ``num_seqs`` rows), read from per-token-count tables that grow on demand. A table
    lookup is exact (step_time and decode_durations read the same float) and keeps the fast engine's
    decode windows as cheap as the roofline's.

    Tensor parallelism: each rank runs the column-/row-parallel shards (query heads, kv heads, MLP
    width and vocabulary divided by the tensor degree, hidden size whole), as Megatron-LM splits
    them; the pipeline stages run in sequence, so all ``num_layers`` are summed. Weights are read
    inside each GEMM's memory term (``k*n`` elements), which is why the fitted analytical model has
    no separate ``weights_read_s``. An MoE or MLA model's layers are :func:`kvsim.timing.gemm.layer_shapes`
    (an MoE layer's dense GEMMs; the timing model adds its routed experts).
    """

    def __init__(self, cfg, ctx: TimingContext):
        from kvsim.timing import gemm

        m, t = ctx.model, ctx.tensor_parallel
        if t > 1:
            m = replace(m, num_attention_heads=ctx.kv.num_query_heads, num_kv_heads=ctx.kv.num_kv_heads,
                        intermediate_size=-(-m.intermediate_size // t), vocab_size=-(-m.vocab_size // t))
        self.model, self.gpu = m, ctx.gpu
        # an MoE or MLA layer: its own GEMMs (an MoE layer's dense ones: attention, router, shared
        # experts; gemm.layer_shapes); a dense GQA/MHA layer: None (gemm.layer_linear_time_s's four)
        self._shapes = (gemm.layer_shapes(m, gemm.shared_params_per_layer(ctx.model), t)
                        if m.num_experts or m.attention == "mla" else None)
        prof = gemm.profile_for(ctx.gpu)
        if prof is gemm.GENERIC:  # no fitted profile for this GPU: the roofline's own efficiencies
            prof = replace(prof, compute_efficiency=cfg.compute_efficiency,
                           bandwidth_efficiency=cfg.bandwidth_efficiency,
                           attn_compute_efficiency=cfg.compute_efficiency)
        self.profile = prof
        # weight bytes per parameter (bf16: 2; fp8 weights: 1); activations are priced the same
        per_param = ctx.weight_bytes * t / max(ctx.model.num_params, 1.0)
        self.element_bytes = max(1, int(round(per_param)))
        self._gemm = gemm
        self._attn_flops_per_pair = float(m.attention_pair_flops(decode=False))  # prefill chunks: MHA form
        self._attn_flops_per_s = ctx.gpu.bf16_flops_per_s * prof.attn_compute_efficiency
        self._num_layers = m.num_layers
        self._layers = np.zeros(0)
        self._lm = np.zeros(0)
        self._size = 0
        self._layers_list: list[float] = []
        self._lm_list: list[float] = []

    def _grow(self, n: int) -> None:
        old = len(self._layers)
        size = max(n + 1, 2 * old, 1024)
        toks = np.arange(old, size, dtype=float)
        g, m = self._gemm, self.model
        if self._shapes is None:
            layers = m.num_layers * g.layer_linear_time_s(toks, m, self.gpu, self.profile, self.element_bytes)
        else:
            layers = m.num_layers * sum(g.linear_time_s(toks, n, k, self.gpu, self.profile, self.element_bytes)
                                        for n, k in self._shapes)
        lm_n, lm_k = g.gemm_shapes(m)["lm_head"]
        lm = g.linear_time_s(toks, lm_n, lm_k, self.gpu, self.profile, self.element_bytes)
        self._layers = np.concatenate([self._layers, np.atleast_1d(layers)])
        self._lm = np.concatenate([self._lm, np.atleast_1d(lm)])
        self._size = len(self._layers)
        self._layers_list = self._layers.tolist()  # Python floats: the same doubles, cheaper to index
        self._lm_list = self._lm.tolist()

    def linear_s(self, num_tokens: int, num_seqs: int) -> tuple[float, float]:
        """(all layers' GEMMs over ``num_tokens`` rows, LM head over ``num_seqs`` rows) for one step."""
        hi = num_tokens if num_tokens > num_seqs else num_seqs
        if hi >= self._size:
            self._grow(hi)
        return self._layers_list[num_tokens], self._lm_list[num_seqs]

    def prefill_attention_s(self, shape: BatchShape, decode_pairs: float) -> float:
        """The fitted prefill-attention time of the step's prefill chunks (all layers).

        BatchShape carries sums, not per-sequence chunks: the ``P`` prefill sequences are taken as
        equal chunks of ``c = num_prefill_tokens / P`` new tokens (exact for one chunk per step, the
        usual chunked-prefill case), and their cached-context pairs ``sum(c_i * p_i)`` are what is
        left of ``attention_pairs`` after the decode pairs and the chunks' causal triangles."""
        P = shape.num_prefill_seqs
        c = shape.num_prefill_tokens / P
        if c <= 0:
            return 0.0
        # max(x, 0.0) written out (the builtin returns its first argument on ties)
        pairs_pre = shape.attention_pairs - decode_pairs
        if 0.0 > pairs_pre:
            pairs_pre = 0.0
        cp = pairs_pre - P * c * (c + 1.0) / 2.0
        if 0.0 > cp:
            cp = 0.0
        prof = self.profile
        pairs_eff = cp + prof.attn_causal_factor * P * c * c / 2.0
        # (4.0 * heads * head_dim) and (peak * efficiency) are evaluated first in the formula: bound once
        flops = self._attn_flops_per_pair * pairs_eff * (1.0 + prof.attn_half_tokens / c)
        per_layer = P * prof.attn_launch_s + flops / self._attn_flops_per_s
        return self._num_layers * per_layer
