"""Decode steps measured in real engine logs, beside kvsim's step time for the same batch.

vLLM V1 prints one line every ~10 s per server (``loggers.py``: prompt and generation throughput
over the interval, then the running and waiting requests and the KV cache usage at its end). Where
a line and the one before it (same process, one interval apart) both show no waiting request, the
line shows no prompt throughput, and the running count did not change, every running request
decoded one token in every step of the interval and no request started or ended. That interval's
decode step time is then ``running / generation throughput``, measured on the real server with
its own batch: a direct check of kvsim's decode step that the benchmark's TPOT (which mixes in
prefill, preemption and queueing) cannot give.

The lines are data: ``scenarios/validation/engine_log_lines.csv`` (every logger line of the
dennislee22 README's Tests 2-8, with its README line; ``--from-readme README.md`` rebuilds it from
a copy of that README at the commit in its source column). Each section is one deployment, priced
with one of its corpus cases' scenarios. The mean context of a window is read from the KV usage:
``usage x capacity / running`` (vLLM counts the blocks running requests hold, so this is the mean
allocated tokens per request, ~half a block above the context) at the interval's end, less half
the tokens each request decoded during it. The capacity is the section heading's "Available KV
cache memory" per GPU over the deployment's KV bytes per token per GPU.

Under tensor parallelism a second table gives each window's all-reduce: the message size, kvsim's
time per all-reduce, and the measured step less kvsim's other terms divided by the all-reduces of
the step (what the measurement leaves for each, if the other terms are right).

    python bench/engine_windows.py                 # table of every steady window
    python bench/engine_windows.py --update-docs   # and write it into docs/validation.md
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LINES = ROOT / "scenarios" / "validation" / "engine_log_lines.csv"
SCENARIOS = ROOT / "scenarios" / "validation"
DOC = ROOT / "docs" / "validation.md"
DOC_START, DOC_END = "<!-- engine-windows:start -->", "<!-- engine-windows:end -->"
INTERVAL_S = 10.0  # vLLM's default log interval (VLLM_LOG_STATS_INTERVAL)
INTERVAL_SLACK_S = 1.5  # a line this close to INTERVAL_S after the previous one follows it
FIELDS = ("section", "pid", "log_time", "readme_line", "prompt_tps", "gen_tps", "running", "waiting",
          "kv_usage_pct", "hit_rate_pct", "kv_cache_gib", "case_id", "source_url")
# the servers whose windows fit overhead.per_seq_s (one GPU, Tests 4 and 5 but pid 2739); every
# other window is held out: pid 2739 (the largest batch), Test 7 (another model) and all TP 2 ones
FIT_SERVERS = frozenset({(4, 113), (5, 118), (5, 136)})
ZERO_PER_SEQ = "timing.overhead={per_seq_s: 0.0}"  # decode steps: the other overhead terms are 0 there
README_URL = ("https://github.com/dennislee22/vLLM-benchmarking/blob/"
              "b474d1e053c35c9aef8c02aae4efbc0d8675f033/README.md")


class WindowError(Exception):
    """A line of engine_log_lines.csv with a missing or invalid field (one line)."""


@dataclass(frozen=True)
class LogLine:
    section: int
    pid: int
    log_time: str  # "MM-DD HH:MM:SS" as printed
    readme_line: int
    prompt_tps: float
    gen_tps: float
    running: int
    waiting: int
    kv_usage_pct: float
    kv_cache_gib: float  # the section's available KV cache memory per GPU
    case_id: str

    @property
    def seconds(self) -> int:
        """Seconds since the start of the month (the log prints no year)."""
        day, clock = self.log_time.split(" ")
        h, m, s = (int(x) for x in clock.split(":"))
        return ((int(day.split("-")[1]) * 24 + h) * 60 + m) * 60 + s


def load_lines(path: Path = LINES) -> list[LogLine]:
    out = []
    with path.open(newline="") as f:
        for n, row in enumerate(csv.DictReader(f), 2):
            missing = [k for k in FIELDS if not (row.get(k) or "").strip()]
            if missing:
                raise WindowError(f"{path}:{n}: field '{missing[0]}' is empty (every field of {', '.join(FIELDS)} "
                                  f"is required)")
            try:
                out.append(LogLine(int(row["section"]), int(row["pid"]), row["log_time"].strip(),
                                   int(row["readme_line"]), float(row["prompt_tps"]), float(row["gen_tps"]),
                                   int(row["running"]), int(row["waiting"]), float(row["kv_usage_pct"]),
                                   float(row["kv_cache_gib"]), row["case_id"].strip()))
            except ValueError as e:
                raise WindowError(f"{path}:{n}: {e} (numbers expected in section, pid, readme_line, the "
                                  f"throughputs, running, waiting and the percentages)") from None
    return out


def steady_windows(lines: list[LogLine]) -> list[tuple[LogLine, LogLine]]:
    """(previous, line) pairs whose interval was pure decode of an unchanged batch (module doc).
    A line printed twice in the README (same process and time) counts once."""
    by_pid: dict[int, dict[str, LogLine]] = {}
    for ln in lines:
        by_pid.setdefault(ln.pid, {}).setdefault(ln.log_time, ln)
    out = []
    for pid in sorted(by_pid):
        series = sorted(by_pid[pid].values(), key=lambda x: x.seconds)
        for prev, cur in zip(series, series[1:]):
            follows = abs(cur.seconds - prev.seconds - INTERVAL_S) <= INTERVAL_SLACK_S
            if (follows and cur.prompt_tps == 0.0 and cur.waiting == 0 and prev.waiting == 0
                    and cur.running == prev.running and cur.running > 0 and cur.gen_tps > 0):
                out.append((prev, cur))
    return sorted(out, key=lambda w: w[1].readme_line)


def mean_context(line: LogLine, interval_s: float, capacity_tokens: int, block: int) -> float:
    """Mean context per running request over the interval (module doc)."""
    held = line.kv_usage_pct / 100 * capacity_tokens / line.running - block / 2
    return max(1.0, held - 0.5 * interval_s * line.gen_tps / line.running)


def _deployment(case_id: str, overrides: tuple[str, ...] = ()):
    """The case's scenario, its timing model and its KV geometry (16-token pages as in vLLM)."""
    from kvsim.config import load_scenario
    from kvsim.build import build_allocator, build_timing, host_transfers

    scn = load_scenario(SCENARIOS / f"{case_id}.yaml", list(overrides)).base
    block = build_allocator(scn, case_id)[0].block_size
    timing, geometry = build_timing(scn, block, SCENARIOS, host_transfers(scn, case_id), case_id)
    return scn, timing, geometry


