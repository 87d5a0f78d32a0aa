"""Preset names: case-insensitive lookup, and "did you mean" that matches on the distinctive parts.

Plain edit distance offers ``A100-80GB`` for ``H100-80GB`` (one letter apart) although the user
clearly meant an H100. Names are split into parts at separators and at letter/digit boundaries
(``H100-SXM-80GB`` -> h, 100, sxm, 80, gb) and the preset sharing the most parts wins (Jaccard);
edit distance only breaks ties and catches typos inside a part. A preset of another family
(the first word: ``gemma`` vs ``llama``) is never offered unless the spelling is close.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")

_PART = re.compile(r"[a-z]+|\d+(?:\.\d+)?")


def parts(name: str) -> frozenset[str]:
    return frozenset(_PART.findall(name.lower()))


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def lookup(name: str, presets: Mapping[str, T]) -> str | None:
    """The preset key ``name`` means: exact, else case-insensitive, else ignoring separators
    (``llama3-8b`` -> ``Llama-3-8B``) when that is unambiguous; None when there is none."""
    if name in presets:
        return name
    for key in presets:
        if key.lower() == name.lower():
            return key
    squashed = [key for key in presets if _squash(key) == _squash(name)]
    return squashed[0] if len(squashed) == 1 else None


def repo_name(name: str) -> str:
    """A Hugging Face repository id without its owner (``meta-llama/Llama-3.1-8B`` -> ``Llama-3.1-8B``)."""
    return name.rsplit("/", 1)[-1]


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice that shares the most distinctive parts with ``name`` (None when nothing is close)."""
    choices = list(choices)
    name = repo_name(name)
    want = parts(name)
    family = re.match(r"[^a-z]*([a-z]+)", name.lower())
    best, best_key, best_ok = None, (0.0, 0.0), False
    for c in choices:
        have = parts(c)
        jaccard = len(want & have) / len(want | have) if want | have else 0.0
        ratio = difflib.SequenceMatcher(None, name.lower(), c.lower()).ratio()
        key = (jaccard, ratio)
        if key > best_key:
            # Close enough: half the parts shared, a near-spelling, or every part the user wrote.
            # Never across families (Gemma-2-9B is not "near" Llama-2-7B) unless it is a misspelling.
            same_family = family is None or family.group(1) in have or ratio >= 0.8
            best, best_key = c, key
            best_ok = same_family and (jaccard >= 0.5 or ratio >= 0.6 or (bool(want) and want <= have))
    return best if best_ok else None


def did_you_mean_preset(name: str, choices: Iterable[str], not_presets: Mapping[str, str] | None = None) -> str:
    """`` (did you mean 'X'?)``, or, for a model family deliberately left out (``not_presets``: name
    prefix -> why), why it is not a preset."""
    squashed = _squash(repo_name(name))
    for prefix, why in (not_presets or {}).items():
        if squashed.startswith(_squash(prefix)):
            return f" ({why})"
    c = closest(name, choices)
    return f" (did you mean '{c}'?)" if c else ""
