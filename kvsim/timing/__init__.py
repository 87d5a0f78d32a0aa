"""Timing models. Importing this package registers the built-in kinds."""

from kvsim.timing import analytical, calibrated, constant  # noqa: F401  (registration side effect)
from kvsim.timing.base import BatchShape, StepTiming, TimingModel

__all__ = ["BatchShape", "StepTiming", "TimingModel"]
