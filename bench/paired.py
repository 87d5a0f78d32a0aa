"""Paired speed comparison of two kvsim checkouts on one bench/run_bench.py case.

    .venv/bin/python bench/paired.py OLD NEW [--case azure-paged-16] [--pairs 5] [--profile vllm-v1]
                                     [--set KEY=VALUE ...]

OLD and NEW are checkout directories (e.g. a detached `git worktree add --detach /tmp/old <commit>`).
Each pair runs the case once in a fresh Python process per checkout (PYTHONPATH and working directory
= that checkout), alternating which one goes first, so load changes on a shared machine hit both
sides alike. Cases: azure-paged-16, azure-contiguous-max, azure-buddy, sharegpt-N (N requests of
the synthetic ShareGPT-like trace), all built from bench/run_bench.py's scenario text in this checkout.
That text pins ``engine_profile: kvsim``; ``--profile NAME`` runs the case under another engine
profile instead (e.g. the default ``vllm-v1``; both checkouts must know engine profiles then).

Per run it records the event-loop wall seconds (`engine_wall_s`), the CPU seconds of `simulate.run`
and the engine step count (which must agree between the sides when the results are unchanged). It
prints every pair, then per measure the median of the per-pair ratios NEW/OLD and the ratio of the
minimums. Not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402  (this checkout's scenario text, so both sides run the same case)

CHILD = r"""
import json, sys, time
from kvsim.config import load_scenario
from kvsim.simulate import run
import kvsim.simulate as R
import pandas, pyarrow  # noqa: F401  (imported before the timer in both trees)
loaded = load_scenario(sys.argv[1], sys.argv[2:])
scn = loaded.base
trace, report = R.build_trace(scn, loaded.path.parent)
c0, w0 = time.process_time(), time.perf_counter()
res = run(scn, loaded.path.parent, trace=trace, trace_report=report)
c1, w1 = time.process_time(), time.perf_counter()
print(json.dumps({"event_loop_s": res.engine_wall_s, "run_cpu_s": c1 - c0, "run_wall_s": w1 - w0,
                  "engine_steps": res.summary["engine_steps"]}))
"""

MEASURES = ("event_loop_s", "run_cpu_s")
PROFILE_LINE = "engine_profile: kvsim\n"


def with_profile(text: str, profile: str | None) -> str:
    """The bench case's text under ``profile`` (None: as run_bench.py pins it, ``kvsim``)."""
    if profile is None:
        return text
    if PROFILE_LINE not in text:
        raise SystemExit("bench/run_bench.py's BASE no longer pins engine_profile: kvsim (update paired.py)")
    return text.replace(PROFILE_LINE, f"engine_profile: {profile}\n")


def scenario_text(case: str) -> str:
    if case.startswith("azure-"):
        alloc = run_bench.ALLOCATORS.get(case[len("azure-"):])
        if alloc is None:
            raise SystemExit(f"--case {case}: valid choices azure-{{{','.join(run_bench.ALLOCATORS)}}}, sharegpt-N")
        return run_bench.BASE.format(name=case, trace=run_bench.AZURE, allocator=alloc)
    if case.startswith("sharegpt-") and case[len("sharegpt-"):].isdigit():
        n = int(case[len("sharegpt-"):])
        return run_bench.BASE.format(name=case, trace=run_bench.synthetic(n), allocator=run_bench.PAGED)
    raise SystemExit(f"--case {case}: valid choices azure-{{{','.join(run_bench.ALLOCATORS)}}}, sharegpt-N")


def knows_profiles(checkout: Path) -> bool:
    """Whether ``checkout``'s kvsim has the ``engine_profile`` key (issue 22/23; older ones refuse it)."""
    return (checkout / "kvsim" / "config" / "profiles.py").exists() or "engine_profile" in (
        (checkout / "kvsim" / "config.py").read_text() if (checkout / "kvsim" / "config.py").exists() else "")


def side_scenario(scenario: Path, checkout: Path) -> Path:
    """The scenario for one side: without the ``engine_profile: kvsim`` line for a checkout from before
    engine profiles (whose defaults are that profile's, so both sides run the same case)."""
    if knows_profiles(checkout):
        return scenario
    if PROFILE_LINE not in scenario.read_text():
        raise SystemExit(f"{checkout}: predates engine profiles, so it can only run engine_profile: kvsim "
                         f"(drop --profile)")
    old = scenario.with_name(f"{scenario.stem}-noprofile.yaml")
    old.write_text("".join(line for line in scenario.read_text().splitlines(keepends=True)
                           if line.strip() != "engine_profile: kvsim"))
    return old


def run_one(checkout: Path, scenario: Path, sets: list[str]) -> dict:
    scenario = side_scenario(scenario, checkout)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(scenario), *sets], capture_output=True, text=True,
                         env=env, cwd=checkout)
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: child failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--case", default="azure-paged-16")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--profile", help="engine profile to run the case under instead of run_bench.py's "
                                      "engine_profile: kvsim (e.g. vllm-v1, the default)")
    ap.add_argument("--set", dest="sets", action="append", default=["engine.mode=fast"],
                    help="scenario override for both sides (default engine.mode=fast)")
    args = ap.parse_args()
    sides = {"old": args.old.resolve(), "new": args.new.resolve()}
    rows: dict[str, list[dict]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="kvsim-paired-") as tmp:
        scenario = Path(tmp) / f"{args.case}.yaml"
        scenario.write_text(with_profile(scenario_text(args.case), args.profile))
        for i in range(args.pairs):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for side in order:
                rows[side].append(run_one(sides[side], scenario, args.sets))
            o, n = rows["old"][-1], rows["new"][-1]
            print(f"pair {i + 1}: " + "  ".join(f"{m} {o[m]:.3f} -> {n[m]:.3f} ({n[m] / o[m]:.3f})" for m in MEASURES)
                  + f"  steps {o['engine_steps']} / {n['engine_steps']}", flush=True)
    print(f"{args.case}, {args.pairs} pairs, profile {args.profile or 'kvsim'}, {' '.join(args.sets)}: new = {sides['new']}, old = {sides['old']}")
    for m in MEASURES:
        old = [r[m] for r in rows["old"]]
        new = [r[m] for r in rows["new"]]
        ratios = [b / a for a, b in zip(old, new)]
        print(f"  {m}: median per-pair ratio {statistics.median(ratios):.3f}, ratio of minimums "
              f"{min(new) / min(old):.3f} (old min/median {min(old):.3f}/{statistics.median(old):.3f} s, "
              f"new {min(new):.3f}/{statistics.median(new):.3f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
