"""``kvsim calibrate --engine vllm``: whole-step times of a running vLLM, as a calibration directory.

The engine is measured, not its kernels: every number is the time of one ``LLMEngine.step()``
(scheduling, forward pass, sampling, output processing) at a known shape (kvsim.realengine.measure),
both wall and process CPU time. The grid is measured in rounds (``EngineGrid.rounds``): every point
once per round, and a point's time is the median across rounds of each round's median, so it spans
the calibration's whole duration (a shared VM's speed drifts by tens of percent over minutes:
docs/studies.md (e)); ``engine_rounds.csv`` keeps each round's medians with their start times. On a CPU host the tables are built from the CPU time (the engine's
own work; a shared host adds other processes' time to the wall clock), on CUDA from the wall time.
``engine_steps.csv`` keeps the raw points; ``measurements.csv`` holds the tables the calibrated
timing model reads (kvsim/timing/calibrated.py), built by ``--fit linear`` (the default: a
five-term least-squares fit, kvsim.realengine.stepfit) or ``--fit exact`` (:func:`decompose`: at
every measured pure-decode and pure-prefill point the model's step time equals the measured one):

* per-token cost ``beta`` (s/token): the linear term of a fit ``P(n) = a + beta n + g n^2`` over the
  prefill steps without cached tokens; it is spread evenly over the four per-layer GEMM ops
  (``gemm_qkv`` .. ``gemm_mlp_down`` each ``beta * tokens / (4 L)``): the ops are accounting buckets
  here, not separate measurements;
* per-step cost at ``s`` sequences ``a_s``: the intercept at zero context of a line through the
  decode steps at batch ``s``; ``gemm_lm_head(s) = a_s - beta s`` (it carries the fixed step
  overhead, sampling and per-request bookkeeping: the model's ``step_overhead_s`` is 0 for an
  engine calibration);
* ``decode_paged(bs, B, C) = (D(B, C) - a_B) / L`` and
  ``prefill_paged(bs, n, k) = (P(n, k) - beta n - gemm_lm_head(1)) / L``.

Mixed steps (decode batch + one prefill chunk) are never fitted: ``meta.json`` reports the model's
error on them (``holdout``), the check that the decomposition adds up on shapes it did not see.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from kvsim.calibration_data import schema as S
from kvsim.realengine.stepfit import MIN_TIME_S, linear_tables, table_row
from kvsim.realengine.vllm_engine import Engine, EngineError, EngineSettings, check_block_size, read_model_config

FITS = ("linear", "exact")  # how the step points become tables (kvsim.realengine.stepfit; decompose below)

ENGINE_STEPS_FILE = "engine_steps.csv"


@dataclass(frozen=True)
class EngineGrid:
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    contexts: tuple[int, ...] = (128, 512, 1024, 2048)
    chunks: tuple[int, ...] = (32, 128, 512, 1024, 2048)
    cached: tuple[int, ...] = (0, 1024)
    mixed_batches: tuple[int, ...] = (4, 16)
    mixed_contexts: tuple[int, ...] = (512,)
    mixed_chunks: tuple[int, ...] = (128, 512)
    block_sizes: tuple[int, ...] = (32, 128)
    warmup: int = 2  # untimed steps per point per round
    repeats: int = 3  # steps kept per point per round
    rounds: int = 3  # passes over the whole grid: a point's time is the median of its rounds' medians

    def check(self, device: str) -> None:
        if 1 not in self.batches:
            raise EngineError("--batches: must include 1 (the per-step cost at one sequence prices prefill steps)")
        if 0 not in self.cached:
            raise EngineError("--cached: must include 0 (the per-token cost is fitted on uncached prefills)")
        if len([c for c in self.chunks]) < 3:
            raise EngineError("--chunks: give at least 3 prefill chunk sizes (the per-token fit has 3 terms)")
        if self.rounds < 1 or self.repeats < 1:
            raise EngineError("--rounds/--repeats: give at least 1")
        if len(self.contexts) < 2:
            raise EngineError("--contexts: give at least 2 decode contexts (a line per batch size)")
        for bs in self.block_sizes:
            check_block_size(bs, device)

    def needs(self) -> dict:
        """Engine limits that fit every point."""
        out = self.warmup + self.repeats + 5 + -(-max(self.batches) * max(self.contexts) // 2048)
        seq = max(max(self.contexts), max(self.mixed_contexts, default=0)) + out
        pre = max(self.chunks) + max(self.cached)
        tokens = max(max(self.batches) * seq, max(self.mixed_batches, default=0) * seq + max(self.mixed_chunks, default=0),
                     2 * pre)
        # the decoder slots' prompts stay in the prefix cache between points and rounds (kvsim.realengine.measure):
        # room for the longest slot sequences plus one round's fresh allocations (LRU evicts those first)
        steps, bs = self.warmup + self.repeats, max(self.block_sizes)
        slots = max(max(self.batches), max(self.mixed_batches, default=0)) * max(max(self.contexts),
                                                                                 max(self.mixed_contexts, default=0))
        fresh = (sum(steps * n + k for n in self.chunks for k in self.cached)
                 + steps * len(self.mixed_contexts) * len(self.mixed_batches) * sum(self.mixed_chunks)
                 + sum(b * (out + 2 * bs) for b in self.batches) * len(self.contexts)
                 + sum(b * (out + 2 * bs) for b in self.mixed_batches) * len(self.mixed_contexts) * len(self.mixed_chunks))
        tokens = max(tokens, int(1.1 * (slots + fresh)))
        return {"max_model_len": max(seq, pre) + 8, "tokens": tokens,
                "max_num_seqs": max(max(self.batches), max(self.mixed_batches, default=0)) + 2,
                "max_num_batched_tokens": max(2048, max(self.chunks), max(self.mixed_chunks, default=0)
                                              + max(self.mixed_batches, default=0))}


ENGINE_ROUNDS_FILE = "engine_rounds.csv"  # per point and round: its median, and when (s from the start) it ran


def measure_block_size(model_config: Path, cfg: dict, grid: EngineGrid, block_size: int, device: str,
                       threads: int, log, eager: bool = False, t_origin: float | None = None
                       ) -> tuple[list, int, dict, list[dict]]:
    """Measure the grid on one engine, ``grid.rounds`` passes; returns (points, mismatched steps,
    engine settings, per-round rows of engine_rounds.csv)."""
    from kvsim.realengine.measure import Measurer

    t_origin = time.monotonic() if t_origin is None else t_origin
    need = grid.needs()
    limit = int(cfg.get("max_position_embeddings") or need["max_model_len"])
    if need["max_model_len"] > limit:
        raise EngineError(f"--contexts/--chunks/--cached: need {need['max_model_len']} tokens per sequence but "
                          f"{model_config} has max_position_embeddings {limit}")
    settings = EngineSettings(model_config=model_config, block_size=block_size,
                              num_blocks=need["tokens"] // block_size + 16, max_num_seqs=need["max_num_seqs"],
                              max_num_batched_tokens=need["max_num_batched_tokens"],
                              max_model_len=need["max_model_len"], chunked_prefill=True, prefix_caching=True,
                              device=device, threads=threads, enforce_eager=eager)
    t0 = time.monotonic()
    eng = Engine(settings)
    log(f"block size {block_size}: engine up in {time.monotonic() - t0:.0f} s")
    try:
        m = Measurer(eng, int(cfg.get("vocab_size", 32000)), grid.warmup, grid.repeats)
        points, per_round = measure_rounds(m, grid, t_origin, lambda msg: log(f"block size {block_size}: {msg}"))
    finally:
        eng.close()
    empty = [p for p in points if not p.durations_s]
    if empty:
        p = empty[0]
        raise EngineError(f"block size {block_size}: the engine never ran the {p.kind} step (decode seqs "
                          f"{p.decode_seqs}, prefill {p.prefill_tokens} + {p.prefill_cached} cached) as asked")
    return points, m.mismatched, settings.provenance(), per_round


def measure_rounds(m, grid: EngineGrid, t_origin: float, log) -> tuple[list, list[dict]]:
    """Every grid point once per round, the same order each round (the decoder prefixes then stay in the
    prefix cache: :meth:`EngineGrid.needs`); returns the points (each with all its rounds' steps: its
    time is the median of its rounds' medians) and the rows of engine_rounds.csv."""
    plan = ([("decode", (b, c)) for b in grid.batches for c in grid.contexts]
            + [("prefill", (n, k)) for n in grid.chunks for k in grid.cached]
            + [("mixed", (b, c, n)) for b in grid.mixed_batches for c in grid.mixed_contexts for n in grid.mixed_chunks])
    measure = {"decode": m.decode, "prefill": m.prefill, "mixed": m.mixed}
    points: list = []
    per_round: list[dict] = []
    for r in range(grid.rounds):
        t_round, setup0 = time.monotonic(), m.setup_steps
        for i, (kind, args) in enumerate(plan):
            t_pt, setup_pt = time.monotonic() - t_origin, m.setup_steps
            pt = measure[kind](*args)
            per_round.append({**pt.key(), "round": r, "start_s": round(t_pt, 3), "kept": len(pt.durations_s),
                              "setup_steps": m.setup_steps - setup_pt,
                              "median_s": float(np.median(pt.durations_s)) if pt.durations_s else float("nan"),
                              "cpu_median_s": float(np.median(pt.cpu_s)) if pt.cpu_s else float("nan")})
            if r == 0:
                pt.rounds = [0] * len(pt.durations_s)
                points.append(pt)
            else:
                points[i].merge(pt, r)
        log(f"round {r + 1}/{grid.rounds} in {time.monotonic() - t_round:.0f} s ({m.setup_steps - setup0} set-up steps)")
    return points, per_round


def fit_per_token(prefill_uncached: list[tuple[int, float]]) -> float:
    """``beta`` of ``P(n) = a + beta n + g n^2`` (least squares, all terms >= 0)."""
    n = np.array([p[0] for p in prefill_uncached], dtype=float)
    y = np.array([p[1] for p in prefill_uncached], dtype=float)
    A = np.stack([np.ones_like(n), n, n * n], axis=1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    if coef[1] > 0 and coef[2] >= 0:
        return float(coef[1])
    A2 = A[:, :2]  # no curvature measurable: a line
    coef2, *_ = np.linalg.lstsq(A2, y, rcond=None)
    return float(max(coef2[1], MIN_TIME_S))


def decompose(points: list, num_layers: int, dtype: str, geometry: tuple[int, int, int]) -> tuple[list[dict], dict]:
    """Measured step points (all block sizes) -> measurements.csv rows + the fitted scalars."""
    L = num_layers
    rows: list[dict] = []
    uncached = sorted((p.prefill_tokens, p.median_s()) for p in points
                      if p.kind == "prefill" and p.prefill_cached == 0)
    # the per-token term is a property of the forward pass, not of the block size: one fit over all
    beta = fit_per_token(uncached)
    fitted: dict = {"per_token_s": beta, "per_step_s": {}}
    for bs in sorted({p.block_size for p in points}):
        dec = [p for p in points if p.block_size == bs and p.kind == "decode"]
        a = {}
        for b in sorted({p.decode_seqs for p in dec}):
            pts = [(p.decode_context, p.median_s()) for p in dec if p.decode_seqs == b]
            x = np.array([q[0] for q in pts])
            y = np.array([q[1] for q in pts])
            slope, icpt = np.polyfit(x, y, 1) if len(pts) > 1 else (0.0, y[0])
            a[b] = float(min(max(icpt, 0.5 * y.min()), 0.95 * y.min()))
            for c, t in pts:
                rows.append(table_row(S.DECODE_PAGED, dtype=dtype, block_size=bs, batch=b, context_len=c, new_tokens=1,
                                 cached_tokens=c - 1, tokens=b, median_s=(t - a[b]) / L, geometry=geometry))
        fitted["per_step_s"][bs] = a
        lm = {s: max(v - beta * s, MIN_TIME_S) for s, v in a.items()}
        for p in (p for p in points if p.block_size == bs and p.kind == "prefill"):
            t = p.median_s()
            n, k = p.prefill_tokens, p.prefill_cached
            rows.append(table_row(S.PREFILL_PAGED, dtype=dtype, block_size=bs, batch=1, context_len=n + k, new_tokens=n,
                             cached_tokens=k, tokens=n, median_s=(t - beta * n - lm[min(lm)]) / L, geometry=geometry))
    # token and per-step curves: the first (smallest) block size's per-step costs (they do not depend on it
    # beyond noise; the per-block differences stay in the attention tables)
    first = min(fitted["per_step_s"])
    lm = {s: max(v - beta * s, MIN_TIME_S) for s, v in fitted["per_step_s"][first].items()}
    for s, v in sorted(lm.items()):
        rows.append(table_row(S.GEMM_LM_HEAD, dtype=dtype, batch=s, tokens=s, median_s=v))
    token_grid = sorted({1, *(p.decode_seqs for p in points if p.decode_seqs),
                         *(p.prefill_tokens for p in points if p.prefill_tokens),
                         *(p.decode_seqs + p.prefill_tokens for p in points)} - {0})
    for op in S.LAYER_GEMMS:
        for t in token_grid:
            rows.append(table_row(op, dtype="bf16", batch=t, tokens=t, median_s=beta * t / (len(S.LAYER_GEMMS) * L)))
    fitted["per_step_s"] = {str(k): {str(b): v for b, v in d.items()} for k, d in fitted["per_step_s"].items()}
    return rows, fitted


def holdout_errors(points: list, timing) -> list[dict]:
    """The calibrated model's step time against every mixed step (never fitted)."""
    from kvsim.timing.base import BatchShape

    out = []
    for p in (p for p in points if p.kind == "mixed"):
        if p.block_size != timing.block_size:
            continue
        b, n = p.decode_seqs, p.prefill_tokens
        kv_read = int(round(b * p.decode_context)) + n
        pairs = int(round(b * p.decode_context)) + n * (n + 1) // 2
        shape = BatchShape(num_seqs=b + 1, num_prefill_seqs=1, num_decode_seqs=b, num_prefill_tokens=n,
                           num_decode_tokens=b, kv_tokens_read=kv_read, attention_pairs=pairs)
        pred = timing.step_time(shape).duration_s
        meas = p.median_s()
        out.append({"block_size": p.block_size, "decode_seqs": b, "decode_context": round(p.decode_context, 1),
                    "prefill_tokens": n, "measured_s": meas, "predicted_s": pred, "error": pred / meas - 1})
    return out


def copy_bandwidth() -> float:
    """Host memory copy rate (bytes read + written per second), the directory's required copy figure."""
    a = np.ones(64 << 20, dtype=np.uint8)
    b = np.empty_like(a)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t0)
    return 2 * a.nbytes / float(np.median(ts))


def model_spec(model_config: Path, cfg: dict):
    """kvsim's ModelSpec for the config file (the name a scenario with ``model: FILE`` gets)."""
    from kvsim.config import ModelConfig
    from kvsim.models.hf import model_fields

    return ModelConfig(**model_fields(cfg, str(model_config))).spec()


def kv_dtype_of(cfg: dict) -> str:
    return "bf16" if str(cfg.get("torch_dtype", "bfloat16")) in ("bfloat16", "bf16") else "fp16"


def default_out(device: str, model_name: str) -> Path:
    import re

    return Path("calibration") / f"vllm-{device}" / (re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-") or "model")


def _timing_for(d: Path, spec, kv_dtype: str, block_size: int):
    """The calibrated timing model reading directory ``d`` (for the hold-out check)."""
    from kvsim.hw import GPUS
    from kvsim.models.geometry import KVGeometry
    from kvsim.timing.calibrated import CalibratedTiming, CalibratedTimingConfig
    from kvsim.timing.context import TimingContext

    gpu = next(iter(GPUS.values()))
    ctx = TimingContext(model=spec, gpu=gpu, kv=KVGeometry.for_gpu(spec, kv_dtype, block_size=block_size),
                        weight_bytes=1, base_dir=d)
    return CalibratedTiming(CalibratedTimingConfig(file=str(d), step_overhead_s=0.0), ctx)


def portable_path(path: str | Path) -> str:
    """A path for meta.json that names no one's machine: relative to the working directory when under it,
    else only its last component (where a directory was written is no property of the calibration)."""
    p = Path(path).expanduser().resolve()
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.name


def run_engine_calibration(model: str, *, out: str | Path | None, device: str = "cpu", grid: EngineGrid = EngineGrid(),
                           threads: int = 1, force: bool = False, eager: bool = False, fit: str = "linear",
                           log=print) -> Path:
    """Measure, fit (``fit``: linear, kvsim.realengine.stepfit; exact: :func:`decompose`), check on the
    hold-out mixed steps and write the calibration directory."""
    import pandas as pd

    from kvsim.outdir import atomic_out_dir
    from kvsim.realengine.vllm_engine import require_vllm

    if device not in ("cpu", "cuda"):
        raise EngineError(f"--device: {device!r} is not a device the vLLM engine path runs on; choose cpu or cuda")
    if fit not in FITS:
        raise EngineError(f"--fit: {fit!r} is not a fit; choose from {', '.join(FITS)}")
    config_path, cfg = read_model_config(model)
    grid.check(device)
    vllm = require_vllm()
    spec = model_spec(config_path, cfg)
    out = Path(out) if out is not None else default_out(device, spec.name)
    from kvsim.outdir import check_out_dir

    check_out_dir(out, "calibrate", force=force)  # refuse a bad --out before minutes of measuring
    t_start = time.monotonic()
    points, mismatched, settings, per_round = [], 0, {}, []
    for bs in grid.block_sizes:
        pts, bad, settings, rnd = measure_block_size(config_path, cfg, grid, bs, device, threads, log, eager, t_start)
        points += pts
        mismatched += bad
        per_round += rnd
    dtype = kv_dtype_of(cfg)
    # the engine's own work: on a CPU host the process CPU time of each step (the wall time also holds
    # whatever time the shared host gave other processes: docs/studies.md (e)); on CUDA the wall time
    basis = "cpu" if device == "cpu" else "wall"
    priced = [replace(p, durations_s=list(p.cpu_s)) for p in points] if basis == "cpu" else points
    geometry = (spec.num_attention_heads, spec.num_kv_heads, spec.head_dim)
    if fit == "linear":
        rows, fitted = linear_tables(priced, spec.num_layers, dtype, geometry, spec.max_model_len_tokens)
    else:
        rows, fitted = decompose(priced, spec.num_layers, dtype, geometry)
    fitted = {"fit": fit, "step_time": f"{basis} time of each step (engine_steps.csv: "
                                        f"{'cpu_median_s' if basis == 'cpu' else 'median_s'})", **fitted}
    for r in rows:
        r["device"] = device
    raw = pd.DataFrame([p.row() for p in points])
    meta = _engine_meta(vllm, device, threads, settings, spec, config_path, dtype, grid, fitted, mismatched, out,
                        rows, points)
    with atomic_out_dir(out, "calibrate", force=force) as tmp:
        pd.DataFrame(rows, columns=list(S.COLUMNS)).to_csv(tmp / S.CSV_FILE, index=False)
        raw.to_csv(tmp / ENGINE_STEPS_FILE, index=False)
        pd.DataFrame(per_round).to_csv(tmp / ENGINE_ROUNDS_FILE, index=False)
        meta["wall_s"] = round(time.monotonic() - t_start, 1)
        (tmp / S.META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
        hold = [h for bs in grid.block_sizes for h in holdout_errors(priced, _timing_for(tmp, spec, dtype, bs))]
        errs = np.abs([h["error"] for h in hold]) if hold else np.array([])
        meta["holdout"] = {"what": f"mixed steps (decode batch + one prefill chunk), never fitted ({basis} time)",
                           "points": hold,
                           "mape": float(errs.mean()) if errs.size else None,
                           "max_ape": float(errs.max()) if errs.size else None}
        (tmp / S.META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    mape = meta["holdout"]["mape"]
    log(f"wrote {out} ({len(points)} step points, {len(rows)} table rows, {meta['wall_s']} s; hold-out mixed "
        f"steps: mean abs error {100 * mape:.1f} %)" if mape is not None else f"wrote {out}")
    return out


def _engine_meta(vllm, device: str, threads: int, settings: dict, spec, config_path, dtype: str, grid, fitted: dict,
                 mismatched: int, out: Path, rows: list, points: list) -> dict:
    """meta.json of an engine calibration: provenance (engine, versions, host, date), model, grid, fit."""
    return {
        "schema_version": S.SCHEMA_VERSION, "device": device, "gpu_name": f"vllm-{device}",
        "source": "engine",
        "label": f"whole-step times of a running vLLM {vllm.__version__} engine on {device} "
                 f"({threads} thread{'s' if threads > 1 else ''}), decomposed (kvsim/realengine/calibrate.py)",
        "engine": {"name": "vllm", "version": str(vllm.__version__), "settings": settings},
        "torch": _torch_version(), "python": platform.python_version(),
        "kvsim_version": _kvsim_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpu_count": os.cpu_count(), "threads": threads,
                 "processor": platform.processor() or None, "loadavg_at_start": _loadavg()},
        "copy_bandwidth_bytes_per_s": copy_bandwidth(),
        "model": {"name": spec.name, **{k: getattr(spec, k) for k in S.MODEL_GEOMETRY_KEYS},
                  "max_model_len_tokens": spec.max_model_len_tokens, "config_file": portable_path(config_path)},
        "weight_dtype": dtype, "kv_dtypes": [dtype], "block_sizes": sorted(grid.block_sizes),
        "decode_impl": "vllm_engine_step",
        "timing": "time.perf_counter around each LLMEngine.step(); the grid measured in rounds (every point "
                  "once per round, warm-up steps then repeats), a point's time the median across rounds of each "
                  "round's median (engine_steps.csv; engine_rounds.csv has each round's median and start time; "
                  "cpu_median_s is the process CPU time of the same steps: wall - CPU is time the host gave to "
                  "other processes)",
        "rounds": grid.rounds, "drift": _drift(points),
        "grid": asdict(grid), "fitted": fitted, "mismatched_steps": mismatched,
        "scenario_timing": {"kind": "calibrated", "file": portable_path(out),
                            "note": "relative to the directory kvsim calibrate ran in (only the directory's name "
                                    "when outside it); a scenario's timing.file is relative to the scenario file"},
        "rows": len(rows), "points": len(points),
    }


def _drift(points: list) -> dict:
    """How much the rounds disagree: per point (max - min) / median of its rounds' CPU medians (the host's
    drift over the calibration; with one round there is none to see)."""
    spread = [p.row()["cpu_round_spread"] for p in points if p.cpu_s]
    spread = [v for v in spread if v == v]
    return {"what": "per point, (max - min) / median of its rounds' CPU-time medians",
            "median": float(np.median(spread)) if spread else None, "max": float(max(spread)) if spread else None}


def _torch_version() -> str | None:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return None


def _kvsim_version() -> str:
    from kvsim.version import __version__

    return __version__


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
