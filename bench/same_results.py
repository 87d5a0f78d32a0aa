"""Do two kvsim checkouts produce the same results? (a check for speed work that must not change them)

    .venv/bin/python bench/same_results.py OLD NEW [--only NAME ...] [--keep DIR]

Runs every case below with ``kvsim run --no-plots -q`` once per checkout (PYTHONPATH and working
directory = that checkout, the scenario file from that checkout or, for the bench cases, from
bench/run_bench.py's text in this one) and compares, per variant:

* ``requests.parquet``: sha256 (must be equal);
* ``summary.json``: sha256; when they differ, every differing field with its two values (floats that
  sum per row can differ in the last digits where the fast engine groups steps into other rows);
* ``steps.parquet``: sha256; when the row grouping differs, the two tables are cut at the engine
  steps where both start a row (a row's first engine step: the sum of ``num_steps`` before it), and per piece the integer columns' sums (steps, tokens, finishes,
  evictions, pages, bytes), the maxima (batch size, running, peak bytes) and the end time must be
  equal, the time-weighted memory columns within 1e-9 relative.

Prints one line per variant and exits 1 if a request table or a step table's content differs.
Not a test: it runs whole scenarios (minutes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_bench  # noqa: E402

PROFILE_LINE = "engine_profile: kvsim\n"


def bench_text(case: str, default_profile: bool) -> str:
    if case.startswith("azure-"):
        text = run_bench.BASE.format(name=case, trace=run_bench.AZURE, allocator=run_bench.ALLOCATORS[case[6:]])
    else:
        n = int(case[len("sharegpt-"):])
        text = run_bench.BASE.format(name=case, trace=run_bench.synthetic(n), allocator=run_bench.PAGED)
    return text.replace(PROFILE_LINE, "") if default_profile else text


# name -> (scenario path inside a checkout, or None for bench text), bench case, extra --set
CASES: dict[str, tuple] = {
    "quickstart": ("scenarios/quickstart.yaml", None, []),
    # the study file runs under the default vllm-v1 since issue 23 item 9: the kvsim case names its profile
    "mooncake-prefix-kvsim": ("scenarios/studies/prefix_caching_mooncake.yaml", None, ["engine_profile=kvsim"]),
    # the file's own default now; kept (with the explicit key) so the case means vllm-v1 whatever the file pins
    "mooncake-prefix-default": ("scenarios/studies/prefix_caching_mooncake.yaml", None,
                                ["engine_profile=vllm-v1"]),
    "features": ("tests/reliability/corpus/features.yaml", None, []),
    "allocators": ("tests/reliability/corpus/allocators.yaml", None, []),
    "tiny": ("tests/reliability/corpus/tiny.yaml", None, []),
    **{f"{c}-{p}": (None, (c, p == "default"), []) for c in
       ("azure-paged-16", "azure-contiguous-max", "azure-buddy", "sharegpt-10000") for p in ("kvsim", "default")},
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_side(checkout: Path, name: str, out: Path, tmp: Path) -> None:
    rel, bench, sets = CASES[name]
    if rel is not None:
        scenario = checkout / rel
    else:
        scenario = tmp / f"{name}.yaml"
        scenario.write_text(bench_text(*bench))
    cmd = [sys.executable, "-m", "kvsim", "run", str(scenario), "--out", str(out), "--no-plots", "-q"]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=checkout)
    if res.returncode != 0:
        raise SystemExit(f"{checkout}: {name} failed:\n{res.stderr[-3000:]}")


def diff_json(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only on one side" for k in set(a) ^ set(b)]
        for k in a:
            if k in b:
                out += diff_json(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff_json(x, y, f"{path}[{i}]")]
    if a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        return []
    if isinstance(a, float) and isinstance(b, float):
        return [f"{path}: {a!r} vs {b!r} (rel {abs(a - b) / max(abs(a), abs(b)):.1e})"]
    return [f"{path}: {a!r} vs {b!r}"]


SUM_COLS = ("num_steps", "prefill_tokens", "decode_tokens", "admitted", "preempted", "finished", "evictions",
            "swap_in_bytes", "swap_out_bytes", "kv_bytes_read", "kv_pages_read")
MAX_COLS = ("batch_size", "running", "peak_used_bytes")
MEAN_COLS = ("token_states_bytes", "reservation_bytes", "internal_frag_bytes", "external_frag_bytes", "free_bytes",
             "cached_free_bytes", "unshared_bytes", "running_mean", "batch_size_mean")


def compare_steps(a: Path, b: Path) -> str:
    """'' if the step tables have the same content (cut at their common row starts), else why not."""
    import numpy as np
    import pandas as pd

    sa, sb = pd.read_parquet(a), pd.read_parquet(b)
    if list(sa.columns) != list(sb.columns):
        return "columns differ"
    problems = []
    for rep in sorted(set(sa["replica"]) | set(sb["replica"])):
        x, y = sa[sa["replica"] == rep], sb[sb["replica"] == rep]
        first = [np.cumsum(t["num_steps"].to_numpy()) - t["num_steps"].to_numpy() for t in (x, y)]  # engine step a row starts at
        common = np.intersect1d(first[0], first[1])
        pieces = []
        for t, f in zip((x, y), first):
            piece = np.searchsorted(common, f, side="right") - 1
            w = t["duration_s"].to_numpy()
            g = pd.DataFrame({c: t[c].to_numpy() for c in SUM_COLS})
            g = g.assign(**{f"w_{c}": t[c].to_numpy() * w for c in MEAN_COLS}, duration_s=w)
            g = g.groupby(piece).sum()
            mx = pd.DataFrame({c: t[c].to_numpy() for c in MAX_COLS}).groupby(piece).max()
            end = pd.Series(t["start_s"].to_numpy() + w).groupby(piece).last()
            pieces.append((g, mx, end))
        (ga, ma, ea), (gb, mb, eb) = pieces
        if not ga.index.equals(gb.index):
            problems.append(f"replica {rep}: pieces differ")
            continue
        for c in SUM_COLS:
            if not (ga[c] == gb[c]).all():
                problems.append(f"replica {rep}: {c} sums differ in {(ga[c] != gb[c]).sum()} pieces")
        for c in MAX_COLS:
            if not (ma[c] == mb[c]).all():
                problems.append(f"replica {rep}: {c} maxima differ")
        for c in [f"w_{c}" for c in MEAN_COLS] + ["duration_s"]:
            if not np.allclose(ga[c], gb[c], rtol=1e-9, atol=1e-6):
                problems.append(f"replica {rep}: {c} differs beyond 1e-9")
        if not np.allclose(ea.to_numpy(), eb.to_numpy(), rtol=1e-12, atol=0):
            problems.append(f"replica {rep}: piece end times differ")
    return "; ".join(problems)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--only", nargs="*", choices=list(CASES), help="run only these cases (default: all)")
    ap.add_argument("--keep", type=Path, help="write the results under this new directory (default: a temporary one)")
    args = ap.parse_args()
    if args.keep is not None and args.keep.exists():
        raise SystemExit(f"--keep {args.keep}: exists (give a new directory)")
    bad = 0
    with tempfile.TemporaryDirectory(prefix="kvsim-same-") as tmpdir:
        root = args.keep or Path(tmpdir)
        root.mkdir(parents=True, exist_ok=True)
        for name in args.only or list(CASES):
            outs = {}
            for side, checkout in (("old", args.old.resolve()), ("new", args.new.resolve())):
                outs[side] = root / side / name
                (root / side).mkdir(exist_ok=True)
                run_side(checkout, name, outs[side], Path(tmpdir))
            for req in sorted(outs["old"].rglob("requests.parquet")):
                rel = req.parent.relative_to(outs["old"])
                o, n = outs["old"] / rel, outs["new"] / rel
                line = [f"{name}/{rel}:"]
                same_req = sha(o / "requests.parquet") == sha(n / "requests.parquet")
                line.append(f"requests {'same' if same_req else 'DIFFER'} ({sha(o / 'requests.parquet')[:12]})")
                steps_same = sha(o / "steps.parquet") == sha(n / "steps.parquet")
                why = "" if steps_same else compare_steps(o / "steps.parquet", n / "steps.parquet")
                if steps_same:
                    line.append("steps same")
                else:
                    rows = [len(__import__("pandas").read_parquet(p / "steps.parquet", columns=["step"]))
                            for p in (o, n)]
                    line.append(f"steps {'regrouped' if not why else 'DIFFER: ' + why} ({rows[0]} -> {rows[1]} rows)")
                diffs = diff_json(json.loads((o / "summary.json").read_text()),
                                  json.loads((n / "summary.json").read_text()))
                line.append("summary same" if not diffs else f"summary: {len(diffs)} fields differ")
                print(" ".join(line), flush=True)
                for d in diffs:
                    print(f"    {d}")
                bad += (not same_req) + bool(why)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