def split(line: LogLine) -> str:
    """``fit`` for the windows the per-sequence overhead is fitted on (FIT_SERVERS), else ``holdout``."""
    return "fit" if (line.section, line.pid) in FIT_SERVERS else "holdout"


def price(lines: list[LogLine], overrides: tuple[str, ...] = ()) -> list[dict]:
    """One row per steady window: measured and kvsim's decode step time (the cases' scenarios with
    ``overrides``, as ``kvsim run --set``)."""
    from kvsim.timing.base import decode_shape

    built: dict[str, tuple] = {}
    rows = []
    for prev, cur in steady_windows(lines):
        if cur.case_id not in built:
            built[cur.case_id] = _deployment(cur.case_id, overrides)
        scn, timing, geometry = built[cur.case_id]
        capacity = int(cur.kv_cache_gib * 2**30) // geometry.bytes_per_token
        interval = float(cur.seconds - prev.seconds)
        ctx = mean_context(cur, interval, capacity, geometry.block_size)
        n, tokens = cur.running, round(ctx)
        pages = n * math.ceil(tokens / geometry.block_size)
        step = timing.step_time(decode_shape(n, n * tokens, pages))
        kvsim_s = step.duration_s
        measured_s = cur.running / cur.gen_tps
        plan = scn.parallel_plan()
        comm_s, calls = step.breakdown_s.get("parallel_comm_s", 0.0), plan.allreduces_per_step
        rows.append({"section": cur.section, "pid": cur.pid, "log_time": cur.log_time,
                     "readme_line": cur.readme_line, "case_id": cur.case_id, "split": split(cur),
                     "tensor": scn.parallel_plan().tensor, "running": n,
                     "context": tokens, "measured_ms": measured_s * 1e3, "kvsim_ms": kvsim_s * 1e3,
                     "error": kvsim_s / measured_s - 1,
                     # under tensor parallelism (one stage): the bytes of each all-reduce, kvsim's time
                     # per all-reduce, and the measured step less kvsim's other terms, per all-reduce
                     "allreduce_bytes": n * plan.allreduce_bytes_per_token,
                     "kvsim_allreduce_s": comm_s / calls if calls else 0.0,
                     "implied_allreduce_s": (measured_s - (kvsim_s - comm_s)) / calls if calls else 0.0})
    return rows


