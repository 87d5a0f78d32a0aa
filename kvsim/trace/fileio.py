"""Low-level file access shared by the trace loaders and writers.

* :func:`open_trace_file` opens a path for streaming, transparently un-gzipping it (detected from
  the magic bytes, not the name) while hashing the bytes *as stored*, so one pass over the file
  yields both its requests and its sha256.
* :class:`LineReader` iterates a decompressed binary stream line by line and counts 1-based line
  numbers, turning decompression failures (a truncated or corrupt ``.gz``) into a
  :class:`~kvsim.errors.TraceError` that names the last line that could be read.
* :func:`resolve_path` finds a file named in a scenario (its folder first, then the current one).

Nothing here holds more than one buffer of the file in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from kvsim.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
PARQUET_MAGIC = b"PAR1"
_HASH_BLOCK_BYTES = 1 << 20
# The longest line a text trace may have. One request per line is at most a few kB (a Mooncake
# line with a 128K-token prompt: ~2 kB); 16 MiB holds ~800,000 20-digit prefix keys. A longer line
# means the file is not a text trace (binary data, /dev/zero), and reading it whole could exhaust
# memory. Read at each call, so tests may lower it.
MAX_LINE_BYTES = 16 << 20
TEXT_FORMATS = "a trace is CSV with a header line or JSON lines, in UTF-8 text, or parquet"


class HashingReader(io.RawIOBase):
    """A read-only raw stream that feeds every byte it returns into a sha256."""

    def __init__(self, raw: io.BufferedIOBase):
        self._raw = raw
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._raw.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.sha256.update(data)
        return n

    def drain(self) -> str:
        """Read (and hash) whatever is left; return the hex digest of the whole file."""
        while True:
            data = self._raw.read(_HASH_BLOCK_BYTES)
            if not data:
                return self.sha256.hexdigest()
            self.sha256.update(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_HASH_BLOCK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def check_path(path: Path) -> None:
    """Raise a TraceError unless ``path`` is a readable regular file."""
    if not path.exists():
        raise TraceError(f"{path}: trace file does not exist")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory, expected a trace file")
    if not os.access(path, os.R_OK):
        raise TraceError(f"{path}: trace file is not readable (permission denied)")


class OpenTrace:
    """An open trace file: ``stream`` yields the decompressed bytes.

    ``compressed`` says whether the file was gzip; ``first_bytes`` are the first (up to 4096)
    decompressed bytes, used to sniff the container (CSV, JSON lines or parquet).
    """

    def __init__(self, path: Path):
        self.path = path
        self._hasher = HashingReader(open(path, "rb"))
        buffered = io.BufferedReader(self._hasher, buffer_size=1 << 16)
        self.compressed = buffered.peek(2)[:2] == GZIP_MAGIC
        if self.compressed:
            # Hash the decompressed bytes too: for a .gz copy of an upstream file this is the
            # upstream file's sha256.
            self._content_hasher: HashingReader | None = HashingReader(gzip.GzipFile(fileobj=buffered, mode="rb"))  # type: ignore[arg-type]
            self.stream: io.BufferedIOBase = io.BufferedReader(self._content_hasher, buffer_size=1 << 16)
        else:
            self._content_hasher = None
            self.stream = buffered
        try:
            self.first_bytes = self.stream.peek(4096)[:4096]
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(f"{path}: line 1: cannot decompress the gzip file ({_describe(exc)})") from None

    def sha256(self) -> tuple[str, str]:
        """(sha256 of the file as stored, sha256 of its decompressed content); reads the rest."""
        content = None
        if self._content_hasher is not None:
            try:
                content = self._content_hasher.drain()
            except (EOFError, OSError, zlib.error) as exc:
                raise TraceError(f"{self.path}: cannot decompress the end of the file ({_describe(exc)})") from None
        stored = self._hasher.drain()
        return stored, content or stored

    def close(self) -> None:
        self.stream.close()
        self._hasher.close()

    def __enter__(self) -> "OpenTrace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the file is truncated: the compressed stream ends before its end marker"
    return f"corrupt compressed data: {exc}"


class LineReader:
    """Iterate the lines (bytes, newline kept) of a decompressed stream, counting line numbers.

    ``line_no`` is the 1-based number of the last line returned. A decompression failure raises
    a TraceError naming the file and the last complete line read before the damage.
    """

    def __init__(self, stream: io.BufferedIOBase, path: Path):
        self._stream = stream
        self._path = path
        self.line_no = 0

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self._next_line()
            if not line:
                return
            self.line_no += 1
            yield line

    def _next_line(self) -> bytes:
        """The next line (b"" at the end), read at most MAX_LINE_BYTES (+ the newline) at a time."""
        limit = MAX_LINE_BYTES
        try:
            line = self._stream.readline(limit + 1)
        except (EOFError, OSError, zlib.error) as exc:
            raise TraceError(
                f"{self._path}: line {self.line_no + 1}: cannot read past line {self.line_no}: {_describe(exc)}"
            ) from None
        if len(line) > limit and not line.endswith(b"\n"):
            raise TraceError(
                f"{self._path}: line {self.line_no + 1}: longer than {_mib(limit)} without a line break: "
                f"not a text trace ({TEXT_FORMATS})"
            )
        return line

    def readline(self) -> bytes:
        for line in self:
            return line
        return b""


def resolve_path(name: str, base_dir: Path | None, what: str = "trace file") -> Path:
    """``name`` as given if absolute; else under ``base_dir`` if it exists there, else under the
    current directory if it exists there; else a TraceError naming every place tried."""
    path = Path(name).expanduser()
    if path.is_absolute():
        tried = [path]
    else:
        tried = ([Path(base_dir) / path] if base_dir is not None else []) + [Path.cwd() / path]
    for candidate in tried:
        if candidate.exists():
            return candidate
    places = " or ".join(str(p) for p in tried)
    raise TraceError(f"{name}: {what} does not exist (looked for {places})")
