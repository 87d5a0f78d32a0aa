"""GPU calibration of the simulator's timing model.

Invariant: importing this package, or :mod:`kvsim.calibration.schema`, :mod:`~.interp`,
:mod:`~.report`, :mod:`~.peer` or :mod:`~.cli`, never imports torch or triton. Only the modules
that run kernels (:mod:`~.kernels`, :mod:`~.reference`, :mod:`~.bench_ops`, :mod:`~.timer`,
:mod:`~.runner`, :mod:`~.selfcheck`) do, and only when the ``calibrate``/``selfcheck`` commands
run. The simulator reads calibration results through :mod:`kvsim.timing.calibrated` (numpy and
pandas only).
"""
