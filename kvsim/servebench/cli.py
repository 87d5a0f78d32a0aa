"""``kvsim servebench RESULT.json``: run a benchmark result's load on kvsim and print both side by side.

    kvsim servebench result.json --model Llama-3.1-8B --gpu H100-SXM-80GB [--tensor 2] [--engine-profile vllm-v1]
    kvsim servebench result.json --scenario my_deployment.yaml [--set scheduler.max_num_seqs=512]

    kvsim servebench rate_*.json sweep.jsonl --scenario my_deployment.yaml   # every result of a rate sweep

Writes ``--out`` (default ``results/servebench/<first result's name>``; kvsim's output rules,
docs/outputs.md): ``scenario.yaml`` and ``trace.csv`` (rerun with ``kvsim run DIR/scenario.yaml`` for
the full output), ``comparison.csv`` and kvsim's ``summary.json``; with several results, those in
``DIR/<result name>/`` each and one ``DIR/comparison.csv`` with a ``result`` column.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

DESCRIPTION = """Read a serving-benchmark result (vllm bench serve --save-result, best with --save-detailed;
benchmark_serving.py --save-result; SGLang bench_serving.py --output-file), replay its requests (lengths,
send times or rate, burstiness and vLLM's --ramp-up-strategy, --max-concurrency) on the deployment you name, and print the benchmark's metrics
(throughputs; TTFT, TPOT, ITL and E2EL means, medians, p90s and p99s, as printed) from kvsim's serving
summary beside the printed ones, with the relative error and issue 23's targets (throughput and TPOT
means / medians within 20 %, TTFT within 35 %). The deployment is --scenario (a kvsim scenario:
model, GPU, parallelism, engine profile and settings; its trace and client are replaced) or --model and
--gpu; --tensor, --engine-profile and --set override either (of the trace and client, --set may change
only trace.length_policy)."""


def register(subparsers) -> None:
    p = subparsers.add_parser("servebench", help="kvsim beside a serving-benchmark result of yours (vllm bench serve)",
                              description=DESCRIPTION)
    p.add_argument("result", type=Path, nargs="+",
                   help="result JSON files (one object each, or one per line: --append-result); several: one "
                        "run each, DIR/<name>/ and a combined DIR/comparison.csv")
    p.add_argument("--scenario", type=Path, help="a scenario YAML naming the deployment")
    p.add_argument("--model", help="a model preset or a config.json (kvsim models lists the presets)")
    p.add_argument("--gpu", help="a GPU preset")
    p.add_argument("--tensor", type=int, help="tensor-parallel GPUs (parallel.tensor)")
    p.add_argument("--engine-profile", help="the engine profile (default: the scenario's, else vllm-v1)")
    p.add_argument("--index", type=int, help="only this result of each file (0-based; default: every one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key")
    p.add_argument("--out", type=Path, help="output directory (default results/servebench/<result name>)")
    p.add_argument("--no-test-prompt", action="store_true",
                   help="no test request before the benchmark (vllm bench serve and SGLang's bench_serving send "
                        "request 0's prompt once first; with prefix caching it stays cached for request 0)")
    p.add_argument("--force", action="store_true", help="replace another kvsim command's output directory")
    p.set_defaults(func=run)


# what --set may change of the trace servebench writes (the result file's requests and arrivals)
TRACE_SETTABLE = ("trace.length_policy",)


def _check_sets(sets: list[str]) -> None:
    """Refuse a ``--set`` of the trace or client that servebench writes from the result file: a cut,
    sliced, rescaled or replaced trace (or another concurrency bound) is not the benchmark's run."""
    from kvsim.config.load import parse_set
    from kvsim.errors import ConfigError

    for expr in sets:
        key = parse_set(expr)[0]
        head = key.split(".")[0]
        if head in ("trace", "client") and key not in TRACE_SETTABLE:
            raise ConfigError(f"--set {expr}: servebench writes the {head} from the result file (its requests, "
                              "arrivals and --max-concurrency), so the run would not be the benchmark's; valid "
                              f"choices under trace/client: {', '.join(TRACE_SETTABLE)}")


def _base(args) -> tuple[dict, Path]:
    from kvsim.config.load import read_yaml_mapping
    from kvsim.errors import ConfigError

    _check_sets(args.set)
    if args.scenario is not None:
        if not args.scenario.is_file():
            raise ConfigError(f"--scenario: {args.scenario}: no such file")
        base, base_dir = read_yaml_mapping(args.scenario), args.scenario.parent
        if base.get("variants"):
            raise ConfigError(f"{args.scenario}: variants: servebench runs one deployment; valid choices: "
                              "a scenario without variants, or one variant's keys through --set")
    elif args.model is None or args.gpu is None:
        raise ConfigError("kvsim servebench: the deployment: give --scenario FILE, or --model and --gpu")
    else:
        base, base_dir = {}, Path(".")
    for key, value in (("model", args.model), ("gpu", args.gpu), ("engine_profile", args.engine_profile)):
        if value is not None:
            base[key] = value
    if args.tensor is not None:
        base["parallel"] = {**(base.get("parallel") or {}), "tensor": args.tensor}
    return base, base_dir


