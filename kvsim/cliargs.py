"""The command line's argument parser and the argument types its tools share (argparse ``type=``
callables)."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors (a bad flag value, an unknown flag, a missing argument)
    are one line, ``kvsim: error: <what> (see <command> --help)``, exit 2, like every other kvsim
    error. Its sub-command parsers are of this class too (argparse makes them of the parent's class),
    so a command registered with ``add_parser`` needs nothing of its own."""

    def error(self, message: str):
        self.exit(2, f"kvsim: error: {message} (see `{self.prog} --help`)\n")


def _at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text}")
    return v


def positive_int(text: str) -> int:
    """An integer >= 1; anything else is a one-line usage error (:class:`OneLineParser`)."""
    return _at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (a seed); anything else is a one-line usage error (:class:`OneLineParser`)."""
    return _at_least(text, 0)


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, a budget); anything else is a one-line usage error (:class:`OneLineParser`)."""
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return v


def int_in(low: int, high: int, why: str = ""):
    """An argparse ``type=``: an integer in ``low..high`` (``why``: what the upper bound is, shown with it)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer in {low}..{high:,}, got {text!r}") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in {low}..{high:,}{f' ({why})' if why else ''}, "
                                             f"got {v:,}")
        return v
    return parse
