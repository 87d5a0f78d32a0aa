"""The serving benchmark's metrics of a kvsim run, and the targets a prediction is held to.

The metrics are kvsim's ``serving`` summary section (:func:`kvsim.metrics.summarize.serving_metrics`,
docs/metrics.md "Serving metrics": vLLM's ``calculate_metrics`` over the finished requests, timed
from each request's send, its ``arrival_s``; with ``client:``, the closed loop's send). This module
only maps a benchmark result's key (``median_tpot_ms``) onto that section and computes the section
for a part of a run's request table (a server history's last run, bench/serving_history.py).
``bench/validate_serving.py`` and ``kvsim servebench`` both read them from here.
"""

from __future__ import annotations

import math

from kvsim.metrics.summarize import serving_metrics

LATENCIES = ("ttft_ms", "tpot_ms", "e2el_ms")

# issue 23's targets for a prediction (relative error): throughput and TPOT within 20 %, TTFT within 35 %
TARGETS = {"request_throughput": 0.20, "output_throughput": 0.20, "tpot_ms": 0.20, "ttft_ms": 0.35}

PERCENTILES = (50.0, 90.0, 99.0)


def table_metrics(requests, zero_ttft: frozenset[int] = frozenset(), chunk_tokens: int = 1,
                  start_s: float | None = None, zero_output: frozenset[int] = frozenset()) -> dict:
    """The ``serving`` section of a request table, or of part of one: its duration runs from the
    benchmark's start (``start_s``, kvsim.servebench.build.benchmark_start_s; None: the first send) to
    the last finish, as the benchmark's does. ``zero_ttft``: request ids whose TTFT the benchmark's
    client recorded as 0 (no text streamed; vLLM 0.5's client). ``chunk_tokens``: the run's
    ``scheduler.num_scheduler_steps`` (a multi-step round streams its tokens as one chunk).
    ``zero_output``: request ids the benchmark counted with 0 output tokens (``output_lens`` 0); kvsim
    generates one token for each (a request's prefill makes one), which the totals leave out."""
    done = requests["finish_s"].notna()
    uncounted = 0
    if zero_output:
        fin = (requests["status"] == "finished").to_numpy()
        uncounted = int((fin & requests["request_id"].isin(list(zero_output)).to_numpy()).sum())
    first = float(requests["arrival_s"].min())
    start = first if start_s is None else min(start_s, first)
    duration = float(requests.loc[done, "finish_s"].max() - start) if done.any() else 0.0
    if zero_ttft:
        requests = requests.copy()
        hit = requests["request_id"].isin(list(zero_ttft)).to_numpy()
        requests.loc[hit, "ttft_s"] = 0.0
    return serving_metrics(requests, duration, None, PERCENTILES, chunk_tokens, uncounted)


def predicted(serving: dict, key: str) -> float:
    """kvsim's value of a benchmark key: ``request_throughput``, ``output_throughput`` or
    ``{mean,median,p90,p99}_{ttft,tpot,itl,e2el}_ms``. vLLM's mean ITL is the mean over every gap
    between tokens, stalls included: the section's ``itl_ms.mean_with_stalls``."""
    if key in ("request_throughput", "output_throughput"):
        return float(serving[key])
    stat, _, metric = key.partition("_")
    if metric == "itl_ms" and stat == "mean":
        stat = "mean_with_stalls"
    v = serving[metric].get(stat)
    return math.nan if v is None else float(v)
