"""The public decode-attention kernel measurement corpus (kvsim/timing/data/kernels/kernel_corpus.csv)
and the kernel model's error on it.

One row per printed measurement: where it was published (source, URL, commit, date), the GPU and the
kvsim preset it maps to (``none``: no preset, recorded but not evaluated), the backend and its
version, the launch shape (batch, context, query/KV heads, head dim, attention kind, dtype, page size,
layers), the measured kernel time, the printed bandwidth utilisation (``na`` where none was printed), L2 state,
whether the number was printed as text or read from a figure (with the reading error), the fixed
``split`` (``fit`` rows may be used to fit profile constants, ``holdout`` rows never are) and how the
time was taken (``timing``: ``kernel``, the kernel alone, or ``eager-wrapper``, CUDA events around an
eagerly launched library call, so the row also holds the wrapper's host time: the model is compared
with such rows through their source's host floor, ``host_floors``). Sources and the split rule are in
docs/kernel_model.md, "Measurement corpus".
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvsim.errors import ConfigError, format_choices, read_user_text
from kvsim.timing.backend_profile import BACKEND_ALIASES

COLUMNS = ("source_id", "source", "source_url", "source_commit", "source_date", "gpu", "gpu_preset", "backend",
           "backend_version", "batch", "context", "query_heads", "kv_heads", "head_dim", "attention", "dtype", "page_size",
           "layers", "time_us", "bandwidth_util", "l2", "reading", "reading_error", "split", "note", "timing")
OPTIONAL_TEXT = ("note",)  # may be empty; every other field must be given ("none"/"na" say "not printed")
INT_FIELDS = ("batch", "context", "query_heads", "kv_heads", "head_dim", "page_size", "layers")
# one launch's bounds, for a row as for ``kvsim kernel --batch/--context`` (kvsim.kernel_cli): a GPU's batch
# (vLLM's max_num_seqs is 256-1,024 by default; the tables the model keeps per batch size grow with it) and a
# context past every preset's max_model_len
MAX_BATCH = 1 << 20
MAX_CONTEXT = 1 << 24
INT_BOUNDS = {"batch": (MAX_BATCH, "--batch"), "context": (MAX_CONTEXT, "--context")}
SPLITS = ("fit", "holdout")
READINGS = ("text", "figure")
L2_STATES = ("warm", "cold", "unknown")
# kernel: the time is the kernel's (CUDA graphs, a profiler's kernel rows, or a launch long enough that
# the host call hides behind it); eager-wrapper: CUDA events around one eager call of a library's Python
# wrapper, so a launch shorter than the wrapper's host work reads the host time (docs/kernel_model.md,
# "Host floor of eagerly timed rows")
TIMINGS = ("kernel", "eager-wrapper")
ATTENTION = ("gqa", "mla")  # gqa: K and V per KV head (MHA/GQA/MQA); mla: one latent of head_dim read as K and V
BUILTIN = "kvsim/timing/data/kernels/kernel_corpus.csv"
# Sources added after the constants were last fitted (twenty-fifth session), held out whole: every row
# is ``holdout``, so they test the shipped profiles as a user's own readings would -- a source the fit
# never saw. Every other source is split by the rule in docs/kernel_model.md (every third row of each
# source and backend held out). A refit that takes them in moves them to that rule.
HELD_OUT_SOURCES = frozenset({
    "onnxruntime-pr-21414-fa2", "onnxruntime-pr-21414-batchdecode", "tileops-nightly-2026-08-22", "tileops-pr-2084",
    "tileops-pr-1930", "flashinfer-issue-1753", "flashmla-issue-30-h20", "pytorch-pr-137036-a6000-fakv",
    "pytorch-pr-137036-a6000-flex", "vllm-issue-1618",
})


def held_out_whole(source_id: str) -> bool:
    """Whether a row's source is held out whole (HELD_OUT_SOURCES)."""
    return source_id in HELD_OUT_SOURCES


@dataclass(frozen=True)
class KernelPoint:
    """One published kernel measurement (times per launch of ``layers`` layers, in seconds)."""

    source_id: str
    source_url: str
    gpu: str
    gpu_preset: str  # kvsim GPU preset name, or "none"
    backend: str
    batch: int
    context: int
    query_heads: int
    kv_heads: int
    head_dim: int
    attention: str  # "gqa" or "mla" (see ATTENTION)
    dtype: str
    page_size: int
    layers: int
    time_s: float
    bandwidth_util: float | None  # as printed (None: not printed)
    reading: str
    split: str
    row: int  # line number in the file (header = 1)
    timing: str = "kernel"  # see TIMINGS


# a corpus field whose value the source did not print may say so; a measured launch's own fields may not
NOT_PRINTED_HINT = "write 'none' or 'na' for a value the source did not print"
LAUNCH_FIELD_HINT = "a reading gives every launch field"