def allreduce_markdown(rows: list[dict]) -> str:
    """Per all-reduce, the windows of a tensor-parallel deployment: message size, kvsim's time and
    what the measured step leaves for it once kvsim's other terms are taken off."""
    tp = sorted((r for r in rows if r["tensor"] > 1), key=lambda r: r["allreduce_bytes"])
    if not tp:
        return ""
    lines = ["| deployment | README line | running | message KB | kvsim us | implied us |", "|---|---:|---:|---:|---:|---:|"]
    for r in tp:
        lines.append(f"| {deployment_label(r['case_id'])} | {r['readme_line']} | {r['running']} | "
                     f"{r['allreduce_bytes'] / 1024:.0f} | {r['kvsim_allreduce_s'] * 1e6:.1f} | "
                     f"{r['implied_allreduce_s'] * 1e6:.1f} |")
    return "\n".join(lines) + "\n"


def fit_per_seq(lines: list[LogLine]) -> float:
    """``overhead.per_seq_s`` that minimises the squared relative error of kvsim's decode step on the
    fit windows, priced without it: ``sum(w r) / sum(w^2)`` with ``w = running / measured`` and
    ``r = 1 - kvsim / measured`` (the step is linear in the term). Clamped at 0."""
    rows = [r for r in price(lines, (ZERO_PER_SEQ,)) if r["split"] == "fit"]
    if not rows:
        raise WindowError("no steady window of the fit servers: nothing to fit")
    w = [r["running"] / (r["measured_ms"] / 1e3) for r in rows]
    res = [1 - r["kvsim_ms"] / r["measured_ms"] for r in rows]
    return max(0.0, sum(a * b for a, b in zip(w, res)) / sum(a * a for a in w))


def deployment_label(case_id: str) -> str:
    m = re.match(r"(qwen[\d.]*-\d+b)-a100x(\d)", case_id)
    return f"{m[1]} A100 x{m[2]}" if m else case_id


