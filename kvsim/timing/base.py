"""The timing-model boundary: a batch shape in, a step duration with a breakdown out.

Timing models are plain Python (no SimPy) and stateless after construction, so they can be unit
tested directly and evaluated vectorised by a fast engine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from kvsim.record import record

log = logging.getLogger("kvsim.capabilities")


@record
class BatchShape:
    """What one engine step computes, aggregated over the scheduled requests.

    For request *i* scheduled with ``n_i`` new tokens on top of ``c_i`` already-computed tokens:

    * ``num_prefill_tokens`` / ``num_decode_tokens``: new tokens of requests still catching up on
      their prompt (prefill, including recompute) / generating (exactly one token each);
    * ``kv_tokens_read``: sum of ``c_i + n_i`` -- every KV entry attention reads this step;
    * ``attention_pairs``: sum of ``n_i*c_i + n_i*(n_i+1)/2`` -- causal (query, key) pairs;
    * ``kv_pages_read``: sum over the sequences counted in ``kv_tokens_read`` of the pages attention
      reads, ``ceil((c_i + n_i) / block_size)`` (1 per sequence when the allocator has no pages);
    * ``num_prefill_seqs`` / ``num_decode_seqs``: requests in each group;
    * ``swap_in_bytes`` / ``swap_out_bytes``: KV moved between GPU and a host tier that this step
      pays for (a swap-in's part that prefetch hid is off: the step table counts it, the step time not);
      ``swap_in_copies`` / ``swap_out_copies``: the copies that takes (blocks or runs x layout
      copies, docs/transfer_model.md; 0 and unused on the legacy size-independent link);
    * ``tier_load_s``: time loading offloaded prefix blocks back, priced by the transfer model
      (:mod:`kvsim.timing.transfer`: the host link, or a tier's own bandwidth); the part hidden by
      prefetch is already taken off;
    * ``round_continuation``: the step is the second or later of a multi-step round
      (``scheduler.num_scheduler_steps``, vLLM 0.6): the round was planned, and its CPU work paid, at
      its first step, so timing models charge this step no overhead term (:mod:`kvsim.timing.overhead`);
    * ``num_arrivals``: requests the scheduler received (accepted) since it planned the last step, for
      an engine that takes requests in on its own loop before it plans (``overhead.per_arrival_s``);
    * ``context_lens`` (optional): per-request ``c_i + n_i`` for models that need the shape of the
      batch (the calibrated model); engines that do not need it may leave it empty.
    """

    num_seqs: int
    num_prefill_seqs: int
    num_decode_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    kv_tokens_read: int
    attention_pairs: int
    kv_pages_read: int = 0  # sum over scheduled sequences of pages (blocks) attention reads: ceil(context_i / block_size) on paged allocators, one contiguous run per sequence on contiguous/buddy
    swap_in_bytes: int = 0
    swap_out_bytes: int = 0
    swap_in_copies: int = 0  # copies (memcpys) the swap-in bytes take over the host link
    swap_out_copies: int = 0  # copies the swap-out bytes take
    tier_load_s: float = 0.0  # loading offloaded prefix blocks back from CPU/SSD tiers (serial)
    # a multi-step round's second or later step (scheduler.num_scheduler_steps): its CPU overhead was
    # paid with the round's first step (kvsim.timing.overhead)
    round_continuation: bool = False
    # requests the scheduler received since its last plan (their intake: timing.overhead per_arrival_s)
    num_arrivals: int = 0
    context_lens: tuple[int, ...] = field(default=(), compare=False)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


def split_kv_tokens(shape: BatchShape) -> tuple[float, float]:
    """(prefill, decode) KV tokens read, from the shape's sums: with ``p`` prefill sequences of
    (assumed) equal chunk ``n = num_prefill_tokens / p``, prefill reads
    ``(attention_pairs - kv_tokens_read) / (n - 1) + p * n / 2`` (exact for one chunk per step, for
    pure-decode and for pure-prefill steps; docs in :mod:`kvsim.timing.calibrated`). Decode reads
    >= 1 token per sequence. Shared by the analytical and calibrated models (a per-step hot path)."""
    p, d, kv = shape.num_prefill_seqs, shape.num_decode_seqs, shape.kv_tokens_read
    if p == 0:
        return 0.0, float(kv)
    if d == 0:
        return float(kv), 0.0
    n = shape.num_prefill_tokens / p
    if n > 1:
        pre = (shape.attention_pairs - kv) / (n - 1) + p * n / 2
    else:  # 1-token chunks look like decode: share the KV in proportion to sequences
        pre = kv * p / (p + d)
    # min(max(pre, lo), hi), written out (the builtins return their first argument on ties)
    lo = float(shape.num_prefill_tokens)
    if lo > pre:
        pre = lo
    hi = float(kv - d)
    if hi < pre:
        pre = hi
    return pre, kv - pre


# The breakdown names a timing model may report (``StepTiming.breakdown_s`` keys and
# ``decode_durations`` parts; seconds each, defined in docs/metrics.md "steps"). This boundary owns
# them: the step table has one column per recorded name, in this order (kvsim/metrics/recorder.py
# builds its columns from this tuple), and a name in neither tuple is refused when a row is
# recorded (:func:`check_breakdown`). A new term is added here (and to docs/metrics.md) first.
RECORDED_BREAKDOWN: tuple[str, ...] = (
    "weights_read_s", "kv_read_s", "linear_compute_s", "attention_compute_s", "attention_s",
    "overhead_s", "swap_s", "compute_s", "decode_attention_s", "prefill_attention_s", "gemm_s", "lm_head_s",
    "elementwise_s", "kv_write_s", "moe_experts_s", "parallel_comm_s",
)
# The step's exclusive parts (docs/metrics.md "Steps", "The step-time identity"): under every timing
# model but the analytical roofline they add up to ``duration_s`` (within float rounding); the other
# names are sub-parts of these (gemm_s, lm_head_s, elementwise_s; decode/prefill_attention_s) or the
# roofline's two sides (weights_read_s, kv_read_s, attention_compute_s), so
#     duration_s == attention_s + linear_compute_s + compute_s + moe_experts_s + kv_write_s
#                   + overhead_s + swap_s + parallel_comm_s                        (sequential kernels)
#     duration_s == max(weights_read_s + kv_read_s, linear_compute_s + attention_compute_s)
#                   + moe_experts_s + overhead_s + swap_s + parallel_comm_s        (gemm_model: roofline)
EXCLUSIVE_BREAKDOWN: tuple[str, ...] = (
    "attention_s", "linear_compute_s", "compute_s", "moe_experts_s", "kv_write_s", "overhead_s", "swap_s",
    "parallel_comm_s",
)
# Reported but not a step-table column: none since parallel_comm_s and moe_experts_s became columns
# (docs/metrics.md changelog); a name added here is refused by no row but recorded by none.
UNRECORDED_BREAKDOWN: tuple[str, ...] = ()
BREAKDOWN_NAMES: frozenset[str] = frozenset(RECORDED_BREAKDOWN + UNRECORDED_BREAKDOWN)


class UndeclaredBreakdown(ValueError):
    """A timing model reported a breakdown name this boundary does not declare."""


def check_breakdown(breakdown: dict) -> None:
    """Raise :class:`UndeclaredBreakdown` if ``breakdown`` has a name not in ``BREAKDOWN_NAMES``
    (one C-level subset test when it has none; called for every recorded row)."""
    if not breakdown.keys() <= BREAKDOWN_NAMES:
        unknown = sorted(set(breakdown) - BREAKDOWN_NAMES)
        raise UndeclaredBreakdown(
            f"timing breakdown names {unknown} are not declared in kvsim/timing/base.py "
            f"(RECORDED_BREAKDOWN / UNRECORDED_BREAKDOWN); declared: {sorted(BREAKDOWN_NAMES)}")


@record
class StepTiming:
    """One step's duration and where it went. The parts named in ``EXCLUSIVE_BREAKDOWN`` add up to
    ``duration_s`` (the roofline: its ``max`` over two of them, above); the other names repeat or
    split them; ``duration_s`` is authoritative. Its keys are
    among ``BREAKDOWN_NAMES`` (any subset; a missing recorded name is a 0 column)."""

    duration_s: float
    breakdown_s: dict[str, float]
    kv_bytes_read: int


@runtime_checkable
class TimingModel(Protocol):
    """Required: the duration of one step of ``shape``."""

    def step_time(self, shape: BatchShape) -> StepTiming: ...


@runtime_checkable
class VectorisedDecodeTiming(Protocol):
    """Optional capability: ``step_time`` of many decode-only steps at once (decode windows).

    Step ``j`` is a batch of ``num_seqs[j]`` sequences that each decode one token, reading
    ``kv_tokens_read[j]`` KV tokens in ``kv_pages_read[j]`` pages (int64 arrays; no prefill, swaps
    or tier loads). Returns ``(durations, parts, kv_bytes_read)``: element ``j`` of ``durations``
    must equal ``step_time(shape_j).duration_s`` bit for bit (the fast engine relies on it);
    ``parts`` maps each breakdown name to its per-step values (an array, or a float that is the
    same every step); ``kv_bytes_read`` is per step. See :func:`decode_totals`."""

    def decode_durations(self, num_seqs: np.ndarray, kv_tokens_read: np.ndarray,
                         kv_pages_read: np.ndarray): ...


@runtime_checkable
class AttentionBackendNamed(Protocol):
    """Optional capability: the attention-kernel backend the model resolved for this run (a
    built-in profile name, ``NAME (PATH)`` for a profile file, or ``roofline``): written to
    ``summary.json`` (``kv_access.attention_backend``), ``scenario.resolved.yaml`` and the report."""

    attention_backend: str


@runtime_checkable
class PricesArrivals(Protocol):
    """Optional capability: the model charges the intake of the requests a step's plan received
    (``BatchShape.num_arrivals``; ``timing.overhead.per_arrival_s`` > 0). Decode windows then end
    before each arrival, so a step-by-step run and a fast one charge each intake in the same step."""

    prices_arrivals: bool


@runtime_checkable
class MoeKernelNamed(Protocol):
    """Optional capability: how the timing model priced an MoE model's routed experts
    (``timing.moe_kernel`` after resolving ``auto``): a kernel profile name, ``none`` (weight
    roofline plus the MoE layers' fixed terms), or None for a dense model. Written to
    ``summary.json`` (``moe_kernel``), ``scenario.resolved.yaml`` and the report."""

    moe_kernel: str | None


class DecodeStepPricer(Protocol):
    """What :class:`ScalarDecodeSteps` hands out: decode steps priced one at a time.

    ``price(num_seqs, kv_tokens_read, kv_pages_read, lo, hi, t, durations, times, columns)`` prices
    steps ``lo .. hi-1`` of the per-step lists (Python ints), the first starting at time ``t``: it
    appends each step's duration to ``durations``, its end (``t`` plus the durations, added one by
    one) to ``times`` and its ``parts`` (an opaque per-step value) to ``columns``, and returns the
    last end. Each duration must equal element j of ``decode_durations`` (and so ``step_time``) bit
    for bit for that step. ``column(num_seqs, kv_tokens_read, kv_pages_read)`` is one step of it:
    ``(duration, parts)``. ``parts(columns)`` returns the breakdown ``decode_durations`` would give
    for the steps whose ``parts`` are ``columns`` (in step order), summed by :func:`decode_totals`
    the same way; ``totals(columns, kv_tokens_read=None)`` is that breakdown for
    ``decode_totals(..., len(columns))`` alone (it may come summed already, with the KV bytes of
    those steps' ``kv_tokens_read``: :class:`SummedParts`); ``kv_bytes_per_token`` converts the
    steps' KV tokens to the bytes ``decode_durations`` reports."""

    kv_bytes_per_token: int

    def price(self, num_seqs: list, kv_tokens_read: list, kv_pages_read: list, lo: int, hi: int, t: float,
              durations: list, times: list, columns: list) -> float: ...

    def column(self, num_seqs: int, kv_tokens_read: int, kv_pages_read: int) -> tuple[float, object]: ...

    def parts(self, columns: list) -> dict: ...

    def totals(self, columns: list, kv_tokens_read: list | None = None) -> dict: ...


@runtime_checkable
class ScalarDecodeSteps(Protocol):
    """Optional capability (with :class:`VectorisedDecodeTiming`): ``decode_step_pricer()`` returns
    a :class:`DecodeStepPricer`, or None where this configuration of the model has none. Decode
    windows that usually stop after a few of their planned steps (a backlog: the waiting queue's
    head is admitted at the next finish) then price only the steps that run, one at a time,
    instead of the whole planned horizon in one ``decode_durations`` call, whose fixed cost is
    that of dozens of steps priced one by one. Checked once, when a run is built."""

    def decode_step_pricer(self) -> DecodeStepPricer | None: ...


@runtime_checkable
class NeedsContextLens(Protocol):
    """Optional: ``needs_context_lens`` -- true when ``step_time`` reads
    ``BatchShape.context_lens`` (each sequence's length; the scheduler builds it only then, and
    decode groups, which keep no per-sequence lengths, are off)."""

    needs_context_lens: bool


@runtime_checkable
class CopyBandwidth(Protocol):
    """Optional: ``copy_bandwidth_bytes_per_s`` -- the device's measured copy rate (bytes read +
    written per second), the summary's reference for ``kv_bandwidth_utilisation``."""

    copy_bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class TimingCapabilities:
    """What a timing model offers beyond :class:`TimingModel` that the build and the summary use,
    checked once per run (:func:`timing_capabilities`)."""

    needs_context_lens: bool = False
    copy_bandwidth_bytes_per_s: float | None = None
    attention_backend: str | None = None  # AttentionBackendNamed; None: no attention kernel model
    moe_kernel: str | None = None  # MoeKernelNamed; None: a dense model or no MoE kernel choice
    prices_arrivals: bool = False  # PricesArrivals: windows end before each arrival


def timing_capabilities(model: object) -> TimingCapabilities:
    if not isinstance(model, TimingModel):
        raise TypeError(f"{type(model).__name__} is not a timing model: missing step_time")
    return TimingCapabilities(
        needs_context_lens=isinstance(model, NeedsContextLens) and bool(model.needs_context_lens),
        copy_bandwidth_bytes_per_s=(float(model.copy_bandwidth_bytes_per_s)
                                    if isinstance(model, CopyBandwidth) else None),
        attention_backend=model.attention_backend if isinstance(model, AttentionBackendNamed) else None,
        moe_kernel=model.moe_kernel if isinstance(model, MoeKernelNamed) else None,
        prices_arrivals=isinstance(model, PricesArrivals) and bool(model.prices_arrivals))


def decode_shape(num_seqs: int, kv_tokens_read: int, kv_pages_read: int) -> BatchShape:
    """The BatchShape of a decode-only step (what the scheduler builds for one)."""
    return BatchShape(num_seqs=num_seqs, num_prefill_seqs=0, num_decode_seqs=num_seqs, num_prefill_tokens=0,
                      num_decode_tokens=num_seqs, kv_tokens_read=kv_tokens_read, attention_pairs=kv_tokens_read,
                      kv_pages_read=kv_pages_read)


class StepTimeVectorisation:
    """The default :class:`VectorisedDecodeTiming` of a model with only ``step_time``: one call per
    step, so element ``j`` is ``step_time(shape_j)`` by construction. Decode windows still run (one
    SimPy event and one row per window), pricing at step speed."""

    def __init__(self, timing: TimingModel):
        self.timing = timing

    def decode_durations(self, num_seqs: np.ndarray, kv_tokens_read: np.ndarray, kv_pages_read: np.ndarray):
        step_time = self.timing.step_time
        steps = [step_time(decode_shape(n, kv, p))
                 for n, kv, p in zip(num_seqs.tolist(), kv_tokens_read.tolist(), kv_pages_read.tolist())]
        m = len(steps)
        durations = np.fromiter((st.duration_s for st in steps), np.float64, m)
        kv_bytes = np.fromiter((st.kv_bytes_read for st in steps), np.int64, m)
        names: dict[str, None] = {}
        for st in steps:
            names.update(dict.fromkeys(st.breakdown_s))
        parts = {name: np.fromiter((st.breakdown_s.get(name, 0.0) for st in steps), np.float64, m)
                 for name in names}
        return durations, parts, kv_bytes


def decode_pricer(timing: TimingModel) -> tuple[VectorisedDecodeTiming, bool]:
    """The vectorised pricing decode windows use for ``timing``: its own ``decode_durations`` if it
    has one, else :class:`StepTimeVectorisation`. Returns ``(pricer, native)``; checked once per run."""
    if not isinstance(timing, TimingModel):
        raise TypeError(f"{type(timing).__name__} is not a timing model: it has no step_time(shape)")
    if isinstance(timing, VectorisedDecodeTiming):
        log.debug("timing %s: native decode_durations", type(timing).__name__)
        return timing, True
    log.debug("timing %s: decode windows priced through step_time", type(timing).__name__)
    return StepTimeVectorisation(timing), False


class DecodeParts(dict):
    """A ``decode_durations`` breakdown whose per-step arrays are the rows of one 2-D ``matrix``
    (``rows``: breakdown name -> row index; the other names hold floats, the same every step), so
    :func:`decode_totals` sums them all in one reduction. numpy sums each row along its contiguous
    axis with the same pairwise summation as the row on its own, so the sums are those of
    ``row[:k].sum()`` bit for bit (tests/timing/test_timing_fast_paths.py checks it; short prefixes
    are summed in step order instead, see :func:`decode_totals`)."""

    __slots__ = ("matrix", "rows")

    def __init__(self, parts: dict, matrix: np.ndarray, rows: dict[str, int]):
        super().__init__(parts)
        # the single reduction needs contiguous rows (a strided row would be summed in another order)
        self.matrix = matrix if matrix.flags.c_contiguous else np.ascontiguousarray(matrix)
        self.rows = rows


SMALL_SUM_STEPS = 24  # decode_totals: a DecodeParts of at most this many steps is summed in Python


class SummedParts(dict):
    """What :func:`decode_totals` returns for a :class:`DecodeParts` of ``steps`` (<=
    ``SMALL_SUM_STEPS``) steps, summed already: the breakdown by name (a row's sum in step order,
    ``value * steps`` for a part that is the same every step) and, where known, the steps' KV bytes
    read (``kv_bytes``; None: decode_totals sums the KV bytes it is given). Only
    ``decode_totals(parts, kv, steps)`` reads it."""

    __slots__ = ("steps", "kv_bytes")

    def __init__(self, totals: dict, steps: int, kv_bytes: int | None = None):
        super().__init__(totals)
        self.steps = steps
        self.kv_bytes = kv_bytes


def decode_totals(parts: dict, kv_read_bytes, k: int) -> tuple[dict[str, float], int]:
    """Breakdown sums and KV bytes read over the first ``k`` steps of a ``decode_durations`` result.

    ``parts`` maps a breakdown name to its per-step values: an array, or a float that is the same
    every step (summed as ``value * k``). A :class:`DecodeParts` is summed in one reduction (up to
    ``SMALL_SUM_STEPS`` steps: in step order, in Python floats; the two may differ in the last
    bits); an array that appears under several names is summed once."""
    if isinstance(parts, SummedParts):
        if k != parts.steps:
            raise ValueError(f"decode_totals: SummedParts of {parts.steps} steps summed over {k}")
        if parts.kv_bytes is not None:
            return dict(parts), parts.kv_bytes
        return dict(parts), _kv_sum(kv_read_bytes, k)
    kv_bytes = _kv_sum(kv_read_bytes, k)
    if isinstance(parts, DecodeParts):
        if k <= SMALL_SUM_STEPS:  # numpy's fixed cost per call would be most of the work
            sums = [sum(row) for row in parts.matrix[:, :k].tolist()]
        else:
            sums = np.add.reduce(parts.matrix[:, :k], axis=1).tolist()
        rows = parts.rows
        return {name: (sums[rows[name]] if name in rows else v * k) for name, v in parts.items()}, kv_bytes
    breakdown: dict[str, float] = {}
    summed: dict[int, float] = {}
    for name, v in parts.items():
        if hasattr(v, "shape"):
            total = summed.get(id(v))
            if total is None:
                total = summed[id(v)] = float(v[:k].sum())
            breakdown[name] = total
        else:
            breakdown[name] = v * k
    return breakdown, kv_bytes


def _kv_sum(kv_read_bytes, k: int) -> int:
    """decode_totals' KV bytes: the first ``k`` steps' sum, a Python int."""
    kv = kv_read_bytes[:k]
    return sum(kv.tolist()) if k <= SMALL_SUM_STEPS and kv.dtype.kind in "iu" else int(np.add.reduce(kv))
