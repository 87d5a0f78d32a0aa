"""Parquet container (uncompressed at the file level; parquet's own codecs are fine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from kvsim.errors import TraceError
from kvsim.trace.coerce import arrow_key_lists
from kvsim.trace.containers.base import Chunk, Container, refuse_duplicate_columns


class ParquetContainer(Container):
    """Parquet, read in record batches of ``chunk_rows`` rows; list columns decode natively."""

    name = "parquet"
    row_label = "row"

    def __init__(self, path: Path, where: str, chunk_rows: int):
        super().__init__(where, chunk_rows)
        import pyarrow.parquet as pq

        try:
            self._file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise TraceError(f"{where}: cannot read the parquet file: {exc}") from None
        schema = self._file.schema_arrow
        self.columns = list(schema.names)
        refuse_duplicate_columns(self.columns, where, "schema")
        meta = schema.metadata or {}
        self.metadata = {k.decode(): v.decode() for k, v in meta.items()}
        if self._file.metadata.num_rows == 0:
            raise TraceError(f"{where}: row 1: the file is empty (no rows)")

    def chunks(self) -> Iterator[Chunk]:
        first_row = 1
        try:
            for batch in self._file.iter_batches(batch_size=self.chunk_rows):
                keys = None
                if self.prefix_column in batch.schema.names:
                    col = batch.column(self.prefix_column)
                    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                        rows = np.arange(first_row, first_row + len(col), dtype=np.int64)
                        keys = arrow_key_lists(col, self._where, rows, "row", strict=True)
                        batch = batch.drop_columns([self.prefix_column])
                frame = batch.to_pandas()
                lines = np.arange(first_row, first_row + len(frame), dtype=np.int64)
                first_row += len(frame)
                yield Chunk(frame, lines, keys)
        except pa.ArrowException as exc:
            raise TraceError(f"{self._where}: near row {first_row}: cannot read the parquet file: {exc}") from None
