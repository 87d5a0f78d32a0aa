"""Reading a model-parameter profile YAML (GEMM profiles, host-link profiles, backend profiles) or a small
measurement CSV (all-reduce curves, MoE kernel times): one place for the file-level checks, so each
model validates only its own parameters."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.yamlio import load_yaml


def read_yaml_file(path: str | Path, what: str):
    """``(path, document)`` of a profile YAML; an unreadable file is a one-line ConfigError naming it."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.__class__.__name__})") from None
    return path, load_yaml(text, str(path))


def read_data_rows(path: str | Path, fields: tuple[str, ...], implementations: tuple[str, ...]
                   ) -> Iterator[tuple[int, dict]]:
    """``(line, row)`` of a measurement CSV whose every row gives every one of ``fields`` and an
    ``implementation`` among ``implementations``; otherwise one ConfigError naming the file, the
    line and the field. The caller parses its own numbers."""
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            for key in fields:
                if not (row.get(key) or "").strip():
                    raise ConfigError(f"{path}: line {line}: field {key!r} is missing")
            if row["implementation"] not in implementations:
                raise ConfigError(f"{path}: line {line}: implementation {row['implementation']!r}: valid: "
                                  f"{', '.join(implementations)}")
            yield line, row


def read_params_file(path: str | Path, what: str) -> tuple[Path, dict, dict]:
    """``(path, document, params)`` of a profile YAML holding a ``params`` mapping; an unreadable
    file or a missing ``params`` mapping is a one-line ConfigError naming the file."""
    path, raw = read_yaml_file(path, what)
    if not isinstance(raw, dict) or not isinstance(raw.get("params"), dict):
        raise ConfigError(f"{path}: expected a mapping with a 'params' mapping")
    return path, raw, raw["params"]
