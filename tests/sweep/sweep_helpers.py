"""Shared helpers of the sweep tests (a module of its own: every test dir has a conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
STUDY_SWEEP = REPO / "scenarios" / "studies" / "block_size_sweep.yaml"
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
SHORT = ["--set", "trace.end_s=60"]


def kvsim_main(argv: list[str]) -> int:
    """``kvsim ARGV`` in this process, with the sweep/report sub-commands registered."""
    import kvsim.cli as cli

    for entry in (("kvsim.sweep.cli", "register"), ("kvsim.report.cli", "register")):
        if entry not in cli.PLUGIN_COMMANDS:
            cli.PLUGIN_COMMANDS.append(entry)
    return cli.main(argv)


def metric_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("point_id").reset_index(drop=True)
