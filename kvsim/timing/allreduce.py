"""A step's tensor-parallel communication, with the engine's own small-message all-reduce.

kvsim/models/parallel.py prices every all-reduce of a step with NCCL's ring model (the GPU preset's
small-message latency plus ``2 (T-1)/T`` bytes over the link), which gives the linear
``comm_s(n) = comm_s_per_step + comm_s_per_token * n`` for a step of ``n`` tokens. Serving engines
do not use NCCL for the small all-reduces of decode steps: vLLM has its own one-kernel
all-reduce over CUDA IPC buffers since vllm-project/vllm#2192 (``CustomAllreduce``: world sizes 2, 4,
6 and 8, messages up to 8 MiB, NVLink), and SGLang another. ``timing.allreduce`` names which one
prices the tensor all-reduces; each is a measured latency curve over the message size
(``data/allreduce/custom_allreduce.csv``, one row per published reading, with its source)::

    comm_s(n) = stage_s(n) + A * ar_s(n * b)
    ar_s(m)   = curve(m)                            if m <= M, the curve's largest message
              = curve(M) + (m - M) * w              above it: NCCL's bandwidth term from the last reading
              = (allreduce_s_per_step + allreduce_s_per_token * n) / A   where no curve covers this
                                                    GPU's interconnect and tensor degree (NCCL's ring)

with ``A`` all-reduces per step (2 per layer), ``b`` bytes per token of each (``hidden x 2``), ``w``
NCCL's seconds per byte (``allreduce_s_per_token / (A b)``: ``2 (T-1)/T`` of the message over the
link) and ``stage_s`` the pipeline stage sends (what is left of comm_s without the all-reduces).
``curve`` is the lower non-decreasing envelope of the readings (a message never costs more than a
larger one's reading), linear in the message size between the printed sizes and flat below the
smallest. Above ``M`` the price is continuous and grows at NCCL's link rate: vLLM's kernel runs up to
its ``max_size`` (8 MiB) as a two-stage reduce-scatter + all-gather, moving the ring's bytes, and
NCCL takes over beyond; keeping the anchored line past 8 MiB keeps it continuous (it differs from
NCCL's own model by the constant ``curve(M) - ring(M)``). Sources: docs/engine_overhead.md,
"All-reduce". ``nccl`` (the field's default, and ``engine_profile: kvsim``) is the linear form
above, bit for bit.

Where NCCL's low-latency protocol is priced beside its ring one (``TimingContext.nccl_ll_protocol``:
the host-memory path of ``parallel.gpu_p2p: false``, unless ``parallel.host_allreduce_ll: false``),
NCCL's own tuning model takes, per all-reduce, the protocol with the least
``latency + bytes / bandwidth`` (kvsim.hw.NCCL_LL)::

    ar_s(n) = min(ring(n), A * (l_base + 2 (T-1) l_step) + allreduce_s_per_token * n / f)

with ``ring(n) = allreduce_s_per_step + allreduce_s_per_token * n`` (the Simple protocol above) and
``f`` LL's fraction of the ring's bus bandwidth: LL wins the small messages of decode steps.

The one definition of the term: :class:`StepComm` is evaluated by ``step_time`` (a Python float),
``decode_durations`` and the stepwise pricer (rows of the per-batch-size decode table); a custom
all-reduce is a per-token-count table that both read, so the three agree bit for bit.
Sources and what moved: docs/engine_overhead.md, "All-reduce".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from kvsim.errors import ConfigError
from kvsim.hw import NCCL_LL
from kvsim.timing.profile_file import read_data_rows

NCCL = "nccl"
ALLREDUCE_KINDS = (NCCL, "vllm-custom", "sglang-custom")
CURVES_FILE = Path(__file__).parent / "data" / "allreduce" / "custom_allreduce.csv"
_FIELDS = ("implementation", "interconnect", "gpu_measured", "tensor_parallel", "message_bytes", "latency_us",
           "cuda_graph", "source")


@dataclass(frozen=True)
class AllReduceCurve:
    """Measured latency of one all-reduce implementation on one interconnect at one tensor degree."""

    message_bytes: tuple[float, ...]  # increasing
    latency_s: tuple[float, ...]
    source: str

    @property
    def max_bytes(self) -> float:
        return self.message_bytes[-1]

    def time_s(self, nbytes) -> np.ndarray:
        """Latency of all-reduces of ``nbytes`` (array; flat below the smallest printed size)."""
        return np.interp(np.asarray(nbytes, dtype=float), self.message_bytes, self.latency_s)


@lru_cache(maxsize=4)
def load_curves(path: Path = CURVES_FILE) -> dict[tuple[str, str, int], AllReduceCurve]:
    """``(implementation, interconnect, tensor degree) -> curve`` from the data file. A row with a
    missing or invalid field is one ConfigError naming the file, line and field."""
    points: dict[tuple[str, str, int], list[tuple[float, float, str]]] = {}
    for line, row in read_data_rows(path, _FIELDS, ALLREDUCE_KINDS[1:]):
        try:
            tp, size, lat = int(row["tensor_parallel"]), float(row["message_bytes"]), float(row["latency_us"])
        except ValueError:
            raise ConfigError(f"{path}: line {line}: tensor_parallel, message_bytes, latency_us must be "
                              "numbers") from None
        if tp < 2 or size <= 0 or lat <= 0:
            raise ConfigError(f"{path}: line {line}: tensor_parallel >= 2, message_bytes > 0, latency_us > 0")
        key = (row["implementation"], row["interconnect"], tp)
        points.setdefault(key, []).append((size, lat * 1e-6, row["source"]))
    curves = {}
    for key, pts in points.items():
        pts.sort()
        sizes = tuple(p[0] for p in pts)
        if len(set(sizes)) != len(sizes):
            raise ConfigError(f"{path}: {key[0]} on {key[1]} at tensor_parallel {key[2]}: a message size twice")
        # the lower non-decreasing envelope: a smaller message is never priced above a larger one's
        # reading (the 512 B readings of sglang#2904 exceed the 4 KiB ones by up to 0.7 us: noise)
        envelope = np.minimum.accumulate(np.array([p[1] for p in pts])[::-1])[::-1]
        curves[key] = AllReduceCurve(sizes, tuple(float(x) for x in envelope), pts[0][2])
    return curves


def custom_curve(kind: str, interconnect: str, tensor: int) -> AllReduceCurve | None:
    """The measured curve of ``kind`` for this interconnect and tensor degree (None: NCCL prices it)."""
    if kind == NCCL:
        return None
    return load_curves().get((kind, interconnect, tensor))


class StepComm:
    """The communication time of a step of ``n`` tokens, built once per timing model.

    ``scalar_s(n)`` / ``array_s(n)``: a float / an array of the same doubles. With NCCL (or no
    measured curve for this deployment) they are ``per_step + per_token * n``, the expression the
    timing model always used; with a custom all-reduce or NCCL's LL protocol they read one
    per-token-count table."""

    __slots__ = ("per_step", "per_token", "none", "curve", "ll", "kind", "_ctx", "_table", "_list")

    def __init__(self, ctx, kind: str = NCCL):
        self.per_step = ctx.comm_s_per_step
        self.per_token = ctx.comm_s_per_token
        self.none = self.per_step == 0.0 and self.per_token == 0.0
        curve = custom_curve(kind, ctx.gpu.interconnect, ctx.tensor_parallel) if ctx.allreduces_per_step else None
        self.curve = curve
        self.kind = kind if curve is not None else NCCL  # what prices the all-reduces of this deployment
        self.ll = bool(ctx.allreduces_per_step) and ctx.nccl_ll_protocol  # NCCL's LL beside its ring
        self._ctx = ctx
        self._table = np.zeros(0)
        self._list: list[float] = []

    @property
    def linear(self) -> bool:
        return self.curve is None and not self.ll

    def _values(self, n: np.ndarray) -> np.ndarray:
        """comm_s for the int64 token counts ``n`` under the custom curve or with NCCL's LL protocol
        (see the module docstring)."""
        c = self._ctx
        A = c.allreduces_per_step
        stage = (self.per_step - c.allreduce_s_per_step) + (self.per_token - c.allreduce_s_per_token) * n
        nccl = c.allreduce_s_per_step + c.allreduce_s_per_token * n
        if self.ll:
            ll_latency_s = NCCL_LL["base_latency_s"] + 2 * (c.tensor_parallel - 1) * NCCL_LL["step_latency_s"]
            nccl = np.minimum(nccl, A * ll_latency_s + c.allreduce_s_per_token * n / NCCL_LL["bandwidth_fraction"])
        if self.curve is None:
            return stage + nccl
        nbytes = n * c.allreduce_bytes_per_token
        top = self.curve.max_bytes
        # above the largest reading: NCCL's bandwidth term (seconds per byte of all A all-reduces)
        # from the curve's last value, so the price is continuous and never falls (module docstring)
        above = c.allreduce_s_per_token / c.allreduce_bytes_per_token * np.maximum(nbytes - top, 0)
        return stage + (A * self.curve.time_s(np.minimum(nbytes, top)) + above)

    def _grow(self, n: int) -> None:
        size = max(n + 1, 2 * len(self._table), 1024)
        self._table = self._values(np.arange(size, dtype=np.int64))
        self._list = self._table.tolist()

    def scalar_s(self, num_tokens: int) -> float:
        if self.linear:
            return self.per_step + self.per_token * num_tokens
        if num_tokens >= len(self._list):
            self._grow(num_tokens)
        return self._list[num_tokens]

    def array_s(self, num_tokens: np.ndarray) -> np.ndarray:
        """comm_s for an int64 array of token counts."""
        if self.linear:
            return self.per_step + self.per_token * num_tokens
        if len(num_tokens) and int(num_tokens.max()) >= len(self._table):
            self._grow(int(num_tokens.max()))
        return self._table.take(num_tokens)
