"""``kvsim replay --engine vllm SCENARIO --out DIR``: the scenario's trace through a running vLLM.

Requests are added at their trace arrival times (wall clock from the replay's start; an arrival
that falls during a step is added right after it, as a server's next schedule would see it; with
``client:``, when the closed-loop client sends them, kvsim/client.py), and
the engine steps while it has work. Each step becomes one step row and each request one request
row, built with kvsim's own row builders (:class:`~kvsim.metrics.recorder.StepRecorder`,
:class:`~kvsim.metrics.request_log.RequestLog`) and summarised by
:func:`kvsim.metrics.summarize.summarize`, so the directory reads like a ``kvsim run`` output and
``kvsim compare`` puts it beside a prediction. Times are measured: ``arrival_s`` is the trace's,
``admitted_s`` the start of the step that first scheduled the request, ``first_token_s`` /
``finish_s`` the end of the step that returned its first / last token.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsim.client import ClosedLoopClient, client_record
from kvsim.kv.base import MemoryParts
from kvsim.metrics.recorder import StepRecorder
from kvsim.metrics.request_log import RequestLog
from kvsim.metrics.requests import log_table
from kvsim.metrics.summarize import SummaryInputs, summarize
from kvsim.models.geometry import KVGeometry
from kvsim.realengine.tokens import prompt_tokens
from kvsim.realengine.vllm_engine import (Engine, EngineError, EngineSettings, check_kv_cache_dtype,
                                           read_model_config)
from kvsim.sched.request import RequestStatus

ENGINE_STEPS_FILE = "engine_steps.parquet"  # per engine step: the shape vLLM scheduled and its wall time


@dataclass
class ReplayedRequest:
    """The attributes a request row is built from (kvsim.metrics.request_log.NUMERIC_COLUMNS)."""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int = 0
    admitted_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    num_preemptions: int = 0
    recomputed_tokens: int = 0
    num_swaps: int = 0
    cached_tokens: int = 0
    cpu_hit_tokens: int = 0
    ssd_hit_tokens: int = 0
    remote_hit_tokens: int = 0
    load_s: float = 0.0
    hidden_s: float = 0.0
    priority: int = 0
    num_samples: int = 1
    replica: int = 0
    status: RequestStatus = RequestStatus.WAITING
    reject_reason: str = ""


# scenario weight_dtype -> the vLLM dtype the dummy weights (and activations) run in
ENGINE_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# scenario kv_dtype -> vLLM kv_cache_dtype ("auto": the model's dtype, which must then be the same)
ENGINE_KV_DTYPES = {"fp8": "fp8"}
VLLM_VICTIM = "latest_admitted"  # vLLM 0.32 v1 Scheduler preempts self.running.pop() (FCFS): the latest admitted
VLLM_EVICTION = "lru"  # vLLM 0.32 v1 BlockPool reuses the least recently freed cached block first


def settings_for(scn, model_file: Path, threads: int, device: str, eager: bool,
                 where: str = "scenario") -> EngineSettings:
    """The engine settings a scenario asks for; anything vLLM 0.32 cannot be told is refused here, one
    line naming ``where`` (the scenario file, as ``kvsim run`` names it), the key, its value and what
    vLLM would run instead (docs/replay.md, "What runs")."""
    a, s = scn.allocator, scn.scheduler
    if a.kind != "paged":
        raise EngineError(f"{where}: allocator.kind is {a.kind!r}; the vLLM engine replays only 'paged'")
    # (auto-vllm-v0 recomputes one-sequence requests, and a trace with num_samples > 1 is refused:
    # refuse_samples)
    if s.preemption_mode == "swap":
        raise EngineError(f"{where}: scheduler.preemption_mode is {s.preemption_mode!r}; vLLM v1 preempts by "
                          "recompute only: set it to 'recompute'")
    if scn.replicas.count != 1:
        raise EngineError(f"{where}: replicas.count is {scn.replicas.count}; replay runs one engine (set it to 1)")
    if scn.allocator_offload() is not None:
        raise EngineError(f"{where}: allocator.offload is set; the vLLM replay has no KV tiers (remove it)")
    if s.async_scheduling:
        raise EngineError(f"{where}: scheduler.async_scheduling is true; the vLLM replay steps its engine one "
                          "step at a time, without async scheduling: set it to false")
    if scn.frontend is not None:
        raise EngineError(f"{where}: frontend is set; the vLLM replay drives the engine in this process, without "
                          "an API server to measure: remove it")
    _refuse_unreplayable(scn, where)
    dtype = ENGINE_DTYPES[scn.weight_dtype]
    kv_dtype = ENGINE_KV_DTYPES.get(scn.kv_dtype, "auto")
    blocks = scn.kv_budget_bytes() // scn.kv_geometry().bytes_per_token // a.block_size
    tokens = s.token_budget(scn.model.max_model_len_tokens)  # the simulator's, engine profile's fill included
    return EngineSettings(model_config=model_file, block_size=a.block_size, num_blocks=int(blocks) + 1,
                          max_num_seqs=s.max_num_seqs, max_num_batched_tokens=int(tokens),
                          max_model_len=scn.model.max_model_len_tokens, chunked_prefill=s.chunked_prefill,
                          prefix_caching=scn.allocator_prefix_caching(), device=device,
                          threads=threads, seed=scn.seed, dtype=dtype, kv_cache_dtype=kv_dtype,
                          reserve_full_isl=s.reserve_full_isl, enforce_eager=eager)


def _refuse_unreplayable(scn, where: str) -> None:
    """One line for a scenario key whose value vLLM 0.32 cannot run: the replay would measure vLLM's own
    behaviour and report it as the scenario's (the profile that filled the key is named)."""
    a, s = scn.allocator, scn.scheduler
    filled = {re.sub(r"\[[^]]*\]", "", k) for k in scn.profile_filled()["filled"]}  # allocator[paged].x -> allocator.x

    def refuse(key: str, value, vllm: str, fix: str) -> None:
        by = f" (filled by engine_profile {scn.engine_profile})" if key in filled else ""
        raise EngineError(f"{where}: {key} is {value!r}{by}; vLLM 0.32 would run {vllm}: {fix}")

    if scn.weight_dtype not in ENGINE_DTYPES:
        refuse("weight_dtype", scn.weight_dtype, "unquantized dummy weights (the replay loads no quantized "
               "checkpoint)", f"choose {', '.join(ENGINE_DTYPES)}")
    if scn.kv_dtype not in ENGINE_KV_DTYPES and scn.kv_dtype != scn.weight_dtype:
        refuse("kv_dtype", scn.kv_dtype, f"its KV cache in the model's dtype ({scn.weight_dtype}) or fp8",
               f"set kv_dtype to {scn.weight_dtype} (weight_dtype) or fp8")
    if scn.parallel.tensor != 1 or scn.parallel.pipeline != 1:
        refuse("parallel", {"tensor": scn.parallel.tensor, "pipeline": scn.parallel.pipeline},
               "one unsharded engine (tensor 1, pipeline 1)", "set parallel.tensor and parallel.pipeline to 1")
    if a.watermark:
        refuse("allocator.watermark", a.watermark, "without a watermark (its v1 KVCacheManager keeps none)",
               "set it to 0")
    if a.prefix_caching and a.eviction.kind != VLLM_EVICTION:
        refuse("allocator.eviction", a.eviction.kind, f"{VLLM_EVICTION} eviction of cached blocks", "remove it")
    if s.chunked_prefill and s.prompt_blocks != "per_chunk":
        refuse("scheduler.prompt_blocks", s.prompt_blocks, "per_chunk (v1 allocates KV slots for each scheduled "
               "chunk)", "set it to per_chunk, or chunked_prefill: false (a whole prompt is one chunk)")
    if not s.chunked_prefill and s.prefill_only_steps:
        refuse("scheduler.prefill_only_steps", True, "false (its v1 scheduler puts admitted prompts in the running "
               "requests' decode step)", "set it to false (engine_profile vllm-v1 or vllm-0.32)")
    if s.chunked_prefill and not s.mixed_chunk:
        refuse("scheduler.mixed_chunk", False, "true (prompt chunks join the decode step)", "set it to true")
    if s.max_prefill_tokens is not None:
        refuse("scheduler.max_prefill_tokens", s.max_prefill_tokens, "no such limit (SGLang's)", "remove it")
    if s.num_scheduler_steps != 1:
        refuse("scheduler.num_scheduler_steps", s.num_scheduler_steps, "1 (multi-step scheduling was V0's)",
               "set it to 1")
    if s.victim.kind != VLLM_VICTIM:
        refuse("scheduler.victim", s.victim.kind, f"{VLLM_VICTIM} (v1 preempts the last running request)",
               "remove it")


