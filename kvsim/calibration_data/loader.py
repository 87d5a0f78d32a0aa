"""Reading and validating a calibration directory (numpy/pandas only; no pydantic, no torch).

Shared by the timing model (:mod:`kvsim.timing.calibrated`), the report and the peer check, so the
report also runs on GPU machines whose Python has only torch/numpy/pandas/matplotlib.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd

from kvsim.calibration_data import schema as S
from kvsim.errors import CalibrationError


@dataclass(frozen=True)
class CalibrationData:
    path: Path
    meta: dict
    df: pd.DataFrame

    @property
    def meta_path(self) -> Path:
        return self.path / S.META_FILE

    @property
    def csv_path(self) -> Path:
        return self.path / S.CSV_FILE


def _positive_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def load_calibration_dir(path: str | Path) -> CalibrationData:
    """Read and validate a calibration directory (independent of any scenario).

    Raises :class:`CalibrationError` naming the file and the field for: a missing directory, a
    missing or unparseable ``meta.json``, missing meta fields, a missing/unreadable CSV, missing
    columns, or non-positive times.
    """
    path = Path(path)
    if not path.exists():
        raise CalibrationError(f"calibration directory {path} does not exist (run `kvsim calibrate --out {path}`)")
    if not path.is_dir():
        raise CalibrationError(f"calibration path {path} is not a directory")
    meta_path = path / S.META_FILE
    if not meta_path.is_file():
        raise CalibrationError(f"{meta_path}: missing (not a calibration directory)")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"{meta_path}: cannot parse JSON ({e})") from None
    if not isinstance(meta, dict):
        raise CalibrationError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    for key in S.META_REQUIRED:
        if key not in meta:
            raise CalibrationError(f"{meta_path}: field '{key}' missing")
    if not isinstance(meta["schema_version"], int) or meta["schema_version"] > S.SCHEMA_VERSION:
        raise CalibrationError(f"{meta_path}: field 'schema_version' is {meta['schema_version']!r}; "
                               f"this kvsim reads version {S.SCHEMA_VERSION}")
    if meta["device"] not in ("cuda", "cpu"):
        raise CalibrationError(f"{meta_path}: field 'device' is {meta['device']!r}; expected 'cuda' or 'cpu'")
    if not _positive_number(meta["copy_bandwidth_bytes_per_s"]):
        raise CalibrationError(f"{meta_path}: field 'copy_bandwidth_bytes_per_s' must be a positive number, "
                               f"got {meta['copy_bandwidth_bytes_per_s']!r}")
    model = meta["model"]
    if not isinstance(model, dict):
        raise CalibrationError(f"{meta_path}: field 'model' must be an object")
    for key in ("name", *S.MODEL_GEOMETRY_KEYS):
        if key not in model:
            raise CalibrationError(f"{meta_path}: field 'model.{key}' missing")
    if not isinstance(meta["kv_dtypes"], list):
        raise CalibrationError(f"{meta_path}: field 'kv_dtypes' must be a list")

    csv_path = path / S.CSV_FILE
    if not csv_path.is_file():
        raise CalibrationError(f"{csv_path}: missing")
    import pandas as pd

    try:
        df = pd.read_csv(csv_path)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        why = " ".join(str(e).split())  # pandas' tokenizer errors end with a newline: one line
        raise CalibrationError(f"{csv_path}: cannot parse CSV ({why})") from None
    missing = [c for c in S.REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise CalibrationError(f"{csv_path}: missing column(s) {', '.join(missing)}")
    med = pd.to_numeric(df["median_s"], errors="coerce")
    bad = df.index[~(med > 0) | ~med.map(math.isfinite)]
    if len(bad):
        i = int(bad[0])
        raw = df["median_s"].iloc[i]  # a numpy number as its Python value (-1.0), or the text as read ('abc')
        raise CalibrationError(f"{csv_path}: row {i + 2}: field 'median_s' must be a positive number, "
                               f"got {raw if isinstance(raw, str) else raw.item()!r}")
    df["median_s"] = med
    return CalibrationData(path, meta, df)
