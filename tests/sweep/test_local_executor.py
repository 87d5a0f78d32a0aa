"""The local executor when its process pool breaks between two waits (a CI failure of 2026-12-06:
the pool broke after a neighbour's result came back and the next ``submit`` raised)."""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures.process import BrokenProcessPool

import kvsim.sweep.executors as executors


class _RacyPool:
    """A stand-in for ProcessPoolExecutor: runs a task at once, except the crashing one, whose
    future fails a moment later while the pool is already marked broken, as CPython's manager
    thread does (``_broken`` is set before the futures are)."""

    crash = "b"

    def __init__(self, max_workers, mp_context):
        self.broken = False

    def submit(self, fn, task):
        if self.broken:
            raise BrokenProcessPool("A child process terminated abruptly")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if task["point_id"] == self.crash:
            self.broken = True
            threading.Timer(0.05, fut.set_exception, [BrokenProcessPool("worker died")]).start()
        else:
            fut.set_result(fn(task))
        return fut

    def shutdown(self, wait=True, cancel_futures=False):
        pass


def test_pool_broken_before_next_submit_blames_only_the_dead_point(monkeypatch):
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _RacyPool)
    monkeypatch.setattr(executors, "run_point", lambda task: {"wall_s": 0.0})
    outcomes = []
    tasks = [{"point_id": p} for p in ("a", "b", "c")]
    executors.execute(tasks, outcomes.append, executor="local", jobs=2, retries=1)
    by_id = {o.point_id: o for o in outcomes}
    assert sorted(by_id) == ["a", "b", "c"] and len(outcomes) == 3
    assert by_id["a"].ok and by_id["c"].ok and by_id["c"].attempts == 1
    assert not by_id["b"].ok and by_id["b"].attempts == 2 and "worker process died" in by_id["b"].error


class _InterruptedPool(_RacyPool):
    """The pool of a terminal's Ctrl-C: the whole process group gets SIGINT, so a worker's point ends in
    KeyboardInterrupt, which its future hands back."""

    def submit(self, fn, task):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if task["point_id"] == "b":
            fut.set_exception(KeyboardInterrupt())
        else:
            fut.set_result(fn(task))
        return fut


def test_a_workers_ctrl_c_stops_the_sweep_and_is_not_retried(monkeypatch):
    import pytest

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _InterruptedPool)
    ran = []
    monkeypatch.setattr(executors, "run_point", lambda task: ran.append(task["point_id"]) or {"wall_s": 0.0})
    outcomes = []
    with pytest.raises(KeyboardInterrupt):
        executors.execute([{"point_id": p} for p in ("a", "b", "c", "d")], outcomes.append, executor="local",
                          jobs=1, retries=3)
    assert [o.point_id for o in outcomes] == ["a"] and ran == ["a"]  # b is neither failed nor retried; c, d not started
