"""The request log: rows written when requests end, in any order, make the same request table as
the Request objects themselves (tests/engine/test_memory_columns.py checks that table against the
straightforward construction)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import kvsim.metrics.request_log as log_mod
from kvsim.metrics.request_log import RequestLog
from kvsim.metrics.requests import log_table, requests_table
from kvsim.sched.request import Request, RequestStatus

REASONS = ["exceeds_kv_capacity", "exceeds_max_model_len", "exceeds_batch_token_budget"]


def ended_requests(n: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = Request(i * 3 + 1, float(rng.random() * 50), int(rng.integers(1, 900)), int(rng.integers(1, 4)), 4096,
                    num_samples=int(rng.integers(1, 3)))
        if rng.random() < 0.2:
            r.status, r.reject_reason = RequestStatus.REJECTED, REASONS[int(rng.integers(0, 3))]
        else:
            r.status = RequestStatus.FINISHED
            r.admitted_s = r.arrival_s + float(rng.random())
            r.first_token_s = r.admitted_s + 0.5
            r.finish_s = r.first_token_s + float(rng.random())
            r.recomputed_tokens = int(rng.integers(0, 100))
        r.replica = int(rng.integers(0, 2))
        out.append(r)
    return out


@pytest.mark.parametrize("flush_rows", [1, 7, 4096])
def test_rows_in_finish_order_make_the_sorted_table(monkeypatch, flush_rows):
    monkeypatch.setattr(log_mod, "FLUSH_ROWS", flush_rows)
    reqs = ended_requests(500, seed=flush_rows)
    ref = requests_table(reqs)
    order = np.random.default_rng(1).permutation(len(reqs))
    log = RequestLog()
    for i in order:  # the order requests end in
        log.append(reqs[i])
    assert len(log) == 500
    assert log.num_rejected == sum(r.status == RequestStatus.REJECTED for r in reqs)
    assert log.num_finished == 500 - log.num_rejected
    assert list(log.column("request_id")) == [reqs[i].request_id for i in order]  # append order, kept
    got = log_table(log)
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    assert list(got["request_id"]) == sorted(r.request_id for r in reqs)
    assert set(got["reject_reason"]) == {""} | {r.reject_reason for r in reqs}
    assert len(log) == 0 and log.num_finished == 0  # handed over


def test_leftovers_are_unfinished_rows():
    reqs = ended_requests(20, seed=4)
    log = RequestLog()
    log.extend(reqs[5:])
    left = reqs[:5]
    for r, status in zip(left, [RequestStatus.WAITING, RequestStatus.RUNNING, RequestStatus.SWAPPED,
                                RequestStatus.RUNNING, RequestStatus.WAITING]):
        r.status, r.reject_reason, r.finish_s = status, "", float("nan")
    got = log_table(log, left)
    assert list(got["status"][:5]) == ["unfinished"] * 5
    pd.testing.assert_frame_equal(got, requests_table(reqs), check_exact=True)


def test_empty_log_makes_an_empty_table_with_the_columns():
    got = log_table(RequestLog())
    ref = requests_table([])
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    assert len(got) == 0 and "request_id" in got and "queue_s" in got