def markdown(rows: list[dict], without: list[dict]) -> str:
    """The windows with kvsim's step as its profiles price it (``rows``) and without the per-sequence
    term (``without``, the same windows), then the errors per group."""
    lines = ["| Test | pid | time | README line | deployment | split | running | mean context | measured ms | "
             "kvsim ms | err | without per-seq | err |", "|---:|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r, z in zip(rows, without):
        lines.append(f"| {r['section']} | {r['pid']} | {r['log_time']} | {r['readme_line']} | "
                     f"{deployment_label(r['case_id'])} | {r['split']} | {r['running']} | {r['context']} | "
                     f"{r['measured_ms']:.1f} | {r['kvsim_ms']:.1f} | {r['error']:+.0%} | {z['kvsim_ms']:.1f} | "
                     f"{z['error']:+.0%} |")
    lines.append("")
    groups = (("fit windows", lambda r: r["split"] == "fit"),
              ("held out, one GPU", lambda r: r["split"] == "holdout" and r["tensor"] == 1),
              ("held out, TP 2 (no peer access)", lambda r: r["split"] == "holdout" and r["tensor"] > 1))
    for label, keep in groups:
        now = sorted(r["error"] for r in rows if keep(r))
        old = sorted(z["error"] for z in without if keep(z))
        if now:
            lines.append(f"- {label} ({len(now)}): median error {_median(now):+.1%} (range {now[0]:+.0%} to "
                         f"{now[-1]:+.0%}); without the per-sequence term {_median(old):+.1%} ({old[0]:+.0%} to "
                         f"{old[-1]:+.0%}).")
    return "\n".join(lines) + "\n"


def _median(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2


# --- rebuilding engine_log_lines.csv from the README ------------------------------------------------

_LOGGER = re.compile(
    r"pid=(\d+)\)\S* INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[loggers\.py:\d+\] Engine 000: Avg prompt throughput: "
    r"([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) "
    r"reqs, GPU KV cache usage: ([\d.]+)%, Prefix cache hit rate: ([\d.]+)%")
_SECTION = re.compile(r"Test (\d+): .*Available KV cache memory[^:]*: ([\d.]+) GiB")


def lines_from_readme(text: str, cases: dict[int, str]) -> list[dict]:
    """Every logger line of the sections in ``cases`` (section -> a corpus case of its deployment)."""
    section, gib, rows = None, None, []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("#") and (m := _SECTION.search(line)):
            section, gib = int(m[1]), m[2]
            continue
        m = _LOGGER.search(line)
        if m and section in cases:
            rows.append({"section": section, "pid": m[1], "log_time": m[2], "readme_line": n,
                         "prompt_tps": m[3], "gen_tps": m[4], "running": m[5], "waiting": m[6],
                         "kv_usage_pct": m[7], "hit_rate_pct": m[8], "kv_cache_gib": gib,
                         "case_id": cases[section], "source_url": README_URL})
    return rows


def _section_cases() -> dict[int, str]:
    """Section -> its first dennislee22 corpus case (each section is one deployment)."""
    out: dict[int, str] = {}
    with (SCENARIOS / "corpus.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            m = re.search(r"Test (\d+) section", row["source_where"])
            if "dennislee22" in row["source_url"] and m:
                out.setdefault(int(m[1]), row["case_id"])
    return out


def update_docs(text: str, doc: Path = DOC) -> None:
    from bench.serving_tables import write_between_markers

    if not write_between_markers(doc, DOC_START, DOC_END, text):
        raise WindowError(f"{doc}: markers {DOC_START} / {DOC_END} not found; not changed")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=Path, default=LINES, help="engine log lines (CSV)")
    ap.add_argument("--from-readme", type=Path, metavar="README",
                    help="rebuild --lines from a copy of the dennislee22 README, then go on")
    ap.add_argument("--fit", action="store_true", help="print overhead.per_seq_s fitted on the fit windows")
    ap.add_argument("--update-docs", action="store_true", help=f"write the table into {DOC.name}")
    args = ap.parse_args(argv)
    try:
        if args.from_readme:
            rows = lines_from_readme(args.from_readme.read_text(), _section_cases())
            with args.lines.open("w", newline="") as f:
                w = csv.DictWriter(f, FIELDS, lineterminator="\n")
                w.writeheader()
                w.writerows(rows)
        lines = load_lines(args.lines)
        if args.fit:
            print(f"overhead.per_seq_s fitted on {len([w for w in steady_windows(lines) if split(w[1]) == 'fit'])} "
                  f"windows: {fit_per_seq(lines):.4g} s")
        rows = price(lines)
        text = markdown(rows, price(lines, (ZERO_PER_SEQ,))) + "\n" + allreduce_markdown(rows)
        if args.update_docs:
            update_docs(text)
    except (WindowError, OSError) as e:
        print(f"engine_windows: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