ENGINE_STEP_COLUMNS = ("step", "start_s", "duration_s", "cpu_s", "decode_seqs", "decode_context", "prefill_seqs",
                       "prefill_tokens", "prefill_cached", "prefill_pairs", "max_prefill_cached", "new_requests",
                       "preempted", "running", "waiting", "used_blocks", "gc_s", "probe_s", "thread_s")
SHAPE_COLUMNS = ENGINE_STEP_COLUMNS[4:-3]


def engine_step_row(step: int, start: float, wall_s: float, cpu_s: float, sh, gc_s: float = 0.0,
                    probe_s: float = 0.0, thread_s: float = 0.0) -> dict:
    """One row of ``engine_steps.parquet``: the exact shape vLLM scheduled in a step and its wall time
    (what ``steps.parquet`` aggregates away: the split of KV reads between decode and prefill); ``gc_s``
    and ``probe_s``: the parts of ``cpu_s`` spent in Python's garbage collector and in reading the schedule;
    ``thread_s``: the stepping thread's own CPU time (``cpu_s`` counts every thread of the process)."""
    return {"step": step, "start_s": start, "duration_s": wall_s, "cpu_s": cpu_s,
            **{k: int(getattr(sh, k)) for k in SHAPE_COLUMNS}, "gc_s": gc_s, "probe_s": probe_s,
            "thread_s": thread_s}


