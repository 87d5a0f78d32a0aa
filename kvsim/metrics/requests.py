"""The per-request result table, built at the end of a run from the :class:`RequestLog` that the
schedulers wrote each request's row into when it finished or was rejected (plus any request a
limit left queued or running).

Memory: the log already holds typed numpy columns, so the table is one sort of those columns
(column by column, each column's unsorted copy freed as the next is sorted) and the DataFrame
wraps them without copying or consolidating.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from kvsim.metrics.request_log import NUMERIC_COLUMNS, STATUS_NAMES, RequestLog  # noqa: F401 (re-exported)
from kvsim.sched.request import Request

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd

BLOCK = 1 << 16  # requests read (and, when consuming, released) at a time


def requests_table(requests: list[Request], *, consume: bool = False) -> pd.DataFrame:
    """One row per request of ``requests`` (in any state), sorted by ``request_id`` (see
    docs/metrics.md for the columns).

    ``consume=True`` empties ``requests`` and drops each block of requests once its rows are read,
    so that, when the list held the last references to them, the Request objects are freed while
    the table fills instead of both being alive at full size."""
    log = RequestLog()
    if consume:
        for lo in range(0, len(requests), BLOCK):
            hi = min(len(requests), lo + BLOCK)
            log.extend(requests[lo:hi])
            requests[lo:hi] = [None] * (hi - lo)
        requests.clear()
    else:
        log.extend(requests)
    return log_table(log)


def log_table(log: RequestLog, leftovers: Iterable[Request] = (), client_arrival_s: np.ndarray | None = None,
              client_queue_s: np.ndarray | None = None) -> pd.DataFrame:
    """The request table from ``log`` (emptied) and the requests in ``leftovers`` (still queued or
    running when a limit stopped the run), sorted by ``request_id``. ``client_arrival_s`` (by
    request id; a run with a front end, kvsim/frontend.py): the arrivals the client saw, from which
    ``arrival_s``, TTFT and end-to-end latency then count; ``frontend_s`` is the time before the
    engine had the request and ``queue_s`` counts from then. ``client_queue_s`` (by request id; a
    run with a closed-loop client, kvsim/client.py): each request's wait for a slot before it was
    sent, a column of its own (the latencies count from the send, as the benchmark clients time them)."""
    import pandas as pd

    log.extend(leftovers)
    cols: dict[str, object] = {}
    order = None  # the permutation sorting by request_id; False: already sorted (finish order often is not)
    for name, arr in log.columns():
        if order is None:  # request_id comes first
            order = np.argsort(arr, kind="stable")
            if np.array_equal(order, np.arange(len(order))):
                order = False
        if order is not False:
            arr = arr[order]
        cols[name] = arr if name in NUMERIC_COLUMNS else pd.Series(arr, dtype="string")
        del arr
    del order
    arrival, first, finish = cols["arrival_s"], cols["first_token_s"], cols["finish_s"]
    engine_arrival = arrival
    if client_arrival_s is not None:
        arrival = cols["arrival_s"] = client_arrival_s[cols["request_id"]]
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
    cols["queue_s"] = cols["admitted_s"] - engine_arrival
    if client_arrival_s is not None:
        cols["frontend_s"] = engine_arrival - arrival
    if client_queue_s is not None:
        cols["client_queue_s"] = client_queue_s[cols["request_id"]]
    # copy=False: keep one block per column instead of consolidating (which would copy the table)
    return pd.DataFrame(cols, copy=False)
