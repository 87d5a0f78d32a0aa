"""Decode-attention kernel model: how long one attention launch per layer takes to read the KV cache.

Plain Python + numpy; every function works elementwise on scalars or on numpy arrays (one element
per engine step), with the same IEEE operations in the same order, so a vectorised evaluation equals
the scalar one bit for bit. The terms (parameters in a :class:`BackendProfile`, sources in
docs/kernel_model.md)::

    per layer launch, for a batch of n sequences with T KV tokens and P pages (sum of ceil(c_i / block)):
      tokens_read  = P * block_size            if the backend reads whole last pages (and is paged)
                   = T                          otherwise
      heads_par    = kv_heads if gqa_grouped else query heads   (one CTA per head and sequence)
      splits       = split-KV partitions per (sequence, head): enough to give every SM
                     units_per_sm_to_saturate work units, at most ceil((T/n) / min_split_tokens)
                     (1 without split_kv)
      units        = n * heads_par * splits                     (parallel work units)
      parallelism  = min(1, units / (num_sms * units_per_sm_to_saturate))   (1 if num_sms unknown)
      chunk_bytes  = block_size * head_dim * elem_bytes           contiguous bytes per page fetch
                   = (T/n) * head_dim * elem_bytes               contiguous KV: one run per sequence
      dram_eff     = chunk_bytes / (chunk_bytes + dram_chunk_half_bytes)
      fetches      = P * kv_heads                                (page, kv head) pairs fetched
      stream_s     = bytes / (peak_hbm_bw * max_bandwidth_utilisation * parallelism * dram_eff)
      time_layer   = launch_overhead_s + unit_overhead_s * units + page_overhead_s * fetches + stream_s
                     [+ dequant_s: an unfused fp8/int8 KV is first converted to fp16 by a separate
                      pass reading the quantised bytes and writing fp16 ones; attention then streams
                      the fp16 bytes]
    kernel time = layers * time_layer

Launch-size saturation is the sum of the fixed terms (launch, per unit) and the parallelism cap:
achieved bandwidth ``bytes / time`` rises with the bytes one launch reads and saturates at
``max_bandwidth_utilisation`` (< 1) of peak. The per-page cost is ``page_overhead_s`` (indirection:
the block-table load each page fetch depends on) plus the DRAM efficiency of short contiguous runs.
A contiguous allocator (``block_size`` None) is one run per sequence: P = n and chunk_bytes is the
whole context of a head.

``pages`` may be 0 with ``tokens`` > 0 on a paged layout when the caller does not know the page
count (an engine that predates ``BatchShape.kv_pages_read``): :func:`pages_or_estimate` then uses
``T / block + n * (block - 1) / (2 * block)`` (each sequence's last page half full on average). The
step engines fill ``kv_pages_read`` exactly, so the estimate is a fallback only.
"""

from __future__ import annotations

import math
from fractions import Fraction
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from kvsim.errors import ConfigError, did_you_mean, format_choices
from kvsim.models.geometry import KVGeometry
from kvsim.yamlio import load_yaml

BACKENDS_PACKAGE = "kvsim.timing.backends"
# ``attention_backend: auto``: one kernel generation for every layout (paged, radix, contiguous,
# buddy), so an allocator or page-size comparison is not a kernel comparison (docs/kernel_model.md,
# "Selecting a backend", gives the sources for the choice).
AUTO = "auto"
AUTO_BACKEND = "flashinfer-paged"
# ``attention_backend: auto-2023``: the rule ``auto`` followed before issue 23 -- paged layouts read
# by the vLLM paper's 2023 kernel, contiguous ones by FlashAttention-2 (a kernel comparison).
AUTO_2023 = "auto-2023"
PAGED_2023_BACKEND = "vllm-2023-paged"
CONTIGUOUS_BACKEND = "contiguous"
AUTO_NAMES = (AUTO, AUTO_2023)
FP16_BYTES = 2

# The static geometry one launch reads is the run's KV geometry (one GPU's heads and layers).
KVLayout = KVGeometry


