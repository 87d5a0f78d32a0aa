"""``kvsim memory --check``: vLLM's memory profile (kvsim/models/memory.py) against printed start-up logs.

    kvsim memory --check                       # the shipped corpus, kvsim/models/data/vllm_memory_profile.csv
    kvsim memory --check --corpus my_logs.csv  # your own engine's logs, same columns
"""

from __future__ import annotations

from pathlib import Path

DESCRIPTION = """Compare kvsim's model of what a vLLM V1 engine keeps off its KV cache (kv_budget.
activation_reserve_bytes: vllm; docs/models.md, "The KV budget: vLLM's memory profile") with vLLM
start-up logs: per row and printed term (non-torch memory, the profile run's activation peak, CUDA-graph
memory, and the KV cache from the printed total and weights), kvsim's value and its relative error,
then the median and largest error per split (fit rows fitted the constants; holdout rows did not)."""


def register(subparsers) -> None:
    p = subparsers.add_parser("memory", help="check vLLM's memory-profile model against start-up logs",
                              description=DESCRIPTION)
    p.add_argument("--check", action="store_true", required=True, help="print the comparison table")
    p.add_argument("--corpus", type=Path, help="a CSV with the shipped corpus's columns (default: the shipped one)")
    p.set_defaults(func=run)


def run(args) -> int:
    from kvsim.errors import ConfigError
    from kvsim.models import memory_corpus

    path = args.corpus or memory_corpus.CORPUS
    if path.is_dir():
        raise ConfigError(f"--corpus: {path}: is a directory; give the corpus CSV file")
    if not path.is_file():
        raise ConfigError(f"--corpus: {path}: no such file")
    rows = memory_corpus.load(path)
    print(memory_corpus.check_table(rows))
    return 0
