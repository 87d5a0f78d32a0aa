"""One serving engine replica in the model: its scheduler, timing model, clock and fast path.

Plain Python: the SimPy loops that drive replicas are :mod:`kvsim.engine`'s (the only module that
imports simpy), which also is the only code that moves a replica's clock (``now_s``). What a replica
holds is checked once, when it is built: the allocator's capabilities (``caps``), the timing
model's (``timing_caps``) and, in fast mode, which fast paths :meth:`Replica.install_fast_path`
installs (kvsim.fast: decode windows and the lazy decode group).
"""

from __future__ import annotations

from kvsim.fast.group import DecodeGroup
from kvsim.sched.scheduler import Scheduler
from kvsim.timing.base import (
    DecodeStepPricer,
    ScalarDecodeSteps,
    TimingCapabilities,
    TimingModel,
    VectorisedDecodeTiming,
    decode_pricer,
    timing_capabilities,
)

MIN_WINDOW_HORIZON = 32  # steps the first decode window of a replica is planned for


class Replica:
    """One serving engine in the model: its scheduler, timing model and clock. With a single
    replica this is simply "the engine"."""

    def __init__(self, index: int, scheduler: Scheduler, timing: TimingModel,
                 timing_caps: TimingCapabilities | None = None):
        self.index = index
        self.scheduler = scheduler
        self.timing = timing
        # the timing model's optional members the build and summary use, checked once
        self.timing_caps = timing_caps if timing_caps is not None else timing_capabilities(timing)
        self.now_s = 0.0  # this replica's exact clock (see Engine._advance_to)
        self.end_s = 0.0
        self.wakeup = None  # the SimPy event an idle replica waits on (kvsim.engine sets and fires it)
        self.num_steps = 0
        self.num_windows = 0
        self.last_evictions = 0
        # Steps the next decode window is planned for: four times the last window's length (at least
        # MIN_WINDOW_HORIZON). Planning costs O(horizon) numpy work, and in a saturated engine a
        # window ends at the first finish, far short of the longest request's end.
        self.window_horizon = MIN_WINDOW_HORIZON
        # Capabilities, checked once here (nothing probes the plugins while the run goes):
        self.caps = scheduler.caps  # the allocator's optional calls
        self.pricer: VectorisedDecodeTiming | None = None  # decode-window pricing, when windows are on
        # backlogged group windows priced step by step as they run (ScalarDecodeSteps), if the timing can
        self.step_pricer: DecodeStepPricer | None = None
        self.windows = False  # decode windows installed (see Engine.__init__)
        self.group: DecodeGroup | None = None  # the lazy decode group, when installed

    def new_evictions(self) -> int:
        """Evictions since the last row of this replica (for the row being recorded)."""
        if not self.caps.eviction_counter:
            return 0
        evictions = self.scheduler.allocator.evictions
        new, self.last_evictions = evictions - self.last_evictions, evictions
        return new

    def _no_bulk_growth(self) -> None:
        """No lazy decode group in this run: the allocator's ledger (LazyLedger) need not track block
        boundaries for bulk decode growth (a cost on every slot change otherwise)."""
        if self.caps.decode_group:
            self.scheduler.allocator.ledger.stop_tracking_boundaries()

    def install_fast_path(self, mode: str, beam_search: bool = False) -> str:
        """Install the fast path (kvsim.fast) where the mode and the plugins' capabilities allow:
        decode windows, and the scheduler's lazy decode group. Returns a line saying which fast
        paths are on (and why not). ``beam_search``: the trace has beam requests, whose forks and
        prunes windows cannot plan: steps with one running go one by one. ``step`` mode installs
        nothing: the scheduler plans every request one by one (the reference)."""
        sched = self.scheduler
        if mode != "fast" or sched.num_scheduler_steps > 1:
            self._no_bulk_growth()
            if mode != "fast":
                return f"replica {self.index}: step mode: every step on its own"
            return (f"replica {self.index}: multi-step rounds (scheduler.num_scheduler_steps = "
                    f"{sched.num_scheduler_steps}): every step on its own")
        if self.caps.decode_group:  # BulkDecodeGrowth + LazyLedger (and WindowAllocator)
            group = DecodeGroup(sched.allocator.block_size, sched.allocator)
            if sched.install_decode_path(group):  # not for timing that needs each context length
                self.group = group
            else:
                self._no_bulk_growth()
        if not self.caps.windows:
            return (f"replica {self.index}: decode windows off: allocator {type(self.scheduler.allocator).__name__} "
                    f"lacks the WindowAllocator capability (steps run one by one)")
        pricer, native = decode_pricer(self.timing)
        if not native and self.scheduler.want_context_lens:
            return (f"replica {self.index}: decode windows off: timing {type(self.timing).__name__} needs "
                    f"per-request context lengths and has no decode_durations")
        self.pricer, self.windows = pricer, True
        if native and self.group is not None and isinstance(self.timing, ScalarDecodeSteps):
            self.step_pricer = self.timing.decode_step_pricer()
        return (f"replica {self.index}: decode windows on (pricing: "
                f"{'decode_durations' if native else 'derived from step_time'}"
                f"{'; backlogged group windows step by step' if self.step_pricer is not None else ''}"
                f"{'; off while a beam-search request runs' if beam_search else ''}); decode group "
                f"{'on' if self.scheduler.decode_group_enabled else 'off'}; bulk slot calls "
                f"{'on' if self.caps.bulk_slots else 'off'}")
