"""The fast path's place: kvsim.fast depends on the scheduler, allocators and timing, never the
other way round; the scheduler reaches the decode group only through its declared hook protocol;
the engine installs it only in fast mode with the capabilities."""

from __future__ import annotations

import ast
from pathlib import Path

import kvsim
from kvsim.fast.group import DecodeGroup
from kvsim.sched.fastpath import DecodeFastPath

ROOT = Path(kvsim.__file__).parent


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (module level or inside functions)."""
    pkg = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
            mod = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def _package_imports(sub: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT / sub)): _imports(p) for p in (ROOT / sub).rglob("*.py")}


def test_nothing_below_the_engine_imports_the_fast_package():
    for sub in ("sched", "kv", "timing", "metrics", "trace"):
        for mod, deps in _package_imports(sub).items():
            bad = sorted(d for d in deps if d == "kvsim.fast" or d.startswith("kvsim.fast."))
            assert not bad, f"kvsim/{sub}/{mod} imports {bad}: kvsim.fast sits above the scheduler"


def test_the_fast_package_imports_neither_the_engine_nor_simpy():
    mods = _package_imports("fast")
    assert {"group.py", "window.py", "__init__.py"} <= set(mods)
    for mod, deps in mods.items():
        bad = sorted(d for d in deps if d.split(".")[0] == "simpy" or d.startswith("kvsim.engine"))
        assert not bad, f"kvsim/fast/{mod} imports {bad}"


def test_the_scheduler_knows_only_the_hook_protocol():
    src = (ROOT / "sched" / "scheduler.py").read_text(encoding="utf-8")
    assert "DecodeGroup" not in src and ".group." not in src and "self.group" not in src
    assert "kvsim.sched.fastpath" in _imports(ROOT / "sched" / "scheduler.py")
    assert isinstance(DecodeGroup(16, allocator=None), DecodeFastPath)


def test_the_engine_installs_the_group_only_in_fast_mode_with_the_capabilities():
    from kvsim.engine import Replica
    from kvsim.kv.paged import CountingPagedAllocator, PagedAllocator
    from kvsim.metrics.request_log import RequestLog
    from kvsim.sched.config import SchedulerConfig
    from kvsim.sched.scheduler import Scheduler
    from kvsim.timing.constant import ConstantTiming, ConstantTimingConfig

    def replica(alloc, mode):
        rep = Replica(0, Scheduler(SchedulerConfig(), alloc, 4096, request_log=RequestLog()), ConstantTiming(ConstantTimingConfig()))
        line = rep.install_fast_path(mode)
        return rep, line

    rep, line = replica(CountingPagedAllocator(100, 16), "fast")
    assert isinstance(rep.group, DecodeGroup) and rep.scheduler.decode_group_enabled
    assert "decode group on" in line
    rep, line = replica(CountingPagedAllocator(100, 16), "step")
    assert rep.group is None and not rep.scheduler.decode_group_enabled and "step mode" in line
    rep, line = replica(PagedAllocator(100, 16, prefix_caching=True), "fast")  # bulk steps by block ids
    assert isinstance(rep.group, DecodeGroup) and rep.scheduler.decode_group_enabled
    # ... but not with swap preemption: a swapped-in request is allocated anew yet keeps its place
    # in the running order, which a bulk step's allocation order would not follow
    swap = Scheduler(SchedulerConfig(preemption_mode="swap", swap_space_bytes=10**9), PagedAllocator(100, 16), 4096,
                     request_log=RequestLog())
    rep = Replica(0, swap, ConstantTiming(ConstantTimingConfig()))
    rep.install_fast_path("fast")
    assert rep.group is None and not rep.scheduler.decode_group_enabled
