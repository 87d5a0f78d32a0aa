"""A benchmark result's trace and scenario (pure functions: text in, text out).

The trace holds the result's requests in order, with its prompt and generated lengths (a request
that streamed nothing still ran its prefill: 1 output token). Arrivals, in order of preference:

* an open loop (no ``max_concurrency``) whose file has ``start_times``: the client's own send times,
  from the first;
* ``request_rate: inf``: every request at 0;
* else the client's schedule as vLLM 0.32 draws it (``vllm/benchmarks/serve.py`` ``get_request``):
  gamma inter-arrival times of shape ``burstiness`` and mean ``1 / request_rate``, summed and scaled
  so that the last request is sent at ``num_prompts / request_rate``. The draw is kvsim's (seeded by
  the scenario's ``seed``), not the run's: same distribution, not the same times.

With ``max_concurrency`` the scenario gets ``client: {max_concurrency: N}`` (kvsim/client.py), so
each request is sent when one of the N in flight ends, as the benchmark sends them.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml

from kvsim.servebench.result import BenchResult

TRACE_HEADER = "arrival_s,prompt_tokens,output_tokens"


def arrivals(result: BenchResult, seed: int) -> tuple[np.ndarray, str]:
    """Each request's arrival at the client (s) and how it was obtained (one line)."""
    n = result.num_requests
    if result.max_concurrency is None and result.start_times is not None:
        t = np.asarray(result.start_times, dtype=np.float64)
        return t - t.min(), "the client's send times (start_times)"
    if math.isinf(result.request_rate):
        return np.zeros(n), "request_rate inf: every request at once"
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=result.burstiness, scale=1.0 / (result.request_rate * result.burstiness), size=n)
    t = np.cumsum(gaps)
    t *= (n / result.request_rate) / t[-1]
    return t, (f"gamma arrivals at {result.request_rate:g} req/s, burstiness {result.burstiness:g} "
               f"(kvsim's draw, seed {seed}; the last at num_prompts / rate, as vLLM 0.32 scales them)")


def trace_text(result: BenchResult, seed: int) -> str:
    t, _ = arrivals(result, seed)
    rows = [TRACE_HEADER] + [f"{a!r},{i},{max(o, 1)}" for a, i, o in
                             zip(t.tolist(), result.input_lens, result.output_lens)]
    return "\n".join(rows) + "\n"


def scenario_dict(result: BenchResult, base: dict, base_dir: Path, seed: int) -> dict:
    """The scenario: ``base`` (the deployment: model, GPU, parallelism, engine profile, engine
    settings), a relative ``timing.file`` made absolute (the written scenario lives elsewhere), the result's
    trace (trace.csv beside the scenario) and its client bound."""
    d = {k: v for k, v in base.items() if k not in ("trace", "client", "variants", "baseline")}
    d.setdefault("name", result.path.stem)
    d.setdefault("seed", seed)
    timing = d.get("timing")
    if isinstance(timing, dict) and isinstance(timing.get("file"), str) and not Path(timing["file"]).is_absolute():
        d["timing"] = {**timing, "file": str((base_dir / timing["file"]).resolve())}
    d["trace"] = {"file": "trace.csv"}
    metrics = d.get("metrics") if isinstance(d.get("metrics"), dict) else {}
    have = metrics.get("percentiles") if isinstance(metrics.get("percentiles"), list) else [50.0, 90.0]
    d["metrics"] = {**metrics, "percentiles": sorted({*have, 90.0, 99.0})}  # for the printed p90s and p99s
    if result.max_concurrency is not None:
        d["client"] = {"max_concurrency": result.max_concurrency}
    return d


def scenario_text(result: BenchResult, d: dict, how: str) -> str:
    head = [f"# kvsim servebench: {result.path.name}" + (f" (result {result.index})" if result.index else ""),
            f"# model_id {result.model_id or '(not printed)'}; {result.num_requests} requests; arrivals: {how}",
            "# lengths: " + ("per request, as printed (input_lens, output_lens)" if result.per_request else
                             "the printed totals' means (the file has no input_lens / output_lens: "
                             "vllm bench serve --save-detailed keeps them)")]
    return "\n".join(head) + "\n" + yaml.safe_dump(d, sort_keys=False, default_flow_style=False)