def _field(rec: dict, key: str, where: str, hint: str = NOT_PRINTED_HINT):
    v = rec.get(key)
    if v is None or (v.strip() == "" and key not in OPTIONAL_TEXT):
        raise ConfigError(f"{where}: key '{key}' is missing ({hint})")
    return v.strip()


def parse_rows(lines, where: str) -> list[KernelPoint]:
    """Rows of a corpus CSV; a missing or malformed field stops with one line naming file, row and key."""
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{where}: key '{missing[0]}' is missing from the header; columns: {', '.join(COLUMNS)}")
    return [_point({k: _field(rec, k, f"{where} row {i}") for k in COLUMNS}, f"{where} row {i}", i)
            for i, rec in enumerate(reader, start=2)]


def _point(vals: dict, at: str, row: int) -> KernelPoint:
    """One validated row (every COLUMNS key given as text); errors name ``at`` (file and row) and the key."""
    from kvsim.hw import KV_DTYPES

    ints = {}
    for k in INT_FIELDS:
        try:
            ints[k] = int(vals[k])
        except ValueError:
            raise ConfigError(f"{at}: key '{k}' must be a whole number, got {vals[k]!r}") from None
        if ints[k] < 1:
            raise ConfigError(f"{at}: key '{k}' must be >= 1, got {ints[k]}")
        if k in INT_BOUNDS and ints[k] > INT_BOUNDS[k][0]:
            top, flag = INT_BOUNDS[k]
            raise ConfigError(f"{at}: key '{k}' must be 1..{top:,} (as {flag}), got {ints[k]:,}")
    if ints["query_heads"] % ints["kv_heads"]:
        raise ConfigError(f"{at}: key 'kv_heads' must divide query_heads ({ints['query_heads']}), got {ints['kv_heads']}")
    if vals["attention"] == "mla" and ints["kv_heads"] != 1:
        raise ConfigError(f"{at}: key 'kv_heads' must be 1 for attention 'mla' (one latent per token), "
                          f"got {ints['kv_heads']}")
    try:
        t_us = float(vals["time_us"])
    except ValueError:
        raise ConfigError(f"{at}: key 'time_us' must be a number, got {vals['time_us']!r}") from None
    if not math.isfinite(t_us) or t_us <= 0:
        raise ConfigError(f"{at}: key 'time_us' must be > 0, got {vals['time_us']!r}")
    bu = None
    if vals["bandwidth_util"] != "na":
        try:
            bu = float(vals["bandwidth_util"])
        except ValueError:
            raise ConfigError(f"{at}: key 'bandwidth_util' must be a fraction or 'na', "
                              f"got {vals['bandwidth_util']!r}") from None
    for key, choices in (("split", SPLITS), ("reading", READINGS), ("l2", L2_STATES), ("attention", ATTENTION),
                         ("dtype", tuple(KV_DTYPES)), ("timing", TIMINGS)):
        if vals[key] not in choices:
            raise ConfigError(f"{at}: key '{key}' must be one of {format_choices(choices)}, got {vals[key]!r}")
    return KernelPoint(vals["source_id"], vals["source_url"], vals["gpu"], vals["gpu_preset"],
                       vals["backend"], ints["batch"], ints["context"], ints["query_heads"],
                       ints["kv_heads"], ints["head_dim"], vals["attention"], vals["dtype"],
                       ints["page_size"],
                       ints["layers"], t_us * 1e-6, bu, vals["reading"], vals["split"], row, vals["timing"])


# A user's own readings (``kvsim kernel --check --readings FILE``): the launch and its time only; every row is
# held out (no fit reads it) and timed as the kernel alone (a CUDA graph or a profiler's kernel rows)
READING_COLUMNS = ("gpu_preset", "backend", "batch", "context", "query_heads", "kv_heads", "head_dim", "dtype",
                   "page_size", "time_us")
READING_OPTIONAL = {"layers": "1", "attention": "gqa", "l2": "unknown", "note": ""}


