"""The vLLM paper's batching figure (Fig. 13a; docs/studies.md, section (f)) on a 400-request slice of
scenarios/studies/vllm_sharegpt.yaml: the order of the four systems and the Orca (Max) ceiling.
The shape only (the gaps to the paper are in docs/studies.md); takes a few seconds."""

from __future__ import annotations

from pathlib import Path

import kvsim

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "studies" / "vllm_sharegpt.yaml"


def test_vllm_batches_more_than_orca_oracle_pow2_max_in_that_order():
    runs = kvsim.run(kvsim.load_scenario(SCENARIO, ["trace.synthetic.num_requests=400"]))
    mean = {name: r.summary["concurrency"]["mean"] for name, r in runs.items()}
    assert mean["vllm-paged-16"] > mean["orca-oracle"] > mean["orca-pow2"] > mean["orca-max"]
    # Orca (Max) reserves 2,048 slots per request: at most capacity // 2048 run, and the queue keeps
    # them full (the paper's 7.00)
    s = runs["orca-max"].summary
    ceiling = s["kv"]["capacity_tokens"] // 2048
    assert s["concurrency"]["max"] == ceiling and mean["orca-max"] > 0.9 * ceiling
    # the vllm-2023 profile runs vLLM v0's prompt-only steps: no step both prefills and decodes
    st = runs["vllm-paged-16"].steps
    assert ((st["prefill_tokens"] > 0) & (st["decode_tokens"] > 0)).sum() == 0
    assert (st["prefill_tokens"] > 0).sum() > 100
