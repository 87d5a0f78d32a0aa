"""Reading a model-parameter profile YAML (GEMM profiles, host-link profiles, backend profiles): one place for the
file-level checks, so each model validates only its own parameters."""

from __future__ import annotations

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


def read_params_file(path: str | Path, what: str) -> tuple[Path, dict, dict]:
    """``(path, document, params)`` of a profile YAML holding a ``params`` mapping; an unreadable
    file or a missing ``params`` mapping is a one-line ConfigError naming the file."""
    path, raw = read_yaml_file(path, what)
    if not isinstance(raw, dict) or not isinstance(raw.get("params"), dict):
        raise ConfigError(f"{path}: expected a mapping with a 'params' mapping")
    return path, raw, raw["params"]
