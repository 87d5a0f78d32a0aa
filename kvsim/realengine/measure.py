"""Step-time measurements on a running engine: pure decode, pure prefill and mixed steps.

Every measured step is checked against what vLLM actually scheduled (the
:class:`~kvsim.realengine.vllm_engine.StepProbe`): a step whose shape is not the intended one
(e.g. a prefill chunked differently) is recorded with its real shape, never the intended one.
One measured point is one :class:`StepPoint` with the repeats' durations, tagged by the round they
were measured in (kvsim.realengine.calibrate measures the whole grid once per round, so a point's
median spans the calibration's whole duration, not one moment of a drifting host).

The decoders of a decode or mixed point have prompts that are prefixes of one fixed sequence per
decoder slot (slot ``i`` at context ``c``: the first ``c`` tokens of sequence ``i``), so the
decoders of later points and rounds are re-created from vLLM's prefix cache instead of being
prefilled again: the same requests at the same context, each on its own KV blocks, at a fraction
of the set-up time. The measured steps are pure decode (or decode plus one fresh prompt) either way.
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
    rounds: list[int] = field(default_factory=list)  # the round each kept step was measured in (empty: one round)
    gc_s: list[float] = field(default_factory=list)  # of cpu_s: Python's garbage collector
    probe_s: list[float] = field(default_factory=list)  # of cpu_s: kvsim reading the schedule (StepProbe)
    thread_s: list[float] = field(default_factory=list)  # of cpu_s: the stepping thread's own CPU time

    def key(self) -> dict:
        """What the point is (its shape), without its measurements."""
        return {"kind": self.kind, "block_size": self.block_size, "decode_seqs": self.decode_seqs,
                "decode_context": self.decode_context, "prefill_tokens": self.prefill_tokens,
                "prefill_cached": self.prefill_cached}

    def round_medians(self, values: list[float] | None = None) -> list[float]:
        """Per round, the median of its kept steps (``values``: durations_s by default, or cpu_s)."""
        v = np.asarray(self.durations_s if values is None else values, dtype=float)
        if not self.rounds:
            return [float(np.median(v))] if v.size else []
        r = np.asarray(self.rounds)
        return [float(np.median(v[r == k])) for k in sorted(set(self.rounds))]

    def median_s(self, values: list[float] | None = None) -> float:
        """The point's time: the median across rounds of each round's median (each round one sample of the
        host's state, equally weighted however many steps it kept)."""
        return float(np.median(self.round_medians(values)))

    def merge(self, other: "StepPoint", round_index: int) -> None:
        """Add ``other`` (the same point measured in round ``round_index``) to this one."""
        n_old, n_new = len(self.durations_s), len(other.durations_s)
        if n_new and self.kind != "prefill":
            self.decode_context = (self.decode_context * n_old + other.decode_context * n_new) / (n_old + n_new)
        self.durations_s += other.durations_s
        self.cpu_s += other.cpu_s
        self.gc_s += other.gc_s
        self.probe_s += other.probe_s
        self.thread_s += other.thread_s
        self.rounds += [round_index] * n_new

    def keep(self, wall_s: float, eng) -> None:
        """Record one measured step of engine ``eng`` (its wall time; CPU, gc and probe times from ``eng``)."""
        self.durations_s.append(wall_s)
        self.cpu_s.append(eng.last_cpu_s)
        self.gc_s.append(eng.last_gc_s)
        self.probe_s.append(eng.probe.last_probe_s)
        self.thread_s.append(eng.last_thread_s)

    def row(self) -> dict:
        d = np.asarray(self.durations_s, dtype=float)
        cpu = self.round_medians(self.cpu_s) if self.cpu_s else []
        return {**self.key(), "repeats": len(d), "rounds": len(set(self.rounds)) or 1,
                "median_s": self.median_s(),
                "p10_s": float(np.quantile(d, 0.1)), "p90_s": float(np.quantile(d, 0.9)), "mean_s": float(d.mean()),
                "cpu_median_s": float(np.median(cpu)) if cpu else float("nan"),
                # how far apart the rounds' CPU medians are: (max - min) / median (the host's drift at this point)
                "cpu_round_spread": float((max(cpu) - min(cpu)) / np.median(cpu)) if cpu else float("nan"),
                "gc_share": float(sum(self.gc_s) / sum(self.cpu_s)) if self.gc_s and sum(self.cpu_s) else float("nan"),
                "probe_median_s": float(np.median(self.probe_s)) if self.probe_s else float("nan")}


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
        self._slots: dict[int, list[int]] = {}  # decoder slot -> its fixed token sequence (prefixes are reused)
        self.setup_steps = 0  # engine steps spent starting decoders (prefill or prefix-cache hits)

    def _new_id(self, tag: str) -> str:
        return f"{tag}-{next(self._ids)}"

    def _prompt(self, n: int) -> list[int]:
        return random_prompt(n, self.vocab, (self._seed, 3, next(self._ids)))

    def _drain(self) -> None:
        while self.eng.has_unfinished():
            self.eng.step()

    def _decoder_prompt(self, slot: int, context: int) -> list[int]:
        """Decoder ``slot``'s prompt at ``context`` tokens: a prefix of the slot's fixed sequence."""
        have = self._slots.setdefault(slot, [])
        if len(have) < context:  # extend, never redraw: the tokens already used stay the slot's prefix
            have += random_prompt(context - len(have), self.vocab, (self._seed, 4, slot, len(have)))
        return have[:context]

    def _start_decoders(self, batch: int, context: int, outputs: int) -> list[str]:
        # the first requests decode while the last still prefill: they must not finish before the measured steps
        outputs += -(-batch * context // self.eng.settings.max_num_batched_tokens) + 1
        ids = [self._new_id("d") for _ in range(batch)]
        for slot, rid in enumerate(ids):
            self.eng.add(rid, self._decoder_prompt(slot, context), outputs)
        started: set[str] = set()
        while len(started) < batch:
            _, _, outs = self.eng.step()
            self.setup_steps += 1
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
                pt.keep(t1 - t0, self.eng)
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
                pt.keep(t1 - t0, self.eng)
                ctx.append(s.decode_context / batch)
        self.eng.abort(ids)
        self._drain()
        pt.decode_context = float(np.mean(ctx)) if ctx else float(context)
        return pt
