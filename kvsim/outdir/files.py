"""Single output files (``trace convert/generate``, ``report --out FILE``): replaced only when the marker
of the kvsim directory holding one says the same command wrote it (or with ``force``), written to a
temp name and renamed into place, recorded in that marker."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from kvsim.errors import ConfigError
from kvsim.outdir.checks import _describe
from kvsim.outdir.marker import FILE_WRITERS, Marker, _is_ours, _marker, write_marker, writer_of


def check_out_file(path: str | Path, *, command: str, force: bool = False, flag: str = "--out") -> None:
    """May ``command`` write the file ``path``? Yes when it does not exist, when the marker of its
    directory says ``command`` wrote it (:func:`writer_of`), or with ``force``. Never a directory;
    never, without ``force``, a file another command wrote (a run's ``summary.json``)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    if not (path.exists() or path.is_symlink()) or force:
        return
    owner, marker, rel = _owning_output(path)
    writer = writer_of(marker, rel) if marker is not None else None
    if writer == command:
        return
    if writer is not None:
        raise ConfigError(f"{flag} {path}: {_describe(writer)} wrote it (in the {_describe(marker.command)} output "
                          f"{owner}), not {_describe(command)}; choose another name, or pass --force to "
                          f"overwrite it")
    raise ConfigError(f"{flag} {path}: file exists and no kvsim output folder records writing it (a file "
                      f"outside one, even one kvsim wrote, carries no record); pass --force to overwrite it, "
                      f"or choose another name")


def _owning_output(path: Path) -> tuple[Path | None, Marker | None, str]:
    """The nearest kvsim output directory holding ``path`` (a folder with a marker), its marker and
    ``path`` relative to it; (None, None, name) when there is none."""
    path = Path(os.path.abspath(path))
    for d in path.parents:
        marker = _is_ours(d)
        if marker is not None:
            return d, marker, path.relative_to(d).as_posix()
    return None, None, path.name


def record_written(d: str | Path, names: Iterable[str], command: str | None = None) -> None:
    """Record in the marker of ``d`` (if it has one) that ``command`` wrote ``names`` (relative to
    ``d``). The directory's own files: those of its command (``None``: that one) and the outputs
    every such directory has (:data:`FILE_WRITERS`: ``report.html``), replaced when it is. Another
    command's files are recorded under ``by`` only: the owner keeps them when it replaces ``d``."""
    d = Path(d)
    m = _is_ours(d)
    if m is None:
        return
    names = set(names)
    own = {n for n in names if command in (None, m.command) or FILE_WRITERS.get(n) == command}
    by = {n: c for n, c in m.by if n not in own}
    by.update({n: command for n in names - own})
    write_marker(d, _marker(m.command, m.complete, set(m.written) | own, by))


def write_file_atomic(path: str | Path, write: Callable[[Path], None], *, command: str, force: bool = False,
                      flag: str = "--out") -> Path:
    """Check ``path`` (:func:`check_out_file`), have ``write(tmp)`` write a temp file next to it,
    rename it into place and record that ``command`` wrote it (:func:`record_written`). Returns ``path``."""
    path = Path(path)
    check_out_file(path, command=command, force=force, flag=flag)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    owner, _, rel = _owning_output(path)
    if owner is not None:
        record_written(owner, [rel], command)
    return path

