"""Server histories: corpus runs made one after another on one long-lived vLLM server, replayed in order.

The dennislee22 runs (docs/validation.md, "Server histories") were benchmark_serving.py runs against
vLLM V1 servers with prefix caching on, several runs per server process. The client's random dataset
(seed 0, a range ratio of 0) gives request *i* of every run the same prompt (token ids
``offset[i] + i + j``, the offsets drawn from the same seed), and before each run the client sends
request 0 once as its "initial single prompt test run". So a run's requests hit the prefix cache on
what the server's earlier runs left there. ``server_runs.csv`` lists every printed run of the
servers of those cases (server = the test section and the engine's process id, time = its first
engine log line, the last printed prefix-cache hit rate); a case's trace is its server's runs up to
and including its own, each preceded by its test prompt, one phase after another, with prefix keys
that depend only on the request index and block. Only the last phase is measured.

The printed hit rate is vLLM V1's windowed rate (``PrefixCachingMetrics``, the last 1,000 requests):
:func:`hit_rate` is kvsim's over the same window (one query per request at its first admission; vLLM
also counts a request again when it is retried after a failed allocation or a preemption), so the
table shows for each case whether the history kvsim replays is consistent with what the server printed.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from kvsim.servebench.build import KEY_BLOCK, prompt_keys  # noqa: F401  (the one definition of a prompt's keys)

HISTORY = "server_runs.csv"  # beside the corpus
HISTORY_TRACE_HEADER = "arrival_s,prompt_tokens,output_tokens,prefix_keys,prefix_block_tokens"
HIT_WINDOW = 1000  # vLLM V1 PrefixCachingMetrics(max_recent_requests=1000)
UNKNOWN = "unknown"  # a run whose server is not known: no history
FIELDS = ("server", "log_time", "num_prompts", "input_len", "output_len", "duration_s", "hit_rate_pct",
          "case_id", "source_where", "source_url")


class HistoryError(Exception):
    """A server_runs.csv row with a missing or invalid field, or phases that overlap (one line)."""


@dataclass(frozen=True)
class Run:
    """One printed benchmark run on a server."""

    server: str
    log_time: str
    num_prompts: int
    input_len: int
    output_len: int
    duration_s: float
    hit_rate_pct: float | None  # None: not printed (a corpus row's own run, see own_run)
    case_id: str


def sends_test_prompt(row: dict) -> bool:
    """Whether a corpus row's run is preceded by its client's test prompt in kvsim: a vLLM benchmark
    client run (every vLLM row) on an engine that caches prefixes (the ``vllm-v1`` profile) with fixed
    random lengths, so the test prompt is exactly request 0's prompt and leaves it cached. (V0 rows
    do not cache prefixes; the sharegpt rows are V0; SGLang's client is not vLLM's; a finite request
    rate would need arrival times within a phase.)"""
    return (row["engine"] == "vllm" and row["engine_profile"] == "vllm-v1" and row["dataset"] == "random"
            and row["request_rate"].strip() == "inf")  # phases are all-at-once (trace_text)


def own_run(row: dict) -> Run:
    """A corpus row's run as a one-run history (no printed duration or hit rate)."""
    return Run("", "", int(row["num_prompts"]), int(row["input_len"]), int(row["output_len"]), 0.0, None,
               row["case_id"])


def _run(path: Path, line: int, row: dict) -> Run:
    for key in FIELDS:
        if key not in row or (key not in ("case_id", "output_len") and not (row[key] or "").strip()):
            raise HistoryError(f"{path}: line {line}: field {key!r} is missing")
    try:
        run = Run(row["server"].strip(), row["log_time"].strip(), int(row["num_prompts"]), int(row["input_len"]),
                  int(row["output_len"] or 0), float(row["duration_s"]), float(row["hit_rate_pct"]),
                  row["case_id"].strip())
    except ValueError as e:
        raise HistoryError(f"{path}: line {line}: {e}") from None
    if run.num_prompts < 1 or run.input_len < 1 or run.output_len < 0:
        raise HistoryError(f"{path}: line {line}: num_prompts and input_len must be >= 1, output_len >= 0")
    return run


