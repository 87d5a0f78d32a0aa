"""The step table as a DataFrame, from the recorder's Arrow table or its streamed parquet file,
column by column: the values, dtypes and column order of ``to_pandas()`` without holding the table
twice (memory freed on the way is handed back to the OS)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where used (import cost: tests/test_import_cost.py)
    import pandas as pd


def steps_table(box: list, steps_path: Path | None):
    """The step table as a DataFrame, from the recorder's Arrow table (``box[0]``; the box holds the
    only reference, so the Arrow columns are freed as they are copied) or, if None, the streamed file."""
    if box[0] is None:
        return steps_frame(_file_columns(steps_path))
    return steps_frame(_table_columns(box))


def _table_columns(box: list):
    """(name, numpy array) for each column of the pyarrow Table ``box[0]``, dropping each column
    from the table once copied; empties ``box``."""
    table = box.pop()
    for name in table.column_names:
        col = table.column(name)
        arr = _to_numpy(col)
        del col
        table = table.drop_columns([name])
        yield name, arr


def _file_columns(path: Path):
    """(name, numpy array) for each column of a parquet file, read one column at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    try:
        for name in pf.schema_arrow.names:
            col = pf.read(columns=[name]).column(0)
            arr = _to_numpy(col)
            del col
            pa.default_memory_pool().release_unused()
            yield name, arr
    finally:
        pf.close()


def _to_numpy(col) -> np.ndarray:
    """A writable numpy copy of a pyarrow ChunkedArray without nulls (as ``to_pandas`` makes it)."""
    if col.num_chunks == 0:
        return col.to_numpy()
    if col.num_chunks == 1:
        return col.chunk(0).to_numpy(zero_copy_only=False).copy()
    return np.concatenate([c.to_numpy(zero_copy_only=False) for c in col.chunks])


def steps_frame(columns) -> pd.DataFrame:
    """The step table from ``(name, numpy array)`` pairs: the values, dtypes and column order of
    ``table.to_pandas()``, one block per column (no consolidation copy). Memory that the columns'
    sources free on the way is handed back to the OS every few columns, so the step table is not
    held twice at its full size."""
    import pandas as pd

    cols = {}
    for i, (name, arr) in enumerate(columns):
        cols[name] = arr
        if i % 4 == 3:
            release_free_memory()
    release_free_memory()
    return pd.DataFrame(cols, copy=False)


def release_free_memory() -> None:
    """Hand memory that the C allocator keeps after ``free`` back to the OS (glibc only; no-op
    elsewhere). The step chunks are many small buffers inside the heap: freed, they stay in the
    process's RSS unless trimmed, so converting them would otherwise hold the step table twice."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list = []


def _malloc_trim():
    if not _TRIM:
        fn = None
        try:
            import ctypes

            fn = ctypes.CDLL("libc.so.6").malloc_trim
            fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _TRIM.append(fn)
    return _TRIM[0]
