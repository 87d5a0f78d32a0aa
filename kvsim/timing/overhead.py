"""The engine's CPU time per step: scheduling, input preparation, sampling, detokenisation, API server.

A serving engine spends part of every step outside the GPU kernels. kvsim prices it as one term of
each step's duration, defined here once for the scalar (``step_time``), array (``decode_durations``)
and stepwise (``FittedDecodeSteps.price``) evaluations::

    overhead_s = step_overhead_s + per_seq_s * num_seqs + per_prefill_token_s * num_prefill_tokens
                 + per_prefill_seq_s * num_prefill_seqs + per_arrival_s * num_arrivals

* ``step_overhead_s`` (the timing model's existing key): fixed per step -- gathering the last step's
  results, scheduling the next one, launching it (a CUDA graph replay or eager launches).
* ``overhead.per_seq_s``: per scheduled sequence per step -- its row of the input tensors (slot
  mapping, block table, positions), its sampling, the detokenisation of its new token and the
  streamed output through the API server. Decode steps pay it for every running sequence, which is
  how the CPU share grows with the batch (vLLM's v0.6.0 post: at high load the API server and the
  scheduler, not the GPU, bound Llama-3-8B on one H100).
* ``overhead.per_prefill_token_s``: per new prompt token computed in the step -- the per-request
  work that scales with the prompt (tokenisation, input preparation of a long chunk), charged in the
  step that computes those tokens.
* ``overhead.per_prefill_seq_s``: per prefill sequence in the step -- the fixed work of taking a
  request in (the API server's request handling and tokenisation call, adding it to the engine,
  its first output's detokenisation and first streamed chunk), charged in the step that computes
  its prompt. BatchShape counts prefill sequences, not new requests, so a prompt split over several
  chunks pays it once per chunk (exact without chunked prefill, and for prompts of one chunk).
* ``overhead.per_arrival_s``: per request the engine received since its last step (``BatchShape.
  num_arrivals``) -- taking it in on the engine's own loop before it can plan: the API server's
  handling, tokenisation and ``add_request`` of an engine whose server shares its event loop (vLLM's
  V0 ``AsyncLLMEngine``). Requests sent together are all taken in before the next step, so a burst of
  N delays that step by N of it, and a request's own prefill step need not be the one that pays.

Multi-step scheduling (``scheduler.num_scheduler_steps``, vLLM 0.6's ``--num-scheduler-steps``): the
engine schedules, prepares inputs and processes outputs once per round of decode steps and the GPU
runs the round's steps back to back, so the per-step terms are charged on a round's first step and
its later steps (``BatchShape.round_continuation``) pay only for arrivals taken in meanwhile
(docs/engine_overhead.md, "Multi-step scheduling").

Async scheduling (``scheduler.async_scheduling``, vLLM V1's default since 0.14.0): the engine plans
and prepares step k+1, and takes in step k-1's output, while the GPU runs step k
(``EngineCore.step_with_batch_queue`` with a batch queue of two), so the per-step, per-sequence and
per-prompt-token terms (the engine core's own loop) overlap the GPU's step::

    duration = max(gpu_s, step_overhead_s + per_seq_s * num_seqs + per_prefill_token_s * num_prefill_tokens)
               + per_prefill_seq_s * num_prefill_seqs + per_arrival_s * num_arrivals

and the step's ``overhead_s`` part is what the GPU did not hide, ``duration - gpu_s``. The per-request
terms stay serial: no source says they overlap (``timing.async_overlap: false`` adds every term as
without async; docs/engine_overhead.md, "Async scheduling").

Sources and the fitted constants: docs/engine_overhead.md. Defaults are 0, so
``overhead_s == step_overhead_s`` exactly (``x + 0.0 * n == x`` for every finite ``n >= 0``) and a
scenario without ``overhead:`` runs as before, bit for bit.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from kvsim.config_base import StrictModel


class EngineOverheadConfig(StrictModel):
    """``timing.overhead``: the CPU overhead terms that scale with the batch (per-step: ``step_overhead_s``)."""

    per_seq_s: float = Field(0.0, ge=0, description="CPU time per scheduled sequence per step: input "
                             "preparation, sampling, detokenisation, output streaming (docs/engine_overhead.md)")
    per_prefill_token_s: float = Field(0.0, ge=0, description="CPU time per new prompt token computed in a "
                                       "step: tokenisation and input preparation (docs/engine_overhead.md)")
    per_prefill_seq_s: float = Field(0.0, ge=0, description="CPU time per prefill sequence (chunk) in a step: "
                                     "taking a request in -- API server, tokenisation call, adding it to the "
                                     "engine, its first streamed output (docs/engine_overhead.md)")
    per_arrival_s: float = Field(0.0, ge=0, description="CPU time per request received since the last step, "
                                 "charged in the next step: an engine that takes requests in on its own loop "
                                 "(vLLM V0's AsyncLLMEngine) before it plans (docs/engine_overhead.md)")


def async_overlap_field():
    """``timing.async_overlap`` of the timing models that price the engine's CPU overhead."""
    return Field(True, description="with scheduler.async_scheduling (vLLM >= 0.14): the per-step, per-sequence "
                 "and per-prompt-token overhead runs while the GPU computes the step (vLLM's "
                 "EngineCore.step_with_batch_queue), so a step lasts max(GPU time, that overhead) plus the "
                 "per-request terms; false: every term is added, as without async (docs/engine_overhead.md)")


