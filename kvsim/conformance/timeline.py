"""What each side of a conformance run records: one row per engine step, one per request."""

from __future__ import annotations

from dataclasses import dataclass, field

# Per-step fields compared (docs/conformance.md defines each).
STEP_FIELDS = ("start_s", "running", "waiting", "scheduled_tokens", "prefill_reqs", "decode_reqs",
               "kv_blocks_used", "preemptions", "prefix_hit_tokens")
# Per-request fields compared: steps are 0-based indices of non-idle engine steps.
REQUEST_FIELDS = ("first_scheduled_step", "first_token_step", "finish_step", "preemptions", "cached_tokens")


@dataclass
class Timeline:
    """``steps``: one dict per engine step (STEP_FIELDS), in order; ``requests``: request index ->
    dict (REQUEST_FIELDS). ``windows``: for a fast-mode kvsim run, (first step, number of steps)
    of each multi-step row, whose inner steps are not planned one by one (only their aggregates
    in ``window_sums`` are compared)."""

    side: str
    steps: list[dict] = field(default_factory=list)
    requests: dict[int, dict] = field(default_factory=dict)
    windows: list[tuple[int, int]] = field(default_factory=list)
    window_sums: list[dict] = field(default_factory=list)
