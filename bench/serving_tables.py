"""The tables of ``bench/validate_serving.py``: pass rates per split, the markdown that goes into
docs/validation.md and the per-case CSV (pure functions of the comparison rows)."""

from __future__ import annotations

import csv
from pathlib import Path

# relative error bounds (issue 23); output token throughput is held to the request-throughput bound
# (with fixed output lengths the two differ by a constant factor)
from kvsim.servebench.metrics import TARGETS  # noqa: E402,F401  (the one definition)


SPLITS = ("all", "fit", "holdout", "new-deployment")  # new-deployment: held out, no fit case of its deployment


def _in_split(r: dict, split: str) -> bool:
    if split == "new-deployment":
        return r.get("new_deployment") == "yes"
    return split == "all" or r["split"] == split


def pass_rates(table: list[dict]) -> dict:
    """Per target metric and split: cases within the bound / cases with a published value."""
    rates = {}
    for split in SPLITS:
        rows = [r for r in table if _in_split(r, split)]
        for m in TARGETS:
            flags = [r[f"{m}_ok"] for r in rows if r[f"{m}_ok"]]
            rates[f"{split}.{m}"] = {"within": flags.count("yes"), "cases": len(flags)}
    return rates


def write_table(table: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(table)


def _fmt(v, pct=False):
    if v != v:
        return "–"
    return f"{v:+.0%}" if pct else (f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}")


def markdown(table: list[dict], title: str) -> str:
    head = ("| case | split | req/s pub | kvsim | err | out tok/s pub | kvsim | err | TTFT ms pub | kvsim | err "
            "| TPOT ms pub | kvsim | err |\n|---|---|" + "---:|" * 12)
    lines = [f"**{title}**", "", head]
    for r in table:
        cells = [r["case_id"], r["split"] + (" (new)" if r.get("new_deployment") == "yes" else "")]
        for m in ("request_throughput", "output_throughput", "ttft_ms", "tpot_ms"):
            cells += [_fmt(r[f"{m}_published"]), _fmt(r[f"{m}_kvsim"]), _fmt(r[f"{m}_error"], pct=True)]
        lines.append("| " + " | ".join(cells) + " |")
    rates = pass_rates(table)
    lines.append("")
    for split in SPLITS:
        parts = [f"{m.replace('_ms', '')} {rates[f'{split}.{m}']['within']}/{rates[f'{split}.{m}']['cases']}"
                 for m in TARGETS]
        parts.append(f"throughput (req/s or tok/s) {_throughput_ok(table, split)}")
        lines.append(f"- within target ({split}): " + ", ".join(parts))
    return "\n".join(lines) + "\n"


def _throughput_ok(table: list[dict], split: str) -> str:
    """Cases whose published throughput (request, else output tokens) is within its bound."""
    flags = []
    for r in table:
        if not _in_split(r, split):
            continue
        flag = r["request_throughput_ok"] or r["output_throughput_ok"]
        if flag:
            flags.append(flag)
    return f"{flags.count('yes')}/{len(flags)}"


def write_between_markers(doc: Path, start: str, end: str, text: str) -> bool:
    """Replace what lies between the ``start`` and ``end`` marker lines of ``doc`` with ``text``; False
    (and ``doc`` unchanged) when a marker is missing."""
    body = doc.read_text()
    if start not in body or end not in body:
        return False
    head, rest = body.split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n{text}{end}{tail}")
    return True
