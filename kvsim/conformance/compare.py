"""Compare two timelines of one case: the first difference per step and per request."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.conformance.timeline import REQUEST_FIELDS, STEP_FIELDS, Timeline


@dataclass(frozen=True)
class Difference:
    case: str
    where: str  # "step 12", "window at step 40 (37 steps)", "request 5", "steps"
    field: str
    expected: object  # vLLM's value (kv_blocks_used: + the blocks kvsim holds ahead, see EXCEPTIONS)
    got: object  # kvsim's value
    side: str  # the kvsim side ("kvsim-step", "kvsim-fast")

    def message(self) -> str:
        return (f"case {self.case}: {self.side} differs from vLLM at {self.where}: {self.field} "
                f"vllm={self.expected!r} kvsim={self.got!r}")


def compare(case: str, ref: Timeline, got: Timeline, blocks_ahead: bool = False) -> list[Difference]:
    """Differences of ``got`` (a kvsim side) from ``ref`` (vLLM): the first differing step (every
    field that differs there), each fast-mode window whose sums differ (first only), and every
    request field that differs (first request only). ``blocks_ahead``: kvsim ran with
    ``scheduler.prompt_blocks: at_admission`` (exception ``prompt-blocks-at-admission``), so its
    ``kv_blocks_used`` is vLLM's plus the blocks of the prompt chunks vLLM has not scheduled yet."""
    diffs: list[Difference] = []

    def add(where, fld, a, b):
        diffs.append(Difference(case, where, fld, a, b, got.side))

    if len(ref.steps) != len(got.steps):
        add("steps", "number of steps", len(ref.steps), len(got.steps))
    for k, (a, b) in enumerate(zip(ref.steps, got.steps)):
        if b is None:
            continue  # inside a fast-mode window: checked by its sums below
        want = dict(a)
        if blocks_ahead:  # kvsim holds the rest of each running prefill's prompt
            want["kv_blocks_used"] = a["kv_blocks_used"] + a.get("kv_blocks_ahead", 0)
        bad = [f for f in STEP_FIELDS if want[f] != b[f]]
        if bad:
            for f in bad:
                add(f"step {k}", f, want[f], b[f])
            break
    finish_at = {}
    for rid, r in ref.requests.items():
        if r["finish_step"] is not None:
            finish_at[r["finish_step"]] = finish_at.get(r["finish_step"], 0) + 1
    for (first, k), sums in zip(got.windows, got.window_sums):
        span = ref.steps[first:first + k]
        want = {"scheduled_tokens": sum(s["scheduled_tokens"] for s in span),
                "preemptions": sum(s["preemptions"] for s in span),
                "finished": sum(finish_at.get(j, 0) for j in range(first, first + k))}
        bad = [f for f in want if want[f] != sums[f]]
        if bad:
            for f in bad:
                add(f"window at step {first} ({k} steps)", f, want[f], sums[f])
            break
    for rid in sorted(set(ref.requests) | set(got.requests)):
        a, b = ref.requests.get(rid), got.requests.get(rid)
        if a is None or b is None:
            add(f"request {rid}", "present", a is not None, b is not None)
            break
        bad = [f for f in REQUEST_FIELDS if a[f] != b[f]]
        if bad:
            for f in bad:
                add(f"request {rid}", f, a[f], b[f])
            break
    return diffs
