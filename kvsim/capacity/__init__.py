"""``kvsim capacity``: the highest request rate each variant serves within its SLOs.

As Vidur users size a deployment: for each variant of a scenario, find by bisection the largest
``trace.rate_scale`` at which the share of requests meeting every objective (SLO attainment,
docs/metrics.md) is at least ``attainment``. Attainment counts every request of the trace: a
rejected or unfinished request misses its objectives.

Search (per variant): run at ``lo``; if it already misses, the capacity is below the range
(``status = below_range``). Run at ``hi``; if it still meets, the capacity is at least ``hi``
(``above_range``). Otherwise bisect geometrically (``mid = sqrt(lo x hi)``, rate scales span
orders of magnitude) keeping ``lo`` meeting and ``hi`` missing until ``hi / lo <= 1 + tol``; the
answer is the last ``lo`` (``status = ok``). Bisection assumes attainment falls as the rate rises;
if it is not monotonic the answer is *a* boundary, not necessarily the highest passing scale
(every evaluation is listed in ``capacity.json``).

**Objectives.** ``--slo`` takes joint objectives (``ttft_ms=500,tpot_ms=50``: a request is good
when it meets every one; the variant meets when at least ``attainment`` of the trace's requests are
good) and percentile objectives as users write them (``p99_ttft_ms=2000,p50_tpot_ms=100``: "p99
TTFT <= 2 s and p50 TPOT <= 100 ms"), or both; the variant meets when every one holds.
``pQ_METRIC_ms=T`` holds when the Q-th percentile of METRIC over **every** request of the trace is at
most T ms, where a rejected or unfinished request counts as infinitely slow and the percentile is
the nearest-rank one (the ceil(Q/100 x n)-th smallest value): equivalently, at least Q % of the
trace's requests have METRIC <= T. A one-token output has TPOT 0 (as in goodput). With percentile
objectives only, ``attainment`` and goodput count requests within every metric's loosest limit.

**Reuse** (exact): the trace is read, sliced and length-limited once (per trace section, seed and
model length); each step only divides the arrival times by its scale, as ``trace.rate_scale`` does.
Every evaluation is stored in ``capacity.json`` under a key (the resolved scenario at that scale,
the trace's sha256, the objectives, kvsim's version: :func:`evaluation_key`); a later run into the
same ``--out`` reuses the steps it finds (a rerun, a smaller ``--tol``, another ``--attainment``,
another variant, a run after Ctrl-C, which keeps the finished steps) and writes byte-identical
files. No simulation is shared between different scales. Each step prints one line on stderr,
``step K/N`` (N: the most steps the search takes; ``--quiet``: none).

Output: a table on stdout, and ``capacity.csv`` (one row per variant) and ``capacity.json``
(also every evaluation) in ``--out`` (default ``results/<scenario name>-capacity``). kvsim only
writes those two files there and replaces them only when ``capacity.json`` says kvsim wrote it.
"""


from kvsim.capacity.rate_search import (  # noqa: F401  (the package's API)
    KEY_FORMS, MARKER, PERCENTILE_KEY, SLO_KEYS, Evaluation, TraceCache, VariantCapacity, capacity, check_search,
    evaluation_key, evaluator, max_steps, parse_slo, percentile_key, percentile_values, search, split_objectives,
    why_below_range,
)
from kvsim.capacity.store import (  # noqa: F401
    check_out, keep_unfinished, known_evaluations, results_frame, table_text, write_outputs,
)
from kvsim.capacity.cli import register  # noqa: F401
