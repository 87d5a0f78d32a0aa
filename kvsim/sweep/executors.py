"""Executors: run sweep tasks and report one :class:`Outcome` per task.

* ``local`` -- a :class:`concurrent.futures.ProcessPoolExecutor` with the ``spawn`` start method
  (safe with threads, on macOS and Windows, and from notebooks). At most ``jobs`` tasks are in
  flight, so a worker that dies (segfault, OOM kill) takes down only the points it was running;
  the pool is rebuilt and those points are retried.
* ``ray`` -- Ray's task API: each point is a ``ray.remote`` task (1 CPU), retried by Ray itself
  (``max_retries`` + ``retry_exceptions``). Connects to ``address`` (``auto``, ``ray://host:port``,
  ``host:port``) or, without one, starts a local Ray instance with ``jobs`` CPUs and shuts it down
  afterwards. With a remote cluster the sweep directory and the trace files must be on a file
  system every node sees, and kvsim must be installed on the nodes.
* ``inline`` -- run in this process, one point after another (debugging, notebooks); a crash here
  is the caller's crash.

Every task is tried ``1 + retries`` times at most (a :class:`~kvsim.errors.ConfigError`, bad input
that every attempt would meet, once only: local and inline executors); a task that still fails is
reported with its last error, never dropped.
"""

from __future__ import annotations

import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvsim.errors import ConfigError
from kvsim.sweep.worker import run_point

EXECUTORS = ("local", "ray", "inline")


@dataclass
class Outcome:
    point_id: str
    ok: bool
    attempts: int
    wall_s: float = 0.0
    error: str = ""       # one line: "ExceptionType: message"
    traceback: str = ""   # the full text, written to errors/<point_id>.txt


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return " ".join(text.split())[:500]


def _remote_traceback(e: BaseException) -> str:
    cause = e.__cause__
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    if cause is not None and type(cause).__name__ == "_RemoteTraceback":
        tb = str(cause) + "\n" + tb
    return tb


def execute(tasks: list[dict], on_outcome: Callable[[Outcome], None], *, executor: str = "local",
            jobs: int = 1, retries: int = 1, address: str | None = None,
            on_retry: Callable[[str, int, str], None] | None = None) -> None:
    if executor not in EXECUTORS:
        raise ConfigError(f"unknown executor {executor!r}; valid executors: {', '.join(EXECUTORS)}")
    if retries < 0:
        raise ConfigError(f"retries must be >= 0 (got {retries})")
    if not tasks:
        return
    if executor == "inline":
        _run_inline(tasks, on_outcome, retries, on_retry)
    elif executor == "local":
        _run_local(tasks, on_outcome, max(1, jobs), retries, on_retry)
    else:
        _run_ray(tasks, on_outcome, max(1, jobs), retries, address)


def _run_inline(tasks, on_outcome, retries, on_retry) -> None:
    for task in tasks:
        for attempt in range(1, retries + 2):
            t0 = time.perf_counter()
            try:
                res = run_point(task)
            except Exception as e:  # noqa: BLE001 -- recorded, retried
                if attempt <= retries and not isinstance(e, ConfigError):
                    if on_retry:
                        on_retry(task["point_id"], attempt, _one_line(e))
                    continue
                on_outcome(Outcome(task["point_id"], False, attempt, time.perf_counter() - t0, _one_line(e),
                                   traceback.format_exc()))
            else:
                on_outcome(Outcome(task["point_id"], True, attempt, res["wall_s"]))
            break


