"""GPU calibration of the simulator's timing model (``kvsim calibrate``; docs/calibration.md).

Invariant: importing this package or its pure modules (:mod:`~.schema`, :mod:`~.grid`,
:mod:`~.interp`, :mod:`~.report`, :mod:`~.peer`, :mod:`~.cli`) never imports torch or triton.
Only the modules that run kernels (:mod:`~.kernels`, :mod:`~.reference`, :mod:`~.cases`,
:mod:`~.bench_ops`, :mod:`~.timer`, :mod:`~.runner`, :mod:`~.selfcheck`) do, and the CLI imports
them only when a measurement or self-check runs. The simulator reads calibration directories
through :mod:`kvsim.timing.calibrated` (numpy and pandas only).
"""
