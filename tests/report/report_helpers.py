"""Shared helpers of the report tests (a module of its own: every test dir has a conftest.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RATES = [0.5, 2.0, 4.0]
BLOCKS = [16, 256]


def kvsim_main(argv: list[str]) -> int:
    import kvsim.cli as cli

    for entry in (("kvsim.sweep.cli", "register"), ("kvsim.report.cli", "register")):
        if entry not in cli.PLUGIN_COMMANDS:
            cli.PLUGIN_COMMANDS.append(entry)
    return cli.main(argv)


def rate_sweep_spec() -> dict:
    return {
        "name": "rates",
        "description": "rate x block size on synthetic ShareGPT-like traffic",
        "base": {
            "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 150,
                                    "arrival": {"process": "poisson", "rate_per_s": 1.0}},
                      "length_policy": "cap"},
            "model": "OPT-13B", "gpu": "A100-40GB",
            # kvsim's own defaults: the plot tests rely on runs without prefix caching
            "engine_profile": "kvsim",
        },
        "grid": {"allocator.block_size": BLOCKS, "trace.synthetic.arrival.rate_per_s": RATES},
    }
