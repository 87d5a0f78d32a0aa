"""Writing a directory atomically: into a hidden temp directory, committed (renamed into place) when
complete; an interrupted commit finished, an interrupted run's temp directory adopted to resume."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kvsim.errors import ConfigError, KvsimError
from kvsim.outdir.checks import check_out_dir
from kvsim.outdir.leftovers import _pid_alive, _pid_of, clean_leftovers
from kvsim.outdir.marker import (INCOMPLETE_FILE, MARKER, RESUME_FILE, Marker, _empty_dir, _is_ours, _marker,
                                 _move_user_entries, _remove_written, _user_entries, read_marker, tree, write_marker)


def finish_killed_commit(out: str | Path, command: str) -> list[str]:
    """Finish a replacement of ``out`` killed after its output was complete, then tidy up.

    :func:`commit` marks the temp directory complete and only then renames it into place; a process
    killed in between leaves a finished ``.OUT.tmp-<pid>`` (marker ``complete``, no ``INCOMPLETE``).
    When its process is gone and it is ``command``'s output, the commit is completed (``out``
    absent, or an earlier output of ``command``: replaced, the user's files kept), so finished work
    is not thrown away. Then :func:`clean_leftovers` (an ``.OUT.old-<pid>`` gives the user's files
    back; other dead temp directories are removed). Returns one note per thing done.
    """
    out = Path(out)
    notes: list[str] = []
    if not out.parent.is_dir():
        return notes
    for tmp in sorted(out.parent.glob(f".{out.name}.tmp-*")):
        pid = _pid_of(tmp)
        if pid is None or tmp.is_symlink() or not tmp.is_dir() or _pid_alive(pid):
            continue
        marker = _is_ours(tmp)
        if marker is None or not marker.complete or marker.command != command or (tmp / INCOMPLETE_FILE).exists():
            continue
        try:
            commit(tmp, out, command)
        except (ConfigError, OSError):  # in the way (a user's file, another command's output): leave it
            continue
        notes.append(f"finished the interrupted replacement of {out} (its complete output was {tmp.name})")
        break  # one complete output per directory; clean_leftovers removes any other dead temp
    return notes + clean_leftovers(out)


def _new_temp(out: Path, command: str) -> Path:
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        if _is_ours(tmp) is None:
            raise ConfigError(f"{tmp}: exists and was not written by kvsim; move it away")
        shutil.rmtree(tmp)
    tmp.mkdir()
    write_marker(tmp, Marker(command, False, ()))
    return tmp


def _by_under(marker: Marker, entries: list[str]) -> dict[str, str]:
    """The ``by`` entries of ``marker`` for files that are, or are under, one of ``entries``."""
    return {n: c for n, c in marker.by if any(n == e or n.startswith(e + "/") for e in entries)}


def commit(tmp: Path, out: Path, command: str, *, force: bool = False, flag: str = "--out",
           legacy: Callable[[Path], Marker | None] | None = None) -> Path:
    """Mark ``tmp`` complete and put it at ``out``, keeping the files in ``out`` kvsim did not write."""
    tmp, out = Path(tmp), Path(out)
    (tmp / INCOMPLETE_FILE).unlink(missing_ok=True)
    (tmp / RESUME_FILE).unlink(missing_ok=True)
    written = tree(tmp)
    mine = _is_ours(tmp)
    by = {n: c for n, c in (mine.by if mine else ()) if n in written}  # e.g. report.html, by the report
    write_marker(tmp, _marker(command, True, written, by))
    # Check again: the directory may have changed while we were running.
    old_marker = check_out_dir(out, command, force=force, flag=flag, legacy=legacy)
    if not out.exists():
        os.replace(tmp, out)
        return out
    if old_marker is None:  # an empty directory
        out.rmdir()
        os.replace(tmp, out)
        return out
    user = _user_entries(out, old_marker.written)
    for u in [u for u in user if _empty_dir(out / u) and (tmp / u).is_dir()]:
        (out / u).rmdir()  # an empty folder where a new output folder goes holds nothing to keep
        user.remove(u)
    taken = [u for u in user if (tmp / u).exists()]
    if taken:
        what = "folder" if (out / taken[0]).is_dir() else "file"
        raise ConfigError(f"{flag} {out}: your {what} {out / taken[0]} has the name of a new kvsim output; move "
                          f"it away and rerun (the new output is kept in {tmp})")
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if old.exists():
        raise ConfigError(f"{old}: in the way of replacing {out}; move it away")
    kept = _by_under(old_marker, user)  # other commands' files among the kept ones: still theirs
    if kept:
        write_marker(tmp, _marker(command, True, written, {**by, **kept}))
    if read_marker(out) is None:  # a recognised older kvsim directory: give it its marker first
        write_marker(out, old_marker)
    os.replace(out, old)
    os.replace(tmp, out)
    _move_user_entries(old, out, user)
    _remove_written(old, old_marker.written)
    (old / MARKER).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        old.rmdir()
    return out


def adopt_interrupted(out: str | Path, command: str) -> Path | None:
    """The temp directory of an interrupted ``command`` into ``out`` that holds finished parts
    (a :data:`RESUME_FILE`; its process gone, or this process), renamed to this process's temp
    name to be written on; None if there is none. The newest wins; :func:`clean_leftovers` removes
    the others."""
    out = Path(out)
    if not out.parent.is_dir():
        return None
    found = []
    for tmp in out.parent.glob(f".{out.name}.tmp-*"):
        pid = _pid_of(tmp)
        if pid is None or tmp.is_symlink() or not tmp.is_dir() or (pid != os.getpid() and _pid_alive(pid)):
            continue
        marker = _is_ours(tmp)
        if marker is not None and marker.command == command and not marker.complete and (tmp / RESUME_FILE).is_file():
            found.append(tmp)
    if not found:
        return None
    best = max(found, key=lambda p: (p.stat().st_mtime_ns, p.name))
    mine = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if best != mine:
        if mine.exists():
            if _is_ours(mine) is None:
                raise ConfigError(f"{mine}: exists and was not written by kvsim; move it away")
            shutil.rmtree(mine)
        os.replace(best, mine)
    (mine / INCOMPLETE_FILE).unlink(missing_ok=True)
    return mine


@contextlib.contextmanager
def atomic_out_dir(out: str | Path, command: str, *, force: bool = False, flag: str = "--out",
                   protect: Iterable[str | Path] = (), legacy: Callable[[Path], Marker | None] | None = None,
                   log: Callable[[str], None] | None = None, resume: bool = False) -> Iterator[Path]:
    """Yield a temporary directory to write ``command``'s output into; on success it replaces ``out``.

    Refused (before anything is written) per :func:`check_out_dir`. On a refusal (a KvsimError) with
    nothing finished the temp directory is removed; on any other exception it stays, marked
    incomplete (``INCOMPLETE`` says why), and a later run removes it.
    ``resume``: the yielded directory may be an interrupted run's (:func:`adopt_interrupted`: the
    caller keeps what its :data:`RESUME_FILE` lists and still holds, and clears the rest); on Ctrl-C
    a temp directory with no :data:`RESUME_FILE` (nothing finished) is removed at once.
    """
    out = Path(out)
    check_out_dir(out, command, force=force, flag=flag, protect=protect, legacy=legacy)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = adopt_interrupted(out, command) if resume else None
    for note in clean_leftovers(out):
        if log:
            log(note)
    if tmp is None:
        tmp = _new_temp(out, command)
    try:
        yield tmp
    except BaseException as e:
        # nothing to resume: a refusal (bad input, one line, exit 2) or Ctrl-C leaves no temp directory
        if (isinstance(e, KvsimError) or (resume and isinstance(e, KeyboardInterrupt))) \
                and not (tmp / RESUME_FILE).exists():
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        with contextlib.suppress(OSError):
            (tmp / INCOMPLETE_FILE).write_text(f"run stopped before completion: {type(e).__name__}: {e}\n")
        raise
    commit(tmp, out, command, force=force, flag=flag, legacy=legacy)

