"""The serving benchmark's metrics of a kvsim request table, as the client computes them.

vLLM 0.32 ``vllm/benchmarks/serve.py`` ``calculate_metrics`` (the same formulas as
``benchmark_serving.py`` since vLLM 0.4): over the completed requests, TTFT is the first token's
time from the send, E2EL the last token's, TPOT ``(E2EL - TTFT) / (output tokens - 1)`` for requests
with more than one output token; request and output throughput are completed requests and their
output tokens over the benchmark's duration (first send to last finish); the statistics are
the mean, the median and ``np.percentile(..., 99)``. A kvsim request's send is its ``arrival_s``
(with ``client:``, the closed loop's send; kvsim/client.py). ``bench/validate_serving.py`` and
``kvsim servebench`` both read them from here.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

LATENCIES = ("ttft_ms", "tpot_ms", "e2el_ms")

# issue 23's targets for a prediction (relative error): throughput and TPOT within 20 %, TTFT within 35 %
TARGETS = {"request_throughput": 0.20, "output_throughput": 0.20, "tpot_ms": 0.20, "ttft_ms": 0.35}
STATS = ("mean", "median", "p99")


def _stat(values: list[float], which: str) -> float:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return math.nan
    if which == "mean":  # (fsum: exact, so the order of the rows does not move the last digit)
        return statistics.fmean(values)
    if which == "median":
        return statistics.median(values)
    return float(np.percentile(values, 99))


def serving_metrics(requests, zero_ttft: frozenset[int] = frozenset()) -> dict[str, float]:
    """``request_throughput`` (req/s), ``output_throughput`` (tok/s), ``duration_s``, ``completed``
    and ``{mean,median,p99}_{ttft,tpot,e2el}_ms`` of a request table. ``zero_ttft``: request ids
    whose TTFT the benchmark's client recorded as 0 (no text streamed; vLLM 0.5's client)."""
    done = requests[requests["finish_s"].notna()]
    start = done["arrival_s"]
    ttft = ((done["first_token_s"] - start) * 1e3).tolist()
    if zero_ttft:
        ttft = [0.0 if rid in zero_ttft else v for rid, v in zip(done["request_id"], ttft)]
    e2el = ((done["finish_s"] - start) * 1e3).tolist()
    outs = done["output_tokens"].tolist()
    tpot = [(e - t) / (n - 1) for e, t, n in zip(e2el, ttft, outs) if n > 1]
    duration = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else math.nan
    ok = duration > 0
    out = {"completed": len(done), "duration_s": duration,
           "request_throughput": len(done) / duration if ok else math.nan,
           "output_throughput": float(done["output_tokens"].sum()) / duration if ok else math.nan}
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("e2el_ms", e2el)):
        for which in STATS:
            out[f"{which}_{name}"] = _stat(values, which)
    return out
