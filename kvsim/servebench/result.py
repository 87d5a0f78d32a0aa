"""A serving-benchmark result file, read into what kvsim needs to replay it.

The keys are those of vLLM's ``--save-result`` JSON (vLLM 0.32 ``vllm/benchmarks/serve.py``, the
``result_json`` it saves; the same names since ``benchmark_serving.py`` of vLLM 0.4), which SGLang's
``bench_serving.py`` also writes: the load (``num_prompts``, ``request_rate``, ``burstiness``,
``max_concurrency``), the per-request lists (``input_lens``, ``output_lens``, ``start_times``; vLLM
0.32 keeps them only with ``--save-detailed``) and the printed metrics (``request_throughput``,
``output_throughput``, ``{mean,median,p90,p99}_{ttft,tpot,itl,e2el}_ms``; vLLM 0.5-0.6 named E2EL
``*_latency_ms``, SGLang ``*_e2e_latency_ms``). ``--append-result`` writes one
JSON object per line: ``index`` picks one. Every problem is one line naming the file, the key and
what was expected (:class:`~kvsim.errors.ConfigError`, exit 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError

# the printed metrics kvsim predicts (kvsim.servebench.metrics.predicted)
PREDICTED = ("request_throughput", "output_throughput",
             *(f"{s}_{m}" for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms") for s in ("mean", "median", "p90", "p99")))


# a token count's bound (input_lens, output_lens, the totals' means): past every preset's max_model_len,
# and the prefix keys' room per request (kvsim.servebench.build.KEY_STRIDE full blocks)
MAX_TOKENS = 1 << 20
# a request count's bound (num_prompts, completed): far past any benchmark's --num-prompts (the trace grows with it)
MAX_REQUESTS = 10_000_000

# other names of a key: end-to-end latency is ``*_latency_ms`` in benchmark_serving.py of vLLM 0.5-0.6 and
# ``*_e2e_latency_ms`` in SGLang's bench_serving.py
_OTHER_NAMES = {f"{s}_e2el_ms": (f"{s}_latency_ms", f"{s}_e2e_latency_ms") for s in ("mean", "median", "p90", "p99")}


def _key(doc: dict, key: str) -> str:
    return next((k for k in (key, *_OTHER_NAMES.get(key, ())) if k in doc), key)


@dataclass(frozen=True)
class BenchResult:
    path: Path
    index: int
    model_id: str
    request_rate: float  # requests/s; inf: every request at once (unless ``ramp_up``)
    burstiness: float  # the gamma shape of the inter-arrival times (1: Poisson; inf: evenly spaced)
    max_concurrency: int | None
    input_lens: list[int]
    output_lens: list[int]
    per_request: bool  # False: the file had no per-request lengths; every request has the mean lengths
    start_times: list[float] | None  # the client's send time of each request (vLLM 0.32 --save-detailed)
    published: dict[str, float]  # PREDICTED keys the file prints
    # requests whose printed TTFT is 0: no text was streamed, and the client counted TTFT 0 (``ttfts``)
    zero_ttft: frozenset[int] = frozenset()
    # tokens per streamed chunk the file's per-request gaps (``itls``) show: N > 1 for vLLM 0.6's
    # multi-step rounds (--num-scheduler-steps N; :func:`stream_chunk_tokens`), else 1
    chunk_tokens: int = 1
    # vLLM's --ramp-up-strategy, --ramp-up-start-rps, --ramp-up-end-rps (the rate rises over the requests)
    ramp_up: tuple[str, float, float] | None = None
    failed: int = 0  # requests the printed run counted as failed (:func:`_failed`)

    @property
    def num_requests(self) -> int:
        return len(self.input_lens)


# what a result file is (the one-line errors of an unreadable one say it)
READS = ("servebench reads the JSON that vllm bench serve --save-result (vLLM's benchmark_serving.py "
         "--save-result) writes, or the JSONL of SGLang's bench_serving.py --output-file")


def _documents(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # (a BOM is no JSON error)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    docs = []
    try:
        whole = json.loads(text)
        docs = [whole]
    except json.JSONDecodeError:
        for n, line in enumerate(text.splitlines(), 1):  # --append-result: one object per line
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    table = "the printed 'Serving Benchmark Result' table" if "Serving Benchmark Result" in text \
                        else "printed text"
                    raise ConfigError(f"{path}: line {n}: not JSON ({e.msg}); {READS}, not {table}") from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise ConfigError(f"{path}: expected a JSON object, or one per line; {READS}")
    return docs


def _number(doc: dict, key: str, where: str, *, required: bool = False) -> float | None:
    v = doc.get(key)
    if v is None:
        if required:
            raise ConfigError(f"{where}: {key}: missing")
        return None
    if v == "inf":  # vLLM writes an infinite rate as the string "inf" (SGLang as Infinity: a float)
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
        raise ConfigError(f"{where}: {key}: expected a number, got {v!r}")
    return float(v)


def _finite(doc: dict, key: str, where: str, *, required: bool = False) -> float | None:
    """:func:`_number`, refusing an infinite one (``"inf"``, ``Infinity``): a printed metric or total."""
    v = _number(doc, key, where, required=required)
    if v is not None and math.isinf(v):
        raise ConfigError(f"{where}: {key}: expected a finite number, got {doc[key]!r}")
    return v


def _count(doc: dict, key: str, where: str, *, required: bool = False) -> int | None:
    """A request count (``num_prompts``, ``completed``): an integer 1..:data:`MAX_REQUESTS`."""
    v = _number(doc, key, where, required=required)
    if v is not None and not (1 <= v <= MAX_REQUESTS and v == int(v)):
        raise ConfigError(f"{where}: {key}: expected an integer 1..{MAX_REQUESTS}, got {doc[key]!r}")
    return None if v is None else int(v)


def _int_list(doc: dict, key: str, where: str, low: int) -> list[int] | None:
    """Token counts, each ``low``..:data:`MAX_TOKENS`."""
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ConfigError(f"{where}: {key}: expected a list of token counts (integers {low}..{MAX_TOKENS})")
    bad = next((i for i, x in enumerate(v) if not low <= x <= MAX_TOKENS), None)
    if bad is not None:
        raise ConfigError(f"{where}: {key}[{bad}]: expected a token count {low}..{MAX_TOKENS}, got {v[bad]}")
    return v


def _mean_length(doc: dict, key: str, done: int, where: str) -> int:
    """A request's mean token count: the printed total ``key`` over ``completed`` requests (at least 1)."""
    total = _finite(doc, key, where, required=True)
    if not 0 <= total <= MAX_TOKENS * done:
        raise ConfigError(f"{where}: {key}: expected 0..{MAX_TOKENS} tokens per completed request ({done} "
                          f"completed), got {total:g}")
    return max(1, round(total / done))


