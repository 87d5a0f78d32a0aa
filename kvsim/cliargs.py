"""Argument types shared by the command-line tools (argparse ``type=`` callables)."""

from __future__ import annotations

import argparse


def _at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text}")
    return v


def positive_int(text: str) -> int:
    """An integer >= 1; anything else is argparse's one-line usage error."""
    return _at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (a seed); anything else is argparse's one-line usage error."""
    return _at_least(text, 0)


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
