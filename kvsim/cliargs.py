"""Argument types shared by the command-line tools (argparse ``type=`` callables)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer >= 1; anything else is argparse's one-line usage error."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
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
