"""A benchmark result's trace and scenario (pure functions: text in, text out).

The trace holds the result's requests in order, with its prompt and generated lengths (a request
that streamed nothing still ran its prefill: 1 output token). Arrivals count from the benchmark's
start; in order of preference:

* an open loop (no ``max_concurrency``) whose file has ``start_times``: the client's own send times,
  from the benchmark's start as vLLM's schedule fixes it (:func:`arrivals`);
* else the client's schedule as vLLM 0.32 makes it (``vllm/benchmarks/serve.py`` ``get_request`` and
  ``_get_current_request_rate``): each request's rate is the printed ``request_rate`` or, with
  ``ramp_up_strategy``, rises from ``ramp_up_start_rps`` to ``ramp_up_end_rps`` over the requests; its gap
  is 0 at rate inf, ``1 / rate`` at ``burstiness`` inf, else a gamma draw of shape ``burstiness`` and mean
  ``1 / rate``; the gaps are summed and, without a ramp-up, scaled so that the last request is sent at
  ``num_prompts / request_rate``. The draw is kvsim's (seeded by the scenario's ``seed``), not the
  run's: same distribution, not the same times.

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


def request_rates(result: BenchResult) -> np.ndarray:
    """Each request's rate (requests/s) as vLLM 0.32's ``_get_current_request_rate`` gives it: the
    printed rate, or with a ramp-up ``start + (end - start) * p`` (linear) or ``start * (end / start) ** p``
    (exponential) at progress ``p = index / max(n - 1, 1)``."""
    n = result.num_requests
    if result.ramp_up is None:
        return np.full(n, result.request_rate)
    strategy, lo, hi = result.ramp_up
    progress = np.arange(n) / max(n - 1, 1)
    return lo + (hi - lo) * progress if strategy == "linear" else lo * (hi / lo) ** progress


def fixed_span_s(result: BenchResult) -> float | None:
    """When vLLM 0.32's ``get_request`` sends the last request, counted from the benchmark's start,
    where its code fixes it: 0 at rate inf, ``num_prompts / rate`` at a finite rate (the drawn gaps are
    scaled to it), the sum of ``1 / rate`` with a ramp-up and burstiness inf (even gaps). None with a
    ramp-up and drawn gaps: vLLM does not scale those."""
    rates = request_rates(result)
    if result.ramp_up is None:
        return 0.0 if math.isinf(result.request_rate) else result.num_requests / result.request_rate
    return float(np.sum(1.0 / rates)) if math.isinf(result.burstiness) else None


def _schedule(result: BenchResult, seed: int) -> np.ndarray:
    """vLLM 0.32's send offsets from the benchmark's start (``get_request``'s ``delay_ts``): per request
    a gap of 0 at rate inf, ``1 / rate`` at burstiness inf, else a gamma draw of shape ``burstiness`` and
    mean ``1 / rate`` (kvsim's draw, seeded); summed, and without a ramp-up scaled so that the last is
    at ``num_prompts / rate``."""
    rates = request_rates(result)
    if np.isinf(rates).all():
        return np.zeros(result.num_requests)
    b = result.burstiness
    if math.isinf(b):
        gaps = 1.0 / rates
    else:
        gaps = np.random.default_rng(seed).gamma(shape=b, scale=1.0 / (rates * b))
    t = np.cumsum(gaps)
    if result.ramp_up is None:
        t *= fixed_span_s(result) / t[-1]
    return t


def _load_text(result: BenchResult, seed: int) -> str:
    if result.ramp_up is not None:
        strategy, lo, hi = result.ramp_up
        rate = f"a {strategy} ramp-up from {lo:g} to {hi:g} req/s (vLLM 0.32's per-request rates, unscaled)"
    elif math.isinf(result.request_rate):
        return "request_rate inf: every request at once"
    else:
        rate = f"{result.request_rate:g} req/s (the last at num_prompts / rate, as vLLM 0.32 scales them)"
    if math.isinf(result.burstiness):
        return f"evenly spaced arrivals (burstiness inf) at {rate}"
    return f"gamma arrivals at {rate}, burstiness {result.burstiness:g} (kvsim's draw, seed {seed})"


def arrivals(result: BenchResult, seed: int) -> tuple[np.ndarray, str]:
    """Each request's arrival at the client (s from the benchmark's start) and how it was obtained (one line).

    Replayed send times (``start_times``: each request's ``time.perf_counter()`` as vLLM's request
    function starts; the file records no base, and vLLM's ``benchmark_start_time`` is not saved) count
    from the start vLLM's schedule fixes: the last send less :func:`fixed_span_s` (vLLM's duration runs
    from ``benchmark_start_time``, taken before ``get_request`` waits the first gap), or the first send
    where that is earlier (a send lags its schedule, never leads it) or the span is not fixed (a
    ramp-up with drawn gaps: the duration is then short by the first gap). This assumes vLLM 0.32's
    schedule (the file does not print its client's version)."""
    if result.max_concurrency is None and result.start_times is not None:
        t = np.asarray(result.start_times, dtype=np.float64)
        span = fixed_span_s(result)
        start = t.min() if span is None else min(t.min(), t.max() - span)
        base = f"the last send less {span:g} s" if start < t.min() else "the first send"
        return t - start, f"the client's send times (start_times), from the benchmark's start ({base})"
    return _schedule(result, seed), _load_text(result, seed)


def benchmark_start_s(test_prompt: bool = True) -> float:
    """Where the benchmark's clock starts in the trace: every arrival (:func:`arrivals`) counts from
    the benchmark's start, which the trace puts at :data:`TEST_PROMPT_GAP_S` (0 without the test
    prompt). vLLM 0.32's client waits the first gap after its start before it sends request 0, and
    its duration counts that wait."""
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


def failed_note(result: BenchResult) -> str | None:
    """One line on the printed run's failed requests (docs/validation.md: not modelled), or None."""
    if not result.failed:
        return None
    return (f"{result.failed} of {result.num_requests} requests failed in the printed run (failed / errors); "
            f"kvsim replays all {result.num_requests} like the others (failed requests are not modelled), while "
            "the printed throughputs and latencies count only the completed ones")


def scenario_text(result: BenchResult, d: dict, how: str, test_prompt: bool = True) -> str:
    head = [f"# kvsim servebench: {result.path.name}" + (f" (result {result.index})" if result.index else ""),
            f"# model_id {result.model_id or '(not printed)'}; {result.num_requests} requests; arrivals: {how}",
            (f"# trace request 0 is the client's test prompt (request 0's, at 0); the benchmark's requests are "
             f"1.. from t = {TEST_PROMPT_GAP_S:g} s" if test_prompt else "# no test prompt (--no-test-prompt)"),
            "# lengths: " + ("per request, as printed (input_lens, output_lens)" if result.per_request else
                             "the printed totals' means (the file has no input_lens / output_lens: "
                             "vllm bench serve --save-detailed keeps them)")]
    if (note := failed_note(result)) is not None:
        head.append(f"# note: {note}")
    return "\n".join(head) + "\n" + yaml.safe_dump(d, sort_keys=False, default_flow_style=False)