def comparison_rows(published: dict[str, float], predicted: dict[str, float]) -> list[dict]:
    """One row per printed metric kvsim predicts: published, kvsim, relative error, target, within."""
    from kvsim.servebench.metrics import TARGETS

    rows = []
    for key, pub in published.items():
        got = predicted[key]
        err = (got - pub) / pub if pub and not math.isnan(got) else math.nan
        target = next((t for m, t in TARGETS.items() if key == m or key.endswith(f"_{m}")), None)
        if key.startswith(("p90_", "p99_")):
            target = None  # the targets are for means and medians
        within = "" if target is None or math.isnan(err) else ("yes" if abs(err) <= target else "no")
        rows.append({"metric": key, "published": pub, "kvsim": got, "error": err,
                     "target": "" if target is None else target, "within": within})
    return rows


def table_text(rows: list[dict]) -> str:
    lines = [f"{'metric':<22}{'published':>12}{'kvsim':>12}{'error':>9}  target"]
    for r in rows:
        err = "" if math.isnan(r["error"]) else f"{r['error']:+.1%}"
        tgt = f"±{r['target']:.0%} {r['within']}" if r["target"] != "" else ""
        lines.append(f"{r['metric']:<22}{r['published']:>12.4g}{r['kvsim']:>12.4g}{err:>9}  {tgt}")
    return "\n".join(lines)


def _csv_text(rows: list[dict], first: list[str] = ()) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[*first, "metric", "published", "kvsim", "error", "target", "within"],
                       lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "kvsim": repr(r["kvsim"]), "error": "" if math.isnan(r["error"]) else round(r["error"], 6)})
    return buf.getvalue()


def _items(args) -> list[tuple[str, object]]:
    """``(label, result)`` for every result named: each file's results in file order (a file holding
    several: ``<stem>-<index>``), labels made unique."""
    from kvsim.errors import ConfigError
    from kvsim.servebench import result as result_mod

    items, seen = [], {}
    for path in args.result:
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        found = result_mod.load_all(path, args.index)
        for res in found:
            label = path.stem if len(found) == 1 else f"{path.stem}-{res.index}"
            seen[label] = seen.get(label, 0) + 1
            items.append((label if seen[label] == 1 else f"{label}-{seen[label]}", res))
    return items


def _prepared(res, base: dict, base_dir: Path, args, where: str):
    """The scenario mapping (``--set`` applied, model expanded) and the validated scenario of one result."""
    from kvsim.config.load import apply_sets, expand_model, validate_scenario
    from kvsim.servebench import build

    raw = build.scenario_dict(res, base, base_dir, seed=int(base.get("seed", 0) or 0))
    raw = expand_model(apply_sets(raw, args.set), base_dir, where)
    return raw, validate_scenario(raw, where, sets=tuple(args.set))


def _check_test_prompt(res, test, scn) -> None:
    """Refuse a run whose test prompt (trace request 0, ``test``: its row) was rejected or did not
    finish before the benchmark: the client stops when its test prompt fails."""
    from kvsim.errors import ConfigError
    from kvsim.servebench import build

    reason = next((r for r in test["reject_reason"] if isinstance(r, str) and r), "")
    if reason:
        why = (f"{res.input_lens[0]} prompt + {max(1, res.output_lens[0])} output tokens exceed the model's "
               f"max_model_len {scn.model.max_model_len_tokens}" if reason == "exceeds_max_model_len" else "")
        raise ConfigError(f"{res.path}: the test prompt (request 0's, sent first) was rejected: {reason}"
                          + (f" ({why})" if why else "") + "; the benchmark's client stops when its test prompt "
                          "fails: rerun with --no-test-prompt, or on a deployment that serves request 0")
    if not (test["finish_s"] < build.TEST_PROMPT_GAP_S).all():
        raise ConfigError(f"{res.path}: the test prompt did not finish within {build.TEST_PROMPT_GAP_S:g} s "
                          "of simulated time; rerun with --no-test-prompt")


def _unserved_warning(res, reqs, report: dict) -> str | None:
    """``kvsim run``'s warning (kvsim.dropped) when more than 5 % of the benchmark's requests (``reqs``:
    their rows of the request table) were not served, and a plain one when none was."""
    from kvsim.dropped import Dropped

    status = reqs["status"]
    rejected = reqs.loc[status == "rejected", "reject_reason"].value_counts()
    d = Dropped(trace_requests=res.num_requests, simulated=len(reqs), finished=int((status == "finished").sum()),
                rejected_by_reason={str(k): int(v) for k, v in rejected.items()},
                unfinished=int((status == "unfinished").sum()),
                dropped_by_length_policy=max(0, res.num_requests - len(reqs)),
                capped_by_length_policy=int(report.get("capped", 0) or 0))
    name = f"{res.path}" + (f" (result {res.index})" if res.index else "")
    if d.finished:
        return d.warning(name)
    fix = "; ".join(d.fixes())
    return (f"kvsim: warning: {name}: kvsim served none of its {d.trace_requests} requests "
            f"({'; '.join(p for p in d.parts() if 'capped' not in p)}): its throughputs are 0 and its latencies "
            "empty" + (f". Fix: {fix}" if fix else ""))


