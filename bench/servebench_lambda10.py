"""The fourth collection: the first collection's ten Lambda deployments at 10 prompts, through
``kvsim servebench`` (docs/validation.md, "The fourth collection").

    .venv/bin/python bench/servebench_lambda10.py [--out DIR]   # default results/servebench-lambda10
    .venv/bin/python bench/servebench_lambda10.py --data scenarios/validation/lambda_loads   # the fifth collection

Each result file in ``scenarios/validation/lambda_prompt10/`` (a ``benchmark_serving.py --save-result``
file of vLLM 0.6.0 with 10-step rounds, its keys as printed, per-request texts and ITLs left out) runs on the scenario of
its deployment (the file's ``kvsim_deployment``: a first-collection case, ``scenarios/validation/<case>.yaml``,
or ``lambda_prompt10/deployments/<name>.yaml`` for the three one-H100 models the first collection does
not have; the same engine settings and the fitted ``vllm-v0.6`` profile); all are held out (nothing is
fitted on them). Prints a markdown table of request throughput and the median TTFT and TPOT, printed beside
kvsim's, and the count within the targets.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "scenarios" / "validation" / "lambda_prompt10"
METRICS = ("request_throughput", "median_ttft_ms", "median_tpot_ms")


def deployment(name: str, data: Path = DATA) -> Path:
    """A result file's deployment scenario: a first-collection case (``scenarios/validation/<case>.yaml``)
    or, for a deployment the first collection does not have, a file under ``<data>/deployments/``."""
    return data / name if name.endswith(".yaml") else ROOT / "scenarios" / "validation" / f"{name}.yaml"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "servebench-lambda10")
    ap.add_argument("--data", type=Path, default=DATA, help="the folder of result files (default: the fourth "
                    "collection, scenarios/validation/lambda_prompt10; the fifth: scenarios/validation/lambda_loads)")
    args = ap.parse_args(argv)
    lines = ["| result | deployment | " + " | ".join(f"{m} printed / kvsim / error" for m in METRICS) + " |",
             "|---|---|" + "---|" * len(METRICS)]
    within = total = 0
    for path in sorted(args.data.glob("*.json")):
        case = json.loads(path.read_text())["kvsim_deployment"]
        out = args.out / path.stem
        r = subprocess.run([sys.executable, "-m", "kvsim", "servebench", str(path), "--scenario",
                            str(deployment(case, args.data)), "--out", str(out)],
                           capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return r.returncode
        rows = {row["metric"]: row for row in csv.DictReader(open(out / "comparison.csv"))}
        cells = []
        for m in METRICS:
            row = rows[m]
            cells.append(f"{float(row['published']):.4g} / {float(row['kvsim']):.4g} / {float(row['error']):+.0%}")
            within += row["within"] == "yes"
            total += row["within"] in ("yes", "no")
        lines.append(f"| {path.stem} | {case} | " + " | ".join(cells) + " |")
    lines.append(f"\nwithin target: {within} of {total}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
