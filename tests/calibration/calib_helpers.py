"""Helpers shared by the calibration tests (imported by name: tests/calibration is on sys.path)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CPU_EXAMPLE = REPO / "calibration" / "cpu-example"


def timing_context(model_name: str = "Llama-3-8B", kv_dtype: str = "fp16", block_size: int | None = 16,
                   gpu: str = "H200-141GB", base_dir: Path | None = None, async_scheduling: bool = False):
    from kvsim.hw import GPUS, MODELS
    from kvsim.models.geometry import KVGeometry
    from kvsim.timing.context import TimingContext

    m = MODELS[model_name]
    return TimingContext(model=m, gpu=GPUS[gpu], kv=KVGeometry.from_model(m, kv_dtype, block_size),
                         weight_bytes=m.weight_bytes("bf16"),
                         base_dir=base_dir if base_dir is not None else REPO, async_scheduling=async_scheduling)


def edit_meta(path: Path, fn) -> None:
    meta = json.loads((path / "meta.json").read_text())
    fn(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def decode_shape(batch: int, context: int):
    """A pure-decode BatchShape: ``batch`` sequences each reading ``context`` KV tokens."""
    from kvsim.timing.base import BatchShape

    return BatchShape(num_seqs=batch, num_prefill_seqs=0, num_decode_seqs=batch, num_prefill_tokens=0,
                      num_decode_tokens=batch, kv_tokens_read=batch * context, attention_pairs=batch * context)


def prefill_shape(new: int, cached: int = 0):
    from kvsim.timing.base import BatchShape

    return BatchShape(num_seqs=1, num_prefill_seqs=1, num_decode_seqs=0, num_prefill_tokens=new, num_decode_tokens=0,
                      kv_tokens_read=cached + new, attention_pairs=new * cached + new * (new + 1) // 2)


def mixed_shape(new: int, cached: int, decode_contexts: list[int]):
    """One prefill chunk plus decode sequences (each context includes its new token)."""
    from kvsim.timing.base import BatchShape

    d = len(decode_contexts)
    return BatchShape(num_seqs=1 + d, num_prefill_seqs=1, num_decode_seqs=d, num_prefill_tokens=new,
                      num_decode_tokens=d, kv_tokens_read=cached + new + sum(decode_contexts),
                      attention_pairs=new * cached + new * (new + 1) // 2 + sum(decode_contexts))
