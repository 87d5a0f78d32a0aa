"""The benchmark client's concurrency bound: a closed loop of ``max_concurrency`` requests in flight.

vLLM's serving benchmark (``vllm bench serve --max-concurrency N``, before it
``benchmarks/benchmark_serving.py``) and SGLang's ``bench_serving.py`` send each request as it
arrives, but through a semaphore of N slots: a request waits at the client until one of the N in
flight has ended, and its clock (TTFT, end-to-end latency) starts when it is sent, inside the
semaphore (vLLM 0.32 ``vllm/benchmarks/serve.py`` ``limited_request_func`` and
``lib/endpoint_request_func.py``, ``st = time.perf_counter()`` after the slot is taken; it records
the wait as ``client_queue_time``). kvsim's ``client: {max_concurrency: N}`` is that loop: request
``i`` enters the client at its trace arrival, is sent at ``max(arrival, the time a slot frees)``
in trace order (the semaphore is first come first served), and reaches the engine then, or when the
front end (kvsim/frontend.py) hands it on. A slot frees when its request finishes or is rejected.

Plain Python, owned by the engine loop (kvsim/engine.py), which tells it when requests end and
reads the engine arrival times it writes. Sends are in trace order at non-decreasing times, so the
engine's arrival array stays sorted; a request not sent yet has an engine arrival of +inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


class ClosedLoopClient:
    """``max_concurrency`` slots over a trace's arrivals.

    ``depart(i, sent_s)``: when request ``i`` sent at ``sent_s`` reaches the engine (the front end's
    FIFO servers, :class:`kvsim.frontend.FrontEndQueue`); None: at once."""

    def __init__(self, arrival_s: np.ndarray, max_concurrency: int,
                 depart: Callable[[int, float], float] | None = None):
        if max_concurrency < 1:
            raise ValueError(f"client.max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self._arrival = arrival_s.tolist()
        n = len(self._arrival)
        self.sent_s = np.full(n, math.nan)  # when each request left the client (latencies count from here)
        self.engine_arrival_s = np.full(n, math.inf)  # when the engine has it (+inf: not sent yet)
        self._depart = depart
        self._next = 0  # the first request not sent yet (trace order)
        self.in_flight = 0  # sent and not ended
        self._send_while_free(-math.inf)

    @property
    def pending(self) -> bool:
        """Some request has not been sent yet (its engine arrival is still unknown)."""
        return self._next < len(self._arrival)

    def ended(self, count: int, t: float) -> None:
        """``count`` requests in flight ended (finished or rejected) at ``t``: their slots take the
        next requests, each sent at ``max(its arrival, t)``."""
        if count > self.in_flight:
            raise RuntimeError(f"client: {count} requests ended with {self.in_flight} in flight")
        self.in_flight -= count
        self._send_while_free(t)

    def _send_while_free(self, t: float) -> None:
        n = len(self._arrival)
        while self.in_flight < self.max_concurrency and self._next < n:
            i = self._next
            sent = max(self._arrival[i], t)
            self.sent_s[i] = sent
            self.engine_arrival_s[i] = sent if self._depart is None else self._depart(i, sent)
            self._next = i + 1
            self.in_flight += 1

    def queue_s(self) -> np.ndarray:
        """Each request's wait at the client (sent - trace arrival; NaN: never sent)."""
        return self.sent_s - np.asarray(self._arrival, dtype=np.float64)


def client_record(max_concurrency: int, requests) -> dict:
    """``summary.json``'s ``client``: the bound and the requests' waits at the client (``client_queue_s``)."""
    wait = requests["client_queue_s"].to_numpy(dtype=np.float64)
    wait = wait[~np.isnan(wait)]
    if not len(wait):
        return {"max_concurrency": max_concurrency, "queue_mean_s": None, "queue_p50_s": None,
                "queue_p99_s": None, "queue_max_s": None}
    return {"max_concurrency": max_concurrency, "queue_mean_s": float(wait.mean()),
            "queue_p50_s": float(np.percentile(wait, 50)), "queue_p99_s": float(np.percentile(wait, 99)),
            "queue_max_s": float(wait.max())}
