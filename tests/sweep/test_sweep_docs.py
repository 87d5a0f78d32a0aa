"""docs/sweeps.md's list of the index's metric columns is the code's (kvsim.report.tables.METRICS)."""

from __future__ import annotations

import itertools
import re

from sweep_helpers import REPO

from kvsim.report.tables import METRICS


def expand(name: str) -> list[str]:
    """``ttft_{mean,p50}_s`` -> ``ttft_mean_s``, ``ttft_p50_s`` (every brace group, in order)."""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def documented_metric_columns() -> list[str]:
    text = (REPO / "docs" / "sweeps.md").read_text(encoding="utf-8")
    m = re.search(r"### The index\n.*?metrics of the point's `summary\.json`[^\n]*\n(.*?)Metrics of failed points",
                  text, re.S)
    assert m, "docs/sweeps.md: no list of the index's metric columns under '### The index'"
    always = m.group(1).partition("when present")[0]  # then the optional columns (prefix_cache_<key>, ...)
    names = re.findall(r"`([^`]+)`", always)
    # column names only: no dotted summary paths, file names, scenario keys or `<key>` patterns
    return [c for n in names if re.fullmatch(r"[a-z0-9_{},]+", n) for c in expand(n)]


def test_sweeps_doc_lists_every_index_metric_column_in_order():
    assert documented_metric_columns() == list(METRICS)


def test_expand():
    assert expand("itl_{mean,max}_s") == ["itl_mean_s", "itl_max_s"]
    assert expand("a_{x,y}_{1,2}") == ["a_x_1", "a_x_2", "a_y_1", "a_y_2"]
    assert expand("busy_frac") == ["busy_frac"]