CLOCKS = ("wall", "cpu")


def run_trace(eng: Engine, trace, vocab: int, seed: int, kv: KVGeometry, steps_path: Path | None,
              log=None, clock: str = "wall", client: ClosedLoopClient | None = None,
              reject: list[str] | None = None) -> tuple[list[ReplayedRequest], StepRecorder, float, list[dict]]:
    """Drive the engine through ``trace``. ``clock``: ``wall`` -- in real time (arrivals on the wall clock,
    each step lasting its wall time); ``cpu`` -- on the engine's own clock: each step lasts the process
    CPU time it took and an idle engine jumps to the next arrival, so time other processes held the
    core is not in the timeline (a shared host; docs/replay.md). The engine schedules and computes for
    real either way. ``client``: a closed loop (kvsim/client.py) sends each request when a slot frees;
    its ``arrival_s`` is then the send. ``reject``: per request, the ``reject_reason`` kvsim's scheduler
    gives it on arrival (kvsim.dropped.reject_reasons; "" to send it): such a request is recorded rejected
    at its arrival, as ``kvsim run`` records it, and never reaches the engine. Returns (requests, recorder, end_s, engine step rows
    (:func:`engine_step_row`))."""
    n = len(trace)
    arrival = trace.arrival_s if client is None else client.engine_arrival_s  # (the client writes its sends)
    prompts = [None if reject is not None and reject[i] else prompt_tokens(trace, i, vocab, seed)
               for i in range(n)]  # before the clock starts
    reqs = [ReplayedRequest(i, float(trace.arrival_s[i]), int(trace.prompt_tokens[i])) for i in range(n)]
    wanted = trace.output_tokens.astype(int)
    rec = StepRecorder(kv, path=steps_path)
    bs = eng.settings.block_size
    usable = eng.usable_blocks()
    capacity = usable * bs
    t_base = time.perf_counter() - float(trace.arrival_s[0]) if n else time.perf_counter()
    nxt, done, peak, last_end = 0, 0, 0, float(trace.arrival_s[0]) if n else 0.0
    shapes: list[dict] = []
    vnow = last_end  # the cpu clock
    while done < n:
        now = time.perf_counter() - t_base if clock == "wall" else vnow
        while nxt < n and arrival[nxt] <= now:
            reqs[nxt].arrival_s = float(arrival[nxt])
            if reject is not None and reject[nxt]:
                reqs[nxt].status = RequestStatus.REJECTED
                reqs[nxt].reject_reason = reject[nxt]
                done += 1
                if client is not None:  # its slot frees at once (kvsim/client.py)
                    client.ended(1, float(arrival[nxt]))
            else:
                eng.add(str(nxt), prompts[nxt], int(wanted[nxt]))
            nxt += 1
        if done == n:
            break
        if not eng.has_unfinished():
            wait = float(arrival[nxt]) - now
            if clock == "cpu":
                vnow = max(vnow, float(arrival[nxt]))
            elif wait > 0:
                time.sleep(wait)
            continue
        t0, t1, outs = eng.step()
        if clock == "wall":
            start, end = t0 - t_base, t1 - t_base
        else:
            start, end = vnow, vnow + eng.last_cpu_s
            vnow = end
        sh = eng.probe.last
        shapes.append(engine_step_row(len(shapes), start, t1 - t0, eng.last_cpu_s, sh, eng.last_gc_s,
                                      eng.probe.last_probe_s, eng.last_thread_s))
        if start > last_end:  # the engine waited (or the host added requests): an idle row
            rec.row(replica=0, idle=True, start_s=last_end, duration_s=start - last_end,
                    memory=_memory(sh, bs, capacity, peak, idle=True), running=sh.running, waiting=sh.waiting)
        finished = 0
        for rid in sh.scheduled:
            r = reqs[_index(rid)]
            if np.isnan(r.admitted_s):
                r.admitted_s = start
        for o in outs:
            r = reqs[_index(o.request_id)]
            got = len(o.outputs[0].token_ids) if o.outputs else 0
            if got and np.isnan(r.first_token_s):
                r.first_token_s = end
            r.output_tokens = got
            if o.finished:
                r.finish_s = end
                r.status = RequestStatus.FINISHED
                r.cached_tokens = int(o.num_cached_tokens or 0)
                # vLLM's RequestStateStats (the engine is built with log stats on)
                r.num_preemptions = int(o.metrics.num_preemptions) if o.metrics is not None else 0
                finished += 1
                done += 1
        peak = max(peak, sh.used_blocks * bs)
        rec.row(replica=0, idle=False, start_s=start, duration_s=end - start,
                memory=_memory(sh, bs, capacity, peak), batch_size=len(sh.scheduled), running=sh.running,
                prefill_tokens=sh.prefill_tokens, decode_tokens=sh.decode_tokens, waiting=sh.waiting,
                admitted=sh.new_requests, preempted=sh.preempted, finished=finished,
                kv_bytes_read=(sh.decode_context + sh.prefill_cached + sh.prefill_tokens) * kv.bytes_per_token)
        last_end = end
        if finished and client is not None:
            client.ended(finished, end)
        if log and finished and done % max(1, n // 10) == 0:
            log(f"  {done}/{n} finished at {end:.1f} s")
    rec.close()
    return reqs, rec, last_end, shapes


def _index(request_id: str) -> int:
    """Trace index of an engine request id: vLLM 0.32 appends '-<random>' to the id it was given."""
    return int(request_id.split("-", 1)[0])


def _memory(sh, bs: int, capacity: int, peak: int, idle: bool = False) -> MemoryParts:
    used = sh.used_blocks * bs
    frag = min(sh.partial_slots, used)
    return MemoryParts(token_states=used - frag, reservation=0, internal_frag=frag, external_frag=0,
                       free=capacity - used, cached_free=0, peak_used=max(peak, used), unshared=sh.held_tokens)


# ModelConfig fields that decide what the engine computes and stores: a run's model must agree with the
# config.json vLLM is built from on all of them (max_model_len_tokens is passed to vLLM as max_model_len)
ENGINE_MODEL_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
                       "intermediate_size", "vocab_size", "gated_mlp", "attention", "kv_lora_rank",
                       "qk_rope_head_dim", "q_lora_rank", "v_head_dim", "sliding_window_tokens",
                       "sliding_window_layers", "num_experts", "experts_per_token")


