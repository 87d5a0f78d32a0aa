"""The ``trace:`` section of a scenario and :func:`build_trace`, which turns it into a Trace.

Order of operations in :func:`build_trace` (each step documented in :mod:`kvsim.trace.transforms`):

1. load ``file`` (resolved against the scenario's folder, then the current directory) or generate
   ``synthetic`` (seeded by ``synthetic.seed`` or else the scenario seed);
2. time slice ``[start_s, end_s)`` on the source's time axis, rebased to ``start_s``;
3. length policy against the model's maximum length (``reject`` | ``cap`` | ``drop``);
4. count slice: skip ``skip_requests``, keep at most ``max_requests``;
5. divide arrival times by ``rate_scale``.

The length policy runs before the count slice so that ``max_requests: N`` with ``drop`` still
gives N requests when the trace has enough.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvsim.errors import TraceError
from kvsim.trace import transforms
from kvsim.trace.fileio import resolve_path  # noqa: F401  (also public here, where it used to live)
from kvsim.trace.formats import FORMAT_CHOICES
from kvsim.trace.schema import Trace
from kvsim.config_base import Count, Number
from kvsim.trace.spec import SyntheticTraceSpec

_FILE_ONLY = ("format", "on_unsorted", "on_zero_output")


class TraceConfig(BaseModel):
    """Where the requests come from and how to reshape them.

    Exactly one of ``file`` and ``synthetic``. ``format``, ``on_unsorted`` and ``on_zero_output``
    apply to ``file`` only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    file: str | None = None
    format: Literal[FORMAT_CHOICES] = "auto"  # type: ignore[valid-type]
    on_unsorted: Literal["error", "sort"] = "error"
    on_zero_output: Literal["error", "drop"] = "error"
    synthetic: SyntheticTraceSpec | None = None

    rate_scale: Number = Field(default=1.0, gt=0)
    start_s: float | None = Field(default=None, ge=0)
    end_s: float | None = Field(default=None, gt=0)
    skip_requests: Count = Field(default=0, ge=0)
    max_requests: Count | None = Field(default=None, ge=1)
    length_policy: Literal["reject", "cap", "drop"] = "reject"

    @model_validator(mode="after")
    def _one_source(self):
        if (self.file is None) == (self.synthetic is None):
            raise ValueError("give exactly one of 'file' (a trace file) or 'synthetic' (a generator spec)")
        if self.synthetic is not None:
            given = [k for k in _FILE_ONLY if k in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)} apply only to 'file', not to 'synthetic'")
        if self.start_s is not None and self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"end_s ({self.end_s}) must be greater than start_s ({self.start_s})")
        return self


def build_trace(
    cfg: TraceConfig, base_dir: Path, seed: int, max_model_len_tokens: int | None
) -> tuple[Trace, dict]:
    """Load or generate the trace of ``cfg`` and apply its transforms.

    Returns the trace and a JSON-able report: ``source`` (``file`` | ``synthetic``), ``file``,
    ``sha256`` (of the file as stored), ``content_sha256`` (decompressed), ``format``, ``repairs``, request counts after each step
    (``requests_loaded``, ``requests_after_time_slice``, ``requests_after_length_policy``,
    ``requests``), the length policy's ``over_long``/``capped``/``dropped`` counts and
    ``rate_scale``. For a synthetic trace, ``spec_sha256`` identifies the spec and ``seed`` the
    seed used.
    """
    base_dir = Path(base_dir)
    report: dict = {}
    if cfg.file is not None:
        from kvsim.trace.load import load_trace

        path = resolve_path(cfg.file, base_dir)
        trace = load_trace(path, cfg.format, on_unsorted=cfg.on_unsorted, on_zero_output=cfg.on_zero_output)
        src = trace.source
        report.update(
            source="file",
            file=str(path),
            sha256=src["sha256"],
            content_sha256=src["content_sha256"],
            format=src["format"],
            requests_in_file=src["requests_in_file"],
            repairs=list(src["repairs"]),
        )
    else:
        from kvsim.trace.synthetic import generate_trace

        spec = cfg.synthetic
        used_seed = spec.seed if spec.seed is not None else seed
        trace = generate_trace(spec, seed=used_seed, base_dir=base_dir)
        spec_json = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
        report.update(
            source="synthetic",
            seed=used_seed,
            spec_sha256=hashlib.sha256(spec_json.encode()).hexdigest(),
            repairs=[],
        )
    report["requests_loaded"] = len(trace)

    if cfg.start_s is not None or cfg.end_s is not None:
        trace = transforms.slice_time(trace, cfg.start_s, cfg.end_s)
    report["start_s"], report["end_s"] = cfg.start_s, cfg.end_s
    report["requests_after_time_slice"] = len(trace)

    over = transforms.over_long(trace, max_model_len_tokens)
    trace, _ = transforms.limit_lengths(trace, max_model_len_tokens, cfg.length_policy)
    report["length_policy"] = cfg.length_policy
    report["max_model_len_tokens"] = max_model_len_tokens
    # counted among the requests the count slice below keeps (a max_requests of 4 is not charged
    # with the file's other over-long requests)
    report.update(transforms.counts_in_window(over, cfg.length_policy, cfg.skip_requests, cfg.max_requests))
    report["requests_after_length_policy"] = len(trace)

    trace = transforms.slice_count(trace, cfg.skip_requests, cfg.max_requests)
    report["skip_requests"], report["max_requests"] = cfg.skip_requests, cfg.max_requests
    trace = transforms.scale_rate(trace, cfg.rate_scale)
    report["rate_scale"] = cfg.rate_scale
    report["requests"] = len(trace)
    if len(trace) == 0:
        raise TraceError(
            f"{report.get('file', 'synthetic trace')}: no requests left after the trace transforms "
            f"(start_s={cfg.start_s}, end_s={cfg.end_s}, skip_requests={cfg.skip_requests}, "
            f"length_policy={cfg.length_policy})"
        )
    trace.validate(report.get("file", "synthetic trace"))
    return trace, report
