"""The public vLLM memory-profile corpus (``kvsim/models/data/vllm_memory_profile.csv``): loading,
kvsim's prediction of each printed term, the fit of kvsim/models/memory.py's constants on the
``fit`` rows, and the check table ``kvsim memory --check`` prints (docs/models.md, "The KV budget:
vLLM's memory profile")."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError, read_user_text
from kvsim.hw import GPUS, MODELS, GiB, WEIGHT_DTYPE_BYTES
from kvsim.models import memory
from kvsim.models.parallel import check_split, layers_per_stage

CORPUS = Path(__file__).parent / "data" / "vllm_memory_profile.csv"
REQUIRED = ("source_url", "vllm_version", "gpu", "model", "weight_dtype", "tensor", "pipeline", "stage",
            "max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization", "split")
MEASURED = ("total_gib", "weights_gib", "non_torch_gib", "activation_peak_gib", "cudagraph_gib", "kv_cache_gib")
STAGES = ("all", "first", "last")
SPLITS = ("fit", "holdout")


@dataclass(frozen=True)
class MemoryRow:
    line: int
    source_url: str
    vllm_version: str
    gpu: str
    model: str
    weight_dtype: str
    tensor: int
    pipeline: int
    stage: str
    tokens: int
    seqs: int
    utilisation: float
    split: str
    gpu_p2p: bool
    printed: dict  # MEASURED key -> GiB (absent: not printed)

    @property
    def spec(self):
        return MODELS[self.model]

    @property
    def plan_kind(self) -> str:
        return "tensor" if self.tensor > 1 and self.gpu_p2p else ("pipeline" if self.pipeline > 1 else "single")

    @property
    def stage_layers(self) -> int:
        return max(layers_per_stage(self.spec.num_layers, self.pipeline))


def _num(path: Path, line: int, key: str, text: str, kind=float, low: float = 0.0, high: float = math.inf):
    """A field's number: an integer >= 1 (``kind=int``) or a finite float in ``[low, high]``."""
    try:
        v = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ConfigError(f"{path}: line {line}: {key}: {text!r} is not {what}") from None
    if kind is int and v < 1:
        raise ConfigError(f"{path}: line {line}: {key}: {v} must be at least 1")
    if kind is float and not (math.isfinite(v) and low <= v <= high):
        raise ConfigError(f"{path}: line {line}: {key}: {text!r} must be a finite number in [{low:g}, {high:g}]")
    return v


def _choice(path: Path, line: int, key: str, value: str, choices) -> str:
    if value not in choices:
        raise ConfigError(f"{path}: line {line}: {key}: {value!r} is not one of {', '.join(sorted(choices))}")
    return value


