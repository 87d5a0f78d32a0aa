"""Where an output may go: refused before any work (protected directories, parents that are files,
paths that cannot be created, directories kvsim did not write or another command wrote)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.outdir.marker import MARKER, Marker, read_marker


def _protected_roots(protect: Iterable[str | Path]) -> list[tuple[Path, str]]:
    roots = [(Path.cwd().resolve(), "the current directory"), (Path("/").resolve(), "the filesystem root")]
    home = os.path.expanduser("~")
    if home and home != "~":
        roots.append((Path(home).resolve(), "your home directory"))
    for p in protect:
        p = Path(p).resolve()
        roots.append((p.parent, f"the directory of {p}") if p.is_file() else (p, str(p)))
    return roots


def check_not_protected(out: Path, flag: str, protect: Iterable[str | Path] = ()) -> None:
    """Refuse ``out`` equal to or a parent of the current/home/root directory or a protected input."""
    real = Path(out).resolve()
    roots = _protected_roots(protect)
    hits = [("is", what) for root, what in roots if real == root]
    hits += [("is a parent of", what) for root, what in roots if real in root.parents]
    if hits:
        rel, what = hits[0]
        raise ConfigError(f"{flag} {out}: {rel} {what}; kvsim writes its output into a directory of its own "
                          f"(e.g. {flag} results/NAME)")


def check_parent_folders(out: Path, flag: str) -> None:
    """Refuse ``out`` when the nearest of its parents that exists is not a folder (``afile/sub``):
    kvsim could not create ``out`` there."""
    for parent in Path(out).parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ConfigError(f"{flag} {out}: {parent} is a file, not a folder; choose an {flag} "
                                  f"under a folder (e.g. {flag} results/NAME)")
            return


def check_creatable(out: str | Path, flag: str = "--out") -> None:
    """Refuse, before any work, an ``out`` that does not exist and cannot be created (a parent that is
    a file, a read-only or virtual file system such as /proc): kvsim makes and removes a hidden probe
    folder where ``out``'s first missing folder would go."""
    out = Path(out)
    check_parent_folders(out, flag)
    if out.exists():
        return
    missing = out
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    try:
        probe = Path(tempfile.mkdtemp(prefix=f".{missing.name}.probe-", dir=missing.parent))
    except OSError as e:
        raise ConfigError(f"{flag} {out}: cannot be created in {missing.parent} ({e.strerror or e}); "
                          f"choose another {flag}") from None
    probe.rmdir()


def _describe(command: str) -> str:
    return f"`kvsim {command}`"


def check_out_dir(out: str | Path, command: str, *, force: bool = False, flag: str = "--out",
                  protect: Iterable[str | Path] = (), legacy: Callable[[Path], Marker | None] | None = None,
                  what: str = "a kvsim output directory") -> Marker | None:
    """May ``command`` write (replace) the directory ``out``? Returns its marker (None: new or empty).

    Raises :class:`ConfigError` (one line) otherwise. ``legacy(out)`` may recognise an older kvsim
    directory without a marker and return the marker it should have had.
    """
    out = Path(out)
    check_not_protected(out, flag, protect)
    check_creatable(out, flag)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{flag} {out}: exists and is not a directory; kvsim will not replace it")
    if not out.exists():
        return None
    marker = read_marker(out)
    if marker is None and legacy is not None:
        marker = legacy(out)
    if marker is None:
        if not any(out.iterdir()):
            return None
        raise ConfigError(f"{flag} {out}: directory exists and is not {what} (no {MARKER}: kvsim did not write it); "
                          f"kvsim never replaces it, even with --force: choose another {flag} or an empty directory")
    if marker.command != command and not force:
        raise ConfigError(f"{flag} {out}: holds the output of {_describe(marker.command)}, not of "
                          f"{_describe(command)}; pass --force to replace it (files kvsim did not write are kept)")
    return marker

