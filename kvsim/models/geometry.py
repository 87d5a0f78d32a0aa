"""The KV cache as one GPU of a replica holds and reads it: one frozen object, built once per run.

Every consumer (the KV budget and the allocator's capacity, the attention-kernel model, the
roofline and KV-write terms, the scheduler's swap sizes, the step recorder's memory bytes and the
summary) reads the same :class:`KVGeometry`, built from the parallel plan
(:func:`kvsim.models.parallel.plan`) and completed with the allocator's page size
(:meth:`KVGeometry.with_block_size`). Under tensor parallelism each GPU holds its share of the KV
heads (vLLM's ``ModelConfig.get_num_kv_heads``: ``max(1, kv_heads // T)``, so heads are replicated
when ``T > kv_heads``; MLA keeps its one latent on every GPU) and of the query heads
(``heads // T``); under pipeline parallelism each stage holds its layers (vLLM's
``get_pp_indices``). Per GPU:

    kv_bytes_per_token_layer = 2 x kv_heads x vector bytes      (MLA: the latent once; scales included)
    bytes_per_token          = max(layers_per_stage) x kv_bytes_per_token_layer
                               (what one token costs on the fullest stage: sizes the KV pool)
    step_bytes_per_token     = num_layers x kv_bytes_per_token_layer
                               (what one token costs along one tensor rank's chain of stages, which
                                run one after another within a step: what attention reads and
                                writes per token in a step)
    fetches_per_page         = num_layers x kv_heads           ((page, KV head, layer) fetches)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvsim.hw import ModelSpec


@dataclass(frozen=True)
class KVGeometry:
    """Per-GPU KV geometry. The first seven fields are the attention kernel's static layout
    (``kvsim.timing.kernel`` reads them); ``layers_per_stage`` defaults to one stage of
    ``num_layers``. Derived sizes are plain attributes, computed once (hot paths read them)."""

    num_layers: int  # every layer one tensor rank's chain of pipeline stages reads in a step
    num_kv_heads: int  # KV heads on this GPU
    num_query_heads: int  # query heads on this GPU
    head_dim: int
    kv_dtype: str
    # stored bytes per token per layer, K and V, this GPU's heads (with scales); a float, as the
    # kernel model's arithmetic takes it (a whole number of bytes)
    kv_bytes_per_token_layer: float
    block_size: int | None = None  # the allocator's page size in tokens; None = contiguous KV (no page table)
    layers_per_stage: tuple[int, ...] = ()  # pipeline stages' layers; () = one stage
    tensor: int = 1  # GPUs sharing each layer (the heads above are one GPU's share)
    bytes_per_token: int = field(init=False)
    step_bytes_per_token: int = field(init=False)
    fetches_per_page: int = field(init=False)

    def __post_init__(self) -> None:
        stages = self.layers_per_stage or (self.num_layers,)
        if sum(stages) != self.num_layers:
            raise ValueError(f"layers_per_stage {stages} do not add up to {self.num_layers} layers")
        per_layer = self.kv_bytes_per_token_layer
        set_ = object.__setattr__
        set_(self, "layers_per_stage", tuple(stages))
        set_(self, "bytes_per_token", _whole(max(stages) * per_layer))
        set_(self, "step_bytes_per_token", _whole(self.num_layers * per_layer))
        set_(self, "fetches_per_page", self.num_layers * self.num_kv_heads)

    @classmethod
    def for_gpu(cls, model: ModelSpec, kv_dtype: str, tensor: int = 1, layers_per_stage: tuple[int, ...] = (),
                block_size: int | None = None) -> KVGeometry:
        """One GPU's share of ``model``'s KV under ``tensor``-way tensor parallelism (the head counts
        must divide as :func:`kvsim.models.parallel.check_split` requires)."""
        kv_heads = 1 if model.attention == "mla" else max(1, model.num_kv_heads // tensor)
        return cls(model.num_layers, kv_heads, max(1, model.num_attention_heads // tensor), model.head_dim,
                   kv_dtype, float(model.kv_bytes_per_token_layer(kv_dtype, kv_heads)), block_size,
                   tuple(layers_per_stage), tensor)

    @classmethod
    def from_model(cls, model: ModelSpec, kv_dtype: str, block_size: int | None) -> KVGeometry:
        """The whole model on one GPU."""
        return cls.for_gpu(model, kv_dtype, block_size=block_size)

    def with_block_size(self, block_size: int | None) -> KVGeometry:
        """This geometry read through pages of ``block_size`` tokens (None: contiguous)."""
        return self if block_size == self.block_size else replace(self, block_size=block_size)

    @property
    def pipeline(self) -> int:
        return len(self.layers_per_stage)

    def to_dict(self) -> dict:
        """The summary's ``kv.geometry`` (docs/metrics.md)."""
        return {
            "tensor": self.tensor, "pipeline": self.pipeline, "layers_per_stage": list(self.layers_per_stage),
            "kv_heads_per_gpu": self.num_kv_heads, "query_heads_per_gpu": self.num_query_heads,
            "head_dim": self.head_dim, "kv_dtype": self.kv_dtype,
            "bytes_per_token_layer": _whole(self.kv_bytes_per_token_layer),
            "bytes_per_token": self.bytes_per_token, "step_bytes_per_token": self.step_bytes_per_token,
            "block_size": self.block_size,
        }


def _whole(x: float):
    """An int when ``x`` is a whole number (byte counts), else ``x``."""
    return int(x) if float(x).is_integer() else x