def _run_local(tasks, on_outcome, jobs, retries, on_retry) -> None:
    """Process pool; see the module docstring. When a worker dies with several points in flight,
    none of them is blamed: each is rerun alone ("suspect"), and only a death while running alone
    counts as an attempt of that point, so one crashing point never fails its neighbours."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")
    pending = deque(tasks)
    suspects: deque = deque()
    attempts: dict[str, int] = {}
    started: dict[str, float] = {}
    inflight: dict = {}
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx)

    def fail_or_retry(task, e: BaseException) -> None:
        pid = task["point_id"]
        if attempts[pid] <= retries and not isinstance(e, ConfigError):  # bad input fails every attempt
            if on_retry:
                on_retry(pid, attempts[pid], _one_line(e))
            pending.append(task)
        else:
            on_outcome(Outcome(pid, False, attempts[pid], time.perf_counter() - started[pid],
                               _one_line(e), _remote_traceback(e)))

    def submit(queue: deque) -> bool:
        """Start the queue's head; False (the head left in place) when the pool has just broken: a
        worker died after the last wait, and its future tells which once waited on."""
        task = queue[0]
        try:
            fut = pool.submit(run_point, task)
        except BrokenProcessPool:
            return False
        queue.popleft()
        attempts[task["point_id"]] = attempts.get(task["point_id"], 0) + 1
        started[task["point_id"]] = time.perf_counter()
        inflight[fut] = task
        return True

    try:
        while pending or inflight or suspects:
            if suspects and not inflight:
                submit(suspects)
            while pending and not suspects and len(inflight) < jobs:
                if not submit(pending):
                    break
            if not inflight:  # the pool broke with nothing of ours in it: start afresh
                pool.shutdown(wait=True, cancel_futures=True)
                pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
                continue
            alone = len(inflight) == 1
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            died: list = []
            for fut in done:
                task = inflight.pop(fut)
                try:
                    res = fut.result()
                except BrokenProcessPool as e:
                    died.append((task, e))
                except KeyboardInterrupt:  # Ctrl-C reached the workers too: stop, retry nothing
                    raise
                except BaseException as e:  # noqa: BLE001 -- recorded, retried
                    fail_or_retry(task, e)
                else:
                    on_outcome(Outcome(task["point_id"], True, attempts[task["point_id"]], res["wall_s"]))
            if not died:
                continue
            # The pool is dead: every task still in it fails the same way. Settle them, start afresh.
            for fut in list(inflight):
                task = inflight.pop(fut)
                try:
                    res = fut.result()
                except BrokenProcessPool as e:
                    died.append((task, e))
                except KeyboardInterrupt:
                    raise
                except BaseException as e:  # noqa: BLE001
                    fail_or_retry(task, e)
                else:
                    on_outcome(Outcome(task["point_id"], True, attempts[task["point_id"]], res["wall_s"]))
            pool.shutdown(wait=True, cancel_futures=True)
            pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx)
            if alone and len(died) == 1:
                task, e = died[0]
                fail_or_retry(task, RuntimeError(f"worker process died while running the point ({e})"))
            else:
                for task, _ in died:  # can't tell which one killed the worker: rerun each alone
                    attempts[task["point_id"]] -= 1
                    suspects.append(task)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'kvsim[ray]'") from None
    return ray


def _run_ray(tasks, on_outcome, jobs, retries, address) -> None:
    import logging
    import os

    ray = _import_ray()
    started_here = False
    if not ray.is_initialized():
        kwargs = dict(log_to_driver=False, logging_level=logging.WARNING, configure_logging=True)
        try:
            if address:
                ray.init(address=address, **kwargs)
            else:
                # A private local instance: never join a cluster that happens to be running here.
                os.environ.pop("RAY_ADDRESS", None)
                ray.init(address="local", num_cpus=jobs, include_dashboard=False, **kwargs)
                started_here = True
        except Exception as e:  # noqa: BLE001 -- ConnectionError, timeouts, bad addresses...
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise ConfigError(f"--executor ray: cannot use {where}: {type(e).__name__}: {e}") from None
    try:
        remote = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=True)(run_point)
        t0 = time.perf_counter()
        refs = {remote.remote(task): task for task in tasks}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                task = refs.pop(ref)
                try:
                    res = ray.get(ref)
                except Exception as e:  # noqa: BLE001 -- RayTaskError, WorkerCrashedError, ...
                    cause = getattr(e, "cause", None) or e
                    on_outcome(Outcome(task["point_id"], False, retries + 1, time.perf_counter() - t0,
                                       _one_line(cause), str(e)))
                else:
                    on_outcome(Outcome(task["point_id"], True, 1, res["wall_s"]))
    finally:
        if started_here:
            ray.shutdown()
