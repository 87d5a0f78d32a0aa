"""The calibration directory format that the simulator reads: :mod:`~.schema` (file and column
names, units), :mod:`~.loader` (reading and validating a directory) and :mod:`~.interp` (the
interpolation rules over measured points).

This package sits below :mod:`kvsim.timing` (the calibrated timing model reads it) and below the
measuring and fitting tools in :mod:`kvsim.calibration` (they write and report it); see
docs/architecture.md, "Layers". It imports numpy and pandas only: no pydantic, simpy, yaml, torch
or triton, so the GPU-side tools run on images that lack the simulator's dependencies.
"""
