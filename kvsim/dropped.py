"""What happened to the requests that did not finish: counts by reason, and how to avoid them.

Used by ``kvsim run`` (console line and warning), ``kvsim validate`` (predicted from the trace
without simulating: :func:`predict_rejections`; ``kvsim replay``: :func:`reject_reasons`) and the HTML report. Reasons are the scheduler's
``reject_reason`` values (docs/metrics.md) plus the trace's length policy (``dropped``/``capped``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# More than this share of the trace's requests rejected or dropped is a warning on stderr.
WARN_REJECTED_FRAC = 0.05

FIXES = {
    "exceeds_max_model_len": "set trace.length_policy: cap (truncate them to the model's max length) or drop, "
                             "or a longer max length (model: {preset: NAME, max_model_len_tokens: N})",
    "exceeds_kv_capacity": "give the KV cache more room (a larger GPU or kv_budget, a smaller model or kv_dtype: "
                           "fp8)",
    "exceeds_kv_capacity_with_watermark": "lower allocator.watermark (the fraction of blocks kept free at "
                                          "admission; they would fit without it), or give the KV cache more room",
    "exceeds_max_num_seqs": "raise scheduler.max_num_seqs to at least the requests' num_samples (their samples "
                            "are scheduled together), or lower num_samples",
    "exceeds_batch_token_budget": "raise scheduler.max_num_batched_tokens (to at least every request's num_samples) "
                                  "or, without chunked prefill, set scheduler.chunked_prefill: true",
    "swap_space_full": "raise scheduler.swap_space_bytes (a swapped group found it full, and its recompute exceeds the "
                       "token budget), or set scheduler.chunked_prefill: true",
    "dropped_by_length_policy": "trace.length_policy: drop removed them; use cap to keep them truncated, or a "
                                "longer max length (model: {preset: NAME, max_model_len_tokens: N})",
}


@dataclass(frozen=True)
class Dropped:
    """Requests of one run that did not finish normally."""

    trace_requests: int  # requests in the trace before the length policy
    simulated: int  # requests the simulator saw
    finished: int
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0  # still queued or running when a limit stopped the run
    dropped_by_length_policy: int = 0
    capped_by_length_policy: int = 0

    @property
    def rejected(self) -> int:
        return sum(self.rejected_by_reason.values())

    @property
    def lost(self) -> int:
        """Requests of the trace that were not served: rejected, dropped or left unfinished."""
        return self.rejected + self.dropped_by_length_policy + self.unfinished

    @property
    def lost_frac(self) -> float:
        return self.lost / self.trace_requests if self.trace_requests else 0.0

    @classmethod
    def from_summary(cls, summary: dict, trace_report: dict | None = None) -> Dropped:
        tr = trace_report or {}
        total = int(summary.get("requests_total", 0))
        dropped = int(tr.get("dropped", 0) or 0)
        return cls(trace_requests=total + dropped, simulated=total, finished=int(summary.get("requests_finished", 0)),
                   rejected_by_reason={str(k): int(v) for k, v in (summary.get("rejected_by_reason") or {}).items()
                                       if int(v)},
                   unfinished=int(summary.get("requests_unfinished", 0) or 0), dropped_by_length_policy=dropped,
                   capped_by_length_policy=int(tr.get("capped", 0) or 0))

    def parts(self) -> list[str]:
        """``"1376 rejected (exceeds_max_model_len 1376)"`` and friends; empty when nothing was lost."""
        out = []
        if self.rejected:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.rejected_by_reason.items(), key=lambda kv: -kv[1]))
            out.append(f"{self.rejected} rejected ({reasons})")
        if self.unfinished:
            out.append(f"{self.unfinished} unfinished (a limit stopped the run)")
        if self.dropped_by_length_policy:
            out.append(f"{self.dropped_by_length_policy} dropped from the trace by length_policy: drop")
        if self.capped_by_length_policy:
            out.append(f"{self.capped_by_length_policy} capped to max_model_len by length_policy: cap")
        return out

    def reasons(self) -> list[str]:
        """The reasons present, largest first (for :data:`FIXES`)."""
        rs = [k for k, _ in sorted(self.rejected_by_reason.items(), key=lambda kv: -kv[1])]
        if self.dropped_by_length_policy:
            rs.append("dropped_by_length_policy")
        return rs

    def fixes(self) -> list[str]:
        return [f"{r}: {FIXES[r]}" for r in self.reasons() if r in FIXES]

    def warning(self, name: str) -> str | None:
        """A one-line warning when more than :data:`WARN_REJECTED_FRAC` of the trace was lost."""
        if self.lost_frac <= WARN_REJECTED_FRAC:
            return None
        fix = "; ".join(self.fixes())
        return (f"kvsim: warning: {name}: {100 * self.lost_frac:.1f}% of the trace's {self.trace_requests} requests were "
                f"not served: {'; '.join(p for p in self.parts() if 'capped' not in p)}"
                + (f". Fix: {fix}" if fix else ""))


def warnings_for(runs: dict[str, Dropped]) -> list[str]:
    """One warning line per distinct loss; runs with the same loss share a line."""
    groups: dict[tuple, list[str]] = {}
    for name, d in runs.items():
        if d.warning(name) is not None:
            groups.setdefault((d.trace_requests, tuple(d.parts())), []).append(name)
    lines = []
    for names in groups.values():
        label = names[0] if len(names) == 1 else f"{', '.join(names)} (each)"
        lines.append(runs[names[0]].warning(label))
    return lines


def predict_rejections(scn, trace, where: str = "scenario") -> dict[str, int]:
    """Rejections by reason the simulator will make for ``trace`` (after its length policy), found
    by the scheduler's own admission check on each request, without simulating."""
    return dict(Counter(r for r in reject_reasons(scn, trace, where) if r))


def reject_reasons(scn, trace, where: str = "scenario") -> list[str]:
    """Per request of ``trace`` (after its length policy), the ``reject_reason`` the simulator's
    scheduler gives it on arrival ("" for a request it queues): its own admission check
    (:meth:`kvsim.sched.arrivals.Arrivals.reject_reason`), without simulating. ``kvsim replay`` records
    these requests rejected and never sends them, as ``kvsim run`` does."""
    from kvsim.kv.base import KVRequest
    from kvsim.metrics.request_log import RequestLog
    from kvsim.build import build_allocator, build_scheduler

    allocator, _ = build_allocator(scn, where)
    max_len = scn.model.max_model_len_tokens
    sched = build_scheduler(scn, allocator, scn.kv_geometry().with_block_size(allocator.block_size), where,
                            request_log=RequestLog())
    samples = trace.num_samples
    keys = trace.prefix_keys
    reasons: list[str] = []
    for i in range(len(trace)):
        kv = KVRequest(i, int(trace.prompt_tokens[i]), int(trace.output_tokens[i]), max_len,
                       block_keys=None if keys is None else keys[i], num_samples=1 if samples is None else int(samples[i]))
        reasons.append(sched.reject_reason(kv))  # the check an arrival gets, without queueing
    return reasons
