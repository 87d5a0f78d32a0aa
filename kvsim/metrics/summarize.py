"""Pure pandas summaries: request and step tables in, ``summary.json`` dict out.

Every formula here is documented in docs/metrics.md. Time-weighted means weight each step row
(engine steps and idle gaps alike) by its ``duration_s``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

MEMORY_PARTS = ["token_states", "reservation", "internal_frag", "external_frag", "free"]


def _dist(values: pd.Series) -> dict[str, float | None]:
    v = values.dropna().to_numpy(dtype=float)
    if v.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    q = np.quantile(v, [0.5, 0.9, 0.99])
    return {"mean": float(v.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
            "max": float(v.max())}


def time_weighted_mean(values: pd.Series, weights: pd.Series) -> float:
    total = float(weights.sum())
    if total <= 0:
        return 0.0
    return float((values.to_numpy(dtype=float) * weights.to_numpy(dtype=float)).sum() / total)


def summarize(requests: pd.DataFrame, steps: pd.DataFrame, *, capacity_tokens: int, bytes_per_token: int,
              prefix_caching: bool = False, offloaded_blocks: int = 0,
              copy_bandwidth_bytes_per_s: float | None = None, num_replicas: int = 1,
              block_size_tokens: int | None, budget_bytes: int, end_s: float, start_s: float,
              hbm_bandwidth_bytes_per_s: float | None = None, page_fetches_per_page: int = 1) -> dict:
    """``hbm_bandwidth_bytes_per_s``: the GPU's peak (datasheet) HBM bandwidth, for
    ``kv_access.hbm_bandwidth_utilisation``; ``page_fetches_per_page``: layers x KV heads -- one
    page of a sequence is fetched once per layer and KV head (``kv_access.pages_fetched``)."""
    # only the columns used below: a filtered copy of the whole table would cost its size again
    status = requests["status"]
    fin = requests.loc[status == "finished", ["output_tokens", "ttft_s", "tpot_s", "e2e_s"]]
    rejected = requests.loc[status == "rejected", ["reject_reason"]]
    del status
    duration = max(end_s - start_s, 0.0)
    dur = steps["duration_s"]
    capacity_bytes = capacity_tokens * bytes_per_token
    is_step = ~steps["idle"]

    kv = {
        "budget_bytes": int(budget_bytes),
        "capacity_bytes": int(capacity_bytes),
        "capacity_tokens": int(capacity_tokens),
        "bytes_per_token": int(bytes_per_token),
        "block_size_tokens": block_size_tokens,
    }
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
    kv["peak_used_frac"] = float(steps["peak_used_bytes"].max() / capacity_bytes) if len(steps) and capacity_bytes else 0.0

    out_tokens = float(fin["output_tokens"].sum())
    norm = (fin["e2e_s"] / fin["output_tokens"]).mean() if len(fin) else math.nan
    step_time_total = float(dur[is_step].sum())
    breakdown = {c: float(steps.loc[is_step, c].sum()) for c in steps.columns
                 if c.endswith("_s") and c not in ("start_s", "duration_s")}
    return {
        "requests_total": int(len(requests)),
        "requests_finished": int(len(fin)),
        "requests_rejected": int(len(rejected)),
        "requests_unfinished": int(len(requests) - len(fin) - len(rejected)),
        "rejected_by_reason": {str(k): int(v) for k, v in sorted(rejected["reject_reason"].value_counts().items())},
        "duration_s": duration,
        "throughput_requests_per_s": len(fin) / duration if duration > 0 else 0.0,
        "throughput_output_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
        "ttft_s": _dist(fin["ttft_s"]),
        "tpot_s": _dist(fin["tpot_s"]),
        "e2e_s": _dist(fin["e2e_s"]),
        "normalized_latency_s_per_token": None if math.isnan(norm) else float(norm),
        "concurrency": {
            "max": int(steps["running"].max()) if len(steps) else 0,
            "mean": time_weighted_mean(steps["running_mean"], dur),
            "mean_batch_size": time_weighted_mean(steps["batch_size_mean"], dur),
        },
        "kv": kv,
        "preemptions": int(requests["preemptions"].sum()),
        "preemptions_by_mode": {"recompute": int(requests["preemptions"].sum() - requests["swaps"].sum()),
                                "swap": int(requests["swaps"].sum())},
        "swapped_out_bytes": int(steps["swap_out_bytes"].sum()),
        "swapped_in_bytes": int(steps["swap_in_bytes"].sum()),
        "prefix_cache": _prefix_cache(requests, steps, block_size_tokens, bytes_per_token, offloaded_blocks)
        if prefix_caching else None,
        "transfer": {
            "swap_in_bytes": int(steps["swap_in_bytes"].sum()),
            "swap_out_bytes": int(steps["swap_out_bytes"].sum()),
            "needed_s": float(requests["transfer_s"].sum()),
            "hidden_by_prefetch_s": float(requests["transfer_hidden_s"].sum()),
        },
        "recomputed_tokens": int(requests["recomputed_tokens"].sum()),
        "engine_steps": int(steps["num_steps"].sum()),
        "busy_time_s": step_time_total,
        "busy_frac": step_time_total / duration if duration > 0 else 0.0,
        "kv_bytes_read_total": int(steps["kv_bytes_read"].sum()),
        "step_time_breakdown_s": breakdown,
        "kv_bandwidth_utilisation": _bandwidth(steps, copy_bandwidth_bytes_per_s),
        "kv_access": kv_access(steps, hbm_bandwidth_bytes_per_s, page_fetches_per_page),
        "replicas": {
            "count": num_replicas,
            "requests": [int((requests["replica"] == i).sum()) for i in range(num_replicas)],
            # rows of every replica cover the whole span, so the time-weighted mean per replica
            # times the count is the cluster's mean concurrency
            "concurrency_mean_total": time_weighted_mean(steps["running_mean"], dur) * num_replicas,
        },
        "time_per_kv_block_read_s": _per_block(steps, bytes_per_token * (block_size_tokens or 1)),
    }


def _bandwidth(steps: pd.DataFrame, copy_bw: float | None) -> float | None:
    """KV bytes read / attention time / measured copy bandwidth (calibrated timing only); summed
    over steps, i.e. weighted by attention time."""
    att = float(steps["attention_s"].sum())
    if not copy_bw or att <= 0:
        return None
    return float(steps["kv_bytes_read"].sum()) / att / copy_bw


def kv_access(steps: pd.DataFrame, peak_bw: float | None, fetches_per_page: int) -> dict:
    """How the attention kernels read the KV cache over the run (docs/metrics.md, "kv_access")."""
    att = float(steps["attention_s"].sum())
    kv_bytes = int(steps["kv_bytes_read"].sum())
    pages = int(steps["kv_pages_read"].sum()) * int(fetches_per_page) if "kv_pages_read" in steps else 0
    return {
        "attention_kernel_s": att,
        "kv_bytes_read": kv_bytes,
        "pages_fetched": pages,
        "hbm_bandwidth_utilisation": kv_bytes / att / peak_bw if att > 0 and peak_bw else None,
        "mean_access_latency_ns": att / pages * 1e9 if att > 0 and pages > 0 else None,
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
