"""Step time from GPU measurements (``kvsim calibrate``), interpolated to the step's shape.

Per step, with ``L`` layers (every table holds one layer's time at tensor-parallel degree 1)::

    decode_attention_s  = L * T_decode(block, batch = decode seqs, context = mean decode context)
    prefill_attention_s = L * prefill seqs * T_prefill(block, new = mean chunk, cached = mean cached)
    gemm_s              = L * sum_op T_op(num_tokens)  for op in QKV, out, MLP up/gate, MLP down
    lm_head_s           = T_lm_head(num_seqs)          (once per step, if measured)
    elementwise_s       = L * T_elementwise(num_tokens) (norms, RoPE, activation, adds; if measured)
    swap_s              = (swap_in_bytes + swap_out_bytes) / host_link_bandwidth + tier_load_s, or with
                          host_link: the transfer model per copy (docs/transfer_model.md)
    duration            = attention_s + gemm_s + lm_head_s + elementwise_s + overhead_s + swap_s
    (overhead_s: kvsim.timing.overhead -- step_overhead_s, plus the per-sequence and per-prompt-token
    terms of ``overhead:`` when given)

``breakdown_s`` holds each term, the decode/prefill split of ``attention_s``, and ``compute_s`` =
gemm + lm_head + elementwise (sub-totals repeat their parts; ``duration_s`` is authoritative).
Kernels on one stream serialise, so components add (no roofline ``max``). The interpolation rules
are in :mod:`kvsim.calibration_data.interp` (log-log over batch/context/tokens, exact at measured
points; unmeasured block sizes interpolate in log2(block size) between neighbours, or take the
nearest measured size outside the range). Allocators without fixed blocks use the contiguous-KV
baseline when it was measured for the KV dtype, else the largest measured block size.

Splitting the aggregate :class:`BatchShape` into decode and prefill work: decode requests read
``c_i + 1`` KV tokens and contribute as many attention pairs, so with ``p`` prefill requests of
(assumed) equal chunk ``n = num_prefill_tokens / p``::

    prefill_kv = (attention_pairs - kv_tokens_read) / (n - 1) + p * n / 2

which is exact when ``p == 1`` (the common chunked-prefill step), for pure-decode and for
pure-prefill steps. ``context_lens`` is not needed (``needs_context_lens = False``): a ragged decode
batch is priced at its mean context, which is exact for a memory-bound kernel whose time is linear
in the KV bytes read.

This module imports numpy/pandas only: never torch or triton.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from kvsim.calibration_data import interp
from kvsim.calibration_data import schema as S
from kvsim.calibration_data.loader import CalibrationData, load_calibration_dir  # noqa: F401  (re-exported)
from kvsim.config_base import ByteRate, StrictModel
from kvsim.errors import CalibrationError
from kvsim.hw import GPUS, ModelSpec
from kvsim.registry import TIMING_MODELS
from kvsim.timing.base import BatchShape, StepTiming, split_kv_tokens  # noqa: F401  (re-exported)
from kvsim.timing.context import TimingContext
from kvsim.timing.overhead import EngineOverheadConfig, StepOverhead, async_overlap_field
from kvsim.timing.transfer import DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S, null_link_rate_is_unset, step_transfers

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd


class CalibratedTimingConfig(StrictModel):
    kind: Literal["calibrated"] = "calibrated"
    file: str = Field(..., description="calibration directory (meta.json + measurements.csv); relative paths "
                                       "resolve against the scenario file's folder, then the working directory")
    step_overhead_s: float = Field(0.002, ge=0, description="fixed CPU/scheduling cost per step (kernel times "
                                                             "are measured without launch gaps)")
    overhead: EngineOverheadConfig | None = Field(
        None, description="CPU overhead that scales with the batch: per_seq_s, per_prefill_token_s; absent: "
                          "none (docs/engine_overhead.md)")
    async_overlap: bool = async_overlap_field()
    host_link_bandwidth_bytes_per_s: ByteRate = Field(DEFAULT_HOST_LINK_BANDWIDTH_BYTES_PER_S, gt=0, description="GPU<->host link for swaps")
    decode_impl: Literal["best", "triton", "triton_splitk", "torch_reference", "triton_interpreter"] = Field(
        "best", description="decode implementation to price; best = fastest measured per point")
    include_lm_head: bool = True
    include_elementwise: bool = True
    allow_cpu_data: bool = Field(False, description="accept a CPU plumbing calibration (tests only)")

    _null_link_is_unset = model_validator(mode="before")(null_link_rate_is_unset)  # null: the key unset


def resolve_calibration_path(file: str, base_dir: Path | None) -> Path:
    """Absolute paths as given; relative ones against ``base_dir`` (the scenario's folder) if that
    exists there, else against the working directory."""
    p = Path(file).expanduser()
    if p.is_absolute():
        return p
    if base_dir is not None and (Path(base_dir) / p).exists():
        return Path(base_dir) / p
    if p.exists():
        return p.resolve()
    where = f"{Path(base_dir) / p} or {Path.cwd() / p}" if base_dir is not None else str(Path.cwd() / p)
    raise CalibrationError(f"timing.file: calibration directory {file!r} not found (looked for {where})")


def check_model(data: CalibrationData, model: ModelSpec) -> None:
    meta_model = data.meta["model"]
    if meta_model["name"] != model.name:
        raise CalibrationError(f"{data.meta_path}: field 'model.name' is {meta_model['name']!r} but the scenario's "
                               f"model is {model.name!r}; calibrate for this model (kvsim calibrate --model "
                               f"{model.name})")
    for key in S.MODEL_GEOMETRY_KEYS:
        if meta_model[key] != getattr(model, key):
            raise CalibrationError(f"{data.meta_path}: field 'model.{key}' is {meta_model[key]!r} but model "
                                   f"{model.name} has {getattr(model, key)!r}")


class CalibratedTiming:
    """A :class:`~kvsim.timing.base.TimingModel` reading a calibration directory.

    Attributes for reports: ``copy_bandwidth_bytes_per_s`` (measured device copy, bytes read +
    written per second), ``calibration_path``, ``device`` ('cuda' | 'cpu'), ``gpu_name``,
    ``block_size_rule`` (how the allocator's block size maps to the measured ones).
    """

    needs_context_lens = False  # see module docstring: aggregates suffice

    def __init__(self, cfg: CalibratedTimingConfig, ctx: TimingContext):
        self.cfg = cfg
        self.transfers = step_transfers(ctx.host_transfers, cfg.host_link_bandwidth_bytes_per_s)
        path = resolve_calibration_path(cfg.file, ctx.base_dir)
        data = load_calibration_dir(path)
        meta = data.meta
        engine = meta.get("source") == "engine"  # whole-step times of a running engine (kvsim.realengine)
        if meta["device"] == "cpu" and not cfg.allow_cpu_data and not engine:
            raise CalibrationError(f"{data.meta_path}: field 'device' is 'cpu': plumbing data, not GPU timings; "
                                   "set timing.allow_cpu_data: true to use it anyway (tests only)")
        check_model(data, ctx.model)
        gpu = meta.get("gpu_name")
        if gpu in GPUS and gpu != ctx.gpu.preset:  # the part measured against the scenario's preset, not its name
            preset = ctx.gpu.preset
            named = "" if preset == ctx.gpu.name else f" (preset {preset!r})" if preset else " (no preset)"
            raise CalibrationError(f"{data.meta_path}: field 'gpu_name' is {gpu!r} but the scenario's GPU is "
                                   f"{ctx.gpu.name!r}{named}")
        dt = ctx.kv_dtype
        if dt not in meta["kv_dtypes"]:
            raise CalibrationError(f"{data.meta_path}: field 'kv_dtypes' is {meta['kv_dtypes']}: KV dtype {dt!r} "
                                   f"was not measured")
        df = data.df
        # an engine calibration's per-step curve already holds the fixed step cost (docs/calibration.md)
        self.step_overhead_s = 0.0 if engine and "step_overhead_s" not in cfg.model_fields_set else cfg.step_overhead_s
        self.overhead = StepOverhead(self.step_overhead_s, cfg.overhead,  # kvsim.timing.overhead
                                     ctx.async_scheduling and cfg.async_overlap)
        self.prices_arrivals = self.overhead.per_arrival_s > 0  # PricesArrivals (kvsim.timing.base)
        self.calibration_path = path
        self.device = meta["device"]
        self.gpu_name = gpu
        self.copy_bandwidth_bytes_per_s = float(meta["copy_bandwidth_bytes_per_s"])
        self.kv_bytes_per_token = ctx.kv_bytes_per_token
        self.num_layers = ctx.model.num_layers

        def rows(op: str, dtype: str | None = None, required: bool = True) -> pd.DataFrame:
            sel = df[(df["op"] == op) & ((df["dtype"] == dtype) if dtype is not None else True)]
            if required and sel.empty:
                what = f"op={op!r}" + (f" and dtype={dtype!r}" if dtype is not None else "")
                raise CalibrationError(f"{data.csv_path}: no rows with {what} (field 'op')")
            return sel

        missing = S.missing_ops(df, (dt,))  # the requirement `kvsim calibrate` checks too
        if missing:
            op, _, mdt = missing[0].partition(" ")
            raise CalibrationError(f"{data.csv_path}: no rows with op={op!r}" + (f" and dtype={mdt!r}" if mdt else "")
                                   + " (field 'op')")
        impl = None if cfg.decode_impl == "best" else cfg.decode_impl
        dec = interp.best_impl(rows(S.DECODE_PAGED, dt), impl)
        if dec.empty:
            raise CalibrationError(f"{data.csv_path}: no decode_paged rows with impl={impl!r} and dtype={dt!r} "
                                   "(field 'impl')")
        self._decode = interp.decode_tables(dec)
        self._prefill = interp.prefill_tables(rows(S.PREFILL_PAGED, dt))
        self._gemms = [interp.token_curve(rows(op)) for op in S.LAYER_GEMMS]
        lm = rows(S.GEMM_LM_HEAD, required=False)
        self._lm_head = interp.token_curve(lm) if cfg.include_lm_head and len(lm) else None
        el = rows(S.ELEMENTWISE, required=False)
        self._elementwise = interp.token_curve(el) if cfg.include_elementwise and len(el) else None

        measured = self._decode.block_sizes
        bs = ctx.block_size
        self._contiguous = None
        if bs is None:
            cont = rows(S.DECODE_CONTIGUOUS, dt, required=False)
            if len(cont):
                self._contiguous = interp.row_table(cont, "batch", "context_len", log_x=True)
                self.block_size_rule = "no fixed blocks: contiguous-KV baseline for decode, largest block for prefill"
            else:
                self.block_size_rule = f"no fixed blocks: largest measured block size ({measured[-1]})"
            bs = measured[-1]
        elif bs in measured:
            self.block_size_rule = f"exact ({bs})"
        elif bs < measured[0] or bs > measured[-1]:
            self.block_size_rule = f"nearest measured ({measured[0] if bs < measured[0] else measured[-1]})"
        else:
            lo = max(b for b in measured if b < bs)
            hi = min(b for b in measured if b > bs)
            self.block_size_rule = f"interpolated in log2(block size) between {lo} and {hi}"
        self.block_size = bs
        self._token_cache: dict[int, tuple[float, float]] = {}
        self._lm_cache: dict[int, float] = {}

    # -- per-component, per step -----------------------------------------------------------------
    def _token_ops_s(self, tokens: int) -> tuple[float, float]:
        """(GEMMs over all layers, elementwise over all layers) for ``tokens`` tokens; memoised."""
        hit = self._token_cache.get(tokens)
        if hit is None:
            if tokens <= 0:
                hit = (0.0, 0.0)
            else:
                gemm = self.num_layers * sum(c(tokens) for c in self._gemms)
                elem = self.num_layers * self._elementwise(tokens) if self._elementwise else 0.0
                hit = (gemm, elem)
            self._token_cache[tokens] = hit
        return hit

    def _lm_head_s(self, seqs: int) -> float:
        if self._lm_head is None or seqs <= 0:
            return 0.0
        hit = self._lm_cache.get(seqs)
        if hit is None:
            hit = self._lm_cache[seqs] = self._lm_head(seqs)
        return hit

    def decode_attention_s(self, num_seqs: int, mean_context_tokens: float) -> float:
        """All layers' decode attention for a batch at a mean context (>= 1 token)."""
        if num_seqs <= 0:
            return 0.0
        ctx = max(1.0, mean_context_tokens)
        if self._contiguous is not None:
            return self.num_layers * self._contiguous(num_seqs, ctx)
        return self.num_layers * self._decode(self.block_size, num_seqs, ctx)

    def prefill_attention_s(self, num_seqs: int, new_tokens: float, cached_tokens: float) -> float:
        """All layers' prefill attention: ``num_seqs`` chunks of ``new_tokens`` over ``cached_tokens``."""
        if num_seqs <= 0 or new_tokens <= 0:
            return 0.0
        return self.num_layers * num_seqs * self._prefill(self.block_size, new_tokens, max(0.0, cached_tokens))

    def step_time(self, shape: BatchShape) -> StepTiming:
        pre_kv, dec_kv = split_kv_tokens(shape)
        dec_s = (self.decode_attention_s(shape.num_decode_seqs, dec_kv / shape.num_decode_seqs)
                 if shape.num_decode_seqs else 0.0)
        pre_s = 0.0
        if shape.num_prefill_seqs:
            n = shape.num_prefill_tokens / shape.num_prefill_seqs
            pre_s = self.prefill_attention_s(shape.num_prefill_seqs, n, pre_kv / shape.num_prefill_seqs - n)
        gemm_s, elem_s = self._token_ops_s(shape.num_tokens)
        lm_s = self._lm_head_s(shape.num_seqs)
        swap_s = self.transfers.swap_s(shape.swap_in_bytes, shape.swap_in_copies,
                                       shape.swap_out_bytes, shape.swap_out_copies) + shape.tier_load_s
        attn_s = dec_s + pre_s
        if self.overhead.overlapped:  # async scheduling: max(GPU, engine loop) (kvsim.timing.overhead)
            gpu_s = attn_s + gemm_s + lm_s + elem_s + swap_s
            duration = self.overhead.step_s(gpu_s, shape.num_prefill_seqs + shape.num_decode_seqs, shape)
            overhead_s = duration - gpu_s
        else:
            overhead_s = (self.step_overhead_s if self.overhead.constant and not shape.round_continuation else
                          self.overhead.of_shape(shape.num_prefill_seqs + shape.num_decode_seqs, shape))
            duration = attn_s + gemm_s + lm_s + elem_s + overhead_s + swap_s
        return StepTiming(
            duration_s=duration,
            breakdown_s={
                "attention_s": attn_s,
                "decode_attention_s": dec_s,
                "prefill_attention_s": pre_s,
                "gemm_s": gemm_s,
                "lm_head_s": lm_s,
                "elementwise_s": elem_s,
                # non-attention kernel time in one key (the step recorder's ``compute_s`` column);
                # it repeats gemm_s + lm_head_s + elementwise_s, as the attention_s sub-keys repeat
                "compute_s": gemm_s + lm_s + elem_s,
                "overhead_s": overhead_s,
                "swap_s": swap_s,
            },
            kv_bytes_read=shape.kv_tokens_read * self.kv_bytes_per_token,
        )


TIMING_MODELS.register("calibrated", CalibratedTimingConfig, CalibratedTiming)