def model_files_of(loaded, override: str | None) -> dict[str, Path]:
    """Run name -> the config.json its engine is built from: the run's own ``model:`` when it names a
    config file (as written in the file, a variant or ``--set``; relative to the scenario's folder),
    else ``--model``; a run whose model is a preset without ``--model`` is refused, naming the key that
    set it. ``--model`` that no run needs is refused too (it would be ignored). Each file must describe
    the run's model (:data:`ENGINE_MODEL_FIELDS`): vLLM runs the file, kvsim's summary reports the
    scenario's model."""
    from kvsim.config.load import model_source
    from kvsim.models.hf import model_fields

    files: dict[str, Path] = {}
    used_override = False
    for name, scn in loaded.runs.items():
        src = loaded.model_sources.get(name) or model_source({"model": None}, None)
        where = src.key if src.key.startswith("--set") else f"{loaded.path}: {src.key}"
        if src.file is not None:
            f, cfg = read_model_config(src.file, flag=f"{where}:")
        elif override is not None:
            f, cfg = read_model_config(override)
            used_override = True
        else:
            shown = src.value.get("preset", src.value) if isinstance(src.value, dict) else src.value
            run = f" (run {name!r})" if loaded.variants else ""
            raise EngineError(f"{where}: model: {shown!r}{run} is a preset, not a config.json; the engine needs the "
                              "model's config file: give it as model: path/config.json or pass --model CONFIG.json")
        try:
            fields = model_fields(cfg, str(f))
        except Exception as e:  # noqa: BLE001 -- kvsim's reader refuses it: one line
            raise EngineError(f"{f}: {e}") from None
        for k in ENGINE_MODEL_FIELDS:
            if k in fields and fields[k] != getattr(scn.model, k):
                via = "--model" if src.file is None else where
                run = f" (run {name!r})" if loaded.variants else ""
                raise EngineError(f"{via}: {f} has {k} {fields[k]!r} but the scenario's model {scn.model.name!r}"
                                  f"{run} has {getattr(scn.model, k)!r}; vLLM would run the file's model: give "
                                  "the config.json of the model the scenario predicts (or drop the model override)")
        files[name] = f
    if override is not None and not used_override:
        raise EngineError(f"--model {override}: every run's model: is already a config.json, which its engine is "
                          "built from; --model is for a scenario whose model: is a preset: drop it")
    return files