def load_readings(path: str | Path, backends: dict) -> list[KernelPoint]:
    """A CSV of READING_COLUMNS (and optionally READING_OPTIONAL's) as held-out corpus points of source ``path``;
    a GPU that is not a kvsim preset, a backend not in ``backends`` (name -> BackendProfile) or an ``attention``
    kind its profile does not read (``attention_kinds``) is refused (one line, file, row, key)."""
    from kvsim.hw import GPUS

    p = Path(path)
    lines = read_user_text(p, "kernel readings").splitlines()
    if not any(line.strip() for line in lines):
        raise ConfigError(f"{p}: the kernel readings file is empty (a header of {', '.join(READING_COLUMNS)} and "
                          f"a row per reading are needed)")
    reader = csv.DictReader(lines)
    missing = [c for c in READING_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"{p}: key '{missing[0]}' is missing from the header; columns: "
                          f"{', '.join(READING_COLUMNS)} (optional: {', '.join(READING_OPTIONAL)})")
    out = []
    for i, rec in enumerate(reader, start=2):
        at = f"{p} row {i}"
        vals = {k: _field(rec, k, at, LAUNCH_FIELD_HINT) for k in READING_COLUMNS}
        vals |= {k: (rec.get(k) or d).strip() for k, d in READING_OPTIONAL.items()}
        if vals["gpu_preset"] not in GPUS:
            raise ConfigError(f"{at}: key 'gpu_preset' must be one of {format_choices(GPUS)}, got {vals['gpu_preset']!r}")
        vals["backend"] = BACKEND_ALIASES.get(vals["backend"], vals["backend"])  # an old name, as --backend takes it
        if vals["backend"] not in backends:
            raise ConfigError(f"{at}: key 'backend' must be one of {format_choices(backends)} (or an old name: "
                              f"{format_choices(BACKEND_ALIASES)}), got {vals['backend']!r}")
        kinds = backends[vals["backend"]].attention_kinds
        if vals["attention"] in ATTENTION and vals["attention"] not in kinds:
            raise ConfigError(f"{at}: key 'attention' must be one of {format_choices(kinds)} for backend "
                              f"{vals['backend']!r} (its profile's attention_kinds), got {vals['attention']!r}")
        vals |= {"source_id": p.name, "source_url": "none", "gpu": vals["gpu_preset"], "bandwidth_util": "na",
                 "reading": "text", "split": "holdout", "timing": "kernel"}
        out.append(_point(vals, at, i))
    if not out:
        raise ConfigError(f"{p}: no readings (a header and at least one row are needed)")
    return out


def load_corpus(path: str | Path | None = None) -> list[KernelPoint]:
    """The built-in corpus, or a CSV of the same columns at ``path``."""
    if path is None:
        res = resources.files("kvsim.timing") / "data" / "kernels" / "kernel_corpus.csv"
        return parse_rows(res.read_text().splitlines(), BUILTIN)
    p = Path(path)
    return parse_rows(read_user_text(p, "kernel corpus").splitlines(), str(p))


def layout_of(pt: KernelPoint):
    """The KV layout one measured launch read (page size, heads and dtype as printed; an MLA launch
    reads its one latent of ``head_dim`` once per token, as K and as V)."""
    from kvsim.hw import KV_DTYPES
    from kvsim.timing.kernel import KVLayout

    vectors = 1 if pt.attention == "mla" else 2 * pt.kv_heads
    bpt = vectors * KV_DTYPES[pt.dtype].head_bytes(pt.head_dim)
    return KVLayout(pt.layers, pt.kv_heads, pt.query_heads, pt.head_dim, pt.dtype, float(bpt), pt.page_size)


# Corpus backends whose benchmark forced one kernel where vLLM would dispatch: evaluated with this
# split rule (vLLM's benchmark_paged_attention.py --version v2 runs the v2 kernel at every shape).
FORCED_SPLIT_RULE = {"vllm-paged-v2": "partition"}


def profile_for(pt: KernelPoint, profiles: dict):
    """The profile a point is checked against: its backend's, with a forced kernel's split rule."""
    from dataclasses import replace

    prof = profiles[pt.backend]
    rule = FORCED_SPLIT_RULE.get(pt.backend)
    return prof if rule is None or not prof.split_kv else replace(prof, split_rule=rule)


