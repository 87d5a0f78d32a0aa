"""Seeded uniform fuzzing: the cheap half of the allocator property tests (docs/testing.md).

Each property test is split in two over the same body function:

* a hypothesis test (``KVSIM_PROPERTY_EXAMPLES_HYPOTHESIS`` examples, default 1,000; derandomized,
  shrinking): hypothesis' edge-case-biased search;
* a seeded fuzz test (``KVSIM_PROPERTY_EXAMPLES`` cases, default 10,000): each case is drawn from the
  same space (same list lengths, every operation uniform over the same integer space, the same
  configuration choices) with ``random.Random(f"{name}/{index}")`` and run through the same body.

Hypothesis spends 85-95 % of these tests' time generating examples; ``random.Random`` draws a case in
microseconds, so the uniform half costs little more than the bodies themselves.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

HYPOTHESIS_EXAMPLES = int(os.environ.get("KVSIM_PROPERTY_EXAMPLES_HYPOTHESIS", "1000"))
FUZZ_EXAMPLES = int(os.environ.get("KVSIM_PROPERTY_EXAMPLES", "10000"))


def int_list(rng: random.Random, num_values: int, min_size: int, max_size: int) -> list[int]:
    """A list of ``min_size..max_size`` integers, each uniform over ``0..num_values - 1`` (the space of
    ``st.lists(st.integers(0, num_values - 1), min_size=min_size, max_size=max_size)``)."""
    return [rng.randrange(num_values) for _ in range(rng.randint(min_size, max_size))]


def case_rng(name: str, index: int) -> random.Random:
    """The generator of case ``index`` of fuzz test ``name`` (a str seed: stable across runs and
    Python processes, independent of PYTHONHASHSEED)."""
    return random.Random(f"{name}/{index}")


def run_fuzz(name: str, draw: Callable[[random.Random], dict[str, Any]],
             body: Callable[..., Any], describe: Callable[[dict[str, Any]], str] = repr,
             examples: int | None = None) -> int:
    """Draw ``examples`` cases (default ``KVSIM_PROPERTY_EXAMPLES``) with ``draw(case_rng(name, i))``
    and call ``body(**case)`` on each. A failing case is re-raised as an AssertionError naming the seed,
    the index and ``describe(case)`` (the decoded operations), chained to the original error, so it
    can be replayed with ``replay_fuzz(name, index, draw, body)``. Returns the number of cases run."""
    n = FUZZ_EXAMPLES if examples is None else examples
    for i in range(n):
        case = draw(case_rng(name, i))
        try:
            body(**case)
        except Exception as e:  # noqa: BLE001 -- re-raised with the case attached
            raise AssertionError(
                f"seeded fuzz case failed: name={name!r} index={i} (random.Random({f'{name}/{i}'!r})); "
                f"replay with seeded_fuzz.replay_fuzz({name!r}, {i}, ...); case: {describe(case)}; "
                f"error: {type(e).__name__}: {e}") from e
    return n


def replay_fuzz(name: str, index: int, draw: Callable[[random.Random], dict[str, Any]],
                body: Callable[..., Any]) -> dict[str, Any]:
    """Re-run one fuzz case (e.g. under a debugger); returns the case."""
    case = draw(case_rng(name, index))
    body(**case)
    return case
