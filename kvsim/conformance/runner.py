"""Run conformance cases on both sides and tabulate the outcome (``kvsim conformance vllm``)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.conformance.cases import Case, builtin_cases
from kvsim.conformance.compare import Difference, compare
from kvsim.conformance.kvsim_side import run_kvsim

MODES = ("step", "fast")


@dataclass(frozen=True)
class Outcome:
    case: Case
    steps: int  # vLLM's engine steps
    preemptions: int  # vLLM's, over the run
    prefix_hit_tokens: int  # vLLM's, over the run
    kv_blocks_ahead_steps: int  # steps where vLLM holds fewer blocks than a whole-prompt admission would
    diffs: dict[str, list[Difference]]  # mode -> differences

    @property
    def ok(self) -> bool:
        """No difference where none is expected; some where a decision-changing exception is named."""
        differs = any(self.diffs.values())
        return differs if self.case.exceptions else not differs

    def status(self) -> str:
        if self.case.exceptions:
            return "expected-difference" if self.ok else "UNEXPECTED-MATCH"
        return "identical" if self.ok else "DIFFERS"


def select(names: list[str] | None) -> list[Case]:
    """The built-in cases named (all when ``names`` is empty); ValueError naming the valid ones."""
    cases = builtin_cases()
    if not names:
        return cases
    by = {c.name: c for c in cases}
    unknown = [n for n in names if n not in by]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(by)}")
    return [by[n] for n in names]


def run_case(case: Case) -> Outcome:
    from kvsim.conformance.vllm_side import run_vllm

    ref = run_vllm(case, async_scheduling=case.async_scheduling)
    diffs = {mode: compare(case.name, ref, run_kvsim(case, mode), blocks_ahead=case.blocks_ahead) for mode in MODES}
    return Outcome(case, len(ref.steps), sum(s["preemptions"] for s in ref.steps),
                   sum(s["prefix_hit_tokens"] for s in ref.steps),
                   sum(1 for s in ref.steps if s["kv_blocks_ahead"]), diffs)


HEADER = ("case", "requests", "steps", "preemptions", "prefix hits", "ahead steps", "step", "fast", "status")


def table(outcomes: list[Outcome]) -> str:
    """A Markdown table of the outcomes (docs/conformance.md shows one)."""
    rows = [HEADER]
    for o in outcomes:
        rows.append((o.case.name, str(sum(q.n for q in o.case.requests)), str(o.steps), str(o.preemptions),
                     str(o.prefix_hit_tokens), str(o.kv_blocks_ahead_steps),
                     *(str(len(o.diffs[m])) for m in MODES), o.status()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