def predict(pt: KernelPoint, profile) -> tuple[float, float, float]:
    """(predicted time s, predicted utilisation, measured utilisation) of one point under ``profile``;
    utilisation = KV bytes attended / time / peak HBM bandwidth (the model's definition) for both."""
    from kvsim.hw import GPUS
    from kvsim.timing.kernel import KernelModel

    g = GPUS[pt.gpu_preset]
    lay = layout_of(pt)
    km = KernelModel.for_gpu(profile, lay, g)
    tokens = pt.batch * pt.context
    t = km.time_scalar(pt.batch, tokens, pt.batch * -(-pt.context // pt.page_size))
    useful = pt.layers * tokens * lay.kv_bytes_per_token_layer
    return t, useful / t / g.hbm_bandwidth_bytes_per_s, useful / pt.time_s / g.hbm_bandwidth_bytes_per_s


def host_floors(points) -> dict[str, float]:
    """Per source with ``eager-wrapper`` rows, its host floor (s): the median time of its fit rows at its
    smallest batch, where every context reads the wrapper's host time (Vidur's FlashInfer rows: 24-25 us
    at batch 1 from 800 to 2,560 tokens). Read from fit rows only, so held-out rows never set it."""
    small: dict[str, list] = {}
    for p in points:
        if p.timing == "eager-wrapper" and p.split == "fit":
            small.setdefault(p.source_id, []).append(p)
    out = {}
    for src, rows in small.items():
        b = min(p.batch for p in rows)
        times = sorted(p.time_s for p in rows if p.batch == b)
        mid = len(times) // 2
        out[src] = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    return out


def as_measured(pt: KernelPoint, t: float, floors: dict[str, float]) -> float:
    """The model's kernel time ``t`` as ``pt``'s method would have read it: an eagerly timed row reads at
    least its source's host floor (``host_floors``); a kernel-timed row reads the kernel. Used only to
    compare the model with corpus rows (fit and --check); the kernel model itself has no floor."""
    return max(t, floors[pt.source_id]) if pt.timing == "eager-wrapper" else t


def evaluable(points, backends) -> list[KernelPoint]:
    """Points with a kvsim GPU preset and a built-in backend of that name."""
    from kvsim.hw import GPUS

    return [p for p in points if p.gpu_preset in GPUS and p.backend in backends]


@dataclass(frozen=True)
class ErrorRow:
    backend: str
    gpu: str
    split: str
    points: int
    mape: float  # mean |predicted - measured| / measured kernel time
    max_rel: float
    util_points: int  # points with measured utilisation >= 40 %
    util_max_abs: float  # largest |predicted - measured| utilisation there (fraction; nan if none)
    util_mean_abs: float  # mean |predicted - measured| utilisation there (fraction; nan if none)
    util_misses: int = 0  # of those rows, how many are more than UTIL_BOUND off


# issue 23's targets for held-out rows: time error <= TIME_TARGET for a backend with >= MIN_HELDOUT rows,
# utilisation within UTIL_BOUND (a fraction of peak) where the measured utilisation is >= UTIL_FLOOR
TIME_TARGET, MIN_HELDOUT, UTIL_BOUND, UTIL_FLOOR = 0.15, 20, 0.05, 0.40


def error_table(points, profiles: dict) -> list[ErrorRow]:
    """The model's error per (backend, GPU preset, split) and per (backend, all GPUs, split), each row's
    predicted time read as its timing method would (``as_measured``)."""
    groups: dict[tuple, list] = {}
    floors = host_floors(points)
    for p in evaluable(points, profiles):
        t, u_pred, u_meas = predict(p, profile_for(p, profiles))
        seen = as_measured(p, t, floors)
        u_pred *= t / seen
        rel = abs(seen - p.time_s) / p.time_s
        for key in ((p.backend, p.gpu_preset, p.split), (p.backend, "all", p.split)):
            groups.setdefault(key, []).append((rel, u_pred, u_meas))
    out = []
    for (b, g, s), vals in sorted(groups.items()):
        rels = [v[0] for v in vals]
        hi = [abs(v[1] - v[2]) for v in vals if v[2] >= UTIL_FLOOR]
        out.append(ErrorRow(b, g, s, len(vals), sum(rels) / len(rels), max(rels), len(hi),
                            max(hi) if hi else float("nan"), sum(hi) / len(hi) if hi else float("nan"),
                            sum(h > UTIL_BOUND for h in hi)))
    return out


def target_verdict(row: ErrorRow) -> str:
    """One line on a held-out (backend, all GPUs) row against issue 23's targets."""
    if row.points < MIN_HELDOUT:
        return f"{row.points} held-out rows (< {MIN_HELDOUT}): target not claimed"
    time_ok = "met" if row.mape <= TIME_TARGET else "NOT met"
    if not row.util_points:
        return f"time {row.mape:.1%} on {row.points} rows ({time_ok}); no row at >= {UTIL_FLOOR:.0%} utilisation"
    util_ok = "met" if row.util_mean_abs <= UTIL_BOUND else "NOT met"
    return (f"time {row.mape:.1%} on {row.points} rows ({time_ok}); utilisation {row.util_mean_abs * 100:.1f} pts "
            f"mean ({util_ok} on the mean), {row.util_misses} of {row.util_points} rows more than "
            f"{UTIL_BOUND * 100:.0f} pts off")


def corpus_summary(points) -> list[tuple[str, str, int, int]]:
    """(source id, URL, points, points on a kvsim GPU preset) per source, in file order."""
    from kvsim.hw import GPUS

    seen: dict[str, list] = {}
    for p in points:
        s = seen.setdefault(p.source_id, [p.source_url, 0, 0])
        s[1] += 1
        s[2] += p.gpu_preset in GPUS
    return [(k, v[0], v[1], v[2]) for k, v in seen.items()]
