"""A directory written in place (a sweep: resumable), and removing what kvsim wrote in a directory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from kvsim.outdir.checks import check_out_dir
from kvsim.outdir.marker import MARKER, Marker, _is_ours, _marker, _remove_written, read_marker, write_marker


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

