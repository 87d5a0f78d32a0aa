"""End-to-end validation: kvsim's predictions beside public results of vLLM's serving benchmark.

    .venv/bin/python bench/validate_serving.py                  # run every case, print + write the tables
    .venv/bin/python bench/validate_serving.py --write-scenarios  # (re)generate scenarios/validation/*.yaml
    .venv/bin/python bench/validate_serving.py --fit            # also fit each engine profile's unsourced
                                                                # constants (FIT_PARAMS) on its fit cases
    .venv/bin/python bench/validate_serving.py --update-docs    # and put the tables into docs/validation.md

The corpus is ``scenarios/validation/corpus.csv``: one published benchmark run a row, with its source
(thread URL, date, where in the thread), engine and version, model, GPU, tensor parallelism, dataset
and lengths, request rate, client concurrency, flags, which statistic the source prints (mean or
median) and the printed results; ``split`` says whether a case may be used to fit (``fit``) or is
held out (``holdout``). Each case has a scenario ``scenarios/validation/<case_id>.yaml`` generated
from its row (``--write-scenarios``; a file there without the generated header is never replaced).

Request lengths. ``dataset = random`` rows are fixed-length runs (``--random-input-len`` /
``--random-output-len`` with a range ratio that fixes them, outputs forced by ``--ignore-eos``): the
scenario is a synthetic trace of ``num_prompts`` requests of exactly those lengths. ``dataset =
sharegpt`` rows are runs whose result file prints every request's prompt length and generated length
(``input_lens`` / ``output_lens`` of benchmark_serving.py ``--save-result``): those are copied, one
row per request, into ``lengths.csv`` and the scenario replays them as a trace file
(``traces/<case_id>.csv``, generated), so kvsim sees the run's own length distribution, not a model
of ShareGPT. A request the file shows with 0 generated tokens (the stream carried no text) still
costs its prefill: kvsim runs it with one output token, its TTFT counts as 0 and that token is left
out of the output totals, as the benchmark client of that version recorded them (its ``ttft`` stays 0
when no text chunk arrives, and it counts 0 output tokens).

Engine settings. ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``, ``chunked_prefill``
and ``gpu_memory_utilization`` carry the run's server flags or the defaults of its engine version when
the source names them; an empty cell keeps the script's defaults (chunked prefill on, as vLLM v1;
``max_num_seqs`` 256, or in a closed loop the engine profile's default for the GPU; kvsim's other defaults).
``kv_cache_gib`` (instead of ``gpu_memory_utilization``) is the KV memory per GPU the engine printed,
written as ``kv_budget.bytes``. ``total_input_tokens`` / ``total_generated_tokens`` are the printed
totals; a random row whose totals are more than 5 % off num_prompts x its lengths is refused.
``num_scheduler_steps`` is vLLM 0.6's ``--num-scheduler-steps`` where the run used it (the Lambda files
show it in their streamed chunks: docs/validation.md), written as ``scheduler.num_scheduler_steps``.

A case with ``max_concurrency`` is a closed loop (the client keeps that many requests in flight):
the scenario's ``client: {max_concurrency: N}`` (kvsim/client.py) sends each request when a slot
frees, and its latencies start at that send, as the benchmark's clock starts inside its semaphore;
the engine keeps its own ``max_num_seqs`` (the row's, else the profile's default for the GPU). Without
it the trace is Poisson at ``request_rate`` (``inf``: all at once) and latencies start at arrival. Metrics are vLLM's (benchmark_serving.py
``calculate_metrics``): request throughput = finished / (last finish - first send), TTFT, TPOT =
(E2EL - TTFT) / (output - 1), E2EL; the statistic compared is the one the source printed.

Each case runs on the ``engine_profile`` its corpus row names (the engine version it reproduces).
A case listed in ``server_runs.csv`` first replays its server's earlier printed runs, and every vLLM V1
case with fixed random lengths its client's test prompt (bench/serving_history.py); only its own run is
measured.
Writes ``results/validation/<label>.csv`` (one row per case: published, predicted, relative error
per metric, pass flags, ``new_deployment`` for a held-out case whose deployment has no fit case) and
``summary.json`` (pass rates per split, and with ``--fit`` the fitted constants per profile and the
observations they came from); prints the tables. Targets (issue 23, item 8):
request throughput and TPOT within 20 %, TTFT within 35 %, on at least 80 % of the cases.
Deterministic: same corpus and kvsim => byte-identical tables.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.serving_fit import (FIT_METRICS, FIT_PARAMS, FIT_STEP, HOST_SOURCED, fit_host_path,  # noqa: E402,F401
                               host_overrides, nnls, param_overrides, robust_fit, zero_values)
from bench.serving_fit import fit_constants as _fit_constants  # noqa: E402
from bench.serving_tables import (SPLITS, TARGETS, markdown, pass_rates, write_between_markers,  # noqa: E402,F401
                                  write_table)
from bench import serving_history as history  # noqa: E402
from kvsim.servebench.metrics import LATENCIES, predicted, table_metrics  # noqa: E402
from bench.serving_history import HistoryError  # noqa: E402
from bench.serving_scenarios import (HEADER, SCENARIO_DIR, TRACE_HEADER, CorpusError, PROFILE_NOTES,  # noqa: E402,F401
                                     _concurrency, _engine, no_p2p, read_trace, scenario_text, trace_file_text, trace_path,
                                     trace_text,
                                     write_scenarios)

CORPUS = ROOT / "scenarios" / "validation" / "corpus.csv"
LENGTHS = "lengths.csv"  # per-request lengths of the sharegpt cases, beside the corpus
OUT_DIR = ROOT / "results" / "validation"
DOC = ROOT / "docs" / "validation.md"
REQUIRED = ("case_id", "source_url", "source_date", "engine", "engine_version", "engine_profile", "kvsim_model",
            "kvsim_gpu",
            "tensor_parallel", "weight_dtype", "dataset", "input_len", "output_len", "num_prompts",
            "request_rate", "max_concurrency", "stat", "split")
METRICS = ("request_throughput", "output_throughput", "ttft_ms", "tpot_ms", "e2el_ms")  # where printed
HISTORY_COLUMNS = ("history_runs", "hit_rate_printed", "hit_rate_kvsim")  # cases with a server history
DOC_START, DOC_END = "<!-- validation-tables:start -->", "<!-- validation-tables:end -->"


def load_corpus(path: Path = CORPUS) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    seen = set()
    for i, row in enumerate(rows, start=2):  # line 1 is the header
        for key in REQUIRED:
            if not (row.get(key) or "").strip():
                raise CorpusError(f"{path}: line {i}: field {key!r} is missing")
        if row["case_id"] in seen:
            raise CorpusError(f"{path}: line {i}: case_id {row['case_id']!r} appears twice")
        seen.add(row["case_id"])
        if row["split"] not in ("fit", "holdout"):
            raise CorpusError(f"{path}: line {i}: split {row['split']!r}: valid: fit, holdout")
        if (row.get("gpu_p2p") or "").strip() not in ("", "yes", "no"):
            raise CorpusError(f"{path}: line {i}: gpu_p2p {row['gpu_p2p']!r}: valid: yes, no, or empty (yes)")
        if row["stat"] not in ("mean", "median"):
            raise CorpusError(f"{path}: line {i}: stat {row['stat']!r}: valid: mean, median")
        if row["engine_profile"] not in _profile_names():
            raise CorpusError(f"{path}: line {i}: engine_profile {row['engine_profile']!r}: valid: "
                              f"{', '.join(_profile_names())}")
        if row["dataset"] not in DATASETS:
            raise CorpusError(f"{path}: line {i}: dataset {row['dataset']!r}: valid: {', '.join(DATASETS)} "
                              "(sharegpt: with every request's lengths in lengths.csv)")
        _check_engine_fields(path, i, row)
        if not any((row.get(m) or "").strip() for m in METRICS):
            raise CorpusError(f"{path}: line {i}: no published metric ({', '.join(METRICS)})")
    lengths = load_lengths(path.parent / LENGTHS) if any(r["dataset"] == "sharegpt" for r in rows) else {}
    for i, row in enumerate(rows, start=2):
        if row["dataset"] == "sharegpt":
            got = len(lengths.get(row["case_id"], []))
            if got != int(row["num_prompts"]):
                raise CorpusError(f"{path}: line {i}: case {row['case_id']!r} has {got} requests in {LENGTHS}, "
                                  f"num_prompts is {row['num_prompts']}")
            row["_lengths"] = lengths[row["case_id"]]
    _attach_histories(path, rows)
    fitted = {deployment(r) for r in rows if r["split"] == "fit"}
    for row in rows:  # held out, and no fit case shares its deployment (--cases keeps the whole corpus's view)
        row["_new_deployment"] = row["split"] == "holdout" and deployment(row) not in fitted
    return rows


DATASETS = ("random", "sharegpt")


def _attach_histories(path: Path, rows: list[dict]) -> None:
    """``row["_history"]``: the printed runs of the case's server up to its own (serving_history.py),
    for the cases listed in server_runs.csv beside the corpus (that run must be the row's); for every
    other case that :func:`serving_history.sends_test_prompt`, its own run alone, so that its client's
    test prompt runs before it."""
    hist_path = path.parent / history.HISTORY
    runs = history.load_history(hist_path) if hist_path.exists() else {}
    ids = {r["case_id"] for r in rows}
    for case in runs:
        if case not in ids:
            raise CorpusError(f"{hist_path}: case_id {case!r} is not in {path.name}")
    for i, row in enumerate(rows, start=2):
        if row["case_id"] not in runs:
            if history.sends_test_prompt(row):
                row["_history"] = (history.own_run(row),)
            continue
        own = runs[row["case_id"]][-1]
        if (row["dataset"], row["request_rate"].strip(), _concurrency(row)) != ("random", "inf", None) or (
                own.num_prompts, own.input_len, own.output_len) != tuple(
                int(row[k]) for k in ("num_prompts", "input_len", "output_len")):
            raise CorpusError(f"{path}: line {i}: case {row['case_id']!r}: a server history needs a random, rate "
                              f"inf, unbounded run with the lengths and prompt count of its {hist_path.name} row")
        row["_history"] = runs[row["case_id"]]


def _profile_names() -> tuple[str, ...]:
    from kvsim.config.profiles import PROFILE_NAMES

    return PROFILE_NAMES
ENGINE_INTS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "total_input_tokens",
               "total_generated_tokens", "num_scheduler_steps")
TOTALS_BOUND = 0.05  # printed totals vs num_prompts x lengths (the inclusion rule in docs/validation.md)


def _check_engine_fields(path: Path, line: int, row: dict) -> None:
    for key in ENGINE_INTS:
        v = (row.get(key) or "").strip()
        if v and not (v.isdigit() and int(v) > 0):
            raise CorpusError(f"{path}: line {line}: {key} {v!r}: a positive integer or empty")
    v = (row.get("chunked_prefill") or "").strip()
    if v not in ("", "true", "false"):
        raise CorpusError(f"{path}: line {line}: chunked_prefill {v!r}: valid: true, false, empty")
    for key, top in (("gpu_memory_utilization", 1.0), ("kv_cache_gib", math.inf)):
        v = (row.get(key) or "").strip()
        if v:
            try:
                ok = 0 < float(v) <= top
            except ValueError:
                ok = False
            if not ok:
                raise CorpusError(f"{path}: line {line}: {key} {v!r}: a number in (0, {top:g}] or empty")
    if _engine(row, "gpu_memory_utilization") and _engine(row, "kv_cache_gib"):
        raise CorpusError(f"{path}: line {line}: give at most one of gpu_memory_utilization and kv_cache_gib")
    if row.get("dataset") == "random":
        _check_totals(path, line, row)


def _check_totals(path: Path, line: int, row: dict) -> None:
    """A random case's printed totals (where given) must be within TOTALS_BOUND of num_prompts x its
    lengths, else its lengths are not known (the run did not fix them or did not force the outputs)."""
    for key, length in (("total_input_tokens", "input_len"), ("total_generated_tokens", "output_len")):
        v = _engine(row, key)
        if not v:
            continue
        want = int(row["num_prompts"]) * int(row[length])
        if abs(int(v) - want) > TOTALS_BOUND * want:
            raise CorpusError(f"{path}: line {line}: {key} {v} is not within {TOTALS_BOUND:.0%} of num_prompts x "
                              f"{length} = {want}: the lengths are not known (docs/validation.md, inclusion rule)")


def load_lengths(path: Path) -> dict[str, list[tuple[int, int]]]:
    """case_id -> [(prompt tokens, generated tokens)] in request order, as the source printed them."""
    if not path.exists():
        raise CorpusError(f"{path}: not found (the sharegpt cases' per-request lengths)")
    out: dict[str, list[tuple[int, int]]] = {}
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=2):
            try:
                idx, isl, osl = int(r["index"]), int(r["input_len"]), int(r["output_len"])
            except (KeyError, TypeError, ValueError):
                raise CorpusError(f"{path}: line {i}: case_id, index, input_len, output_len must be integers "
                                  "(case_id text)") from None
            seq = out.setdefault(r["case_id"], [])
            if idx != len(seq) or isl < 1 or osl < 0:
                raise CorpusError(f"{path}: line {i}: index {idx} out of order or lengths {isl}/{osl} invalid")
            seq.append((isl, osl))
    return out


def zero_output_requests(row: dict) -> frozenset[int]:
    """Request indices the source printed with 0 generated tokens (its client recorded TTFT 0)."""
    return frozenset(k for k, (_, osl) in enumerate(row.get("_lengths", ())) if osl == 0)


def measure(requests, which: str, zero_ttft: frozenset[int] = frozenset(), chunk_tokens: int = 1) -> dict:
    """vLLM's benchmark metrics of one run's request table (times in ms, throughput in req/s), timed
    from each request's send, with the statistic ``which`` the source printed (mean or median): the
    run's ``serving`` summary section over these rows (kvsim.servebench.metrics.table_metrics).
    ``zero_ttft``: request ids whose TTFT the source's client recorded as 0 (no text streamed); the
    same requests' one generated token is left out of the output totals, as the client counted 0."""
    m = table_metrics(requests, zero_ttft, chunk_tokens, zero_output=zero_ttft)
    return {"request_throughput": m["request_throughput"], "output_throughput": m["output_throughput"],
            **{name: predicted(m, f"{which}_{name}") for name in LATENCIES}}


def run_case(row: dict, overrides: list[str], directory: Path = SCENARIO_DIR) -> dict:
    from kvsim.api import run
    from kvsim.config import load_scenario

    loaded = load_scenario(directory / f"{row['case_id']}.yaml", overrides)
    requests = run(loaded).requests
    chunk = loaded.base.scheduler.num_scheduler_steps  # a multi-step round streams one chunk (kvsim.sched.rounds)
    if not row.get("_history"):
        return measure(requests, row["stat"], zero_output_requests(row), chunk)
    runs = row["_history"]
    out = measure(history.measured(requests, runs), row["stat"], chunk_tokens=chunk)
    if runs[-1].hit_rate_pct is None:  # no printed hit rate to check against
        return out
    return {**out, "history_runs": len(runs), "hit_rate_printed": runs[-1].hit_rate_pct,
            "hit_rate_kvsim": round(history.hit_rate(requests), 2)}


def _published(row: dict, metric: str) -> float:
    v = (row.get(metric) or "").strip()
    return float(v) if v else math.nan


def deployment(row: dict) -> tuple:
    """What a fit case shares with the held-out cases of its sweep: model, GPU, TP, weights, engine."""
    return tuple(row.get(k, "") for k in ("kvsim_model", "kvsim_gpu", "tensor_parallel", "weight_dtype",
                                          "engine_profile"))


def compare(rows: list[dict], predictions: dict[str, dict]) -> list[dict]:
    """One table row per case: published, predicted and relative error of each metric, pass flags;
    ``new_deployment``: a held-out case whose deployment (:func:`deployment`) has no fit case in the
    corpus (``_new_deployment``, set by :func:`load_corpus`; else judged from ``rows``)."""
    fitted = {deployment(r) for r in rows if r["split"] == "fit"}
    table = []
    for row in rows:
        pred = predictions[row["case_id"]]
        out = {"case_id": row["case_id"], "split": row["split"], "stat": row["stat"],
               "new_deployment": "yes" if row.get("_new_deployment", row["split"] == "holdout"
                                                  and deployment(row) not in fitted) else ""}
        for m in METRICS:
            pub = _published(row, m)
            err = (pred[m] - pub) / pub if pub == pub and pub != 0 else math.nan
            out[f"{m}_published"] = pub
            out[f"{m}_kvsim"] = round(pred[m], 6)
            out[f"{m}_error"] = round(err, 4) if err == err else math.nan
        out.update({k: pred.get(k, "") for k in HISTORY_COLUMNS})  # "": no server history
        for m, bound in TARGETS.items():
            err = out[f"{m}_error"]
            out[f"{m}_ok"] = "" if err != err else ("yes" if abs(err) <= bound else "no")
        table.append(out)
    return table


def fit_constants(rows: list[dict], zero: dict[str, dict], bumped: dict[str, dict[str, dict]]) -> dict:
    """:func:`bench.serving_fit.fit_constants` on this corpus's targets and published values."""
    return _fit_constants(rows, zero, bumped, TARGETS, _published)


def update_docs(text: str, doc: Path = DOC) -> None:
    if not write_between_markers(doc, DOC_START, DOC_END, text):
        raise CorpusError(f"{doc}: markers {DOC_START} / {DOC_END} not found; not changed")


def run_all(rows, overrides, label, out_dir, per_case=None):
    """Run every case (``per_case(row)``: overrides of that case after ``overrides``); write the table."""
    preds = {row["case_id"]: run_case(row, [*overrides, *(per_case(row) if per_case else [])]) for row in rows}
    table = compare(rows, preds)
    if out_dir is not None:
        write_table(table, out_dir / f"{label}.csv")
    return preds, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="where the tables go (default results/validation)")
    ap.add_argument("--write-scenarios", action="store_true", help="(re)generate the cases' scenarios and stop")
    ap.add_argument("--cases", help="comma-separated case_ids (default: all)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override every case's scenario, as kvsim run --set")
    ap.add_argument("--fit", action="store_true",
                    help="fit each engine profile's unsourced constants (FIT_PARAMS) on its fit cases; tables for "
                         "the defaults, the sourced terms only, and the fitted constants")
    ap.add_argument("--update-docs", action="store_true", help="write the tables into docs/validation.md")
    args = ap.parse_args(argv)
    try:
        rows = load_corpus(args.corpus)
        if args.cases:
            keep = set(args.cases.split(","))
            unknown = keep - {r["case_id"] for r in rows}
            if unknown:
                raise CorpusError(f"--cases: unknown {', '.join(sorted(unknown))}")
            rows = [r for r in rows if r["case_id"] in keep]
        if args.write_scenarios:
            for p in write_scenarios(rows):
                print(f"wrote {p.relative_to(ROOT)}")
            return 0
        texts, summary = [], {"corpus": str(args.corpus.relative_to(ROOT)) if args.corpus.is_relative_to(ROOT)
                              else str(args.corpus), "cases": len(rows), "overrides": args.set}
        _, table = run_all(rows, args.set, "default", args.out)
        texts.append(markdown(table, "kvsim defaults (each case's engine_profile)" if not args.set
                              else f"kvsim with {' '.join(args.set)}"))
        summary["default"] = pass_rates(table)
        texts.append(history.markdown(table))
        if args.fit:
            zero, ztable = run_all(rows, args.set, "no_fitted", args.out,
                                   lambda r: param_overrides(zero_values(r), r["engine_profile"])
                                   + (host_overrides(HOST_SOURCED) if no_p2p(r) else []))
            texts.append(markdown(ztable, "sourced terms only: the fitted constants at 0 ("
                                          + ", ".join(sorted({p for ps in FIT_PARAMS.values() for p in ps})) + ")"))
            # the no-peer-access fit cases fit the host path only (below), not the profiles' constants
            profile_rows = [r for r in rows if not no_p2p(r)]
            fit_rows = [r for r in profile_rows if r["split"] == "fit" and r["engine_profile"] in FIT_PARAMS]
            bumped = {}
            for param, step in FIT_STEP.items():
                these = [r for r in fit_rows if param in FIT_PARAMS[r["engine_profile"]]]
                bumped[param], _ = run_all(
                    these, args.set, None, None,
                    lambda r, p=param, d=step: param_overrides({**zero_values(r), p: d}, r["engine_profile"]))
            fit = fit_constants(profile_rows, zero, bumped)
            values = {p: f["values"] for p, f in fit.items()}

            def fitted_overrides(r, host):
                return (param_overrides(values.get(r["engine_profile"], {}), r["engine_profile"])
                        + (host_overrides(host) if no_p2p(r) else []))

            host_rows = [r for r in rows if r["split"] == "fit" and no_p2p(r)]
            host = fit_host_path(host_rows, lambda r, h: run_case(r, [*args.set, *fitted_overrides(r, h)]),
                                 TARGETS, _published) if host_rows else None
            summary["fit"] = {**fit, **({"host_path": host} if host else {})}
            _, ftable = run_all(rows, args.set, "fitted", args.out,
                                lambda r: fitted_overrides(r, host["values"] if host else HOST_SOURCED))
            host_text = (f"; host path (gpu_p2p: false): efficiency = {host['values']['efficiency']:.6g}, "
                         f"latency = {host['values']['latency_s']:.6g} s" if host else "")
            texts.append(markdown(ftable, "fitted on the fit cases (held-out cases not used): "
                                          + "; ".join(f"{p}: " + ", ".join(f"{k} = {v:.6g} s" for k, v in vs.items())
                                                      for p, vs in values.items()) + host_text))
            summary["no_fitted"], summary["fitted"] = pass_rates(ztable), pass_rates(ftable)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        text = "\n".join(texts)
        print(text)
        if args.update_docs:
            update_docs(text)
    except (CorpusError, HistoryError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
