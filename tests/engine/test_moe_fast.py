"""MoE and MLA models under the fitted GEMM model (their own GEMM shapes fitted; an MoE model's routed
experts priced beside them: the fused MoE kernel, or the experts' weight reads without one): the
fast engine's decode windows against the step-by-step engine, synchronous and async scheduling,
identical request tables and summaries, invariants checked every step."""

import pytest

from engine.test_fast_engine import assert_same, both, random_rows

MIXTRAL = dict(model="Mixtral-8x7B", gpu="A100-80GB", parallel={"tensor": 2})
DEEPSEEK = dict(model="DeepSeek-V3", gpu="H200-141GB", parallel={"tensor": 8})


@pytest.mark.parametrize("deployment,profile,moe_kernel,weight_dtype", [
    (MIXTRAL, "vllm-v1", "auto", "bf16"),     # the fused MoE kernel
    (MIXTRAL, "vllm-0.32", "auto", "bf16"),   # async scheduling: max(GPU, engine loop)
    (MIXTRAL, "vllm-v1", "none", "bf16"),     # the routed experts' weight reads and the MoE layers' fixed time
    (MIXTRAL, "vllm-v1", "auto", "fp8"),      # FP8 on an A100: no kernel reading, the weight reads again
    (DEEPSEEK, "vllm-v1", "auto", "fp8"),     # MLA attention GEMMs, shared experts, the FP8 MoE kernel
])
def test_fast_equals_step_for_an_moe_model(deployment, profile, moe_kernel, weight_dtype):
    rows = random_rows(120, seed=5, rate=30.0, prompt=(1, 1200), output=(1, 200))
    kw = dict(engine_profile=profile, weight_dtype=weight_dtype, kv_budget={"tokens": 30000},
              allocator={"kind": "paged", "block_size": 16, "prefix_caching": True},
              scheduler={"chunked_prefill": True, "max_num_seqs": 64, "max_num_batched_tokens": 2048},
              timing={"kind": "analytical", "moe_kernel": moe_kernel}, **deployment)
    step, fast = both(kw, rows)
    assert_same(step, fast, fast_has_windows=True)
    b = fast.summary["step_time_breakdown_s"]
    assert b["weights_read_s"] == 0.0 and b["gemm_s"] > 0  # the fitted GEMM model ran
    # the routed experts are their own part, beside the dense GEMMs and the LM head
    assert b["moe_experts_s"] > 0.5 * (b["gemm_s"] + b["lm_head_s"])
    assert b["linear_compute_s"] == pytest.approx(b["gemm_s"] + b["lm_head_s"], rel=1e-9)