def _lengths(doc: dict, where: str) -> tuple[list[int], list[int], bool]:
    # a prompt has at least one token; a request that streamed nothing has output 0 (it runs one)
    inp, out = _int_list(doc, "input_lens", where, 1), _int_list(doc, "output_lens", where, 0)
    if inp is not None and out is not None:
        if len(inp) != len(out) or not inp:
            raise ConfigError(f"{where}: input_lens / output_lens: expected two lists of one length >= 1, "
                              f"got {len(inp)} and {len(out)}")
        n = _count(doc, "num_prompts", where)
        if n is not None and n != len(inp):  # vLLM's client writes one entry per prompt it sent
            raise ConfigError(f"{where}: num_prompts is {n} but input_lens / output_lens hold {len(inp)} "
                              f"requests; the file is not one benchmark's result")
        return inp, out, True
    # no per-request lengths (vLLM 0.32 without --save-detailed): the printed totals' means
    done = _count(doc, "completed", where, required=True)
    tin, tout = (_mean_length(doc, k, done, where) for k in ("total_input_tokens", "total_output_tokens"))
    n = _count(doc, "num_prompts", where) or done
    return [tin] * n, [tout] * n, False


def _start_times(doc: dict, n: int, open_loop: bool, where: str) -> list[float] | None:
    """The client's send times: finite, one per request; in an open loop (where kvsim replays them) in
    request order, as vLLM's client sends and records them (a task per request, started in order)."""
    starts = doc.get("start_times")
    if starts is None:
        return None
    if not isinstance(starts, list) or len(starts) != n or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in starts):
        raise ConfigError(f"{where}: start_times: expected one number per request ({n})")
    bad = next((i for i, x in enumerate(starts) if isinstance(x, float) and not math.isfinite(x)), None)
    if bad is not None:
        raise ConfigError(f"{where}: start_times[{bad}]: expected a finite send time (s), got {starts[bad]!r}")
    back = next((i for i in range(1, n) if starts[i] < starts[i - 1]), None) if open_loop else None
    if back is not None:
        raise ConfigError(f"{where}: start_times[{back}]: expected send times in request order (non-decreasing), "
                          f"got {starts[back]!r} after {starts[back - 1]!r}")
    return starts


def load(path: Path, index: int | None = None) -> BenchResult:
    """The result at ``index`` of ``path`` (a file with one result: that one)."""
    docs = _documents(path)
    if index is None and len(docs) > 1:
        raise ConfigError(f"{path}: holds {len(docs)} results (--append-result); choose one with --index 0..{len(docs) - 1}")
    return _result(path, docs, 0 if index is None else index)


def load_all(path: Path, index: int | None = None) -> list[BenchResult]:
    """Every result of ``path`` in file order (``index``: that one only)."""
    docs = _documents(path)
    return [_result(path, docs, i) for i in (range(len(docs)) if index is None else [index])]


