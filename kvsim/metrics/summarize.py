"""Pure pandas summaries: request and step tables in, ``summary.json`` dict out.

Every formula here is documented in docs/metrics.md. Time-weighted means weight each step row
(engine steps and idle gaps alike) by its ``duration_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvsim.metrics.itl import ITLAccumulator, pkey

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    from kvsim.models.geometry import KVGeometry
    import pandas as pd

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
MEMORY_PARTS = ["token_states", "reservation", "internal_frag", "external_frag", "free"]


def _dist(values: pd.Series) -> dict[str, float | None]:
    v = values.dropna().to_numpy(dtype=float)
    if v.size == 0:
        return {"mean": None, "std": None, "p50": None, "p90": None, "p99": None, "max": None}
    q = np.quantile(v, [0.5, 0.9, 0.99])
    return {"mean": float(v.mean()), "std": float(v.std()), "p50": float(q[0]), "p90": float(q[1]),
            "p99": float(q[2]), "max": float(v.max())}


def time_weighted_mean(values: pd.Series, weights: pd.Series) -> float:
    total = float(weights.sum())
    if total <= 0:
        return 0.0
    return float((values.to_numpy(dtype=float) * weights.to_numpy(dtype=float)).sum() / total)


@dataclass(frozen=True)
class SummaryInputs:
    """Everything :func:`summarize` needs besides the two tables (kvsim.simulate.summary_inputs
    builds it from all replicas at once; the replay from the real engine's settings).

    ``kv``: the run's KV geometry (bytes per token, page size, fetches per page: one page of a
    sequence is fetched once per layer and KV head, ``kv_access.pages_fetched``);
    ``hbm_bandwidth_bytes_per_s``: the GPU's peak (datasheet) HBM bandwidth, for
    ``kv_access.hbm_bandwidth_utilisation``; ``attention_backend``: the backend the timing model
    resolved (None: it has no attention kernel); ``moe_kernel``: how it priced an MoE model's routed
    experts (a kernel profile, ``none``; None: a dense model or a timing model without the choice); ``beam``: (forks, copied tokens) when the trace has
    beam-search requests."""

    capacity_tokens: int
    kv: KVGeometry
    budget_bytes: int
    end_s: float
    start_s: float
    prefix_caching: bool = False
    offloaded_blocks: int = 0
    copy_bandwidth_bytes_per_s: float | None = None
    num_replicas: int = 1
    itl: ITLAccumulator | None = None
    slo: dict[str, float] | None = None
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    hbm_bandwidth_bytes_per_s: float | None = None
    attention_backend: str | None = None
    moe_kernel: str | None = None
    beam: tuple[int, int] | None = None
    reserve: dict | None = None  # what the derived KV budget kept off the GPU (Scenario.reserve_summary)
    # tokens a streamed chunk carries: a multi-step round's (scheduler.num_scheduler_steps), else 1
    chunk_tokens: int = 1


def _kv_section(steps: pd.DataFrame, inp: SummaryInputs) -> dict:
    """``summary.kv``: the budget and geometry, time-weighted memory fractions, sharing and waste."""
    geometry, bytes_per_token = inp.kv, inp.kv.bytes_per_token
    dur = steps["duration_s"]
    capacity_bytes = inp.capacity_tokens * bytes_per_token
    kv = {
        "budget_bytes": int(inp.budget_bytes),
        "capacity_bytes": int(capacity_bytes),
        "capacity_tokens": int(inp.capacity_tokens),
        "bytes_per_token": int(bytes_per_token),
        "block_size": geometry.block_size,
        "geometry": geometry.to_dict(),
    }
    if inp.reserve is not None:
        kv["reserve"] = dict(inp.reserve)
    for part in MEMORY_PARTS:
        frac = steps[f"{part}_bytes"] / capacity_bytes if capacity_bytes else steps[f"{part}_bytes"] * 0.0
        kv[f"{part}_frac"] = time_weighted_mean(frac, dur)
    ts = float((steps["token_states_bytes"] * dur).sum())
    unshared = float((steps["unshared_bytes"] * dur).sum())
    # KV that sharing (prefix blocks, parallel samples' prompts) saved, over the unshared footprint
    kv["sharing_saving_frac"] = 1.0 - ts / unshared if unshared > 0 else 0.0
    # the vLLM paper's memory-waste view: what allocated KV memory does not hold token states
    waste = float(((steps["reservation_bytes"] + steps["internal_frag_bytes"] + steps["external_frag_bytes"])
                   * dur).sum())
    allocated = waste + ts
    kv["fragmentation_frac"] = waste / allocated if allocated > 0 else 0.0
    if inp.beam is not None:  # beam search: forks and the KV they copied (paged: partial blocks; extents: whole beams)
        kv["beam_forks"] = int(inp.beam[0])
        kv["beam_copied_bytes"] = int(inp.beam[1]) * int(bytes_per_token)
    kv["peak_used_frac"] = float(steps["peak_used_bytes"].max() / capacity_bytes) if len(steps) and capacity_bytes else 0.0
    return kv


def _request_section(requests: pd.DataFrame, fin: pd.DataFrame, rejected: pd.DataFrame, duration: float,
                     serving: dict, itl: ITLAccumulator | None, chunk_tokens: int = 1) -> dict:
    """Request counts, throughputs and latency distributions (the summary's first keys, in order)."""
    out_tokens = float(fin["output_tokens"].sum())
    norm = (fin["e2e_s"] / fin["output_tokens"]).mean() if len(fin) else math.nan
    return {
        "requests_total": int(len(requests)),
        "requests_finished": int(len(fin)),
        "requests_rejected": int(len(rejected)),
        "requests_unfinished": int(len(requests) - len(fin) - len(rejected)),
        "rejected_by_reason": {str(k): int(v) for k, v in sorted(rejected["reject_reason"].value_counts().items())},
        "duration_s": duration,
        "throughput_requests_per_s": len(fin) / duration if duration > 0 else 0.0,
        "throughput_output_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
        "throughput_input_tokens_per_s": serving["input_throughput"],
        "throughput_total_tokens_per_s": serving["total_token_throughput"],
        "ttft_s": _dist(fin["ttft_s"]),
        "tpot_s": _dist(fin["tpot_s"]),
        "itl_s": {**(itl or ITLAccumulator()).summary(), **itl_stalls(requests, itl, chunk_tokens)},
        "e2e_s": _dist(fin["e2e_s"]),
        "normalized_latency_s_per_token": None if math.isnan(norm) else float(norm),
    }


def _movement_section(requests: pd.DataFrame, steps: pd.DataFrame, inp: SummaryInputs) -> dict:
    """Preemptions, swaps, the prefix cache and host transfers."""
    bytes_per_token, block_size = inp.kv.bytes_per_token, inp.kv.block_size
    return {
        "preemptions": int(requests["preemptions"].sum()),
        "preemptions_by_mode": {"recompute": int(requests["preemptions"].sum() - requests["swaps"].sum()),
                                "swap": int(requests["swaps"].sum())},
        "swapped_out_bytes": int(steps["swap_out_bytes"].sum()),
        "swapped_in_bytes": int(steps["swap_in_bytes"].sum()),
        "prefix_cache": _prefix_cache(requests, steps, block_size, bytes_per_token, inp.offloaded_blocks)
        if inp.prefix_caching else None,
        "transfer": {
            "swap_in_bytes": int(steps["swap_in_bytes"].sum()),
            "swap_out_bytes": int(steps["swap_out_bytes"].sum()),
            "needed_s": float(requests["transfer_s"].sum()),
            "hidden_by_prefetch_s": float(requests["transfer_hidden_s"].sum()),
        },
        "recomputed_tokens": int(requests["recomputed_tokens"].sum()),
    }


def _engine_section(requests: pd.DataFrame, steps: pd.DataFrame, duration: float, inp: SummaryInputs) -> dict:
    """Engine steps, busy time, the step-time breakdown, KV reads and the replicas."""
    geometry, dur, is_step = inp.kv, steps["duration_s"], ~steps["idle"]
    step_time_total = float(dur[is_step].sum())
    breakdown = {c: float(steps.loc[is_step, c].sum()) for c in steps.columns
                 if c.endswith("_s") and c not in ("start_s", "duration_s")}
    n = inp.num_replicas
    return {
        "engine_steps": int(steps["num_steps"].sum()),
        "busy_time_s": step_time_total,
        "busy_frac": step_time_total / duration if duration > 0 else 0.0,
        "kv_bytes_read_total": int(steps["kv_bytes_read"].sum()),
        "step_time_breakdown_s": breakdown,
        "moe_kernel": inp.moe_kernel,
        "kv_bandwidth_utilisation": _bandwidth(steps, inp.copy_bandwidth_bytes_per_s),
        "kv_access": {**kv_access(steps, inp.hbm_bandwidth_bytes_per_s, geometry.fetches_per_page,
                                  geometry.kv_bytes_per_token_layer),
                      "attention_backend": inp.attention_backend},
        "replicas": {
            "count": n,
            "requests": [int((requests["replica"] == i).sum()) for i in range(n)],
            # rows of every replica cover the whole span, so the time-weighted mean per replica
            # times the count is the cluster's mean concurrency
            "concurrency_mean_total": time_weighted_mean(steps["running_mean"], dur) * n,
        },
        "time_per_kv_block_read_s": _per_block(steps, geometry.bytes_per_token * (geometry.block_size or 1)),
    }


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, inputs: SummaryInputs) -> dict:
    """The ``summary.json`` dict of a run's request and step tables (docs/metrics.md)."""
    # only the columns used below: a filtered copy of the whole table would cost its size again
    status = requests["status"]
    fin = requests.loc[status == "finished", ["output_tokens", "ttft_s", "tpot_s", "e2e_s"]]
    rejected = requests.loc[status == "rejected", ["reject_reason"]]
    del status
    duration = max(inputs.end_s - inputs.start_s, 0.0)
    dur = steps["duration_s"]
    serving = serving_metrics(requests, duration, inputs.itl, inputs.percentiles, inputs.chunk_tokens)
    return {
        **_request_section(requests, fin, rejected, duration, serving, inputs.itl, inputs.chunk_tokens),
        "concurrency": {
            "max": int(steps["running"].max()) if len(steps) else 0,
            "mean": time_weighted_mean(steps["running_mean"], dur),
            "mean_batch_size": time_weighted_mean(steps["batch_size_mean"], dur),
        },
        "kv": _kv_section(steps, inputs),
        **_movement_section(requests, steps, inputs),
        **_engine_section(requests, steps, duration, inputs),
        "serving": serving,
        "slo": slo_metrics(requests, duration, inputs.slo) if inputs.slo else None,
    }


