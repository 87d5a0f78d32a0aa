"""What runs one sweep point, in whichever process or Ray worker the executor picked.

A task is a plain JSON-able dict (so it pickles under ``spawn`` and ships to Ray workers):
``{"point_id", "anchor", "raw", "out", "plots"}``. The worker validates ``raw`` again (the same
checks the driver ran up front) and calls :func:`kvsim.api.run_to_dir`, which writes the point's
run directory atomically. It raises on failure; the executor counts the attempt and retries.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# Testing hook: a worker whose point id contains this variable's value exits abruptly (os._exit),
# as a segfault or the OOM killer would, so tests can check that crashes are retried and recorded.
CRASH_ENV = "KVSIM_SWEEP_TEST_CRASH"


def make_task(sweep, point, out_dir: Path, plots: bool) -> dict:
    return {
        "point_id": point.id,
        "anchor": str(sweep.anchor),
        "sweep_name": sweep.name,
        "raw": point.raw,
        "out": str(Path(out_dir) / "points" / point.id),
        "plots": bool(plots),
        "driver_pid": os.getpid(),
    }


def run_point(task: dict) -> dict:
    """Run one point into ``task["out"]``. Returns ``{"point_id", "wall_s"}``."""
    from kvsim.api import run_to_dir
    from kvsim.config import LoadedScenario
    from kvsim.sweep.spec import validate_point_raw

    t0 = time.perf_counter()
    crash = os.environ.get(CRASH_ENV)
    # test hook: die like a segfault / OOM kill would (never in the driver: executor "inline")
    if crash and crash in task["point_id"] and os.getpid() != task.get("driver_pid"):
        os._exit(86)
    anchor = Path(task["anchor"])
    where = f"{anchor}: point {task['point_id']}"
    scn = validate_point_raw(task["raw"], where)
    loaded = LoadedScenario(path=anchor, name=task["point_id"], base=scn, variants={})
    run_to_dir(loaded, Path(task["out"]), progress=False, plots=task["plots"])
    return {"point_id": task["point_id"], "wall_s": time.perf_counter() - t0}
