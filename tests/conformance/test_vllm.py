"""Every conformance case against vLLM's own v1 scheduler (skips where vLLM is not importable;
`make test` runs this file in .venv-conformance, which has the conformance extra)."""

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (the conformance extra; docs/conformance.md)")

from kvsim.conformance.cases import builtin_cases  # noqa: E402
from kvsim.conformance.runner import MODES, run_case  # noqa: E402

CASES = builtin_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_against_vllm(case):
    out = run_case(case)
    if case.exceptions:
        # a named exception that changes decisions: the difference must show, in both modes
        assert all(out.diffs[m] for m in MODES), f"case {case.name}: expected a difference ({case.exceptions})"
        return
    msgs = [d.message() for m in MODES for d in out.diffs[m]]
    assert not msgs, "\n".join(msgs)


def test_the_suite_exercises_what_it_claims():
    """Preemptions, prefix hits and chunked prompts held ahead all happen somewhere in the suite."""
    outs = {c.name: run_case(c) for c in CASES if c.name in ("pressure", "prefix_on_pressure", "long_prompts",
                                                                "reserve_full_isl_off")}
    assert outs["pressure"].preemptions > 5
    assert outs["prefix_on_pressure"].prefix_hit_tokens > 0 and outs["prefix_on_pressure"].preemptions > 0
    assert outs["long_prompts"].kv_blocks_ahead_steps > 10
    assert outs["reserve_full_isl_off"].preemptions > outs["pressure"].preemptions
