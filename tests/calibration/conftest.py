"""Calibration tests run the Triton kernels on the CPU through Triton's interpreter.

``TRITON_INTERPRET`` must be set before triton is first imported (triton reads it at import and
when kernels are decorated), so it is set here, at collection time, before any test module imports
``kvsim.calibration.kernels``. Tests needing torch/triton skip cleanly when they are not installed,
except in CI (``CI=true``), which installs the ``calibration`` extra: there a missing torch or
triton fails the run instead of hiding every kernel test behind a skip.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

if os.environ.get("CI") == "true":
    import torch  # noqa: E402,F401  (CI must have the calibration extra)
    import triton  # noqa: E402,F401

from calib_helpers import CPU_EXAMPLE  # noqa: E402


@pytest.fixture
def example_copy(tmp_path) -> Path:
    """A writable copy of the committed CPU example calibration (for corrupting in error tests)."""
    dst = tmp_path / "calib"
    shutil.copytree(CPU_EXAMPLE, dst)
    return dst
