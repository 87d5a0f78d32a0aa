"""Run directories: written into a hidden temporary directory and renamed into place when complete.

Layout of ``OUT`` (one scenario without variants)::

    OUT/scenario.resolved.yaml  requests.parquet  steps.parquet  summary.json  *.png

With variants, each variant gets ``OUT/<variant>/`` with the files above, and ``OUT`` holds
``scenario.resolved.yaml``, ``comparison.csv`` and the cross-variant plots. A directory at ``OUT``
is complete by construction: a killed run leaves only ``.OUT.tmp-<pid>`` (hidden), and an
interrupted one also writes ``INCOMPLETE`` into it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import yaml

INCOMPLETE_MARKER = "INCOMPLETE"


def _pid_alive(pid: int) -> bool:
    """Is ``pid`` a live process? A zombie (killed, not yet reaped) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def clean_stale_tmp(out: Path) -> None:
    """Remove temporary directories of earlier runs into ``out`` whose process is gone."""
    for p in out.parent.glob(f".{out.name}.tmp-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Yield a temporary directory; on success replace ``out`` with it, on failure leave it marked."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException as e:
        (tmp / INCOMPLETE_MARKER).write_text(f"run stopped before completion: {type(e).__name__}: {e}\n")
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False, default=_json_default) + "\n")


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_yaml(path: Path, obj) -> None:
    write_text_atomic(path, yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))


def write_parquet(path: Path, df: pd.DataFrame) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def is_complete_run_dir(path: Path) -> bool:
    return (Path(path) / "summary.json").exists() and not (Path(path) / INCOMPLETE_MARKER).exists()
