"""Parameter sweeps: a base scenario x a grid / list of override sets, run in parallel, resumable.

``run_sweep(sweep_file_or_spec, out_dir, jobs=..., executor=...)`` returns the index DataFrame
(one row per point); ``load_sweep`` validates and expands a sweep without running it;
``load_index(sweep_dir)`` reads an index back. See ``docs/sweeps.md``.
"""

from kvsim.sweep.index import load_index
from kvsim.sweep.runner import run_sweep
from kvsim.sweep.spec import LoadedSweep, SweepFile, SweepPoint, load_sweep

__all__ = ["LoadedSweep", "SweepFile", "SweepPoint", "load_index", "load_sweep", "run_sweep"]
