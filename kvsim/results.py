"""Run directories: written into a hidden temporary directory and renamed into place when complete.

Layout of ``OUT`` (one scenario without variants)::

    OUT/scenario.resolved.yaml  requests.parquet  steps.parquet  summary.json  *.png

With variants, each variant gets ``OUT/<variant>/`` with the files above, and ``OUT`` holds
``scenario.resolved.yaml``, ``comparison.csv`` and ``comparison.parquet`` (one table, one row per
variant, baseline first: kvsim.report.comparison_table.comparison_frame; docs/outputs.md) and the
cross-variant plots. A directory at ``OUT``
is complete by construction: a killed run leaves only ``.OUT.tmp-<pid>`` (hidden), and an
interrupted one also writes ``INCOMPLETE`` into it. Which directories kvsim may write or replace,
and the marker file ``.kvsim-output.json`` that records what it wrote: :mod:`kvsim.outdir`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from kvsim.errors import ConfigError
from kvsim.outdir import INCOMPLETE_FILE, atomic_out_dir, read_marker

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd

INCOMPLETE_MARKER = INCOMPLETE_FILE


def atomic_dir(out: Path, command: str = "run", **kw):
    """``kvsim.outdir.atomic_out_dir`` (kept for callers of the old name)."""
    return atomic_out_dir(out, command, **kw)


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
    path = Path(path)
    if not (path / "summary.json").exists() or (path / INCOMPLETE_MARKER).exists():
        return False
    try:
        marker = read_marker(path)
    except ConfigError:  # a damaged marker: not a complete run
        return False
    return marker is None or marker.complete