def load_history(path: Path) -> dict[str, tuple[Run, ...]]:
    """``{case_id: its server's printed runs up to and including its own, oldest first}`` (a case on
    server ``unknown``: its own run alone). A run without a case_id is history only."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    runs = [_run(path, i, row) for i, row in enumerate(rows, start=2)]
    cases = [r.case_id for r in runs if r.case_id]
    if len(cases) != len(set(cases)):
        raise HistoryError(f"{path}: a case_id appears on two runs")
    by_server: dict[str, list[Run]] = {}
    for r in runs:
        by_server.setdefault(r.server, []).append(r)
    out = {}
    for server, these in by_server.items():
        these.sort(key=lambda r: r.log_time)  # ISO time stamps: text order is time order
        for k, r in enumerate(these):
            if r.case_id:
                out[r.case_id] = (r,) if server == UNKNOWN else tuple(these[: k + 1])
    return out


def _gaps(run: Run) -> tuple[int, int]:
    """Seconds from a run's test prompt to its first request, and from that to the next run's test
    prompt: generous bounds (the printed duration x 10 plus 10 minutes), checked after the run."""
    return 600 + run.output_len // 2, 600 + 10 * int(run.duration_s + 1)


def phases(runs: tuple[Run, ...]) -> list[tuple[int, list[int], Run]]:
    """``(start_s, request indices, run)`` per phase: each run's test prompt (index 0), then its requests."""
    out, t = [], 0
    for run in runs:
        test_gap, run_gap = _gaps(run)
        out.append((t, [0], run))
        out.append((t + test_gap, list(range(run.num_prompts)), run))
        t += test_gap + run_gap
    return out


def trace_text(runs: tuple[Run, ...]) -> str:
    """The generic trace of a history case: every phase's requests at its start time, all at once
    (``--request-rate inf``), each prompt with its index's prefix keys."""
    lines = [HISTORY_TRACE_HEADER]
    for start, indices, run in phases(runs):
        out = max(run.output_len, 1)
        for i in indices:
            keys = " ".join(str(k) for k in prompt_keys(i, run.input_len))
            lines.append(f"{start},{run.input_len},{out},{keys},{KEY_BLOCK}")
    return "\n".join(lines) + "\n"


def measured(requests, runs: tuple[Run, ...]):
    """The last phase's rows of a history case's request table (the measured run), after checking
    that every phase finished before the next one began (else :class:`HistoryError`)."""
    starts = [start for start, _, _ in phases(runs)]
    for a, b in zip(starts, starts[1:]):
        phase = requests[(requests["arrival_s"] >= a) & (requests["arrival_s"] < b)]
        if phase["finish_s"].isna().any() or phase["finish_s"].max() >= b:
            raise HistoryError(f"server history of {runs[-1].case_id}: the phase from t = {a} s did not finish "
                               f"before the next began at t = {b} s; widen _gaps")
    return requests[requests["arrival_s"] >= starts[-1]]


def hit_rate(requests) -> float:
    """Prefix-cache hit rate in % over the last :data:`HIT_WINDOW` admitted requests (vLLM V1's
    windowed rate: cached prompt tokens / prompt tokens, at each request's first admission)."""
    admitted = requests[requests["cached_tokens"] >= 0].sort_values(["admitted_s", "request_id"])
    last = admitted.tail(HIT_WINDOW)
    return 100.0 * float(last["cached_tokens"].sum()) / float(last["prompt_tokens"].sum())


def markdown(table: list[dict]) -> str:
    """The history check: each history case's printed and replayed hit rate (within 5 points: consistent)."""
    rows = [r for r in table if r.get("hit_rate_printed", "") != ""]
    if not rows:
        return ""
    lines = ["**Server histories: prefix-cache hit rate printed after the run vs kvsim's replay "
             f"(last {HIT_WINDOW} requests)**", "",
             "| case | runs replayed | printed % | kvsim % | consistent (5 points) |", "|---|---:|---:|---:|---|"]
    for r in rows:
        ok = "yes" if abs(r["hit_rate_kvsim"] - r["hit_rate_printed"]) <= 5 else "no"
        lines.append(f"| {r['case_id']} | {r['history_runs']} | {r['hit_rate_printed']:.1f} | "
                     f"{r['hit_rate_kvsim']:.1f} | {ok} |")
    n_ok = sum(abs(r["hit_rate_kvsim"] - r["hit_rate_printed"]) <= 5 for r in rows)
    lines += ["", f"- consistent: {n_ok}/{len(rows)}"]
    return "\n".join(lines) + "\n"