@dataclass(frozen=True)
class BackendProfile:
    """One attention backend's kernel behaviour (a YAML file under kvsim/timing/backends/)."""

    name: str
    description: str
    reference_gpu: str  # the GPU the time constants were measured/derived on (documentation)
    split_kv: bool  # splits a sequence's KV into partitions (Flash-Decoding / FlashInfer)
    gqa_grouped: bool  # one work unit per KV head (query heads of a group share it) vs per query head
    whole_page_reads: bool  # reads every token slot of a sequence's last, partly filled page
    fused_dequant_kv_dtypes: tuple[str, ...]  # quantised KV dtypes dequantised inside the kernel
    launch_overhead_s: float  # fixed cost per launch (one launch per layer)
    unit_overhead_s: float  # GPU-aggregate cost per work unit (sequence x head x split)
    max_bandwidth_utilisation: float  # saturation: best achieved / peak HBM bandwidth, in (0, 1]
    units_per_sm_to_saturate: float  # work units per SM needed to reach full bandwidth
    min_split_tokens: int  # smallest split-KV partition (tokens); unused without split_kv
    page_overhead_s: float  # GPU-aggregate cost per (page, kv head) fetch: block-table indirection
    dram_chunk_half_bytes: float  # contiguous run length at which DRAM efficiency is 1/2
    source: str = ""  # where the file came from (path), filled by the loader

    NUMERIC = ("launch_overhead_s", "unit_overhead_s", "max_bandwidth_utilisation", "units_per_sm_to_saturate",
               "min_split_tokens", "page_overhead_s", "dram_chunk_half_bytes")
    FLAGS = ("split_kv", "gqa_grouped", "whole_page_reads")

    def to_yaml_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "source"}
        d["fused_dequant_kv_dtypes"] = list(self.fused_dequant_kv_dtypes)
        return d


