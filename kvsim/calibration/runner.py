"""``kvsim calibrate``: check, measure the grid, write ``meta.json`` + ``measurements.csv`` atomically.

Phases, in order (after the self-check and the copy, a first pass measures one point of every op the
calibrated timing model needs -- ``schema.missing_ops`` -- against the whole of ``time_budget_s``; then
each measuring phase gets a share of what is left, and time a phase leaves unused passes on; a run whose
budget cannot cover the first pass writes nothing and fails, naming the missing ops):

1. correctness self-check of the Triton kernel on the device (aborts the run on failure: timing a
   wrong kernel is worthless);
2. device-to-device copy (achievable bandwidth, the yardstick of the report);
3. GEMMs (QKV, out, MLP up/gate, down, LM head) and the per-layer elementwise ops over token counts;
4. paged decode attention over KV dtype x block size x batch x context;
5. paged prefill attention (torch gather + SDPA) over chunk x cached context;
6. the contiguous-KV SDPA decode baseline.

Without CUDA the same code runs on the CPU on a tiny grid, with the torch reference as the decode
implementation (or the Triton kernel under the interpreter if asked), and the directory is labelled
``device: cpu``: plumbing data, never GPU timings.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from kvsim.calibration_data import schema as S
from kvsim.calibration._deps import interpreter_requested, package_version, require_torch
from kvsim.calibration.grid import CPU_GRID, GPU_GRID, Grid, decode_points, prefill_points
from kvsim.errors import CalibrationError, KvsimError
from kvsim.hw import GPUS, MODELS, ModelSpec

# Share of the time budget per phase (cumulative deadlines).
PHASE_SHARES = {"gemm": 0.12, "decode": 0.55, "prefill": 0.2, "contiguous": 0.13}
CPU_CACHE_BYTES = 8 << 20  # CPU runs are plumbing: a token rotation is enough


def kvsim_version() -> str:
    try:
        from kvsim.version import __version__

        return __version__
    except ImportError:
        return package_version("kvsim") or "unknown"


def safe_name(name: str) -> str:
    """A path component: letters, digits, '.', '_' and '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "unknown"


def preset_gpu_name(device_name: str) -> str:
    """Map a CUDA device name ('NVIDIA H200') to a kvsim GPU preset name where unambiguous."""
    low = device_name.lower()
    for key, preset in (("h200", "H200-141GB"), ("h100", "H100-SXM-80GB"), ("l40s", "L40S")):
        if key in low and preset in GPUS:
            return preset
    if "a100" in low:
        return "A100-80GB" if "80" in low else "A100-40GB"
    return safe_name(device_name)


def default_out_dir(gpu_name: str, model_name: str) -> Path:
    return Path("calibration") / safe_name(gpu_name) / safe_name(model_name)


def resolve_model(name: str) -> ModelSpec:
    """The model preset ``name`` means, read as a scenario reads it (any case)."""
    from kvsim.config.sections import preset_key

    try:
        return MODELS[preset_key("model", name, MODELS)]
    except ValueError as e:
        raise CalibrationError(f"--model: {e}") from None


def _driver_version() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


# Every file a calibration directory may hold (meta.json, measurements.csv, `calibrate report`'s).
CALIBRATION_FILES = frozenset({S.META_FILE, S.CSV_FILE, "report_loo.csv", "report_loo.png", "report_bandwidth.csv",
                               "report_bandwidth.png"})


def _legacy_marker(d: Path):
    """A calibration directory written before output markers existed: meta.json and nothing but
    calibration files. Returns the marker it should have had, else None."""
    from kvsim.outdir import Marker

    names = {p.name for p in d.iterdir()}
    if S.META_FILE in names and names <= CALIBRATION_FILES:
        return Marker("calibrate", True, tuple(sorted(names)))
    return None


REPORT_FILES = ("report_loo.csv", "report_bandwidth.csv")
REPORT_PLOTS = ("report_loo.png", "report_bandwidth.png")


def check_report_files(d: str | Path, *, plots: bool = True, force: bool = False,
                       hint: str = "or pass --force to overwrite it") -> None:
    """Refuse (one line) to overwrite a report file in the calibration directory ``d`` that kvsim did not write:
    its marker (kvsim.outdir; an older calibration directory without one: :func:`_legacy_marker`) must record
    ``calibrate`` writing it. ``force`` skips the check."""
    from kvsim.outdir import read_marker, writer_of

    d = Path(d)
    names = REPORT_FILES + (REPORT_PLOTS if plots else ())
    present = [n for n in names if (d / n).exists() or (d / n).is_symlink()]
    if force or not present or not d.is_dir():
        return
    try:
        marker = read_marker(d)
    except KvsimError as e:
        raise CalibrationError(str(e)) from None
    if marker is None:
        marker = _legacy_marker(d)
    for n in present:
        p = d / n
        if p.is_dir() and not p.is_symlink():
            raise CalibrationError(f"{p}: is a folder where the report writes its file {n}; move it away")
        if marker is None or writer_of(marker, n) != "calibrate":
            raise CalibrationError(f"{p}: file exists and kvsim did not write it (the calibration directory's "
                                   f"output record does not list it); the report would overwrite it: move it "
                                   f"away, {hint}")


