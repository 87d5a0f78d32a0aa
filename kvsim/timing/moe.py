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

**The MoE layers' fixed time.** An MoE layer also runs kernels whose time is not its weight bytes:
the router's top-k, the token-to-expert alignment (``moe_align_block_size``), and the launches
of the grouped expert GEMMs. kvsim adds, to every step of an MoE model, once per layer::

    moe_fixed_s = num_layers * (align_s(kernel, E, k) + moe_layer_s)

``align_s`` is the alignment kernel's measured time (``data/moe/moe_align.csv``: sgl-project/sglang
#4327 prints vLLM's and SGLang's kernels on an H200 at 16 tokens for 32-256 experts; the row with
the nearest top-k, linear in log2(E) between the printed expert counts, the end values outside).
``moe_layer_s`` is the rest of the per-layer fixed time (routing, launches); no public figure was
found, so it is fitted on the serving corpus's fit cases (docs/engine_overhead.md, "MoE layers").
Both are in the weights-read term (``weights_read_s``), so the scalar and array lookups keep one
table. Every layer is counted as an MoE layer (DeepSeek-V3's 3 dense layers of 61 included).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvsim.errors import ConfigError
from kvsim.hw import ModelSpec
from kvsim.timing.profile_file import read_data_rows

MOE_ALIGN_KINDS = ("none", "vllm", "sglang")
ALIGN_FILE = Path(__file__).parent / "data" / "moe" / "moe_align.csv"
_ALIGN_FIELDS = ("implementation", "gpu_measured", "num_experts", "top_k", "num_tokens", "latency_us", "source")


@lru_cache(maxsize=2)
def load_align(path: Path = ALIGN_FILE) -> dict[str, dict[int, dict[int, float]]]:
    """``implementation -> {num_experts: {top_k: seconds}}`` from the data file (one ConfigError line
    naming the file, line and field for a bad row)."""
    out: dict[str, dict[int, dict[int, float]]] = {}
    for line, row in read_data_rows(path, _ALIGN_FIELDS, MOE_ALIGN_KINDS[1:]):
        try:
            e, k, us = int(row["num_experts"]), int(row["top_k"]), float(row["latency_us"])
        except ValueError:
            raise ConfigError(f"{path}: line {line}: num_experts, top_k, latency_us must be numbers") from None
        if e < 2 or k < 1 or us <= 0:
            raise ConfigError(f"{path}: line {line}: num_experts >= 2, top_k >= 1, latency_us > 0")
        out.setdefault(row["implementation"], {}).setdefault(e, {})[k] = us * 1e-6
    return out


def align_kernel_s(kind: str, num_experts: int, top_k: int) -> float:
    """One MoE layer's token-alignment kernel time (0.0 for ``none``): at each printed expert count
    the row with the nearest top-k (the smaller on ties), linear in log2(experts) between them and
    the end value outside the printed range."""
    if kind == "none" or not num_experts:
        return 0.0
    table = load_align()[kind]
    es = sorted(table)
    at = [table[e][min(table[e], key=lambda k: (abs(k - top_k), k))] for e in es]
    return float(np.interp(math.log2(num_experts), [math.log2(e) for e in es], at))


def moe_fixed_s(model: ModelSpec, kind: str, layer_s: float) -> float:
    """The fixed per-step time of an MoE model's layers (0.0 for a dense model)."""
    if not routed_expert_params(model):
        return 0.0
    return model.num_layers * (align_kernel_s(kind, model.num_experts, model.experts_per_token) + layer_s)


def routed_expert_params(model: ModelSpec) -> float:
    """Parameters of one routed expert summed over the MoE layers (``ModelSpec.routed_expert_params``)."""
    return model.routed_expert_params()


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

    def __init__(self, model: ModelSpec, weight_bytes: int, bandwidth_bytes_per_s: float, fixed_s: float = 0.0,
                 routed_experts: bool = True, only_routed: bool = False, compute_s_per_token: float = 0.0):
        """``routed_experts`` False: every weight but the routed experts (they are priced apart);
        ``only_routed``: the routed experts' reads alone (the other weights are priced apart: the
        fitted GEMM model's dense GEMMs), as a roofline with their FLOPs when ``compute_s_per_token``
        (a token's routed-expert FLOPs over the achieved FLOP rate) is given: ``max(bytes / bandwidth,
        n x compute_s_per_token)``."""
        per_expert = routed_expert_params(model)
        if per_expert and not routed_experts:  # the experts are priced apart (kvsim.timing.moe_kernel)
            weight_bytes = weight_bytes * ((model.num_params - model.num_experts * per_expert) / model.num_params)
            per_expert = 0.0
        self.weight_bytes = weight_bytes
        self.fixed_s = fixed_s  # MoE: the layers' fixed time per step (moe_fixed_s), in every table entry
        self.compute_s_per_token = compute_s_per_token
        self.bandwidth_bytes_per_s = bandwidth_bytes_per_s
        self.constant_s = weight_bytes / bandwidth_bytes_per_s
        self.moe = per_expert > 0.0
        if self.moe:
            total = model.num_params
            self._always = 0.0 if only_routed else weight_bytes * ((total - model.num_experts * per_expert) / total)
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
        if self.compute_s_per_token:
            self._table = np.maximum(self._table, np.arange(size) * self.compute_s_per_token)
        if self.fixed_s:
            self._table = self._table + self.fixed_s
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