class StepOverhead:
    """The overhead term of one deployment: built once per timing model, evaluated on ints or arrays."""

    __slots__ = ("per_step_s", "per_seq_s", "per_prefill_token_s", "per_prefill_seq_s", "per_arrival_s", "constant",
                 "overlapped")

    def __init__(self, step_overhead_s: float, cfg: EngineOverheadConfig | None = None, overlapped: bool = False):
        """``overlapped``: the engine plans the next step while the GPU runs this one
        (TimingContext.async_scheduling and the timing model's ``async_overlap``): the engine-loop terms overlap."""
        cfg = cfg or EngineOverheadConfig()
        self.per_step_s = float(step_overhead_s)
        self.per_seq_s = float(cfg.per_seq_s)
        self.per_prefill_token_s = float(cfg.per_prefill_token_s)
        self.per_prefill_seq_s = float(cfg.per_prefill_seq_s)
        self.per_arrival_s = float(cfg.per_arrival_s)
        self.overlapped = bool(overlapped)
        # no batch-dependent term: every step costs per_step_s (the callers keep a float, no array row);
        # overlapped, what a step pays depends on its GPU time, so never constant
        self.constant = (self.per_seq_s == 0.0 and self.per_prefill_token_s == 0.0 and self.per_prefill_seq_s == 0.0
                         and self.per_arrival_s == 0.0 and not self.overlapped)

    def time_s(self, num_seqs, num_prefill_tokens=0, num_prefill_seqs=0):
        """The overhead of a step of ``num_seqs`` scheduled sequences, ``num_prefill_seqs`` of them
        prefill chunks computing ``num_prefill_tokens`` prompt tokens (ints, or int arrays: the same
        IEEE operations element by element). Without the per-prefill-sequence term the expression is
        the one before it existed, operation for operation."""
        t = self.per_step_s + self.per_seq_s * num_seqs + self.per_prefill_token_s * num_prefill_tokens
        if self.per_prefill_seq_s == 0.0:
            return t
        return t + self.per_prefill_seq_s * num_prefill_seqs

    def of_shape(self, seqs: int, shape) -> float:
        """THE overhead of one step of ``shape`` (a BatchShape) with ``seqs`` sequences in its
        launch: :meth:`time_s` of its counts plus its arrivals' intake; only that intake on a
        multi-step round's later steps."""
        if shape.round_continuation:
            return self.per_arrival_s * shape.num_arrivals if shape.num_arrivals else 0.0
        t = self.time_s(seqs, shape.num_prefill_tokens, shape.num_prefill_seqs)
        if shape.num_arrivals:
            t = t + self.per_arrival_s * shape.num_arrivals
        return t

    def decode_row(self, num_seqs: np.ndarray) -> np.ndarray:
        """``time_s(n, 0)`` for an int64 array of batch sizes (decode steps compute no prompt tokens)."""
        return self.time_s(num_seqs, 0)

    # -- async scheduling: the engine loop's terms overlap the GPU --------------------------------
    def step_s(self, gpu_s: float, seqs: int, shape) -> float:
        """THE duration of a step of ``shape`` whose GPU part (kernels, communication, swaps) is
        ``gpu_s``, overlapped (:attr:`overlapped`): ``max(gpu_s, loop)`` plus the per-request terms."""
        loop = self.time_s(seqs, shape.num_prefill_tokens)  # (+ per_prefill_seq_s * 0 = + 0.0: exact)
        d = loop if loop > gpu_s else gpu_s  # max(): the GPU's time on ties, as np.maximum(gpu, loop)
        if self.per_prefill_seq_s != 0.0 and shape.num_prefill_seqs:
            d = d + self.per_prefill_seq_s * shape.num_prefill_seqs
        if shape.num_arrivals:
            d = d + self.per_arrival_s * shape.num_arrivals
        return d

    def decode_steps_s(self, gpu_s: np.ndarray, loop_row: np.ndarray) -> np.ndarray:
        """:meth:`step_s` of decode steps (no prompt, no arrivals), element by element: ``gpu_s`` the
        steps' GPU parts, ``loop_row`` their :meth:`decode_row`."""
        return np.maximum(gpu_s, loop_row)