def _prepare_out(out: Path, force: bool = False) -> Path:
    """Refuse to replace a directory that is not an earlier calibration (kvsim.outdir); return the
    hidden temp dir to write into."""
    from kvsim.errors import ConfigError
    from kvsim.outdir import check_out_dir, clean_leftovers
    from kvsim.outdir.atomic import _new_temp

    try:
        check_out_dir(out, "calibrate", force=force, legacy=_legacy_marker, what="a calibration directory")
        out.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(out)
        return _new_temp(out, "calibrate")
    except ConfigError as e:
        raise CalibrationError(str(e)) from None


def _commit(tmp: Path, out: Path, force: bool = False) -> None:
    """Replace ``out`` by ``tmp`` with renames only (readers see the old or the new directory),
    keeping any file in ``out`` kvsim did not write."""
    from kvsim.errors import ConfigError
    from kvsim.outdir import commit

    try:
        commit(tmp, out, "calibrate", force=force, legacy=_legacy_marker)
    except ConfigError as e:
        raise CalibrationError(str(e)) from None


def resolve_device(torch, device: str):
    """(``cuda`` or ``cpu``, the torch device) for ``--device`` (``auto``: CUDA if available)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("--device cuda: torch sees no CUDA device (use --device cpu for a plumbing run)")
    if device not in ("cuda", "cpu"):
        raise CalibrationError(f"--device: expected auto, cuda or cpu, got {device!r}")
    return device, (torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu"))


def _decode_impl(decode_impl: str, device: str) -> str:
    """The decode implementation timed for ``--decode-impl`` on ``device``."""
    if decode_impl == "auto":
        return S.IMPL_TRITON if device == "cuda" else S.IMPL_TORCH_REFERENCE
    if decode_impl == "triton":
        if device != "cpu":
            return S.IMPL_TRITON
        if not interpreter_requested():
            raise CalibrationError("--decode-impl triton on CPU runs Triton's interpreter: set "
                                   "TRITON_INTERPRET=1 in the environment before running")
        return S.IMPL_TRITON_INTERPRETER
    if decode_impl == "torch":
        return S.IMPL_TORCH_REFERENCE
    raise CalibrationError(f"--decode-impl: expected auto, triton or torch, got {decode_impl!r}")


def _device_memory(torch, device: str, dev, mem_fraction: float) -> tuple[str, int, int | None, int]:
    """(device name, cache bytes the inputs rotate past, device memory, memory the measurements may use)."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(dev)
        # L2_cache_size: a device property torch has had since 2.1; 50 MiB (H100's L2) without it
        cache_bytes = int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))
        free_bytes, total_bytes = torch.cuda.mem_get_info(dev)
        return props.name, cache_bytes, total_bytes, int(free_bytes * mem_fraction)
    # 1 GiB keeps CPU plumbing runs light (the LM head weight alone is 1 GiB: one copy)
    return platform.processor() or platform.machine() or "cpu", CPU_CACHE_BYTES, None, 1 << 30


class _PhaseClock:
    """The time budget split among the measuring phases (``PHASE_SHARES``)."""

    def __init__(self, budget: float | None, t_start: float):
        self.budget, self.t_start = budget, t_start
        self.deadlines: dict[str, float] = {}

    def set_deadlines(self) -> None:
        """Split what is left of the budget (after the self-check, whose Triton compilations the
        measurements then reuse, and the copy) among the measuring phases."""
        if self.budget is None:
            return
        now = time.monotonic()
        left = max(0.0, self.budget - (now - self.t_start))
        acc = 0.0
        for phase, share in PHASE_SHARES.items():
            acc += share
            self.deadlines[phase] = now + left * acc

    def out_of_budget(self) -> Callable[[], bool]:
        """Deadline check against the whole budget (the first pass)."""
        if self.budget is None:
            return lambda: False
        return lambda: time.monotonic() - self.t_start > self.budget

    def out_of_time_for(self, phase: str, part: int = 0, parts: int = 1) -> Callable[[], bool]:
        """Deadline check for slice ``part`` of ``parts`` of ``phase``: called when the slice starts,
        it gets an equal share of the phase's remaining time (a slow KV dtype cannot starve the rest)."""
        deadline = self.deadlines.get(phase)
        if deadline is None:
            return lambda: False
        now = time.monotonic()
        end = now + max(0.0, deadline - now) / (parts - part)  # the rest, shared by the slices still to run
        return lambda: time.monotonic() > end


