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

from kvsim.servebench.result import MAX_TOKENS, BenchResult

TRACE_HEADER = "arrival_s,prompt_tokens,output_tokens"
KEYED_HEADER = TRACE_HEADER + ",prefix_keys,prefix_block_tokens"
KEY_BLOCK = 16  # block size of the prefix keys: the scenarios' (and vLLM's default) block size
# keys per request index: a prompt (at most MAX_TOKENS tokens, checked by kvsim.servebench.result) has
# no more full blocks than this
KEY_STRIDE = MAX_TOKENS // KEY_BLOCK
# where the benchmark starts after the client's test prompt (sent at 0): far past its finish (checked)
TEST_PROMPT_GAP_S = 3600.0


def prompt_keys(index: int, tokens: int) -> list[int]:
    """Prefix keys of request ``index``'s prompt of ``tokens`` tokens: full block ``b`` gets the same
    key whenever the same request index is sent (its content depends only on the index); a partial
    last block gets a key of its index and length (the same content only for the same prompt). So the
    client's test prompt (request 0's, sent again first) shares request 0's blocks and no other's."""
    keys = [index * KEY_STRIDE + b + 1 for b in range(tokens // KEY_BLOCK)]
    if tokens % KEY_BLOCK:
        keys.append(-1 - (index * KEY_STRIDE + tokens))
    return keys


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


def benchmark_start_s(result: BenchResult, test_prompt: bool = True) -> float | None:
    """Where the benchmark's clock starts in the trace when kvsim draws the arrivals: vLLM 0.32's client
    (``get_request``) waits the first gap after its start before it sends request 0, and its duration
    counts that wait. None where request 0 is sent at the start (replayed send times, rate inf)."""
    if (result.max_concurrency is None and result.start_times is not None) or math.isinf(result.request_rate):
        return None
    return TEST_PROMPT_GAP_S if test_prompt else 0.0


def trace_text(result: BenchResult, seed: int, test_prompt: bool = True) -> str:
    """The trace. ``test_prompt``: first the client's test request (request 0's prompt and output,
    at 0: ``vllm bench serve`` sends one before the benchmark, SGLang's ``bench_serving.py`` a warm-up
    request of the same), then the benchmark from :data:`TEST_PROMPT_GAP_S`; every prompt with its
    index's prefix keys, so that a prefix cache keeps the test prompt for request 0 and nothing else
    is shared (the prompts of a benchmark dataset share no text kvsim knows of)."""
    t, _ = arrivals(result, seed)
    outs = [max(o, 1) for o in result.output_lens]
    if not test_prompt:
        rows = [TRACE_HEADER] + [f"{a!r},{i},{o}" for a, i, o in zip(t.tolist(), result.input_lens, outs)]
        return "\n".join(rows) + "\n"

    def row(a: float, k: int) -> str:
        keys = " ".join(str(x) for x in prompt_keys(k, result.input_lens[k]))
        return f"{a!r},{result.input_lens[k]},{outs[k]},{keys},{KEY_BLOCK}"

    rows = [KEYED_HEADER, row(0.0, 0)] + [row(TEST_PROMPT_GAP_S + a, k) for k, a in enumerate(t.tolist())]
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


def scenario_text(result: BenchResult, d: dict, how: str, test_prompt: bool = True) -> str:
    head = [f"# kvsim servebench: {result.path.name}" + (f" (result {result.index})" if result.index else ""),
            f"# model_id {result.model_id or '(not printed)'}; {result.num_requests} requests; arrivals: {how}",
            (f"# trace request 0 is the client's test prompt (request 0's, at 0); the benchmark's requests are "
             f"1.. from t = {TEST_PROMPT_GAP_S:g} s" if test_prompt else "# no test prompt (--no-test-prompt)"),
            "# lengths: " + ("per request, as printed (input_lens, output_lens)" if result.per_request else
                             "the printed totals' means (the file has no input_lens / output_lens: "
                             "vllm bench serve --save-detailed keeps them)")]
    return "\n".join(head) + "\n" + yaml.safe_dump(d, sort_keys=False, default_flow_style=False)
