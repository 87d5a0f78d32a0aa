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

import time
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
from kvsim.realengine.vllm_engine import Engine, EngineError, EngineSettings, read_model_config
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


def settings_for(scn, model_file: Path, threads: int, device: str, eager: bool,
                 where: str = "scenario") -> EngineSettings:
    """The engine settings a scenario asks for; anything vLLM cannot be told is refused here, one
    line naming ``where`` (the scenario file, as ``kvsim run`` names it)."""
    a, s = scn.allocator, scn.scheduler
    if a.kind != "paged":
        raise EngineError(f"{where}: allocator.kind is {a.kind!r}; the vLLM engine replays only 'paged'")
    if s.preemption_mode != "recompute":
        raise EngineError(f"{where}: scheduler.preemption_mode is {s.preemption_mode!r}; vLLM v1 preempts by "
                          "recompute only: set it to 'recompute'")
    if scn.replicas.count != 1:
        raise EngineError(f"{where}: replicas.count is {scn.replicas.count}; replay runs one engine (set it to 1)")
    if scn.allocator_offload() is not None:
        raise EngineError(f"{where}: allocator.offload is set; the vLLM replay has no KV tiers (remove it)")
    if s.async_scheduling:
        raise EngineError(f"{where}: scheduler.async_scheduling is true; the vLLM replay steps its engine one "
                          "step at a time, without async scheduling: set it to false")
    blocks = scn.kv_budget_bytes() // scn.kv_geometry().bytes_per_token // a.block_size
    tokens = s.token_budget(scn.model.max_model_len_tokens)  # the simulator's, engine profile's fill included
    return EngineSettings(model_config=model_file, block_size=a.block_size, num_blocks=int(blocks) + 1,
                          max_num_seqs=s.max_num_seqs, max_num_batched_tokens=int(tokens),
                          max_model_len=scn.model.max_model_len_tokens, chunked_prefill=s.chunked_prefill,
                          prefix_caching=scn.allocator_prefix_caching(), device=device,
                          threads=threads, seed=scn.seed, enforce_eager=eager)


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
              log=None, clock: str = "wall", client: ClosedLoopClient | None = None
              ) -> tuple[list[ReplayedRequest], StepRecorder, float, list[dict]]:
    """Drive the engine through ``trace``. ``clock``: ``wall`` -- in real time (arrivals on the wall clock,
    each step lasting its wall time); ``cpu`` -- on the engine's own clock: each step lasts the process
    CPU time it took and an idle engine jumps to the next arrival, so time other processes held the
    core is not in the timeline (a shared host; docs/replay.md). The engine schedules and computes for
    real either way. ``client``: a closed loop (kvsim/client.py) sends each request when a slot frees;
    its ``arrival_s`` is then the send. Returns (requests, recorder, end_s, engine step rows
    (:func:`engine_step_row`))."""
    n = len(trace)
    arrival = trace.arrival_s if client is None else client.engine_arrival_s  # (the client writes its sends)
    prompts = [prompt_tokens(trace, i, vocab, seed) for i in range(n)]  # before the clock starts
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
            eng.add(str(nxt), prompts[nxt], int(wanted[nxt]))
            reqs[nxt].arrival_s = float(arrival[nxt])
            nxt += 1
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


def model_file_of(loaded, override: str | None) -> Path:
    """The config.json the engine is built from: ``--model``, else the scenario's ``model:`` when it is a
    config file (relative to the scenario's folder)."""
    from kvsim.config import read_yaml_mapping
    from kvsim.models.hf import is_config_path

    if override is not None:
        return read_model_config(override)[0]
    raw = read_yaml_mapping(loaded.path).get("model")
    name = raw.get("preset") if isinstance(raw, dict) else raw
    if not (isinstance(name, str) and is_config_path(name, loaded.path.parent)):
        raise EngineError(f"{loaded.path}: model: {name!r} is a preset, not a config.json; the engine needs the "
                          "model's config file: give it as model: path/config.json or pass --model CONFIG.json")
    p = Path(name).expanduser()
    return read_model_config(p if p.is_absolute() else loaded.path.parent / p, flag=f"{loaded.path}: model:")[0]


def replay_to_dir(loaded, out: Path | None, *, model: str | None = None, threads: int = 1, device: str = "cpu",
                  eager: bool = False, force: bool = False, plots: bool = True, log=None, clock: str = "wall") -> Path:
    """Replay every run (variant) of ``loaded`` on the engine and write the directory (docs/replay.md):
    the layout of ``kvsim run`` (one subdirectory per variant), under kvsim.outdir's rules."""
    from kvsim.outdir import atomic_out_dir, check_out_dir
    from kvsim.realengine.vllm_engine import require_vllm
    from kvsim.results import write_json, write_yaml
    from kvsim.simulate import build_trace, resolved_dict
    from kvsim.version import __version__

    if device not in ("cpu", "cuda"):
        raise EngineError(f"--device: {device!r} is not a device the vLLM engine path runs on; choose cpu or cuda")
    if clock not in CLOCKS or (clock == "cpu" and device != "cpu"):
        raise EngineError(f"--clock: {clock!r} is not a clock for --device {device}; choose wall"
                          + (" or cpu" if device == "cpu" else " (the CPU clock does not time GPU work)"))
    model_file = model_file_of(loaded, model)
    vocab = int(read_model_config(model_file)[1].get("vocab_size", 32000))
    settings = {name: settings_for(scn, model_file, threads, device, eager, str(loaded.path))
                for name, scn in loaded.runs.items()}
    vllm = require_vllm()
    out = Path(out) if out is not None else Path("results") / f"{loaded.name}-replay-vllm"
    check_out_dir(out, "replay", force=force, protect=[loaded.path])
    base_dir = loaded.path.parent
    with atomic_out_dir(out, "replay", force=force, protect=[loaded.path], log=log) as tmp:
        built = {name: build_trace(scn, base_dir) for name, scn in loaded.runs.items()}
        write_yaml(tmp / "scenario.resolved.yaml", {
            "kvsim_version": __version__, "scenario_file": str(loaded.path), "name": loaded.name,
            "replay": {"engine": "vllm", "version": str(vllm.__version__), "model_file": str(model_file)},
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
            summary = _replay_one(scn, settings[name], trace, vocab, d, str(vllm.__version__), log, clock)
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


def _replay_one(scn, settings: EngineSettings, trace, vocab: int, d: Path, version: str, log, clock: str) -> dict:
    """One run on a fresh engine; writes steps.parquet and requests.parquet into ``d``; returns the summary."""
    import pandas as pd

    from kvsim.results import write_parquet

    kv = scn.kv_geometry().with_block_size(settings.block_size)  # the run's one KV geometry
    eng = Engine(settings)
    try:
        wall0 = time.perf_counter()
        client = None if scn.client is None else ClosedLoopClient(trace.arrival_s, scn.client.max_concurrency)
        reqs, rec, end_s, shapes = run_trace(eng, trace, vocab, scn.seed, kv, d / "steps.parquet", log, clock, client)
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
