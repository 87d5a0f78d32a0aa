"""Suite-wide test configuration.

``make test`` runs the suite on several processes (pytest-xdist, ``-n auto --dist loadgroup``).
Tests are then sent to workers one by one, except that every test needing one of the expensive
shared fixtures below is put in that fixture's ``xdist_group``, so one worker builds the fixture once
and runs all of its tests (instead of every worker building its own copy). The grouping is by the
fixtures a test requests (directly or through another fixture), so a new test joins its group
without a marker. Workers also move long tests (hypothesis, ``slow``) to the front of the queue.
Without xdist (plain ``pytest``) the marks are inert and the order is unchanged.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# fixture name -> xdist group. Fixtures used together by one test must share a group (xdist would put
# that test in a third group, "a_b", whose worker builds both again); collection fails if they do not.
EXPENSIVE_FIXTURES = {
    "corpus_results": "corpus",        # reliability/test_corpus.py: every bad-input case as a subprocess
    "block_sweep": "block_sweep",      # sweep/conftest.py: 10-point sweep of the quickstart trace
    "rate_sweep": "rate_sweep",        # report/conftest.py: 6-point rate sweep with compare/ and report
    "variants_dir": "variants_dir",    # report/conftest.py: the quickstart's 4 variants on 60 s
    "quickstart_runs": "cli_quickstart",  # cli/test_cli.py
    "mooncake_runs": "radix_mooncake",    # kv/test_radix.py: 3 runs of 300 Mooncake requests
    "cpu_run": "calib_cpu_run",           # calibration/test_calib_cli.py: a CPU calibration run
}


def runs_long(item) -> bool:
    """Hypothesis tests (10,000 examples each for the allocator properties) and tests marked slow."""
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False)) or \
        item.get_closest_marker("slow") is not None


def xdist_groups_of(item) -> set[str]:
    return {EXPENSIVE_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in EXPENSIVE_FIXTURES}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the marks into node-id suffixes
def pytest_collection_modifyitems(config, items):
    for item in items:
        groups = xdist_groups_of(item)
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses fixtures of xdist groups {sorted(groups)}: give those "
                                    "fixtures one group in EXPENSIVE_FIXTURES (tests/conftest.py)")
        for group in groups:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):
        # On xdist workers: long tests first (a stable sort, so every worker collects the same order),
        # so they start at once instead of leaving one worker busy at the end.
        items.sort(key=lambda item: not runs_long(item))
