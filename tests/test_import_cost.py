"""Process cost (issue 15 item 6). Imports: the scenario loader, the engine, the wiring and the
CLI's parser import no pandas, pyarrow, matplotlib, scipy or torch. Those are imported inside the
functions that need them (trace loading, the request/step tables, summaries, writers, plots,
calibrated timing's table loading), so `kvsim --help`, `kvsim models` and `import kvsim.config`
stay light. Each check runs in a fresh interpreter (this process has imported everything already).
Exit: the `kvsim` process freezes the collector before it exits (kvsim.cli.freeze_for_exit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "pyarrow", "matplotlib", "scipy", "torch")

PROBE = r"""
import importlib, sys
for m in sys.argv[1].split(","):
    importlib.import_module(m)
if sys.argv[2] == "parser":
    from kvsim.cli import build_parser
    build_parser()
heavy = sorted({n.split(".")[0] for n in sys.modules} & set(sys.argv[3].split(",")))
print(",".join(heavy))
"""


def _heavy_after(modules: list[str], parser: bool = False) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(modules), "parser" if parser else "-",
                          ",".join(HEAVY)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    return [m for m in line.split(",") if m]


def test_run_path_imports_no_heavy_packages():
    """kvsim.config, kvsim.engine and kvsim.simulate (and the API/writers above them): one fresh
    interpreter for all (any of them importing a heavy package fails the check)."""
    assert _heavy_after(["kvsim.config", "kvsim.engine", "kvsim.simulate", "kvsim.api", "kvsim.results"]) == []


def test_cli_parser_imports_no_heavy_packages():
    """Building the whole parser (every plugin sub-command registered) stays light."""
    assert _heavy_after(["kvsim.cli"], parser=True) == []


def test_probe_detects_a_heavy_import():
    """The probe itself can fail: importing the trace loader does pull pandas in."""
    assert "pandas" in _heavy_after(["kvsim.trace.load"])


def test_main_freezes_only_as_the_process_command(capsys):
    """``main()`` (the ``kvsim`` script, ``python -m kvsim``) freezes the collector before the process
    exits so shutdown skips tearing down pandas/pyarrow object by object; ``main(argv)`` (tests,
    embedding callers) never does."""
    import gc

    from kvsim.cli import main

    before = gc.get_freeze_count()
    assert main(["models", "--json"]) == 0
    assert gc.get_freeze_count() == before
    code = ("import gc, sys; sys.argv = ['kvsim', 'models', '--json']; from kvsim.cli import main; rc = main(); "
            "sys.stderr.write(f'rc={rc} frozen={gc.get_freeze_count() > 0}')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().endswith("rc=0 frozen=True")
    assert '"models"' in out.stdout  # the command's output is complete
