"""Comparison tables/plots (``kvsim compare``) and self-contained HTML reports (``kvsim report``).

``write_run_report(run_dir) -> Path`` writes ``report.html`` into a run, variants or sweep
directory; ``compare(paths, out)`` writes ``comparison.csv`` and the comparison plots. See
``docs/report.md``.
"""

from __future__ import annotations


def write_run_report(run_dir, out=None, *, force=False, shown_name=None):
    """Write ``report.html`` for a run, variants or sweep directory; returns its path. An existing
    file kvsim did not write is replaced only with ``force`` (see docs/outputs.md)."""
    from kvsim.report.html import write_run_report as _write

    return _write(run_dir, out, force=force, shown_name=shown_name)


def render_report(run_dir):
    from kvsim.report.html import render_report as _render

    return _render(run_dir)


def compare(paths, out=None, log=None, *, force=False):
    """Write comparison tables and plots for ``paths`` (run, variants or sweep dirs) into ``out``
    (a kvsim output directory: see docs/outputs.md)."""
    from kvsim.report.comparison import compare as _compare

    return _compare(paths, out, log=log, force=force)


__all__ = ["compare", "render_report", "write_run_report"]
