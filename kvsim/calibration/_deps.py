"""Optional-dependency gate: torch/triton are imported here, lazily, with a one-line user error."""

from __future__ import annotations

import importlib
import importlib.metadata
import os

from kvsim.errors import CalibrationError

_INSTALL_HINT = "install the calibration extra: pip install -e '.[calibration]' (torch==2.13.0, triton==3.7.1)"


def require_torch():
    """Return the torch module, or raise :class:`CalibrationError` saying how to install it."""
    try:
        return importlib.import_module("torch")
    except ImportError as e:
        raise CalibrationError(f"kvsim calibrate needs torch ({e}); {_INSTALL_HINT}") from None


def require_triton():
    try:
        return importlib.import_module("triton")
    except ImportError as e:
        raise CalibrationError(f"the Triton decode kernel needs triton ({e}); {_INSTALL_HINT}") from None


def interpreter_requested() -> bool:
    """True when ``TRITON_INTERPRET=1``: kernels run on the CPU in Triton's numpy interpreter.

    Triton reads the variable when it is imported, so it must be set before the first import of
    triton (tests do this in ``tests/calibration/conftest.py``).
    """
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def package_version(name: str) -> str | None:
    """Installed version of a distribution without importing it (``None`` if absent)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
