"""The step-time breakdown accounts for the whole step (docs/metrics.md, "The step-time identity").

Per step, the exclusive parts (kvsim.timing.base.EXCLUSIVE_BREAKDOWN) add up to ``duration_s``
under every timing model whose kernels run in sequence (analytical ``gemm_model: fitted``, constant,
calibrated); under ``gemm_model: roofline`` the memory and compute sides overlap by design and
``duration_s = max(weights_read_s + kv_read_s, linear_compute_s + attention_compute_s) + moe_experts_s
+ overhead_s + swap_s + parallel_comm_s``. Checked on every row of both engines (a decode window's
row sums its steps: the sequential identity holds for the sums, the roofline's max only per step, so
a window's duration is at least the relation over its sums), for dense, MoE (fitted and roofline
GEMMs, with and without the fused MoE kernel), tensor/pipeline-parallel and async-scheduling runs,
and on the summary's ``step_time_breakdown_s`` against ``busy_time_s``.
"""

import pytest

from engine.test_fast_engine import both, random_rows
from kvsim.timing.base import EXCLUSIVE_BREAKDOWN, RECORDED_BREAKDOWN

MIXTRAL = dict(model="Mixtral-8x7B", gpu="A100-80GB", parallel={"tensor": 2})
SEQUENTIAL = ("attention_s", "linear_compute_s", "compute_s", "moe_experts_s", "kv_write_s", "overhead_s",
              "swap_s", "parallel_comm_s")
ROOFLINE_REST = ("moe_experts_s", "overhead_s", "swap_s", "parallel_comm_s")


def test_the_exclusive_parts_are_recorded_columns():
    assert EXCLUSIVE_BREAKDOWN == SEQUENTIAL
    assert set(EXCLUSIVE_BREAKDOWN) <= set(RECORDED_BREAKDOWN)
    assert {"parallel_comm_s", "moe_experts_s", "kv_write_s"} <= set(RECORDED_BREAKDOWN)


def _roofline(df):
    mem = df["weights_read_s"] + df["kv_read_s"]
    flops = df["linear_compute_s"] + df["attention_compute_s"]
    return mem.where(mem >= flops, flops) + sum(df[c] for c in ROOFLINE_REST)


def _check_rows(res, roofline: bool):
    busy = res.steps[~res.steps["idle"]]
    assert len(busy)
    dur = busy["duration_s"]
    if not roofline:
        total = sum(busy[c] for c in SEQUENTIAL)
        assert ((total - dur).abs() <= 1e-9 * dur + 1e-15).all(), (total - dur).abs().max()
        b = res.summary["step_time_breakdown_s"]
        assert sum(b[c] for c in SEQUENTIAL) == pytest.approx(res.summary["busy_time_s"], rel=1e-9)
        return
    one = busy[busy["num_steps"] == 1]
    assert len(one)
    assert ((_roofline(one) - one["duration_s"]).abs() <= 1e-9 * one["duration_s"] + 1e-15).all()
    win = busy[busy["num_steps"] > 1]  # sum of the per-step maxima >= the max of the sums
    assert (win["duration_s"] >= _roofline(win) * (1 - 1e-9)).all()


CASES = {
    "dense-fitted": (dict(), False),
    "dense-roofline": (dict(timing={"kind": "analytical", "gemm_model": "roofline"}), True),
    "dense-tp2-pp2": (dict(parallel={"tensor": 2, "pipeline": 2}), False),
    "dense-swap": (dict(kv_budget={"tokens": 2000}, scheduler={"preemption_mode": "swap",
                                                                "swap_space_bytes": 2 * 10**9}), False),
    "moe-fitted-kernel": (dict(MIXTRAL, timing={"kind": "analytical", "moe_kernel": "auto"}), False),
    "moe-fitted-none": (dict(MIXTRAL, timing={"kind": "analytical", "moe_kernel": "none"}), False),
    "moe-fitted-async": (dict(MIXTRAL, engine_profile="vllm-0.32", timing={"kind": "analytical", "moe_kernel": "auto"}),
                         False),
    "moe-roofline-kernel": (dict(MIXTRAL, timing={"kind": "analytical", "gemm_model": "roofline",
                                                  "moe_kernel": "auto"}), True),
    "moe-roofline-none": (dict(MIXTRAL, timing={"kind": "analytical", "gemm_model": "roofline",
                                                "moe_kernel": "none"}), True),
    "constant": (dict(timing={"kind": "constant", "step_s": 0.01, "per_token_s": 1e-5}), False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_breakdown_adds_up_to_the_step(case):
    kw, roofline = CASES[case]
    kw = {"kv_budget": {"tokens": 20000}, "allocator": {"kind": "paged", "block_size": 16},
          "timing": {"kind": "analytical"}, **kw}
    rows = random_rows(100 if case == "dense-swap" else 60, seed=3, rate=30.0, prompt=(1, 600), output=(1, 120))
    step, fast = both(kw, rows)
    for res in (step, fast):
        _check_rows(res, roofline)
    b = step.summary["step_time_breakdown_s"]
    assert set(RECORDED_BREAKDOWN) <= set(b)
    if "tp" in case or "moe" in case:
        assert b["parallel_comm_s"] > 0
    else:
        assert b["parallel_comm_s"] == 0.0
    if case in ("moe-fitted-kernel", "moe-fitted-none", "moe-fitted-async", "moe-roofline-kernel"):
        assert b["moe_experts_s"] > 0
    else:  # dense, or the experts on the roofline's weight reads and FLOPs
        assert b["moe_experts_s"] == 0.0
    if case == "dense-swap":
        assert b["swap_s"] > 0
    for k, v in b.items():  # the fast engine's rows sum the same parts
        assert fast.summary["step_time_breakdown_s"][k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