def load(path: Path = CORPUS) -> list[MemoryRow]:
    """The corpus rows; a missing field or an unknown name is one ConfigError naming file, line and key."""
    numbered = [(n, ln) for n, ln in enumerate(read_user_text(Path(path), "memory corpus").splitlines(), start=1)
                if not ln.startswith("#")]  # comment lines are skipped; errors name the file's own line numbers
    reader = csv.DictReader(ln for _, ln in numbered)
    missing = [k for k in REQUIRED if k not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{path}: column '{missing[0]}' is missing from the header (required: {', '.join(REQUIRED)})")
    rows = []
    for r in reader:
        i = numbered[reader.line_num - 1][0]
        for key in REQUIRED:
            if not (r.get(key) or "").strip():
                raise ConfigError(f"{path}: line {i}: {key}: required field is empty")
        rows.append(MemoryRow(
            line=i, source_url=r["source_url"], vllm_version=r["vllm_version"],
            gpu=_choice(path, i, "gpu", r["gpu"], GPUS), model=_choice(path, i, "model", r["model"], MODELS),
            weight_dtype=_choice(path, i, "weight_dtype", r["weight_dtype"], WEIGHT_DTYPE_BYTES),
            tensor=_num(path, i, "tensor", r["tensor"], int), pipeline=_num(path, i, "pipeline", r["pipeline"], int),
            stage=_choice(path, i, "stage", r["stage"], STAGES),
            tokens=_num(path, i, "max_num_batched_tokens", r["max_num_batched_tokens"], int),
            seqs=_num(path, i, "max_num_seqs", r["max_num_seqs"], int),
            utilisation=_num(path, i, "gpu_memory_utilization", r["gpu_memory_utilization"], float, 1e-9, 1.0),
            split=_choice(path, i, "split", r["split"], SPLITS),
            gpu_p2p=_choice(path, i, "gpu_p2p", (r.get("gpu_p2p") or "yes").strip(), ("yes", "no")) == "yes",
            printed={k: _num(path, i, k, r[k]) for k in MEASURED if (r.get(k) or "").strip()}))
        why = check_split(rows[-1].spec, rows[-1].tensor, rows[-1].pipeline)
        if why:
            raise ConfigError(f"{path}: line {i}: {why.removeprefix('parallel.')}")  # the corpus' own column
    if not rows:
        raise ConfigError(f"{path}: no rows (only the header); the corpus needs at least one row")
    return rows


def predicted(row: MemoryRow) -> dict:
    """kvsim's value (GiB) of each printed term of ``row``; the KV cache from the printed total and
    weights where printed (so that its error is the reserve's alone), else from kvsim's (the CUDA
    total of kvsim/models/memory.py, the preset's weights)."""
    spec = row.spec
    fwd = memory.forward_peak_bytes(spec, row.tensor, row.tokens, row.weight_dtype)
    smp = memory.sampler_peak_bytes(spec, min(row.seqs, row.tokens))
    moe = memory.moe_workspace_bytes(spec, row.tensor, row.tokens, row.weight_dtype)
    act = (fwd if row.stage == "first" else max(fwd, smp)) + moe
    non_torch = memory.non_torch_bytes(row.tensor, row.pipeline, row.gpu_p2p)
    out = {"non_torch_gib": non_torch / GiB, "activation_peak_gib": act / GiB,
           "cudagraph_gib": memory.cudagraph_bytes(row.stage_layers) / GiB}
    total = row.printed.get("total_gib", memory_total_bytes(row.gpu) / GiB)
    weights = row.printed.get("weights_gib", spec.weight_bytes(row.weight_dtype) / (row.tensor * row.pipeline) / GiB)
    out["kv_cache_gib"] = total * row.utilisation - weights - (non_torch + act) / GiB
    return out


def memory_total_bytes(gpu: str) -> int:
    return memory.cuda_total_bytes(gpu, GPUS[gpu].memory_bytes)


def errors(rows: list[MemoryRow]) -> list[dict]:
    """One dict per row and printed term: printed, kvsim, relative error."""
    out = []
    for r in rows:
        p = predicted(r)
        for key, value in p.items():
            if key in r.printed and r.printed[key] > 0:
                out.append({"line": r.line, "model": r.model, "gpu": r.gpu, "tensor": r.tensor,
                            "pipeline": r.pipeline, "stage": r.stage, "split": r.split, "term": key,
                            "printed": r.printed[key], "kvsim": value, "error": value / r.printed[key] - 1})
    return out


def _lsq2(xs: list[tuple[float, float]], ys: list[float]) -> tuple[float, float]:
    """Least squares of y = a x0 + b x1 (no intercept)."""
    s00 = sum(x0 * x0 for x0, _ in xs)
    s01 = sum(x0 * x1 for x0, x1 in xs)
    s11 = sum(x1 * x1 for _, x1 in xs)
    t0 = sum(x0 * y for (x0, _), y in zip(xs, ys))
    t1 = sum(x1 * y for (_, x1), y in zip(xs, ys))
    det = s00 * s11 - s01 * s01
    return (t0 * s11 - t1 * s01) / det, (s00 * t1 - s01 * t0) / det


def fit(rows: list[MemoryRow]) -> dict:
    """memory.py's constants from the ``fit`` rows only (held-out rows are never read).

    The sampler's two coefficients by least squares on one-stage rows (their peak is the sampler's:
    vocabularies of 128K-256K rows x 1,024); the forward factor as the median over first-stage rows
    (no sampler there); non-torch memory as the median printed value per plan kind; the CUDA-graph
    line by least squares on every fit row that prints it."""
    fit_rows = [r for r in rows if r.split == "fit"]
    smp = [r for r in fit_rows if r.stage == "all" and "activation_peak_gib" in r.printed]
    n = [min(r.seqs, r.tokens) for r in smp]
    b_logit, b_hidden = _lsq2([(k * r.spec.vocab_size, k * r.spec.hidden_size) for k, r in zip(n, smp)],
                              [r.printed["activation_peak_gib"] * GiB for r in smp])
    fwd_rows = [r for r in fit_rows if r.stage == "first"]
    factor = statistics.median(
        r.printed["activation_peak_gib"] * GiB
        / (r.tokens * (3 * r.spec.intermediate_size / r.tensor + 2 * r.spec.hidden_size)
           * memory.activation_bytes_per_element(r.weight_dtype)) for r in fwd_rows)
    non_torch = {kind: statistics.median(r.printed["non_torch_gib"] for r in fit_rows
                                         if r.plan_kind == kind and "non_torch_gib" in r.printed)
                 for kind in ("single", "tensor", "pipeline")}
    cg = [r for r in fit_rows if "cudagraph_gib" in r.printed]
    xs = [r.stage_layers for r in cg]
    ys = [r.printed["cudagraph_gib"] for r in cg]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"sampler_bytes_per_logit": b_logit, "sampler_bytes_per_hidden": b_hidden, "forward_factor": factor,
            "non_torch_gib": non_torch, "cudagraph_base_gib": my - slope * mx, "cudagraph_per_layer_gib": slope}


def check_table(rows: list[MemoryRow]) -> str:
    """The per-row table and, per split and term, the median and largest absolute error."""
    errs = errors(rows)
    lines = ["line  model            gpu             TP PP stage split    term                  printed   kvsim   error"]
    for e in errs:
        lines.append(f"{e['line']:>4}  {e['model']:<16} {e['gpu']:<15} {e['tensor']:>2} {e['pipeline']:>2} "
                     f"{e['stage']:<5} {e['split']:<8} {e['term']:<20} {e['printed']:>8.2f} {e['kvsim']:>7.2f} "
                     f"{e['error']:>+7.1%}")
    lines.append("")
    for split in SPLITS:
        for term in ("non_torch_gib", "activation_peak_gib", "cudagraph_gib", "kv_cache_gib"):
            es = [abs(e["error"]) for e in errs if e["split"] == split and e["term"] == term]
            if es:
                lines.append(f"{split:<8} {term:<20} rows {len(es):>3}  median |error| {statistics.median(es):6.1%}  "
                             f"max {max(es):6.1%}")
    return "\n".join(lines)
