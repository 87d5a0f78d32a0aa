"""``python -m kvsim.calibration ...`` -- the ``kvsim calibrate`` command on its own."""

from kvsim.calibration.cli import main

raise SystemExit(main())
