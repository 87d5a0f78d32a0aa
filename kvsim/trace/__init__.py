"""Request traces: the :class:`Trace` record, loaders, generators, transforms and statistics.

Public entry points (imported lazily so ``import kvsim.trace`` stays cheap):

* :class:`~kvsim.trace.schema.Trace` — the columnar request record;
* :class:`~kvsim.trace.config.TraceConfig`, :func:`~kvsim.trace.config.build_trace` — the
  scenario's ``trace:`` section and the function that materialises it;
* :func:`~kvsim.trace.load.load_trace`, :func:`~kvsim.trace.write.write_trace`;
* :func:`~kvsim.trace.synthetic.generate_trace`, :class:`~kvsim.trace.spec.SyntheticTraceSpec`;
* :func:`~kvsim.trace.prefix.block_keys`; :func:`~kvsim.trace.stats.trace_stats`.
"""

from __future__ import annotations

import importlib

from kvsim.trace.schema import Trace

_LAZY = {
    "TraceConfig": "kvsim.trace.config",
    "build_trace": "kvsim.trace.config",
    "load_trace": "kvsim.trace.load",
    "write_trace": "kvsim.trace.write",
    "generate_trace": "kvsim.trace.synthetic",
    "SyntheticTraceSpec": "kvsim.trace.spec",
    "block_keys": "kvsim.trace.prefix",
    "trace_stats": "kvsim.trace.stats",
}

__all__ = ["Trace", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kvsim.trace' has no attribute {name!r}")
