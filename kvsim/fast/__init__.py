"""The fast path, in one place: decode windows and the lazy decode group.

Nothing here changes a result; it only makes runs cheaper. The engine (:mod:`kvsim.engine`)
installs it per replica in ``Replica.install_fast_path``, and only when the plugins' capabilities
allow (kvsim/kv/protocol.py, docs/architecture.md):

* :mod:`kvsim.fast.group` -- the decode group: running requests that decode one token per step,
  advanced lazily. The scheduler reaches it only through the hook protocol it declares,
  :class:`kvsim.sched.fastpath.DecodeFastPath`.
* :mod:`kvsim.fast.window` -- decode windows: planning many decode steps as numpy arrays, and
  replaying only their events through the scheduler's public calls; :mod:`kvsim.fast.group_window`
  the same for decode-group members, :mod:`kvsim.fast.stepwise` backlogged windows priced one step
  at a time, :mod:`kvsim.fast.means` a window's time-weighted means.

Import direction: ``kvsim.fast`` may import ``kvsim.sched``, ``kvsim.kv`` and ``kvsim.timing``;
none of those imports ``kvsim.fast`` (tests/engine/test_fast_layout.py).
"""