def _run_one(tmp: Path, res, raw: dict, scn, where: str, test_prompt: bool) -> list[dict]:
    """Write one result's trace and scenario into ``tmp``, run it, write its comparison and summary."""
    from kvsim.errors import ConfigError, TraceError
    from kvsim.servebench import build
    from kvsim.servebench.metrics import predicted, table_metrics
    from kvsim.simulate import run as simulate

    tmp.mkdir(parents=True, exist_ok=True)
    if res.chunk_tokens > 1 and res.chunk_tokens != scn.scheduler.num_scheduler_steps:
        print(f"note: {res.path}: its streamed gaps show one chunk per {res.chunk_tokens} tokens after the first (vLLM "
              f"0.6's multi-step scheduling, --num-scheduler-steps {res.chunk_tokens}); this run has "
              f"scheduler.num_scheduler_steps {scn.scheduler.num_scheduler_steps}: add --set "
              f"scheduler.num_scheduler_steps={res.chunk_tokens} (engine_profile vllm-v0.6)", file=sys.stderr)
    if (note := build.failed_note(res)) is not None:
        print(f"note: {res.path}: {note}", file=sys.stderr)
    _, how = build.arrivals(res, scn.seed)
    (tmp / "trace.csv").write_text(build.trace_text(res, scn.seed, test_prompt))
    (tmp / "scenario.yaml").write_text(build.scenario_text(res, raw, how, test_prompt))
    try:
        ran = simulate(scn, tmp, where=where)
    except TraceError as e:  # the trace kvsim wrote from the result: name the result, not the hidden file
        why = str(e).removeprefix(f"{tmp / 'trace.csv'}: ")
        raise ConfigError(f"{res.path}: its requests as a kvsim trace: {why}") from None
    reqs, shift = ran.requests, 0
    if test_prompt:  # the benchmark's own requests: trace requests 1.. (request 0 is the test prompt)
        _check_test_prompt(res, reqs[reqs["request_id"] == 0], scn)
        reqs, shift = reqs[reqs["request_id"] >= 1], 1
    # the serving section (kvsim.metrics.summarize.serving_metrics) of the benchmark's own requests,
    # with the TTFT of a request that streamed no text at 0 and its output tokens (kvsim generates
    # one for a 0-token output) left out of the totals, as the client counted them; the ITL
    # distribution over decode steps is the run's (a request table has no step times; the test
    # prompt's few steps are in it), its mean over every gap the benchmark requests' own
    serving = table_metrics(reqs, frozenset(i + shift for i in res.zero_ttft), scn.scheduler.num_scheduler_steps,
                            build.benchmark_start_s(test_prompt),
                            frozenset(i + shift for i, o in enumerate(res.output_lens) if o == 0))
    serving["itl_ms"] = {**ran.summary["serving"]["itl_ms"],
                         "mean_with_stalls": serving["itl_ms"]["mean_with_stalls"]}
    rows = comparison_rows(res.published, {k: predicted(serving, k) for k in res.published})
    (tmp / "comparison.csv").write_text(_csv_text(rows))
    (tmp / "summary.json").write_text(json.dumps(ran.summary, indent=1, sort_keys=True, default=str) + "\n")
    print(f"{res.path}" + (f" (result {res.index})" if res.index else "")
          + f": {res.num_requests} requests ({'per-request lengths' if res.per_request else 'mean lengths'}); "
          f"arrivals: {how}" + (f"; client max_concurrency {res.max_concurrency}" if res.max_concurrency else ""))
    print(f"kvsim: {scn.model.name} on {scn.parallel.tensor}x {scn.gpu.name}, engine profile {scn.engine_profile}")
    print(table_text(rows))
    if (warning := _unserved_warning(res, reqs, ran.trace_report)) is not None:
        print(warning, file=sys.stderr)
    return rows


def run(args) -> int:
    from kvsim.outdir import atomic_out_dir

    items = _items(args)
    base, base_dir = _base(args)
    where = str(args.scenario) if args.scenario else "servebench scenario"
    ready = [(label, res, *_prepared(res, base, base_dir, args, f"{where} for {res.path}")) for label, res in items]
    out = args.out or Path("results") / "servebench" / items[0][0]
    protect = [*args.result] + ([args.scenario] if args.scenario else [])
    combined = []
    with atomic_out_dir(out, "servebench", force=args.force, protect=protect) as tmp:
        for label, res, raw, scn in ready:
            d = tmp if len(ready) == 1 else tmp / label
            rows = _run_one(d, res, raw, scn, where, not args.no_test_prompt)
            combined += [{"result": label, **r} for r in rows]
        if len(ready) > 1:
            (tmp / "comparison.csv").write_text(_csv_text(combined, ["result"]))
    flags = [r["within"] for r in combined if r["within"]]
    print(f"within target: {flags.count('yes')} of {len(flags)} printed means and medians with a target")
    print(f"wrote {out}/" + (" (scenario.yaml, trace.csv, comparison.csv, summary.json)" if len(ready) == 1
                             else f" ({len(ready)} result directories and comparison.csv)"))
    return 0