def _selfcheck(impl: str, dev, grid: Grid, spec: ModelSpec, log) -> dict:
    """The Triton decode kernel's correctness check on this device (raises if it fails), or a
    note that the torch reference is timed instead."""
    if impl not in (S.IMPL_TRITON, S.IMPL_TRITON_INTERPRETER):
        return {"ok": None, "triton_checked": False,
                "note": "decode timed with the torch reference; the Triton kernel was not run"}
    from kvsim.calibration.selfcheck import run_selfcheck

    # block sizes 1, a non-multiple of 16 and multiples of 16 are Triton's distinct
    # specialisations: check one of each that the grid has (plus the smallest and largest)
    sizes = sorted(set(grid.block_sizes))
    odd = [b for b in sizes if b > 1 and b % 16]
    check_sizes = tuple(sorted({sizes[0], sizes[-1], *odd[:1], *[b for b in sizes if b == 16]}))
    check = run_selfcheck(dev, block_sizes=check_sizes, kv_dtypes=grid.kv_dtypes,
                          geometry=(spec.num_attention_heads, spec.num_kv_heads, spec.head_dim), log=log)
    if not check["ok"]:
        raise CalibrationError("the Triton decode kernel failed its correctness check on this device: "
                               + "; ".join(check["failures"][:3]))
    return check


def _measure(B, env, grid: Grid, spec: ModelSpec, kv_dtypes: tuple, mem_budget: int, clock: _PhaseClock,
             log) -> tuple[list[dict], float, dict[str, list], dict]:
    """Phases 2-6 (copy; a first pass of one point per op the timing model needs; then GEMMs and
    elementwise, paged decode, prefill, contiguous): (rows, copy bandwidth, decode points dropped for
    memory per KV dtype, the first pass's record: seconds before it, its seconds, points done and planned)."""
    rows: list[dict] = []
    copy_row = B.measure_copy(env, grid.copy_bytes)
    rows.append(copy_row)
    copy_bw = copy_row["achieved_bandwidth_bytes_per_s"]
    log(f"copy: {copy_bw / 1e9:.1f} GB/s (bytes read + written)")

    # first pass: the cheapest point of every op the calibrated timing model needs, before any extra point
    t0 = time.monotonic()
    first = clock.out_of_budget()
    kept_by, dropped_points = {}, {}
    for dt in kv_dtypes:
        kept, dropped = decode_points(grid, spec, dt, mem_budget)
        kept_by[dt], dropped_points[dt] = kept, [list(p) for p in dropped]
    pts = prefill_points(grid, spec)
    n_first = len(rows)
    rows += B.measure_gemms(env, grid.gemm_tokens[:1], grid.lm_head_tokens[:1], first)
    rows += B.measure_elementwise(env, grid.gemm_tokens[:1], first)
    for dt in kv_dtypes:
        rows += B.measure_decode_paged(env, dt, grid.block_sizes[:1], kept_by[dt][:1], first)
        rows += B.measure_prefill(env, dt, grid.prefill_block_sizes[:1], pts[:1], first)
    first_pass = {"before_s": t0 - clock.t_start, "seconds": time.monotonic() - t0, "done": len(rows) - n_first,
                  "planned": len(S.TOKEN_OPS) + len(S.PER_KV_DTYPE_OPS) * len(kv_dtypes)}

    # refinement: the rest of the grid, phases sharing what is left of the budget
    clock.set_deadlines()
    gemm = clock.out_of_time_for("gemm")
    rows += B.measure_gemms(env, grid.gemm_tokens[1:], grid.lm_head_tokens[1:], gemm)
    rows += B.measure_elementwise(env, grid.gemm_tokens[1:], gemm)
    # paged decode: each dtype gets an equal slice of the phase so a truncated run keeps all dtypes
    for i, dt in enumerate(kv_dtypes):
        kept, oot = kept_by[dt], clock.out_of_time_for("decode", i, len(kv_dtypes))
        rows += B.measure_decode_paged(env, dt, grid.block_sizes[:1], kept[1:], oot)
        rows += B.measure_decode_paged(env, dt, grid.block_sizes[1:], kept, oot)
    for i, dt in enumerate(kv_dtypes):
        oot = clock.out_of_time_for("prefill", i, len(kv_dtypes))
        rows += B.measure_prefill(env, dt, grid.prefill_block_sizes[:1], pts[1:], oot)
        rows += B.measure_prefill(env, dt, grid.prefill_block_sizes[1:], pts, oot)
    for dt in grid.contiguous_dtypes:  # the contiguous baseline
        if dt in kv_dtypes:
            rows += B.measure_contiguous(env, dt, kept_by[dt], clock.out_of_time_for("contiguous"))
    # time the later phases left unused flows back: GEMM/elementwise points their share skipped
    token_skips = [k for k in env.skipped if k.split(" ", 1)[0] in S.TOKEN_OPS]
    if token_skips and not clock.out_of_budget()():
        env.skipped[:] = [k for k in env.skipped if k not in token_skips]
        done = frozenset((r["op"], r["tokens"]) for r in rows if r["op"] in S.TOKEN_OPS)
        rest = clock.out_of_budget()
        rows += B.measure_gemms(env, grid.gemm_tokens, grid.lm_head_tokens, rest, done)
        rows += B.measure_elementwise(env, grid.gemm_tokens, rest, done)
    return rows, copy_bw, dropped_points, first_pass


