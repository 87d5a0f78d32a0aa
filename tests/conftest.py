"""Suite-wide test configuration.

``make test`` runs the suite on several processes (pytest-xdist, ``--dist loadfile``: each test file
goes to one worker, so a file's module- and session-scoped fixtures -- the bad-input corpus, the
quickstart runs of test_cli.py, the CPU calibration run, the Mooncake runs of test_radix.py -- are
built once). ``--dist loadgroup`` with ``xdist_group`` marks cannot be used: pytest-xdist 3.8.0
groups by appending ``@group`` to ``item._nodeid``, which pytest 9 no longer reads (the marks are
silently ignored; docs/testing.md). On xdist workers, long tests (hypothesis, ``slow``) are moved to
the front of the collection. Without xdist (plain ``pytest``) the order is unchanged.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def runs_long(item) -> bool:
    """Hypothesis tests (1,000 examples each for the allocator properties) and tests marked slow (among
    them the allocator properties' 10,000-case seeded fuzz halves)."""
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False)) or \
        item.get_closest_marker("slow") is not None


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):
        # On xdist workers: long tests first (a stable sort, so every worker collects the same order).
        items.sort(key=lambda item: not runs_long(item))
