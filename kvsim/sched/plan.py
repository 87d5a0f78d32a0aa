"""The scheduler -> engine boundary for one step."""

from __future__ import annotations

from kvsim.record import record
from kvsim.timing.base import BatchShape


@record
class StepPlan:
    """What one engine step runs. ``scheduled`` pairs request ids with their new-token counts, in
    scheduling order; ``preempted``/``admitted`` list request ids changed by this schedule() call.
    ``group_decodes``: members of the scheduler's decode group that each decode one token in this
    step besides ``scheduled`` (they are not listed one by one). ``swapped_in``: requests this call
    swapped back in (a step that does is never a decode window's step 0, whatever its bytes);
    ``swapped_in_bytes``: the KV bytes they moved back, whether prefetch hid the copies or not (the
    step row's ``swap_in_bytes``; ``shape.swap_in_bytes`` is only the part the step pays for)."""

    scheduled: tuple[tuple[int, int], ...]
    shape: BatchShape
    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    group_decodes: int = 0
    swapped_in: int = 0
    swapped_in_bytes: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.group_decodes and not self.shape.num_seqs
