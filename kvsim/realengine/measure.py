"""Step-time measurements on a running engine: pure decode, pure prefill and mixed steps.

Every measured step is checked against what vLLM actually scheduled (the
:class:`~kvsim.realengine.vllm_engine.StepProbe`): a step whose shape is not the intended one
(e.g. a prefill chunked differently) is recorded with its real shape, never the intended one.
One measured point is one :class:`StepPoint` with the repeats' durations.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from kvsim.realengine.tokens import random_prompt

POINT_KINDS = ("decode", "prefill", "mixed")


@dataclass
class StepPoint:
    kind: str  # decode | prefill | mixed
    block_size: int
    decode_seqs: int
    decode_context: float  # mean KV tokens a decode sequence attends to
    prefill_tokens: int
    prefill_cached: int
    durations_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)  # process CPU time of the same steps

    def row(self) -> dict:
        d = np.asarray(self.durations_s, dtype=float)
        return {"kind": self.kind, "block_size": self.block_size, "decode_seqs": self.decode_seqs,
                "decode_context": self.decode_context, "prefill_tokens": self.prefill_tokens,
                "prefill_cached": self.prefill_cached, "repeats": len(d), "median_s": float(np.median(d)),
                "p10_s": float(np.quantile(d, 0.1)), "p90_s": float(np.quantile(d, 0.9)), "mean_s": float(d.mean()),
                "cpu_median_s": float(np.median(self.cpu_s)) if self.cpu_s else float("nan")}


class Measurer:
    """Drives one engine through measurement points. ``vocab``: the model's vocabulary size."""

    def __init__(self, engine, vocab: int, warmup: int, repeats: int, seed: int = 0):
        self.eng = engine
        self.vocab = vocab
        self.warmup = warmup
        self.repeats = repeats
        self._ids = itertools.count()
        self._seed = seed
        self.mismatched = 0  # steps whose shape was not the intended one (recorded with the real shape)

    def _new_id(self, tag: str) -> str:
        return f"{tag}-{next(self._ids)}"

    def _prompt(self, n: int) -> list[int]:
        return random_prompt(n, self.vocab, (self._seed, 3, next(self._ids)))

    def _drain(self) -> None:
        while self.eng.has_unfinished():
            self.eng.step()

    def _start_decoders(self, batch: int, context: int, outputs: int) -> list[str]:
        # the first requests decode while the last still prefill: they must not finish before the measured steps
        outputs += -(-batch * context // self.eng.settings.max_num_batched_tokens) + 1
        ids = [self._new_id("d") for _ in range(batch)]
        for rid in ids:
            self.eng.add(rid, self._prompt(context), outputs)
        started: set[str] = set()
        while len(started) < batch:
            _, _, outs = self.eng.step()
            started.update(o.request_id for o in outs if o.outputs and o.outputs[0].token_ids)
        return ids

    def decode(self, batch: int, context: int) -> StepPoint:
        return self._with_decoders("decode", batch, context, 0)

    def prefill(self, chunk: int, cached: int) -> StepPoint:
        prefix = self._prompt(cached) if cached else []
        if cached:
            self.eng.add(self._new_id("p"), prefix, 1)
            self._drain()
        pt = StepPoint("prefill", self.eng.settings.block_size, 0, 0.0, chunk, cached)
        for k in range(self.warmup + self.repeats):
            self.eng.add(self._new_id("q"), prefix + self._prompt(chunk), 1)
            t0, t1, _ = self.eng.step()
            s = self.eng.probe.last
            self._drain()
            if s.prefill_seqs != 1 or s.decode_seqs or s.prefill_tokens != chunk or s.prefill_cached != cached:
                self.mismatched += 1
                continue
            if k >= self.warmup:
                pt.durations_s.append(t1 - t0)
                pt.cpu_s.append(self.eng.last_cpu_s)
        return pt

    def mixed(self, batch: int, context: int, chunk: int) -> StepPoint:
        return self._with_decoders("mixed", batch, context, chunk)

    def _with_decoders(self, kind: str, batch: int, context: int, chunk: int) -> StepPoint:
        """Steps of ``batch`` decoding requests at ``context`` tokens, each with one new prompt of
        ``chunk`` tokens beside them (0: pure decode); steps vLLM scheduled otherwise are not kept."""
        ids = self._start_decoders(batch, context, self.warmup + self.repeats + (3 if chunk else 2))
        pt = StepPoint(kind, self.eng.settings.block_size, batch, 0.0, chunk, 0)
        ctx = []
        for k in range(self.warmup + self.repeats):
            if chunk:
                self.eng.add(self._new_id("m"), self._prompt(chunk), 1)
            t0, t1, _ = self.eng.step()
            s = self.eng.probe.last
            if s.decode_seqs != batch or s.prefill_tokens != chunk or (chunk and s.prefill_seqs != 1):
                self.mismatched += 1
                continue
            if k >= self.warmup:
                pt.durations_s.append(t1 - t0)
                pt.cpu_s.append(self.eng.last_cpu_s)
                ctx.append(s.decode_context / batch)
        self.eng.abort(ids)
        self._drain()
        pt.decode_context = float(np.mean(ctx)) if ctx else float(context)
        return pt
