"""Parameter sweeps: a base scenario x a grid / list of override sets, run in parallel, resumable.

``run_sweep(sweep_file_or_spec, out_dir, jobs=..., executor=...)`` returns the index DataFrame
(one row per point); ``load_sweep`` validates and expands a sweep without running it;
``load_index(sweep_dir)`` reads an index back. See ``docs/sweeps.md``.
"""

_EXPORTS = {
    "run_sweep": "kvsim.sweep.runner",
    "load_sweep": "kvsim.sweep.spec",
    "LoadedSweep": "kvsim.sweep.spec",
    "SweepFile": "kvsim.sweep.spec",
    "SweepPoint": "kvsim.sweep.spec",
    "load_index": "kvsim.sweep.index",
}


def __getattr__(name):
    # Lazy, so that registering `kvsim sweep` on the command line stays cheap.
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = ["LoadedSweep", "SweepFile", "SweepPoint", "load_index", "load_sweep", "run_sweep"]
