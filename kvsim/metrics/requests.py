"""The per-request result table, built once at the end of a run from the scheduler's records.

Memory: a million-request run ends with a million :class:`Request` objects alive, so the table is
built straight into typed numpy columns (one pass over the requests per column, no per-column list
of Python objects) and the DataFrame wraps those columns without copying or consolidating them.
"""

from __future__ import annotations

from operator import attrgetter

from typing import TYPE_CHECKING

import numpy as np

from kvsim.sched.request import Request, RequestStatus

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd

STATUS_NAMES = {RequestStatus.FINISHED: "finished", RequestStatus.REJECTED: "rejected",
                RequestStatus.WAITING: "unfinished", RequestStatus.RUNNING: "unfinished"}

# column -> (Request attribute, dtype), in the table's column order (before the string columns)
NUMERIC_COLUMNS: dict[str, tuple[str, type]] = {
    "request_id": ("request_id", np.int64),
    "arrival_s": ("arrival_s", np.float64),
    "admitted_s": ("admitted_s", np.float64),
    "first_token_s": ("first_token_s", np.float64),
    "finish_s": ("finish_s", np.float64),
    "prompt_tokens": ("prompt_tokens", np.int64),
    "output_tokens": ("output_tokens", np.int64),
    "preemptions": ("num_preemptions", np.int64),
    "recomputed_tokens": ("recomputed_tokens", np.int64),
    "swaps": ("num_swaps", np.int64),
    "cached_tokens": ("cached_tokens", np.int64),
    "cpu_hit_tokens": ("cpu_hit_tokens", np.int64),
    "ssd_hit_tokens": ("ssd_hit_tokens", np.int64),
    "remote_hit_tokens": ("remote_hit_tokens", np.int64),
    "transfer_s": ("load_s", np.float64),
    "transfer_hidden_s": ("hidden_s", np.float64),
    "priority": ("priority", np.int64),
    "num_samples": ("num_samples", np.int64),
    "replica": ("replica", np.int64),
}


BLOCK = 1 << 16  # requests read (and, when consuming, released) at a time


def requests_table(requests: list[Request], *, consume: bool = False) -> pd.DataFrame:
    """One row per request, sorted by ``request_id`` (see docs/metrics.md for the columns).

    ``consume=True`` empties ``requests`` and drops each block of requests once its rows are read,
    so that, when the list held the last references to them, the Request objects are freed while
    the table fills instead of both being alive at full size."""
    import pandas as pd

    if consume:
        reqs = requests
        reqs.sort(key=attrgetter("request_id"))
    else:
        reqs = sorted(requests, key=attrgetter("request_id"))
    n = len(reqs)
    cols: dict[str, object] = {name: np.empty(n, dtype=dtype) for name, (_, dtype) in NUMERIC_COLUMNS.items()}
    status: list[str] = []
    reasons: list[str] = []
    for lo in range(0, n, BLOCK):
        hi = min(n, lo + BLOCK)
        block = reqs[lo:hi]
        for name, (attr, dtype) in NUMERIC_COLUMNS.items():
            cols[name][lo:hi] = np.fromiter(map(attrgetter(attr), block), dtype=dtype, count=hi - lo)
        status.extend([STATUS_NAMES[r.status] for r in block])
        reasons.extend([r.reject_reason for r in block])
        if consume:
            reqs[lo:hi] = [None] * (hi - lo)
        del block
    if consume:
        reqs.clear()
    del reqs
    cols["status"] = pd.Series(status, dtype="string")
    del status
    cols["reject_reason"] = pd.Series(reasons, dtype="string")
    del reasons
    arrival, first, finish = cols["arrival_s"], cols["first_token_s"], cols["finish_s"]
    cols["ttft_s"] = first - arrival
    cols["e2e_s"] = finish - arrival
    # time per output token after the first; undefined (NaN) for single-token outputs
    out = cols["output_tokens"]
    decode_tokens = (out - 1).astype(np.float64)
    decode_tokens[out <= 1] = np.nan
    tpot = finish - first
    tpot /= decode_tokens
    del decode_tokens
    cols["tpot_s"] = tpot
    cols["queue_s"] = cols["admitted_s"] - arrival
    # copy=False: keep one block per column instead of consolidating (which would copy the table)
    return pd.DataFrame(cols, copy=False)
