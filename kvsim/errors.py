"""User-facing errors.

Every problem caused by the user's input (a scenario file, a trace, a calibration directory, a
command-line flag) is raised as a :class:`KvsimError` subclass. The CLI prints ``str(error)`` as a
single line on stderr and exits with status 2; it never shows a traceback unless ``--debug`` is
given. Messages name the file, the field (a dotted key path, a row or a line) and, where there is a
closed set, the valid choices.

Bugs (violated invariants, misuse of an allocator) raise ordinary exceptions such as
``RuntimeError``/``ValueError``/``AssertionError``: those are ours to fix, not the user's.
"""

from __future__ import annotations

import contextlib
import difflib
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path


class KvsimError(Exception):
    """Base class of errors caused by user input; ``str()`` is the one-line message."""


class ConfigError(KvsimError):
    """A scenario/spec YAML file is malformed or has an invalid value."""


class TraceError(KvsimError):
    """A trace file cannot be read or holds invalid requests."""


class CalibrationError(KvsimError):
    """A calibration directory is missing, inconsistent, or for another model/GPU."""


class SimulationLimitError(KvsimError):
    """A run exceeded a configured simulated-time or wall-time limit."""


class KvsimWarning(UserWarning):
    """Something the user should know that is not an error (a trace repaired while loading, ...);
    the CLI prints ``str(warning)`` as one line ``kvsim: warning: <message>`` on stderr. Every
    warning kvsim raises for the user derives from it."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what was kept: ``str()`` is the one-line message the CLI prints (exit 130)."""


def read_user_text(path: Path, what: str) -> str:
    """The UTF-8 text of the user's file ``path``, without a leading byte-order mark (a spreadsheet's
    "CSV UTF-8" export starts with one, which would otherwise join the first header key); a file that
    cannot be read (missing, a directory, no permission) or is not UTF-8 text is one
    :class:`ConfigError` line: ``PATH: cannot read WHAT: why``."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: cannot read {what}: not UTF-8 text (byte {e.start}: {e.reason})") from None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def format_choices(choices: Iterable[str]) -> str:
    return ", ".join(sorted(choices))


@contextlib.contextmanager
def one_line_warnings():
    """While active, kvsim's own warnings (:class:`~kvsim.errors.KvsimWarning` and its subclasses,
    e.g. a trace repair) print as one line ``kvsim: warning: <message>`` on stderr, like errors do;
    any other warning is shown as Python would show it. Filters (``-W``) still apply."""
    with warnings.catch_warnings():
        python_show = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, KvsimWarning):
                print(f"kvsim: warning: {message}", file=sys.stderr)
            else:
                python_show(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield
