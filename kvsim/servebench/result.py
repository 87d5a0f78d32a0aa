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
    request_rate: float  # requests/s; inf: every request at once
    burstiness: float  # the gamma shape of the inter-arrival times (1: Poisson)
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

    @property
    def num_requests(self) -> int:
        return len(self.input_lens)


def _documents(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
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
                    raise ConfigError(f"{path}: line {n}: not JSON ({e.msg})") from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise ConfigError(f"{path}: expected a JSON object (vllm bench serve --save-result), or one per line")
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


def _int_list(doc: dict, key: str, where: str) -> list[int] | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise ConfigError(f"{where}: {key}: expected a list of token counts (integers >= 0)")
    return v


def _lengths(doc: dict, where: str) -> tuple[list[int], list[int], bool]:
    inp, out = _int_list(doc, "input_lens", where), _int_list(doc, "output_lens", where)
    if inp is not None and out is not None:
        if len(inp) != len(out) or not inp:
            raise ConfigError(f"{where}: input_lens / output_lens: expected two lists of one length >= 1, "
                              f"got {len(inp)} and {len(out)}")
        return inp, out, True
    # no per-request lengths (vLLM 0.32 without --save-detailed): the printed totals' means
    done = _number(doc, "completed", where, required=True)
    tin, tout = (_number(doc, k, where, required=True) for k in ("total_input_tokens", "total_output_tokens"))
    if done < 1:
        raise ConfigError(f"{where}: completed: expected at least 1 request, got {done:g}")
    n = int(_number(doc, "num_prompts", where) or done)
    return [max(1, round(tin / done))] * n, [max(1, round(tout / done))] * n, False


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


def _result(path: Path, docs: list[dict], index: int) -> BenchResult:
    if not 0 <= index < len(docs):
        raise ConfigError(f"{path}: --index {index}: the file holds {len(docs)} result(s) (0..{len(docs) - 1})")
    doc, where = docs[index], str(path) if len(docs) == 1 else f"{path}: result {index}"
    rate = _number(doc, "request_rate", where, required=True)
    burst = _number(doc, "burstiness", where) or 1.0
    conc = doc.get("max_concurrency")
    if conc is not None and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise ConfigError(f"{where}: max_concurrency: expected null or an integer >= 1, got {conc!r}")
    if rate <= 0 or burst <= 0:
        raise ConfigError(f"{where}: request_rate / burstiness: expected > 0")
    inp, out, per_request = _lengths(doc, where)
    starts = doc.get("start_times")
    if starts is not None and (not isinstance(starts, list) or len(starts) != len(inp)
                               or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in starts)):
        raise ConfigError(f"{where}: start_times: expected one number per request ({len(inp)})")
    ttfts = doc.get("ttfts")
    zero = frozenset()
    if isinstance(ttfts, list) and len(ttfts) == len(inp):
        zero = frozenset(i for i, t in enumerate(ttfts) if isinstance(t, (int, float)) and t == 0)
    published = {k: v for k in PREDICTED if (v := _number(doc, _key(doc, k), where)) is not None}
    if not published:
        raise ConfigError(f"{where}: no printed metric to compare with (expected one of {', '.join(PREDICTED)})")
    return BenchResult(path=path, index=index, model_id=str(doc.get("model_id") or ""), request_rate=rate,
                       burstiness=burst, max_concurrency=conc, input_lens=inp, output_lens=out,
                       per_request=per_request, start_times=starts, published=published, zero_ttft=zero,
                       chunk_tokens=stream_chunk_tokens(out, doc.get("itls")) if per_request else 1)
