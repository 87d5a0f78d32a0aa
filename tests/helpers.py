"""Shared test helpers: tiny traces and scenarios."""

from __future__ import annotations

import numpy as np

from kvsim.config import Scenario
from kvsim.trace.schema import Trace


def make_trace(rows):
    """rows: [(arrival_s, prompt_tokens, output_tokens), ...]"""
    a = np.array([r[0] for r in rows], dtype=np.float64)
    p = np.array([r[1] for r in rows], dtype=np.int64)
    o = np.array([r[2] for r in rows], dtype=np.int64)
    return Trace(arrival_s=a, prompt_tokens=p, output_tokens=o, source={"kind": "test"})


def make_scenario(**over):
    # The mechanism tests that use this helper pin kvsim's own defaults (no prefix caching, no chunked
    # prefill, prompt blocks at admission), not the default engine profile's (vllm-v1).
    raw = {
        "engine_profile": "kvsim",
        "trace": {"file": "unused.csv"},
        "model": "OPT-13B",
        "kv_budget": {"tokens": 64},
        "allocator": {"kind": "paged", "block_size": 4, "watermark": 0.0},
        "timing": {"kind": "constant", "step_s": 0.1},
    }
    for k, v in over.items():
        raw[k] = v
    return Scenario.model_validate(raw)


def load_bench(name: str):
    """The script ``bench/<name>.py`` as a module (the bench scripts are not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vidur_dir():
    """Vidur's public profiling data (../shared/peer-data/vidur beside the checkout, as on the
    developers' machines and in CI), or $KVSIM_VIDUR_DIR."""
    import os
    from pathlib import Path

    env = os.environ.get("KVSIM_VIDUR_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared" / "peer-data" / "vidur"


# Runs `kvsim ARGS...` and sends itself SIGINT as call number $KVSIM_TEST_SIGINT_AT of
# kvsim.api.run_scenario starts (a variant of `kvsim run`, a point of an inline sweep): Ctrl-C at a
# deterministic place, never after a timed wait.
SIGINT_DRIVER = """
import os, signal, sys
import kvsim.api as api
from kvsim import cli
# a job started in the background by a non-interactive shell inherits SIGINT ignored (POSIX), and
# Python then installs no KeyboardInterrupt handler; a user's terminal delivers Ctrl-C, so do as it does
signal.signal(signal.SIGINT, signal.default_int_handler)
real, calls = api.run_scenario, []
def run_scenario(*a, **k):
    calls.append(1)
    if len(calls) == int(os.environ.get("KVSIM_TEST_SIGINT_AT", "0")):
        os.kill(os.getpid(), signal.SIGINT)
    return real(*a, **k)
api.run_scenario = run_scenario
sys.exit(cli.main(sys.argv[1:]))
"""


def kvsim_with_sigint(cwd, args: list[str], sigint_at: int = 0):
    """``kvsim ARGS`` in a subprocess in ``cwd`` (SIGINT at run_scenario call ``sigint_at``; 0: never);
    returns the CompletedProcess (text)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    driver = Path(cwd) / "sigint_driver.py"
    driver.write_text(SIGINT_DRIVER)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "KVSIM_TEST_SIGINT_AT": str(sigint_at)}
    return subprocess.run([sys.executable, str(driver), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