def stream_chunk_tokens(output_lens: list[int], itls) -> int:
    """Tokens per streamed chunk after the first token: the smallest N >= 2 for which at least 80 % of
    the requests with 2+ output tokens streamed ``ceil((output - 1) / N)`` gaps (vLLM 0.6's multi-step
    rounds: a request's first token comes alone, then one chunk per round), with at least three
    requests long enough to show it (``output - 1 >= 2 N``); 1 when the gaps are one per token or
    follow no such N. The client counts ``output_lens`` by re-tokenising the text, so a few requests
    may be one gap off."""
    if not isinstance(itls, list) or len(itls) != len(output_lens):
        return 1
    pairs = [(o - 1, len(g)) for o, g in zip(output_lens, itls) if isinstance(g, list) and o >= 2]
    if len(pairs) < 3:
        return 1
    need = 0.8 * len(pairs)
    if sum(k == n for n, k in pairs) >= need:
        return 1
    for n_steps in range(2, 257):
        if (sum(k == -(-n // n_steps) for n, k in pairs) >= need
                and sum(n >= 2 * n_steps for n, _ in pairs) >= 3):
            return n_steps
    return 1


RAMP_UP_STRATEGIES = ("exponential", "linear")  # vLLM 0.32 vllm/benchmarks/serve.py _get_current_request_rate


def _ramp_up(doc: dict, where: str) -> tuple[str, float, float] | None:
    """vLLM's ramp-up (``ramp_up_strategy``, ``ramp_up_start_rps``, ``ramp_up_end_rps``: written only
    with --ramp-up-strategy), or None. vLLM refuses an end below the start, and a start of 0 fails its
    positive-rate assertion at request 0."""
    strategy = doc.get("ramp_up_strategy")
    if strategy is None:
        return None
    if strategy not in RAMP_UP_STRATEGIES:
        raise ConfigError(f"{where}: ramp_up_strategy: expected one of {', '.join(RAMP_UP_STRATEGIES)} "
                          f"(vllm bench serve --ramp-up-strategy), got {strategy!r}")
    lo, hi = (_finite(doc, k, where, required=True) for k in ("ramp_up_start_rps", "ramp_up_end_rps"))
    if not 0 < lo <= hi:
        raise ConfigError(f"{where}: ramp_up_start_rps / ramp_up_end_rps: expected 0 < start <= end requests/s, "
                          f"got {lo:g} and {hi:g}")
    return strategy, lo, hi


def _failed(doc: dict, n: int, where: str) -> int:
    """Requests the printed run counted as failed: ``failed`` (vLLM 0.10+), else its non-empty
    ``errors``, else ``num_prompts`` (``n``) less ``completed``."""
    failed = _number(doc, "failed", where)
    if failed is not None:
        if not (0 <= failed <= n and failed == int(failed)):
            raise ConfigError(f"{where}: failed: expected an integer 0..{n} (requests), got {doc['failed']!r}")
        return int(failed)
    errors = doc.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        return sum(1 for e in errors if e)
    done = _number(doc, "completed", where)
    return 0 if done is None or math.isinf(done) else min(n, max(0, n - int(done)))


def _result(path: Path, docs: list[dict], index: int) -> BenchResult:
    if not 0 <= index < len(docs):
        raise ConfigError(f"{path}: --index {index}: the file holds {len(docs)} result(s) (0..{len(docs) - 1})")
    doc, where = docs[index], str(path) if len(docs) == 1 else f"{path}: result {index}"
    rate = _number(doc, "request_rate", where, required=True)
    burst = _number(doc, "burstiness", where)
    conc = doc.get("max_concurrency")
    if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise ConfigError(f"{where}: max_concurrency: expected null or an integer >= 1, got {conc!r}")
    if rate <= 0:
        raise ConfigError(f"{where}: request_rate: expected a number > 0 (\"inf\": every request at once), "
                          f"got {doc['request_rate']!r}")
    if burst is not None and burst <= 0:
        raise ConfigError(f"{where}: burstiness: expected a number > 0 (1: Poisson; inf: evenly spaced), "
                          f"got {doc['burstiness']!r}")
    inp, out, per_request = _lengths(doc, where)
    starts = _start_times(doc, len(inp), conc is None, where)
    ttfts = doc.get("ttfts")
    zero = frozenset()
    if isinstance(ttfts, list) and len(ttfts) == len(inp):
        zero = frozenset(i for i, t in enumerate(ttfts) if isinstance(t, (int, float)) and t == 0)
    published = {k: v for k in PREDICTED if (v := _finite(doc, _key(doc, k), where)) is not None}
    if not published:
        raise ConfigError(f"{where}: no printed metric to compare with (expected one of {', '.join(PREDICTED)})")
    return BenchResult(path=path, index=index, model_id=str(doc.get("model_id") or ""), request_rate=rate,
                       burstiness=1.0 if burst is None else burst, max_concurrency=conc, input_lens=inp,
                       output_lens=out, per_request=per_request, start_times=starts, published=published,
                       zero_ttft=zero,
                       chunk_tokens=stream_chunk_tokens(out, doc.get("itls")) if per_request else 1,
                       ramp_up=_ramp_up(doc, where), failed=_failed(doc, len(inp), where))