def engine_settings(loaded, model: str | None = None, threads: int = 1, device: str = "cpu",
                    eager: bool = False) -> dict[str, EngineSettings]:
    """Run name -> the settings its engine is built with (each run's own model file, :func:`model_files_of`;
    everything else :func:`settings_for`), or one line refusing what vLLM cannot run; needs no vLLM."""
    model_files = model_files_of(loaded, model)
    return {name: settings_for(scn, model_files[name], threads, device, eager, str(loaded.path))
            for name, scn in loaded.runs.items()}


def replay_to_dir(loaded, out: Path | None, *, model: str | None = None, threads: int = 1, device: str = "cpu",
                  eager: bool = False, force: bool = False, plots: bool = True, log=None, clock: str = "wall") -> Path:
    """Replay every run (variant) of ``loaded`` on the engine and write the directory (docs/replay.md):
    the layout of ``kvsim run`` (one subdirectory per variant), under kvsim.outdir's rules."""
    from kvsim.dropped import reject_reasons
    from kvsim.outdir import atomic_out_dir, check_out_dir
    from kvsim.realengine.vllm_engine import require_vllm
    from kvsim.results import write_json, write_yaml
    from kvsim.config.resolved import resolved_dict
    from kvsim.simulate import build_trace
    from kvsim.version import __version__

    if device not in ("cpu", "cuda"):
        raise EngineError(f"--device: {device!r} is not a device the vLLM engine path runs on; choose cpu or cuda")
    if clock not in CLOCKS or (clock == "cpu" and device != "cpu"):
        raise EngineError(f"--clock: {clock!r} is not a clock for --device {device}; choose wall"
                          + (" or cpu" if device == "cpu" else " (the CPU clock does not time GPU work)"))
    settings = engine_settings(loaded, model, threads, device, eager)
    model_files = {name: st.model_config for name, st in settings.items()}
    base_dir = loaded.path.parent
    built = {name: build_trace(scn, base_dir) for name, scn in loaded.runs.items()}
    for name, (trace, _) in built.items():
        refuse_samples(trace, str(loaded.path) + (f": variants.{name}" if loaded.variants else ""))
    vllm = require_vllm()
    for st in settings.values():
        check_kv_cache_dtype(st.kv_cache_dtype, device, str(loaded.path))
    out = Path(out) if out is not None else Path("results") / f"{loaded.name}-replay-vllm"
    check_out_dir(out, "replay", force=force, protect=[loaded.path])
    with atomic_out_dir(out, "replay", force=force, protect=[loaded.path], log=log) as tmp:
        write_yaml(tmp / "scenario.resolved.yaml", {
            "kvsim_version": __version__, "scenario_file": str(loaded.path), "name": loaded.name,
            "replay": {"engine": "vllm", "version": str(vllm.__version__),
                       **({"model_file": str(next(iter(model_files.values())))} if len(set(model_files.values())) == 1
                          else {"model_files": {k: str(v) for k, v in model_files.items()}})},
            "runs": {name: {"scenario": resolved_dict(s), "trace": built[name][1],
                            "engine_settings": settings[name].provenance()} for name, s in loaded.runs.items()},
        })
        for name, scn in loaded.runs.items():
            d = tmp / name if loaded.variants else tmp
            d.mkdir(exist_ok=True)
            trace, _ = built[name]
            if log:
                log(f"{name}: starting the engine ({settings[name].num_blocks - 1} KV blocks of "
                    f"{settings[name].block_size} tokens), then {len(trace)} requests in real time")
            vocab = int(read_model_config(model_files[name])[1].get("vocab_size", 32000))
            reject = reject_reasons(scn, trace, str(loaded.path))
            if log and any(reject):
                counts = ", ".join(f"{k} {v}" for k, v in sorted(Counter(r for r in reject if r).items()))
                log(f"{name}: {sum(map(bool, reject))} requests rejected as kvsim run rejects them, not sent ({counts})")
            summary = _replay_one(scn, settings[name], trace, vocab, d, str(vllm.__version__), log, clock, reject)
            summary = {"name": name, "scenario": loaded.name, "kvsim_version": __version__, **summary}
            write_json(d / "summary.json", summary)
            if log:
                log(f"{name}: {summary['requests_finished']}/{summary['requests_total']} finished in "
                    f"{summary['measured']['wall_s']} s of engine time")
            if plots:
                from kvsim import plots as plotting

                plotting.plot_run_dir(d)
        if plots:
            from kvsim.report import write_run_report

            write_run_report(tmp, shown_name=out.name)
    return out