def check_complete(df, kv_dtypes: tuple, budget: float | None, first_pass: dict) -> None:
    """Refuse (one line) a measurement that the calibrated timing model could not use: the ops
    ``schema.missing_ops`` names, and, where the time budget cut the first pass, about how much would do."""
    missing = S.missing_ops(df, kv_dtypes, S.DEFAULT_OPTIONAL_OPS)
    if not missing:
        return
    msg = f"no rows for {', '.join(missing)} (the calibrated timing model needs one point of each)"
    done, planned = first_pass["done"], first_pass["planned"]
    if budget is not None and done < planned:
        need = (f"about {math.ceil(first_pass['before_s'] + first_pass['seconds'] * planned / done * 1.2)} s"
                if done else f"more than {math.ceil(first_pass['before_s'] + first_pass['seconds'])} s")
        msg = f"--time-budget-s {budget:g} ran out: {msg}; a budget of {need} would cover them"
    else:
        msg += " (points dropped for memory or the model's context window: see the grid)"
    raise CalibrationError(f"{msg}; nothing written")


def _kv_dtypes(env, grid: Grid, dev) -> tuple:
    """The grid's KV dtypes this device can time (fp8 dropped, and noted, where unsupported)."""
    fp8_ok = True
    if "fp8" in grid.kv_dtypes:
        from kvsim.calibration.selfcheck import fp8_supported

        fp8_ok, why = fp8_supported(dev)
        if not fp8_ok:
            env.skipped.append(f"fp8: {why}")
    return tuple(d for d in grid.kv_dtypes if d != "fp8" or fp8_ok)


def _run_record(env, budget: float | None, num_rows: int, t_start: float) -> dict:
    """The metadata's last keys: the budget, what was skipped, rows and wall time."""
    return {
        "time_budget_s": budget,
        "truncated": bool(env.skipped),
        "skipped": env.skipped[:200],
        "num_skipped": len(env.skipped),
        "rows": num_rows,
        "wall_s": round(time.monotonic() - t_start, 2),
    }


def _software(torch, device: str, device_name: str) -> dict:
    """The metadata's provenance keys: label, driver, library versions, date, host."""
    return {
        "label": S.CPU_LABEL if device == "cpu" else f"GPU measurements on {device_name}",
        "driver": _driver_version() if device == "cuda" else None,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "python": platform.python_version(),
        "kvsim_version": kvsim_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"machine": platform.machine(), "cpu_count": os.cpu_count(),
                 "torch_threads": 1 if device == "cpu" else torch.get_num_threads()},
    }


def _methods(device: str, impl: str) -> dict:
    """The metadata's keys naming what was timed and how."""
    return {
        "decode_impl": impl,
        "prefill_impl": "torch_gather_sdpa",
        "contiguous_impl": "torch_sdpa",
        "attention_compute": ("query dtype (fp16/bf16; bf16 for fp8 KV), fp32 softmax/accumulation"
                              if device == "cuda" else "fp32 (CPU)"),
        "timing": ("CUDA events around each call, device queue pre-filled by a spin kernel; median of "
                   "repeats after warm-up; inputs rotated" if device == "cuda"
                   else "time.perf_counter around each call; median of repeats after warm-up"),
    }


