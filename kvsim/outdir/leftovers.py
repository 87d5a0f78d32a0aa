"""Leftovers of killed runs: hidden ``.OUT.tmp-<pid>`` and ``.OUT.old-<pid>`` directories whose
process is gone, recognised by kvsim's marker, tidied up."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from kvsim.outdir.marker import MARKER, _is_ours, _move_user_entries, _remove_written, _user_entries


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