def builtin_backends() -> list[str]:
    root = resources.files(BACKENDS_PACKAGE)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def _finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_profile(data, where: str) -> BackendProfile:
    """Validate a profile mapping; errors name ``where`` (the file) and the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of backend parameters, got {type(data).__name__}")
    known = {f.name for f in fields(BackendProfile)} - {"source"}
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(str(key), known)}; "
                              f"valid keys: {format_choices(known)}")
    for key in ("name", *BackendProfile.FLAGS, *BackendProfile.NUMERIC):
        if key not in data:
            raise ConfigError(f"{where}: key '{key}' is missing (every backend parameter must be given)")
    for key in BackendProfile.FLAGS:
        if not isinstance(data[key], bool):
            raise ConfigError(f"{where}: key '{key}' must be true or false, got {data[key]!r}")
    vals = {}
    for key in BackendProfile.NUMERIC:
        v = data[key]
        if not _finite_number(v) or v < 0:
            raise ConfigError(f"{where}: key '{key}' must be a number >= 0, got {v!r}")
        vals[key] = v
    u = vals["max_bandwidth_utilisation"]
    if not 0 < u <= 1:
        raise ConfigError(f"{where}: key 'max_bandwidth_utilisation' must be in (0, 1], got {u!r}")
    for key in ("units_per_sm_to_saturate", "min_split_tokens"):
        if vals[key] <= 0:
            raise ConfigError(f"{where}: key '{key}' must be > 0, got {vals[key]!r}")
    if vals["min_split_tokens"] != int(vals["min_split_tokens"]):
        raise ConfigError(f"{where}: key 'min_split_tokens' must be a whole number of tokens")
    fused = data.get("fused_dequant_kv_dtypes", [])
    from kvsim.hw import KV_DTYPES

    if not isinstance(fused, list) or any(d not in KV_DTYPES for d in fused):
        raise ConfigError(f"{where}: key 'fused_dequant_kv_dtypes' must be a list of KV dtypes "
                          f"({format_choices(KV_DTYPES)}), got {fused!r}")
    return BackendProfile(
        name=str(data["name"]), description=str(data.get("description", "")),
        reference_gpu=str(data.get("reference_gpu", "")),
        split_kv=data["split_kv"], gqa_grouped=data["gqa_grouped"], whole_page_reads=data["whole_page_reads"],
        fused_dequant_kv_dtypes=tuple(fused),
        launch_overhead_s=float(vals["launch_overhead_s"]), unit_overhead_s=float(vals["unit_overhead_s"]),
        max_bandwidth_utilisation=float(u), units_per_sm_to_saturate=float(vals["units_per_sm_to_saturate"]),
        min_split_tokens=int(vals["min_split_tokens"]), page_overhead_s=float(vals["page_overhead_s"]),
        dram_chunk_half_bytes=float(vals["dram_chunk_half_bytes"]), source=where,
    )


def load_profile_file(path: str | Path) -> BackendProfile:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read backend profile ({e.strerror})") from None
    data = load_yaml(text, str(path))
    return parse_profile(data, str(path))


def load_backend(name: str, base_dir: Path | None = None, where: str = "timing.attention_backend") -> BackendProfile:
    """A built-in backend by name, or a profile YAML by path (relative to ``base_dir``, then cwd)."""
    if name in builtin_backends():
        res = resources.files(BACKENDS_PACKAGE) / f"{name}.yaml"
        return parse_profile(yaml.safe_load(res.read_text()), f"kvsim/timing/backends/{name}.yaml")
    if name.endswith((".yaml", ".yml")):
        p = Path(name).expanduser()
        if not p.is_absolute() and base_dir is not None and (Path(base_dir) / p).exists():
            p = Path(base_dir) / p
        if p.exists():
            return load_profile_file(p)
        raise ConfigError(f"{where}: backend profile file {name!r} not found")
    raise ConfigError(f"{where}: unknown attention backend {name!r}{did_you_mean(name, builtin_backends())}; "
                      f"valid: {format_choices(builtin_backends())}, or a path to a profile .yaml")


def resolve_backend(name: str, block_size: int | None) -> str:
    """The backend a run uses for ``timing.attention_backend: name`` on a layout of ``block_size``
    (None: contiguous KV): ``auto`` -> :data:`AUTO_BACKEND` for every layout; ``auto-2023`` -> the
    2023 paged kernel for paged layouts and ``contiguous`` for contiguous ones; else ``name``."""
    if name == AUTO:
        return AUTO_BACKEND
    if name == AUTO_2023:
        return PAGED_2023_BACKEND if block_size else CONTIGUOUS_BACKEND
    return name


def default_backend(block_size: int | None) -> str:
    """What ``auto`` resolves to on a layout of ``block_size`` (the same for every layout)."""
    return resolve_backend(AUTO, block_size)


def pages_or_estimate(num_seqs, kv_tokens, kv_pages, block_size: int | None):
    """Pages attention reads. Contiguous KV: one run per sequence. Paged: ``kv_pages`` when known;
    ``kv_pages`` None (a caller that does not know the page count) -> ``T/b + n(b-1)/(2b)``."""
    if block_size is None:
        return num_seqs
    if kv_pages is None:
        return kv_tokens / block_size + num_seqs * ((block_size - 1) / (2 * block_size))
    return kv_pages


def _exact_product(a: float, b: float) -> float | None:
    """``a * b`` when that double is the exact product, else None."""
    prod = float(a) * float(b)
    return prod if math.isfinite(prod) and Fraction(a) * Fraction(b) == Fraction(prod) else None


@dataclass(frozen=True)
class KernelResult:
    time_s: object  # float or array: all layers
    bytes_read: object  # HBM bytes the attention kernel (and an unfused dequant pass) reads, all layers
    pages_fetched: object  # (page, kv head, layer) fetches; contiguous: one run per (sequence, head, layer)
    bandwidth_utilisation: object  # useful KV bytes / time / peak HBM bandwidth


class KernelModel:
    """A backend profile bound to a KV layout and a GPU. ``time_s`` is the hot path."""

    def __init__(self, profile: BackendProfile, layout: KVLayout, hbm_bandwidth_bytes_per_s: float,
                 num_sms: int | None):
        from kvsim.hw import KV_DTYPES

        self.profile = profile
        self.layout = layout
        self.peak_bw = float(hbm_bandwidth_bytes_per_s)
        p, lay = profile, layout
        self.fused = lay.kv_dtype in p.fused_dequant_kv_dtypes or KV_DTYPES[lay.kv_dtype].bits >= 16
        fp16_layer = 2 * lay.num_kv_heads * lay.head_dim * FP16_BYTES  # per token per layer
        # bytes per token the attention loop streams: stored bytes when fused, fp16 after a dequant pass
        self.stream_bytes_per_token = lay.kv_bytes_per_token_layer if self.fused else float(fp16_layer)
        self.dequant_bytes_per_token = 0.0 if self.fused else lay.kv_bytes_per_token_layer + fp16_layer
        elem_bytes = self.stream_bytes_per_token / (2 * lay.num_kv_heads * lay.head_dim)
        self.head_token_bytes = lay.head_dim * elem_bytes  # one head's K (or V) of one token
        self.heads_par = lay.num_kv_heads if p.gqa_grouped else lay.num_query_heads
        self.units_sat = None if num_sms is None else num_sms * p.units_per_sm_to_saturate
        self.bw = self.peak_bw * p.max_bandwidth_utilisation
        self.whole_pages = p.whole_page_reads and lay.block_size is not None
        if lay.block_size is not None:
            chunk = lay.block_size * self.head_token_bytes
            self.dram_eff = chunk / (chunk + p.dram_chunk_half_bytes)
        else:
            self.dram_eff = None  # per launch: the mean context is the run length
        self._bind()

    # -- the model ---------------------------------------------------------------------------------
    # ``time_s`` is called once per engine step (scalars) and once per decode window (arrays), so
    # the two paths below are written out separately with the per-run constants bound at
    # construction. They perform the module docstring's IEEE operations in the same order; integer
    # operands enter as exact doubles (counts far below 2**53), which is how numpy and Python
    # convert them in mixed arithmetic anyway. tests/timing/test_timing_fast_paths.py checks both
    # against the term-by-term formula bit for bit over many shapes, backends and layouts.
    def _bind(self) -> None:
        p, lay = self.profile, self.layout
        self._L = lay.num_layers
        self._block = lay.block_size
        self._tail_pages = None if lay.block_size is None else (lay.block_size - 1) / (2 * lay.block_size)
        self._kvh = lay.num_kv_heads
        self._split = p.split_kv and self.units_sat is not None
        self._min_split = p.min_split_tokens
        self._launch = p.launch_overhead_s
        self._unit_oh = p.unit_overhead_s
        self._page_oh = p.page_overhead_s
        self._half = p.dram_chunk_half_bytes
        self._dequant_bytes = None if self.fused else self.dequant_bytes_per_token
        self._n_size = 0
        # products of two per-run constants, bound only when the double product is exact (see _time_array)
        self._stream_bytes_per_page = (_exact_product(lay.block_size, self.stream_bytes_per_token)
                                       if self.whole_pages else None)
        self._page_oh_per_page = _exact_product(p.page_overhead_s, lay.num_kv_heads)
        self._needs_float_tokens = (not self.whole_pages or self._split or self.dram_eff is None
                                    or self._dequant_bytes is not None)
        self._n_table = np.zeros((3, 0))
        self._n_lists: list[list[float]] = []

    def time_s(self, num_seqs, kv_tokens, kv_pages):
        """All layers' attention-kernel time. Scalars (python ints/floats) or numpy arrays;
        ``kv_pages`` None = unknown (see :func:`pages_or_estimate`)."""
        if isinstance(num_seqs, np.ndarray):
            return self._time_array(num_seqs, kv_tokens, kv_pages)
        return self.time_scalar(num_seqs, kv_tokens, kv_pages)

    # Without split-KV the terms that depend on the batch size alone are tabulated by n (grown on
    # demand, like the GEMM tables): head[n] = launch + unit_overhead * units(n), bwpar[n] =
    # peak * utilisation * parallelism(n) and, with a fixed DRAM efficiency (paged), den[n] =
    # bwpar[n] * dram_eff. A lookup returns the very double the formula gives.
    def _grow_n_table(self, top: int) -> None:
        size = max(top + 1, 2 * self._n_size, 256)
        n1 = np.maximum(np.arange(size, dtype=np.float64), 1.0)
        units = n1 * self.heads_par
        if self._split:
            # split-KV: units depend on the tokens too; the batch-size terms are tabulated (the
            # same doubles _time_array computed from them: n1, base = n1 * heads_par and
            # want = max(ceil(units_sat / base), 1))
            self._n_table = np.array([n1, units, np.maximum(np.ceil(self.units_sat / units), 1.0)])
            self._n_size = size
            return
        head = self._launch + self._unit_oh * units
        if self.units_sat is None:
            bwpar = np.full(size, self.bw * 1.0)
        else:
            bwpar = self.bw * np.minimum(units / self.units_sat, 1.0)
        rows = [head, bwpar] if self.dram_eff is None else [head, bwpar, bwpar * self.dram_eff]
        self._n_table = np.array(rows)
        self._n_lists = [row.tolist() for row in rows]  # Python floats: the same doubles, cheaper to index
        self._n_size = size

    def _pages(self, num_seqs, kv_tokens, kv_pages):
        """Pages a launch fetches (numbers or arrays): one per sequence for a contiguous kernel, the
        counted ``kv_pages`` when given, else the expected count from the token total."""
        bs = self._block
        if bs is None:
            return num_seqs
        if kv_pages is None:
            return kv_tokens / bs + num_seqs * self._tail_pages
        return kv_pages

    def time_scalar(self, num_seqs, kv_tokens, kv_pages) -> float:
        """``time_s`` of one launch (Python numbers): the engine's per-step hot path."""
        bs = self._block
        P = self._pages(num_seqs, kv_tokens, kv_pages)
        T = int(kv_tokens)
        if T <= 0:  # nothing to read costs nothing (no KV tokens: no kernel)
            return 0.0
        n1 = int(num_seqs)
        if n1 < 1:
            n1 = 1
        sb = (P * bs if self.whole_pages else T) * self.stream_bytes_per_token
        if self._split:
            base = n1 * self.heads_par
            want = float(math.ceil(self.units_sat / base))
            cap = float(math.ceil((T / n1) / self._min_split))
            if cap < 1.0:
                cap = 1.0
            if want < 1.0:
                want = 1.0
            units = base * (cap if cap < want else want)
            par = units / self.units_sat
            if par > 1.0:
                par = 1.0
            head = self._launch + self._unit_oh * units
            bwpar = self.bw * par
        else:
            if n1 >= self._n_size:
                self._grow_n_table(n1)
            lists = self._n_lists
            head, bwpar = lists[0][n1], lists[1][n1]
        eff = self.dram_eff
        if eff is None:
            r = T / n1
            chunk = (r if r > 1.0 else 1.0) * self.head_token_bytes
            den = bwpar * (chunk / (chunk + self._half))
        elif self._split:
            den = bwpar * eff
        else:
            den = self._n_lists[2][n1]
        t = head + self._page_oh * (P * self._kvh) + sb / den
        if self._dequant_bytes is not None:
            t = t + (self._launch + T * self._dequant_bytes / self.bw)
        return self._L * t

    def _time_array(self, num_seqs: np.ndarray, kv_tokens, kv_pages) -> np.ndarray:
        """``time_s`` of many launches: counts are turned into doubles once, then float ops only."""
        P = self._pages(num_seqs, kv_tokens, kv_pages)
        n = num_seqs if num_seqs.dtype.kind in "iu" else num_seqs.astype(np.int64)
        T = np.asarray(kv_tokens, dtype=np.int64)
        if self._needs_float_tokens:
            Tf = T.astype(np.float64)
        P = np.asarray(P)
        # Whole page counts (integers): P * block and P * kv_heads are exact, so when block x
        # stream bytes (and page cost x kv heads) are exact doubles too, one multiplication by the
        # bound product rounds the same real number once, exactly as the formula's two do.
        counted = P.dtype.kind in "iu"
        if counted and self._stream_bytes_per_page is not None:
            sb = P * self._stream_bytes_per_page
        elif self.whole_pages:
            sb = np.asarray(P, dtype=np.float64) * self._block * self.stream_bytes_per_token
        else:
            sb = Tf * self.stream_bytes_per_token
        eff = self.dram_eff
        if self._split:
            ni = np.maximum(n, 1)
            try:
                n1, base, want = self._n_table.take(ni, axis=1)
            except IndexError:
                self._grow_n_table(int(ni.max()))
                n1, base, want = self._n_table.take(ni, axis=1)
            cap = np.maximum(np.ceil((Tf / n1) / self._min_split), 1.0)
            units = base * np.minimum(want, cap)
            head = self._launch + self._unit_oh * units
            bwpar = self.bw * np.minimum(units / self.units_sat, 1.0)
        else:
            n1 = np.maximum(n, 1)
            try:
                rows = self._n_table.take(n1, axis=1)
            except IndexError:
                self._grow_n_table(int(n1.max()))
                rows = self._n_table.take(n1, axis=1)
            head, bwpar = rows[0], rows[1]
        if eff is None:
            chunk = np.maximum(Tf / n1, 1.0) * self.head_token_bytes
            den = bwpar * (chunk / (chunk + self._half))
        elif self._split:
            den = bwpar * eff
        else:
            den = rows[2]
        t = head  # a fresh array (lookup or arithmetic): updated in place
        if self._page_oh != 0.0:  # else the term is +0.0, which leaves t (>= +0.0) unchanged
            if counted and self._page_oh_per_page is not None:
                t += P * self._page_oh_per_page
            else:
                t += self._page_oh * (np.asarray(P, dtype=np.float64) * self._kvh)
        t += sb / den
        if self._dequant_bytes is not None:
            t += self._launch + Tf * self._dequant_bytes / self.bw
        if len(T) and np.minimum.reduce(T) <= 0:
            t = np.where(T > 0, t, 0.0)
        return self._L * t

    def evaluate(self, num_seqs, kv_tokens, kv_pages):
        """(time_s, bytes_read, pages_fetched) over all layers; ``kv_pages`` None = unknown
        (see :func:`pages_or_estimate`)."""
        lay = self.layout
        P = pages_or_estimate(num_seqs, kv_tokens, kv_pages, lay.block_size)
        if isinstance(num_seqs, np.ndarray):
            T = np.asarray(kv_tokens, dtype=np.int64)
            P = np.asarray(P)
        else:
            T = int(kv_tokens)
        tokens = P * lay.block_size if self.whole_pages else T
        sb = tokens * self.stream_bytes_per_token
        b = sb + (0.0 if self.fused else T * self.dequant_bytes_per_token)
        f = P * lay.num_kv_heads
        L = lay.num_layers
        return self.time_s(num_seqs, kv_tokens, kv_pages), L * b, L * f

    def result(self, num_seqs, kv_tokens, kv_pages) -> KernelResult:
        t, b, f = self.evaluate(num_seqs, kv_tokens, kv_pages)
        useful = self.layout.num_layers * kv_tokens * self.layout.kv_bytes_per_token_layer
        if isinstance(t, np.ndarray):
            util = np.where(t > 0, useful / np.where(t > 0, t, 1.0) / self.peak_bw, 0.0)
        else:
            util = useful / t / self.peak_bw if t > 0 else 0.0
        return KernelResult(time_s=t, bytes_read=b, pages_fetched=f, bandwidth_utilisation=util)
