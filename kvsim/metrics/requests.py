"""The per-request result table, built once at the end of a run from the scheduler's records."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvsim.sched.request import Request, RequestStatus

STATUS_NAMES = {RequestStatus.FINISHED: "finished", RequestStatus.REJECTED: "rejected",
                RequestStatus.WAITING: "unfinished", RequestStatus.RUNNING: "unfinished"}


def requests_table(requests: list[Request]) -> pd.DataFrame:
    reqs = sorted(requests, key=lambda r: r.request_id)
    n = len(reqs)

    def col(attr, dtype):
        return np.fromiter((getattr(r, attr) for r in reqs), dtype=dtype, count=n)

    df = pd.DataFrame({
        "request_id": col("request_id", np.int64),
        "arrival_s": col("arrival_s", np.float64),
        "admitted_s": col("admitted_s", np.float64),
        "first_token_s": col("first_token_s", np.float64),
        "finish_s": col("finish_s", np.float64),
        "prompt_tokens": col("prompt_tokens", np.int64),
        "output_tokens": col("output_tokens", np.int64),
        "preemptions": col("num_preemptions", np.int64),
        "recomputed_tokens": col("recomputed_tokens", np.int64),
        "swaps": col("num_swaps", np.int64),
        "cached_tokens": col("cached_tokens", np.int64),
        "cpu_hit_tokens": col("cpu_hit_tokens", np.int64),
        "ssd_hit_tokens": col("ssd_hit_tokens", np.int64),
        "remote_hit_tokens": col("remote_hit_tokens", np.int64),
        "transfer_s": col("load_s", np.float64),
        "transfer_hidden_s": col("hidden_s", np.float64),
        "priority": col("priority", np.int64),
        "num_samples": col("num_samples", np.int64),
        "replica": col("replica", np.int64),
        "status": pd.Series([STATUS_NAMES[r.status] for r in reqs], dtype="string"),
        "reject_reason": pd.Series([r.reject_reason for r in reqs], dtype="string"),
    })
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2e_s"] = df["finish_s"] - df["arrival_s"]
    decode_tokens = (df["output_tokens"] - 1).where(df["output_tokens"] > 1)
    df["tpot_s"] = (df["finish_s"] - df["first_token_s"]) / decode_tokens
    df["queue_s"] = df["admitted_s"] - df["arrival_s"]
    return df