# -- serving metrics as vLLM's serving benchmark names them (docs/metrics.md, "Serving metrics") ------

MS = 1000.0


def _dist_ms(values_s: np.ndarray, percentiles: tuple[float, ...]) -> dict[str, float | None]:
    """``{mean, median, std, p<q>..., max}`` in ms of ``values_s`` (NaN dropped), with numpy's
    mean / median / population std / linear percentiles, as ``vllm bench serve``."""
    v = values_s[~np.isnan(values_s)] * MS
    keys = ["mean", "median", "std", *(pkey(q) for q in percentiles), "max"]
    if v.size == 0:
        return dict.fromkeys(keys)
    out = {"mean": float(v.mean()), "median": float(np.median(v)), "std": float(v.std())}
    for q, x in zip(percentiles, np.percentile(v, list(percentiles))):
        out[pkey(q)] = float(x)
    out["max"] = float(v.max())
    return out


def itl_stalls(requests: pd.DataFrame, itl: ITLAccumulator | None, chunk_tokens: int = 1) -> dict[str, float | None]:
    """What the step-level ITL cannot see, exactly, from the request table: ``stall_s_total``, the
    time between the tokens of finished requests beyond the durations of the decode steps that
    produced them (preempted, swapped-out or skipped time and re-prefills), and
    ``mean_with_stalls_s`` = ``Σ n·(finish − first) / Σ n·gaps`` (n = parallel samples; gaps =
    ``output − 1``, or with multi-step rounds of ``chunk_tokens`` tokens ``ceil((output − 1) /
    chunk_tokens)``, the streamed chunks after the first token), the mean over every gap, as vLLM's
    mean ITL."""
    fin = requests.loc[requests["status"] == "finished", ["first_token_s", "finish_s", "output_tokens",
                                                          "num_samples"]]
    n = fin["num_samples"].to_numpy(dtype=np.float64)
    span = float((n * (fin["finish_s"] - fin["first_token_s"]).to_numpy(dtype=np.float64)).sum())
    after_first = fin["output_tokens"].to_numpy() - 1
    if chunk_tokens > 1:  # a round's tokens reach the client as one chunk (kvsim.sched.rounds)
        after_first = -(-after_first // chunk_tokens)
    gaps = float((n * after_first).sum())
    mean = span / gaps if gaps > 0 else None
    if itl is None:
        return {"stall_s_total": None, "mean_with_stalls_s": mean}
    itl.flush()
    stall = span - itl.sum_s
    if abs(stall) <= 1e-9 * max(span, 1e-300):  # the same steps summed in another order
        stall = 0.0
    return {"stall_s_total": max(stall, 0.0), "mean_with_stalls_s": mean}


def _itl_ms(itl: ITLAccumulator | None, percentiles: tuple[float, ...],
            stalls: dict[str, float | None]) -> dict[str, float | None]:
    d = (itl or ITLAccumulator()).summary(tuple(sorted(set(percentiles) | {50.0})))
    out = {k: (None if d[k] is None else d[k] * MS) for k in ("mean",)}
    out["median"] = None if d["p50"] is None else d["p50"] * MS
    out["std"] = None if d["std"] is None else d["std"] * MS
    for q in percentiles:
        out[pkey(q)] = None if d[pkey(q)] is None else d[pkey(q)] * MS
    out["max"] = None if d["max"] is None else d["max"] * MS
    m = stalls["mean_with_stalls_s"]
    out["mean_with_stalls"] = None if m is None else m * MS
    st = stalls["stall_s_total"]
    out["stall_total"] = None if st is None else st * MS
    return out


def serving_metrics(requests: pd.DataFrame, duration_s: float, itl: ITLAccumulator | None,
                    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES, chunk_tokens: int = 1,
                    uncounted_output_tokens: int = 0) -> dict:
    """Totals, throughputs and TTFT / TPOT / ITL / E2EL distributions in ms over finished requests
    (vLLM's "successful requests"); ITL pools the gaps of every decode token (with multi-step
    rounds, ``chunk_tokens`` > 1, of every streamed chunk). ``uncounted_output_tokens``: tokens of
    the finished requests that a benchmark's client did not count (kvsim.servebench.metrics)."""
    percentiles = tuple(float(q) for q in percentiles)
    fin = requests["status"] == "finished"
    prompt = requests.loc[fin, "prompt_tokens"].to_numpy()
    output = requests.loc[fin, "output_tokens"].to_numpy()
    total_in, total_out = int(prompt.sum()), int(output.sum()) - uncounted_output_tokens
    rate = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    return {
        "completed": int(fin.sum()),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": float(rate(int(fin.sum()))),
        "input_throughput": float(rate(total_in)),
        "output_throughput": float(rate(total_out)),
        "total_token_throughput": float(rate(total_in + total_out)),
        "percentiles": list(percentiles),
        "ttft_ms": _dist_ms(requests.loc[fin, "ttft_s"].to_numpy(dtype=float), percentiles),
        "tpot_ms": _dist_ms(requests.loc[fin, "tpot_s"].to_numpy(dtype=float), percentiles),
        "itl_ms": _itl_ms(itl, percentiles, itl_stalls(requests, itl, chunk_tokens)),
        "e2el_ms": _dist_ms(requests.loc[fin, "e2e_s"].to_numpy(dtype=float), percentiles),
    }


def good_requests(requests: pd.DataFrame, slo: dict[str, float]) -> np.ndarray:
    """Boolean mask: finished and within every objective of ``slo`` (``{ttft_ms, tpot_ms, e2e_ms}``;
    a single-token output has TPOT 0, as in vLLM's goodput)."""
    good = (requests["status"] == "finished").to_numpy()
    for key, col in (("ttft_ms", "ttft_s"), ("tpot_ms", "tpot_s"), ("e2e_ms", "e2e_s")):
        limit = slo.get(key)
        if limit is None:
            continue
        v = requests[col].to_numpy(dtype=float)
        if col == "tpot_s":
            v = np.where(requests["output_tokens"].to_numpy() <= 1, 0.0, v)
        with np.errstate(invalid="ignore"):
            good &= v <= limit / MS
    return good


def slo_metrics(requests: pd.DataFrame, duration_s: float, slo: dict[str, float]) -> dict:
    """Goodput and SLO attainment. Attainment counts every trace request: a rejected or unfinished
    request misses its objectives."""
    fin = (requests["status"] == "finished").to_numpy()
    good = good_requests(requests, slo)
    n, n_fin, n_good = len(requests), int(fin.sum()), int(good.sum())
    met = {}
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        if slo.get(key) is not None:
            met[key] = float(good_requests(requests, {key: slo[key]}).sum() / n) if n else 0.0
    return {
        "objectives_ms": {k: float(v) for k, v in slo.items() if v is not None},
        "good_requests": n_good,
        "goodput_requests_per_s": n_good / duration_s if duration_s > 0 else 0.0,
        "attainment": n_good / n if n else 0.0,
        "attainment_of_finished": n_good / n_fin if n_fin else 0.0,
        "met_frac": met,
    }


def _bandwidth(steps: pd.DataFrame, copy_bw: float | None) -> float | None:
    """KV bytes read / attention time / measured copy bandwidth (calibrated timing only); summed
    over steps, i.e. weighted by attention time."""
    att = float(steps["attention_s"].sum())
    if not copy_bw or att <= 0:
        return None
    return float(steps["kv_bytes_read"].sum()) / att / copy_bw


def kv_access(steps: pd.DataFrame, peak_bw: float | None, fetches_per_page: int,
              bytes_per_token_layer: float) -> dict:
    """How the attention kernels read the KV cache over the run (docs/metrics.md, "kv_access").

    ``kv_load_latency_ns`` (the headline's access latency): attention-kernel time per (token,
    layer) of KV read, ``Σ attention_s / (Σ kv_bytes_read / bytes_per_token_layer)``, comparable
    across layouts and page sizes; ``page_fetch_time_ns`` (= the older ``mean_access_latency_ns``):
    time per (page, KV head, layer) fetch."""
    att = float(steps["attention_s"].sum())
    kv_bytes = int(steps["kv_bytes_read"].sum())
    pages = int(steps["kv_pages_read"].sum()) * int(fetches_per_page) if "kv_pages_read" in steps else 0
    token_layers = kv_bytes / bytes_per_token_layer if bytes_per_token_layer > 0 else 0.0
    per_page = att / pages * 1e9 if att > 0 and pages > 0 else None
    return {
        "attention_kernel_s": att,
        "kv_bytes_read": kv_bytes,
        "pages_fetched": pages,
        "hbm_bandwidth_utilisation": kv_bytes / att / peak_bw if att > 0 and peak_bw else None,
        "kv_load_latency_ns": att / token_layers * 1e9 if att > 0 and token_layers > 0 else None,
        "page_fetch_time_ns": per_page,
        "mean_access_latency_ns": per_page,  # deprecated name of page_fetch_time_ns (before issue 23)
    }


def _per_block(steps: pd.DataFrame, block_bytes: int) -> float | None:
    att = float(steps["attention_s"].sum())
    blocks = float(steps["kv_bytes_read"].sum()) / block_bytes if block_bytes else 0.0
    return att / blocks if att > 0 and blocks > 0 else None


def _prefix_cache(requests: pd.DataFrame, steps: pd.DataFrame, block_size: int | None, bytes_per_token: int,
                  offloaded_blocks: int = 0) -> dict:
    """Hit ratios over first admissions: a readmission after preemption hitting its own blocks is
    not counted as a prefix hit."""
    adm = requests.loc[requests["cached_tokens"] >= 0,
                       ["prompt_tokens", "cached_tokens", "cpu_hit_tokens", "ssd_hit_tokens", "remote_hit_tokens"]]
    prompt = adm["prompt_tokens"].to_numpy()
    cached = adm["cached_tokens"].to_numpy()
    cpu = adm["cpu_hit_tokens"].to_numpy()
    ssd = adm["ssd_hit_tokens"].to_numpy()
    remote = adm["remote_hit_tokens"].to_numpy()
    bs = block_size or 1
    blocks_total = int(((prompt + bs - 1) // bs).sum())
    return {
        "hit_ratio_tokens": float(cached.sum() / prompt.sum()) if prompt.sum() else 0.0,
        "hit_ratio_blocks": float((cached // bs).sum() / blocks_total) if blocks_total else 0.0,
        "hit_tokens": int(cached.sum()),
        "evictions": int(steps["evictions"].sum()),
        "offloaded_blocks": int(offloaded_blocks),
        "tier_hits": {"gpu": int(((cached - cpu - ssd - remote) // bs).sum()), "cpu": int((cpu // bs).sum()),
                      "ssd": int((ssd // bs).sum()), "remote": int((remote // bs).sum())},
        "cached_free_frac_mean": time_weighted_mean(
            steps["cached_free_bytes"] / max(1, steps[[f"{p}_bytes" for p in MEMORY_PARTS]].sum(axis=1).max()),
            steps["duration_s"]),
    }
