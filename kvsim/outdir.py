"""Output safety: kvsim deletes or replaces only what kvsim wrote. Every command that writes uses this.

Rules (user-facing text: docs/outputs.md):

* **Output directories** (``run``, ``sweep``, ``compare``, ``calibrate``) carry a marker file,
  :data:`MARKER` (``.kvsim-output.json``), recording the command that wrote the directory, whether
  it is complete, and every file and directory kvsim wrote there (paths relative to it).
* A path that does not exist, or an empty directory, may be used. A directory with a marker is a
  kvsim directory: a rerun of the same command replaces it, ``--force`` also lets another kvsim
  command replace it. Only what the marker lists is removed: anything else (a user's ``notes.txt``
  or ``compare-mine/``, another command's output nested inside) is moved into the new directory.
  A non-empty directory without a marker is never touched, with or without ``--force``.
* Refused outright: ``--out`` equal to, or a parent of, the current directory, the home directory,
  the filesystem root, or a protected input (the scenario file's directory, compared runs).
* Replacement is atomic: the new output is written into a hidden ``.OUT.tmp-<pid>`` next to
  ``OUT`` (marked incomplete) and renamed into place when complete; the old directory is renamed to
  ``.OUT.old-<pid>`` in between. Readers see the old or the new complete directory. Leftovers of a
  killed run are recognised by their marker and dead pid: a temp directory is removed, an old
  directory gives the user's files back (or is renamed back to ``OUT`` if the swap was cut short).
  A hidden directory without our marker is never removed.
* **Output files** (``trace convert/generate``, ``report --out FILE``): an existing file is
  replaced only when the marker of the kvsim directory holding it says the same command wrote it
  (:func:`writer_of`: a run's ``summary.json`` is never a report's to replace; its ``report.html``
  is), or with ``--force``. Files are written to a temp name and renamed into place. One written into
  another command's directory is recorded in that marker's ``by`` (name -> command), not in its
  ``written``: the owner keeps it when it replaces the directory.

This module uses the standard library only (``kvsim calibrate`` runs on machines with a bare Python).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError, KvsimError

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


# --- where an output may go ----------------------------------------------------------------------


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


# --- leftovers of killed runs ---------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    """Is ``pid`` a live process? A zombie (killed, not yet reaped) counts as dead."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _pid_of(p: Path) -> int | None:
    try:
        return int(p.name.rsplit("-", 1)[1])
    except (ValueError, IndexError):
        return None


def _is_ours(d: Path) -> Marker | None:
    try:
        return read_marker(d)
    except ConfigError:
        return None


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


def clean_leftovers(out: Path) -> list[str]:
    """Tidy up after killed runs into ``out``: returns one note per thing done or left alone."""
    out = Path(out)
    notes: list[str] = []
    if not out.parent.is_dir():
        return notes
    for old in sorted(out.parent.glob(f".{out.name}.old-*")):
        pid, marker = _pid_of(old), _is_ours(old)
        if pid is None or marker is None or _pid_alive(pid):
            continue
        if not out.exists():  # killed between the two renames: the old complete output goes back
            os.replace(old, out)
            notes.append(f"restored {out} from an interrupted replacement")
            continue
        left = _move_user_entries(old, out, _user_entries(old, marker.written))
        _remove_written(old, marker.written)
        if left:
            notes.append(f"kept {old}: it holds your files {', '.join(left[:5])} whose names are now taken in {out}")
            continue
        (old / MARKER).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            old.rmdir()
    for tmp in sorted(out.parent.glob(f".{out.name}.tmp-*")):
        pid = _pid_of(tmp)
        if pid is None or not tmp.is_dir() or _is_ours(tmp) is None or _pid_alive(pid):
            continue
        shutil.rmtree(tmp, ignore_errors=True)
    return notes


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


# --- writing a directory atomically ---------------------------------------------------------------


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


# --- a directory written in place (a sweep: resumable) ---------------------------------------------


def open_in_place(out: str | Path, command: str, written: Iterable[str], *, force: bool = False,
                  flag: str = "--out", protect: Iterable[str | Path] = ()) -> Path:
    """Prepare ``out`` for ``command`` to write into directly (resumable output such as a sweep).

    A directory of another kvsim command is replaced only with ``force`` (its own files only).
    The marker is written incomplete, listing ``written`` (top-level names the command may write).
    """
    out = Path(out)
    marker = check_out_dir(out, command, force=force, flag=flag, protect=protect)
    by = dict(marker.by) if marker else {}
    if marker is not None and marker.command != command:
        _remove_written(out, marker.written)
        by = {n: c for n, c in by.items() if n not in marker.written}  # other commands' files: kept
        marker = None
    out.mkdir(parents=True, exist_ok=True)
    names = set(written) | (set(marker.written) if marker else set())
    write_marker(out, _marker(command, False, names, by))
    return out


def set_complete(out: str | Path, complete: bool = True) -> None:
    out = Path(out)
    m = read_marker(out)
    if m is not None:
        write_marker(out, Marker(m.command, complete, m.written, m.by))


# --- single files ---------------------------------------------------------------------------------


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


def remove_output(out: str | Path) -> bool:
    """Delete what kvsim wrote in the output directory ``out`` (per its marker), keeping anything
    else; the directory goes too if nothing else is left. Returns False if ``out`` has no marker."""
    out = Path(out)
    marker = _is_ours(out) if out.is_dir() else None
    if marker is None:
        return False
    _remove_written(out, marker.written)
    (out / MARKER).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        out.rmdir()
    return True


def withdraw_output(out: str | Path) -> bool:
    """Delete what kvsim wrote in the output directory ``out`` (per its marker), as
    :func:`remove_output` does, but where anything else is left keep the marker, now incomplete and
    listing nothing: the directory stays its command's to write again (an output found out of date,
    e.g. a sweep's ``compare/`` whose new version could not be written). Returns False if ``out`` has
    no marker."""
    out = Path(out)
    marker = _is_ours(out) if out.is_dir() else None
    if marker is None:
        return False
    _remove_written(out, marker.written)
    if any(c.name != MARKER for c in out.iterdir()):
        write_marker(out, _marker(marker.command, False, (), dict(marker.by)))
    else:
        (out / MARKER).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            out.rmdir()
    return True