# Length (~86 lines, over the ~80 rule, issue 24 item 5): one try/finally must hold the CPU thread
# setting and the temp-directory cleanup around every phase; each phase is a named helper above.
def run_calibration(
    out: str | Path | None = None,
    *,
    device: str = "auto",
    model: str | ModelSpec = "Llama-3-8B",
    gpu_name: str | None = None,
    grid: Grid | None = None,
    time_budget_s: float | None = None,
    decode_impl: str = "auto",
    mem_fraction: float = 0.4,
    seed: int = 0,
    log: Callable[[str], None] = print,
    force: bool = False,
    report: bool = False,
) -> Path:
    """Measure and write a calibration directory; returns its path.

    ``report``: ``calibrate report`` will run on the result: a report file at ``out`` that kvsim did not write
    is refused before measuring (the replacement keeps it, the report would overwrite it).

    ``device``: ``auto`` (CUDA if available, else CPU), ``cuda`` or ``cpu``. ``decode_impl``:
    ``auto`` (Triton on CUDA, torch reference on CPU), ``triton`` (on CPU: the interpreter, which
    needs ``TRITON_INTERPRET=1`` before triton is imported) or ``torch``.
    """
    torch = require_torch()
    from kvsim.calibration import bench_ops as B
    from kvsim.calibration.timer import Timer

    t_start = time.monotonic()
    device, dev = resolve_device(torch, device)
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    grid = grid or (GPU_GRID if device == "cuda" else CPU_GRID)
    grid.validate()
    impl = _decode_impl(decode_impl, device)
    device_name, cache_bytes, total_bytes, mem_budget = _device_memory(torch, device, dev, mem_fraction)
    label = gpu_name or (preset_gpu_name(device_name) if device == "cuda" else "cpu")
    out_path = Path(out) if out is not None else default_out_dir(label, spec.name)
    if report:
        check_report_files(out_path, hint="or leave out --report")
    tmp = _prepare_out(out_path, force)
    budget = time_budget_s if time_budget_s and time_budget_s > 0 else None
    clock = _PhaseClock(budget, t_start)

    if device == "cpu":
        # One intra-op thread: on a shared 2-core machine OpenMP workers spin at barriers while
        # descheduled, inflating tiny ops 10-50x; plumbing runs want stable, not fast, numbers.
        prev_threads = torch.get_num_threads()
        torch.set_num_threads(1)
    env = B.BenchEnv(device=dev, model=spec, timer=Timer(dev, grid.warmup, grid.repeats), cache_bytes=cache_bytes,
                     mem_budget_bytes=mem_budget, decode_impl=impl, act_dtype=torch.bfloat16, seed=seed, log=log)
    log(f"calibrating {spec.name} on {device_name} ({device}), decode impl {impl}, out {out_path}"
        + (f", budget {budget:.0f} s" if budget else ""))
    try:
        check = _selfcheck(impl, dev, grid, spec, log)  # 1. correctness on this device
        kv_dtypes = _kv_dtypes(env, grid, dev)
        rows, copy_bw, dropped_points, first_pass = _measure(B, env, grid, spec, kv_dtypes, mem_budget, clock, log)

        import pandas as pd

        df = pd.DataFrame(rows, columns=list(S.COLUMNS))
        check_complete(df, kv_dtypes, budget, first_pass)  # never a directory `kvsim run` cannot use
        df.to_csv(tmp / S.CSV_FILE, index=False)
        meta = {
            "schema_version": S.SCHEMA_VERSION,
            "device": device,
            "gpu_name": label,
            "device_name": device_name,
            **_software(torch, device, device_name),
            "device_memory_bytes": total_bytes,
            "l2_cache_bytes": cache_bytes if device == "cuda" else None,
            "copy_bandwidth_bytes_per_s": copy_bw,
            "model": {"name": spec.name, **{k: getattr(spec, k) for k in S.MODEL_GEOMETRY_KEYS},
                      "max_model_len_tokens": spec.max_model_len_tokens},
            "weight_dtype": "bf16",
            "kv_dtypes": list(kv_dtypes),
            "block_sizes": sorted(set(grid.block_sizes)),
            **_methods(device, impl),
            "grid": grid.to_dict(),
            "dropped_points": dropped_points,
            "selfcheck": check,
            **_run_record(env, budget, len(df), t_start),
        }
        (tmp / S.META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
        _commit(tmp, out_path, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if device == "cpu":
            torch.set_num_threads(prev_threads)
    log(f"wrote {out_path} ({len(df)} rows, {meta['wall_s']} s"
        + (f", {len(env.skipped)} points skipped for time/memory" if env.skipped else "") + ")")
    return out_path
