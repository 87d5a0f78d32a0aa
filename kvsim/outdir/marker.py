"""The marker file (:data:`MARKER`) of a kvsim output directory: the command that wrote it, whether
it is complete, what it wrote there (and which single files other commands wrote); read, written, and
set against the directory's entries (what kvsim wrote, what is the user's)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError

MARKER = ".kvsim-output.json"
MARKER_FORMAT = "kvsim output directory"
INCOMPLETE_FILE = "INCOMPLETE"
RESUME_FILE = ".kvsim-resume.json"  # in a temp directory: the parts finished so far (kvsim run's variants)


# Single files that several commands write the same way: ``report.html`` of a run, sweep or replay
# directory is the report ``kvsim report DIR`` writes, so that command may rewrite it.
FILE_WRITERS = {"report.html": "report"}


@dataclass(frozen=True)
class Marker:
    """The content of a :data:`MARKER` file."""

    command: str
    complete: bool
    written: tuple[str, ...]  # relative paths ("a", "a/summary.json"), sorted
    # single files written into the directory by another command: sorted (name, command) pairs; a name
    # not in ``written`` is not the owner's (kept when the owner replaces the directory)
    by: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str:
        doc = {"format": MARKER_FORMAT, "command": self.command, "complete": self.complete,
               "written": list(self.written)}
        if self.by:
            doc["by"] = dict(self.by)
        return json.dumps(doc, indent=1) + "\n"


def _marker(command: str, complete: bool, written: Iterable[str], by: dict[str, str] | None = None) -> Marker:
    """A :class:`Marker` with ``by`` entries that say no more than the defaults dropped
    (:func:`writer_of`)."""
    written = tuple(sorted(set(written)))
    listed = set(written)
    kept = {n: c for n, c in (by or {}).items() if not (n in listed and FILE_WRITERS.get(n, command) == c)}
    return Marker(command, complete, written, tuple(sorted(kept.items())))


def writer_of(marker: Marker, name: str) -> str | None:
    """The kvsim command that wrote the file ``name`` of the directory ``marker`` belongs to (None:
    not kvsim). Markers written before ``by`` existed read as before: their files are the owner's,
    ``report.html`` the report's."""
    by = dict(marker.by)
    if name in by:
        return by[name]
    if name in marker.written:
        return FILE_WRITERS.get(name, marker.command)
    return None


def _read_by(doc: dict) -> dict[str, str]:
    by = doc.get("by", {})
    if not isinstance(by, dict):
        raise TypeError("by")
    return {str(n): str(c) for n, c in by.items()}


def read_marker(d: Path) -> Marker | None:
    """The marker of directory ``d``, or None when it has none. A damaged marker is a user error."""
    p = Path(d) / MARKER
    if not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
        if doc.get("format") != MARKER_FORMAT:
            raise ValueError("not a kvsim marker")
        written = tuple(sorted(str(w) for w in doc["written"]))
        return Marker(str(doc["command"]), bool(doc["complete"]), written, tuple(sorted(_read_by(doc).items())))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"{p}: damaged kvsim marker file; kvsim will not touch {d} "
                          f"(move it away or choose another output path)") from None


def write_marker(d: Path, marker: Marker) -> None:
    _write_text_atomic(Path(d) / MARKER, marker.to_json())


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def tree(d: Path) -> list[str]:
    """Every file and directory under ``d`` as sorted relative POSIX paths, the marker excluded."""
    d = Path(d)
    out = []
    for root, dirs, files in os.walk(d):
        rel = Path(root).relative_to(d)
        for name in dirs + files:
            r = (rel / name).as_posix()
            if r != MARKER:
                out.append(r)
    return sorted(out)


def _is_ours(d: Path) -> Marker | None:
    try:
        return read_marker(d)
    except ConfigError:
        return None



# --- the entries of a directory: kvsim's (listed in its marker) and the user's ---------------------


def _remove_written(d: Path, written: Iterable[str]) -> None:
    """Delete the listed paths under ``d`` (deepest first); a listed directory that still holds
    unlisted entries is kept."""
    listed = set(written)
    for rel in sorted(listed, key=lambda r: r.count("/"), reverse=True):
        p = d / rel
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            if all(f"{rel}/{c.name}" in listed for c in p.iterdir()):
                shutil.rmtree(p, ignore_errors=True)


def _empty_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and not any(p.iterdir())


def _user_entries(d: Path, written: Iterable[str]) -> list[str]:
    """Top-most paths under ``d`` that kvsim did not write (per ``written``)."""
    listed = set(written)
    found = []

    def walk(base: Path, prefix: str) -> None:
        for c in sorted(base.iterdir(), key=lambda c: c.name):
            rel = f"{prefix}{c.name}"
            if rel == MARKER:
                continue
            if rel not in listed:
                found.append(rel)
            elif c.is_dir() and not c.is_symlink():
                walk(c, rel + "/")

    walk(d, "")
    return found


def _move_user_entries(src: Path, dst: Path, entries: list[str]) -> list[str]:
    """Move ``entries`` from ``src`` to ``dst`` (same relative paths); returns those left behind
    because ``dst`` already has that name."""
    left = []
    for rel in entries:
        target = dst / rel
        if target.exists() or target.is_symlink():
            left.append(rel)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src / rel, target)
    return left