def refuse_samples(trace, where: str) -> None:
    """One line for a trace whose requests ask for several samples (parallel sampling or beams): the
    replay sends one sample per request, so vLLM would not run what kvsim predicts."""
    if trace.num_samples is not None and (many := trace.num_samples > 1).any():
        raise EngineError(f"{where}: its trace has {int(many.sum())} request(s) with num_samples > 1 (parallel "
                          "sampling or beams); the vLLM replay sends one sample per request: use a trace without "
                          "them (no num_samples column, trace.synthetic.sampling unset)")


def _replay_one(scn, settings: EngineSettings, trace, vocab: int, d: Path, version: str, log, clock: str,
                reject: list[str] | None = None) -> dict:
    """One run on a fresh engine; writes steps.parquet and requests.parquet into ``d``; returns the summary."""
    import pandas as pd

    from kvsim.results import write_parquet

    kv = scn.kv_geometry().with_block_size(settings.block_size)  # the run's one KV geometry
    eng = Engine(settings)
    try:
        wall0 = time.perf_counter()
        client = None if scn.client is None else ClosedLoopClient(trace.arrival_s, scn.client.max_concurrency)
        reqs, rec, end_s, shapes = run_trace(eng, trace, vocab, scn.seed, kv, d / "steps.parquet", log, clock, client,
                                             reject)
        wall = time.perf_counter() - wall0
        capacity = eng.usable_blocks() * settings.block_size
    finally:
        eng.close()
    request_log = RequestLog()
    request_log.extend(reqs)
    table = log_table(request_log, client_queue_s=None if client is None else client.queue_s())
    write_parquet(d / "requests.parquet", table)
    write_parquet(d / ENGINE_STEPS_FILE, pd.DataFrame(shapes, columns=list(ENGINE_STEP_COLUMNS)))
    steps = pd.read_parquet(d / "steps.parquet")
    summary = summarize(table, steps, SummaryInputs(
        capacity_tokens=capacity, kv=kv, prefix_caching=settings.prefix_caching,
        budget_bytes=capacity * kv.bytes_per_token, end_s=end_s,
        start_s=float(trace.arrival_s[0]) if len(trace) else 0.0, itl=rec.itl,
        slo=scn.slo.as_dict() if scn.slo is not None else None, percentiles=tuple(scn.metrics.percentiles)))
    summary["measured"] = {"engine": "vllm", "version": version, "device": settings.device,
                           "threads": settings.threads, "wall_s": round(wall, 2), "clock": clock,
                           "busy_wall_s": round(sum(r["duration_s"] for r in shapes), 3),
                           "busy_cpu_s": round(sum(r["cpu_s"] for r in shapes), 3),
                           "busy_gc_s": round(sum(r["gc_s"] for r in shapes), 3),  # of busy_cpu_s
                           "busy_probe_s": round(sum(r["probe_s"] for r in shapes), 3),  # of busy_cpu_s
                           "settings": settings.provenance(),
                           "note": "measured on a running engine (kvsim replay), not simulated"}
    if client is not None:
        summary["client"] = client_record(client.max_concurrency, table)
    return summary
