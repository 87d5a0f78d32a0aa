"""GPU calibration of the simulator's timing model (``kvsim calibrate``; docs/calibration.md).

Invariant: importing this package or its pure modules (:mod:`~.grid`, :mod:`~.report`,
:mod:`~.peer`, :mod:`~.cli`) never imports torch or triton.
Only the modules that run kernels (:mod:`~.kernels`, :mod:`~.reference`, :mod:`~.cases`,
:mod:`~.bench_ops`, :mod:`~.timer`, :mod:`~.runner`, :mod:`~.selfcheck`) do, and the CLI imports
them only when a measurement or self-check runs. The simulator reads calibration directories
through :mod:`kvsim.timing.calibrated` (numpy and pandas only).

The directory format itself (:mod:`kvsim.calibration_data`: schema, loader, interpolation) lives
below the timing model; these tools sit above it and import it (docs/architecture.md, "Layers").
"""
