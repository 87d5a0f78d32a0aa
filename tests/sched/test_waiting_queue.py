"""The waiting queue keeps never-admitted requests as typed rows and builds each Request when it
reaches the head: it must behave exactly like a deque of the original Request objects."""

from __future__ import annotations

import gc
import math
from collections import deque

import numpy as np
from hypothesis import given, settings, strategies as st

from helpers import make_scenario, make_trace
from kvsim.sched.request import Request, RequestStatus, WaitingQueue
from kvsim.sched.scheduler import Scheduler

MAX_LEN = 4096


def state(r: Request) -> tuple:
    """Every field of ``r`` and of its allocator view (NaN as a string so that NaN == NaN)."""
    vals = []
    for name in Request.__slots__:
        v = getattr(r, name)
        if name == "kv":
            v = (v.request_id, v.prompt_tokens, v.output_tokens, v.max_model_len_tokens, v.priority,
                 v.num_samples, None if v.block_keys is None else tuple(v.block_keys), v.beam_events)
        elif isinstance(v, float) and math.isnan(v):
            v = "nan"
        vals.append((name, v))
    return tuple(vals)


def fresh(i: int, rng: np.random.Generator) -> Request:
    keys = rng.integers(0, 1 << 40, int(rng.integers(0, 4))) if rng.random() < 0.3 else None
    r = Request(i, float(rng.random() * 1e4), int(rng.integers(1, 3000)), int(rng.integers(1, 900)), MAX_LEN,
                priority=int(rng.integers(-3, 3)), block_keys=keys, num_samples=int(rng.integers(1, 4)),
                beam_events=("beam", i) if rng.random() < 0.1 else None)
    r.replica = int(rng.integers(0, 4))
    return r


def admitted_before(i: int, rng: np.random.Generator) -> Request:
    r = fresh(i, rng)
    r.admit_seq, r.num_preemptions, r.num_generated = int(rng.integers(0, 99)), 1, 2
    r.admitted_s, r.prefetched_s = r.arrival_s + 1.0, 0.25
    return r


OPS = st.lists(st.sampled_from(["append", "append_old", "appendleft", "popleft", "pop", "head", "credit"]),
               max_size=120)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**32 - 1))
def test_queue_behaves_like_a_deque_of_the_original_requests(ops, seed):
    rng = np.random.default_rng(seed)
    q, ref = WaitingQueue(), deque()
    next_id = 0
    for op in ops:
        if op in ("append", "append_old", "appendleft"):
            r = (admitted_before if op != "append" else fresh)(next_id, rng)
            next_id += 1
            (q.appendleft if op == "appendleft" else q.append)(r)
            (ref.appendleft if op == "appendleft" else ref.append)(r)
        elif not ref:
            continue
        elif op == "popleft":
            assert state(q.popleft()) == state(ref.popleft())
        elif op == "pop":
            assert state(q.pop()) == state(ref.pop())
        elif op == "head":
            assert q[0] is q[0]  # built once: the head is one object until it leaves
            assert state(q[0]) == state(ref[0])
        else:  # the engine credits the head with prefetch time: the credit stays with it
            q[0].prefetched_s += 0.5
            ref[0].prefetched_s += 0.5
        assert len(q) == len(ref) and bool(q) == bool(ref)
        assert (q.head is None) == (not ref) and (not ref or state(q.head) == state(ref[0]))
        assert q.num_seqs == sum(r.num_samples for r in ref)
        assert [state(r) for r in q] == [state(r) for r in ref]


def test_many_rows_compact_and_keep_order(monkeypatch):
    import kvsim.sched.request as request_mod

    monkeypatch.setattr(request_mod, "_COMPACT_ROWS", 64)  # compact often
    rng = np.random.default_rng(3)
    q, ref = WaitingQueue(), deque()
    for i in range(3000):
        r = fresh(i, rng)
        q.append(r)
        ref.append(r)
        if i % 3 == 0:
            assert state(q.popleft()) == state(ref.popleft())
    assert q._head < 3000  # the popped rows were compacted away
    while ref:
        assert state(q.popleft()) == state(ref.popleft())
    assert not q and q.num_seqs == 0


def test_a_fresh_request_is_not_kept_as_an_object():
    """Only the head is a Request object; the other fresh arrivals are rows."""
    q = WaitingQueue()
    gc.collect()
    before = sum(type(o) is Request for o in gc.get_objects())
    for i in range(1000):
        q.append(Request(i, float(i), 100, 10, MAX_LEN))
    assert sum(type(o) is Request for o in gc.get_objects()) == before + 1  # the head
    assert q.head is q[0] and q[0].request_id == 0 and q[0].status == RequestStatus.WAITING
    assert q.popleft().request_id == 0 and q.head.request_id == 1  # the next head is built at once
    assert sum(type(o) is Request for o in gc.get_objects()) == before + 1


def test_rows_appended_by_view_build_their_request_once_at_the_head():
    rng = np.random.default_rng(5)
    q, ref = WaitingQueue(), deque()
    for i in range(50):
        r = fresh(i, rng)
        q.append_row(r.kv, r.arrival_s, r.replica)
        ref.append(r)
        if i % 4 == 3:
            head = q.head
            assert head is q[0] and state(head) == state(ref[0])
            assert q.popleft() is head
            ref.popleft()
    assert q.num_seqs == sum(r.num_samples for r in ref)
    assert [state(r) for r in q] == [state(r) for r in ref]
    while ref:
        assert state(q.popleft()) == state(ref.popleft())
    assert q.head is None and not q and len(q) == 0


def test_live_requests_stay_bounded_during_a_backlogged_run(monkeypatch):
    """A run whose queue grows to hundreds of requests holds Request objects only for the admitted
    (running, swapped, preempted) ones and the queue's head; ended requests are log rows (here
    at once: the log's small buffer of ended requests is turned off)."""
    import kvsim.metrics.request_log as log_mod
    from kvsim.simulate import run

    monkeypatch.setattr(log_mod, "FLUSH_ROWS", 1)

    rng = np.random.default_rng(7)
    n = 800
    rows = list(zip(np.cumsum(rng.exponential(1 / 200, n)), rng.integers(1, 60, n), rng.integers(1, 40, n)))
    rows[10] = (rows[10][0], 9000, 5)  # longer than the model: rejected, a log row at once
    scn = make_scenario(kv_budget={"tokens": 1024}, engine={"mode": "step"},
                        scheduler={"max_num_seqs": 16})
    seen = {"max_live": 0, "max_waiting": 0, "bound": 0, "steps": 0}
    orig = Scheduler.on_step_done

    def spy(self, now_s):
        out = orig(self, now_s)
        seen["steps"] += 1
        if seen["steps"] % 150 == 0:  # gc.get_objects is slow: sample
            live = sum(type(o) is Request for o in gc.get_objects()) - base
            seen["max_live"] = max(seen["max_live"], live)
            seen["bound"] = max(seen["bound"], len(self.requests) + 1 + len(out[1]))
            seen["max_waiting"] = max(seen["max_waiting"], len(self.waiting))
        return out

    monkeypatch.setattr(Scheduler, "on_step_done", spy)
    gc.collect()
    base = sum(type(o) is Request for o in gc.get_objects())
    res = run(scn, trace=make_trace(rows))
    assert res.summary["requests_finished"] == n - 1 and res.summary["requests_rejected"] == 1
    assert seen["max_waiting"] > 200, "the test needs a backlog"
    assert 0 < seen["max_live"] <= seen["bound"] <= 16 + 1 + 16
