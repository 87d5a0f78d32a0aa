"""The engine's CPU overhead term (kvsim.timing.overhead): its formula, where it enters the step,
and that a scenario without ``overhead:`` is priced and resolved exactly as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from helpers import make_scenario
from kvsim.hw import GPUS, MODELS
from kvsim.config.resolved import resolved_dict
from kvsim.timing.analytical import AnalyticalTiming, AnalyticalTimingConfig
from kvsim.timing.base import BatchShape, decode_shape
from kvsim.models.geometry import KVGeometry
from kvsim.timing.context import TimingContext
from kvsim.timing.overhead import EngineOverheadConfig, StepOverhead


def _timing(gemm_model="fitted", **overhead):
    m = MODELS["Llama-3-8B"]
    ctx = TimingContext(m, GPUS["H100-SXM-80GB"], KVGeometry.from_model(m, "bf16", 16), m.weight_bytes(), Path("."))
    cfg = AnalyticalTimingConfig(gemm_model=gemm_model, step_overhead_s=0.003,
                                 overhead=overhead or None)
    return AnalyticalTiming(cfg, ctx)


def _mixed_shape():
    # 3 decodes (contexts 100, 200, 300) + one 512-token prefill chunk on 64 cached tokens
    return BatchShape(num_seqs=4, num_prefill_seqs=1, num_decode_seqs=3, num_prefill_tokens=512,
                      num_decode_tokens=3, kv_tokens_read=600 + 576, attention_pairs=600 + 512 * 64 + 512 * 513 // 2,
                      kv_pages_read=1 + 2 + 3 + 36)


def test_formula_on_ints_and_arrays():
    ov = StepOverhead(0.002, EngineOverheadConfig(per_seq_s=1e-5, per_prefill_token_s=2e-8))
    assert not ov.constant
    assert ov.time_s(10, 1000) == 0.002 + 1e-5 * 10 + 2e-8 * 1000
    n = np.array([1, 7, 300], np.int64)
    assert [x.hex() for x in ov.decode_row(n)] == [ov.time_s(int(k), 0).hex() for k in n]
    assert StepOverhead(0.002).constant and StepOverhead(0.002).time_s(500, 9000) == 0.002


@pytest.mark.parametrize("gemm_model", ["fitted", "roofline"])
def test_overhead_enters_the_step_once(gemm_model):
    base, loaded = _timing(gemm_model), _timing(gemm_model, per_seq_s=4e-6, per_prefill_token_s=3e-8)
    shape = _mixed_shape()
    a, b = base.step_time(shape), loaded.step_time(shape)
    want = 0.003 + 4e-6 * 4 + 3e-8 * 512
    assert b.breakdown_s["overhead_s"] == want and a.breakdown_s["overhead_s"] == 0.003
    # everything but the overhead is unchanged, and the duration moves by the overhead difference
    assert {k: v for k, v in a.breakdown_s.items() if k != "overhead_s"} == \
           {k: v for k, v in b.breakdown_s.items() if k != "overhead_s"}
    assert b.duration_s - a.duration_s == pytest.approx(want - 0.003, rel=1e-9)
    # a decode step pays per sequence, not per prompt token
    d = loaded.step_time(decode_shape(64, 64 * 700, 64 * 44))
    assert d.breakdown_s["overhead_s"] == 0.003 + 4e-6 * 64


def test_zero_terms_price_bit_for_bit_as_without_them():
    base, zero = _timing(), _timing(per_seq_s=0.0, per_prefill_token_s=0.0)
    for shape in (_mixed_shape(), decode_shape(1, 10, 1), decode_shape(250, 250 * 3000, 250 * 188)):
        assert base.step_time(shape).duration_s.hex() == zero.step_time(shape).duration_s.hex()
    n = np.array([1, 33, 900], np.int64)
    d0, _, _ = base.decode_durations(n, n * 500, n * 32)
    d1, _, _ = zero.decode_durations(n, n * 500, n * 32)
    assert [x.hex() for x in d0] == [x.hex() for x in d1]


def test_absent_overhead_keeps_the_resolved_scenario():
    plain = resolved_dict(make_scenario(timing={"kind": "analytical"}))
    assert "overhead" not in plain["timing"]
    given = resolved_dict(make_scenario(timing={"kind": "analytical", "overhead": {"per_seq_s": 1e-6}}))
    assert given["timing"]["overhead"] == {"per_seq_s": 1e-6, "per_prefill_token_s": 0.0}


def test_negative_or_unknown_keys_are_refused():
    with pytest.raises(ValueError, match="per_seq_s"):
        EngineOverheadConfig(per_seq_s=-1.0)
    with pytest.raises(ValueError, match="per_token_s"):
        EngineOverheadConfig(per_token_s=1.0)


def test_per_prefill_sequence_term_is_charged_in_prefill_steps_only():
    ov = StepOverhead(0.002, EngineOverheadConfig(per_prefill_seq_s=0.004))
    assert not ov.constant and ov.time_s(5, 700, 2) == 0.002 + 0.0 * 5 + 0.0 * 700 + 0.004 * 2
    t = _timing(per_prefill_seq_s=0.004)
    assert t.step_time(_mixed_shape()).breakdown_s["overhead_s"] == 0.003 + 0.004  # one prefill chunk
    assert t.step_time(decode_shape(64, 64 * 700, 64 * 44)).breakdown_s["overhead_s"] == 0.003
    n = np.array([1, 9, 200], np.int64)
    d, _, _ = t.decode_durations(n, n * 500, n * 32)
    assert [x.hex() for x in d] == [t.step_time(decode_shape(int(k), int(k) * 500, int(k) * 32)).duration_s.hex()
                                    for k in n]


def test_per_arrival_intake_is_charged_once_in_the_next_step():
    """overhead.per_arrival_s: requests received since the last plan are taken in before the next
    step (vLLM V0's engine loop): a burst of N pays N of it in one step, later steps nothing."""
    from dataclasses import replace

    t = _timing(per_arrival_s=0.002)
    assert t.prices_arrivals and not _timing().prices_arrivals
    shape = _mixed_shape()
    plain = t.step_time(shape).breakdown_s["overhead_s"]
    burst = t.step_time(replace(shape, num_arrivals=80)).breakdown_s["overhead_s"]
    assert plain == 0.003 and burst == 0.003 + 0.002 * 80
    # a multi-step round's later step pays its arrivals' intake, not the per-step terms
    cont = replace(decode_shape(8, 8 * 300, 8 * 19), round_continuation=True)
    assert t.step_time(cont).breakdown_s["overhead_s"] == 0.0
    assert t.step_time(replace(cont, num_arrivals=3)).breakdown_s["overhead_s"] == 0.002 * 3


def _burst_run(mode, per_arrival, rows):
    from helpers import make_trace
    from kvsim.simulate import run

    scn = make_scenario(engine={"mode": mode}, model="Llama-3-8B", gpu="H100-SXM-80GB", kv_budget={"tokens": 20000},
                        allocator={"kind": "paged", "block_size": 16, "watermark": 0.01},
                        timing={"kind": "analytical", "step_overhead_s": 0.001,
                                "overhead": {"per_arrival_s": per_arrival} if per_arrival else None})
    return run(scn, trace=make_trace(rows), check_invariants=True)


def test_a_burst_delays_the_first_step_by_its_intake_and_fast_equals_step():
    rows = [(0.0, 100, 50)] * 30 + [(0.5 + 0.013 * i, 60, 40) for i in range(60)]
    base, fast, step = _burst_run("fast", 0.0, rows), _burst_run("fast", 0.004, rows), _burst_run("step", 0.004, rows)
    assert fast.requests.equals(step.requests)  # windows end before each arrival whose intake is charged
    first = fast.steps[~fast.steps["idle"]].iloc[0]
    assert first["overhead_s"] == pytest.approx(0.001 + 30 * 0.004)
    ttft = (fast.requests["first_token_s"] - fast.requests["arrival_s"]).to_numpy()
    ttft0 = (base.requests["first_token_s"] - base.requests["arrival_s"]).to_numpy()
    assert ttft[:30] == pytest.approx(ttft0[:30] + 30 * 0.004, rel=1e-6)  # one prompt step holds all 30
    assert "per_arrival_s" not in str(resolved_dict(make_scenario(timing={"kind": "analytical", "overhead": {
        "per_seq_s": 1e-6, "per_arrival_s": 0.0}})))
