"""Weight bytes an MoE model's step reads: only the routed experts its tokens go to.

A dense model's step reads every weight once. An MoE layer with ``E`` routed experts, ``k`` of them
per token, reads only the experts at least one of the step's ``n`` tokens is routed to. Under
uniform routing each token picks ``k`` of the ``E`` experts, so an expert is missed by one token
with probability ``1 - k/E`` and by all ``n`` tokens (independent) with ``(1 - k/E)**n``; the
expected number of distinct experts a layer reads is (balls in bins)::

    touched(n) = E * (1 - (1 - k/E)**n)          (0 <= touched <= E; touched(1) = k)

Everything else -- attention, the dense layers before the first MoE layer, shared experts,
routers, embeddings, the LM head -- is read every step. From the model's totals::

    per_expert   = (num_params - active_params) / (E - k)   # one routed expert, all MoE layers
    always       = num_params - E * per_expert
    bytes_read(n) = weight_bytes * (always + touched(n) * per_expert) / num_params

``weight_bytes`` is the timing context's (one tensor rank's share over the pipeline stages:
kvsim/models/parallel.py splits every expert evenly across the tensor ranks, so a rank reads its
shard of each touched expert). Real routing is skewed (popular experts), which touches fewer
experts than uniform routing: this is an upper bound on the expected traffic for a given ``n``.
See docs/models.md, "MoE weight reads".
"""

from __future__ import annotations

import numpy as np

from kvsim.hw import ModelSpec


def routed_expert_params(model: ModelSpec) -> float:
    """Parameters of one routed expert summed over the MoE layers (0.0: dense, or every expert
    used by every token so nothing is skipped)."""
    E, k = model.num_experts, model.experts_per_token
    if not E or not k or k >= E or not model.active_params:
        return 0.0
    return (model.num_params - model.active_params) / (E - k)


def experts_touched(num_tokens, num_experts: int, experts_per_token: int) -> np.ndarray:
    """Expected distinct routed experts per MoE layer for ``num_tokens`` tokens (an array),
    uniform routing: ``E * (1 - (1 - k/E)**n)``."""
    n = np.asarray(num_tokens, dtype=float)
    miss = 1.0 - experts_per_token / num_experts
    return num_experts * (1.0 - miss ** n)


class WeightReads:
    """The weights-read time of a step of ``n`` tokens, defined once for every evaluation.

    Dense models (and MoE models whose tokens use every expert): ``constant_s``, the float
    ``weight_bytes / bandwidth`` every step, and :meth:`scalar_s` / :meth:`array_s` return it.
    MoE: a per-token-count table (grown on demand) that the scalar and the array lookups read, so
    both return the same doubles bit for bit."""

    def __init__(self, model: ModelSpec, weight_bytes: int, bandwidth_bytes_per_s: float):
        self.weight_bytes = weight_bytes
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.constant_s = weight_bytes / bandwidth_bytes_per_s
        per_expert = routed_expert_params(model)
        self.moe = per_expert > 0.0
        if self.moe:
            total = model.num_params
            self._always = weight_bytes * ((total - model.num_experts * per_expert) / total)
            self._per_expert = weight_bytes * (per_expert / total)
            self._experts = (model.num_experts, model.experts_per_token)
        self._table = np.zeros(0)
        self._list: list[float] = []

    def bytes_read(self, num_tokens) -> np.ndarray:
        """Expected weight bytes a step of ``num_tokens`` tokens reads (array in, array out)."""
        if not self.moe:
            return np.full(np.shape(num_tokens), float(self.weight_bytes))
        return self._always + experts_touched(num_tokens, *self._experts) * self._per_expert

    def _grow(self, n: int) -> None:
        size = max(n + 1, 2 * len(self._table), 1024)
        self._table = self.bytes_read(np.arange(size)) / self.bandwidth_bytes_per_s
        self._list = self._table.tolist()

    def scalar_s(self, num_tokens: int) -> float:
        if not self.moe:
            return self.constant_s
        if num_tokens >= len(self._list):
            self._grow(num_tokens)
        return self._list[num_tokens]

    def array_s(self, num_tokens: np.ndarray):
        """Per-step weights time for an int array of token counts (dense: the float constant)."""
        if not self.moe:
            return self.constant_s
        if len(num_tokens) and int(num_tokens.max()) >= len(self._table):
            self._grow(int(num_tokens.max()))
        return self._table.take(num_tokens)
