"""The breakdown names are owned by the timing boundary (kvsim/timing/base.py, issue 24 item 2).

The step table's breakdown columns are exactly ``RECORDED_BREAKDOWN``, and a timing model that
reports a name the boundary does not declare fails the run with the name in the message, in both
engine modes (step rows and decode windows), instead of the name being dropped silently.
"""

from typing import Literal

import pytest
from pydantic import Field

from kvsim import api
from kvsim.config_base import StrictModel
from kvsim.metrics.recorder import BREAKDOWN_COLUMNS, STEP_COLUMNS
from kvsim.registry import TIMING_MODELS
from kvsim.timing.base import (BREAKDOWN_NAMES, RECORDED_BREAKDOWN, UNRECORDED_BREAKDOWN, BatchShape, StepTiming,
                               UndeclaredBreakdown, check_breakdown)


class ExtraTermConfig(StrictModel):
    kind: Literal["extra_term"] = "extra_term"
    name: str = "overhead_s"
    step_s: float = Field(0.01, gt=0)


class ExtraTerm:
    """A constant step time reported under ``cfg.name`` (a declared name or not)."""

    def __init__(self, cfg: ExtraTermConfig, ctx):
        self.cfg = cfg
        self.kv_bytes_per_token = ctx.kv_bytes_per_token

    def step_time(self, shape: BatchShape) -> StepTiming:
        return StepTiming(duration_s=self.cfg.step_s, breakdown_s={self.cfg.name: self.cfg.step_s},
                          kv_bytes_read=shape.kv_tokens_read * self.kv_bytes_per_token)


@pytest.fixture
def extra_term():
    TIMING_MODELS.register("extra_term", ExtraTermConfig, ExtraTerm)
    try:
        yield
    finally:
        TIMING_MODELS.unregister("extra_term")


def scenario(tmp_path, name: str, mode: str):
    lines = ["arrival_s,prompt_tokens,output_tokens"] + [f"{0.01 * i:.2f},{20 + i},{40 + i}" for i in range(12)]
    (tmp_path / "trace.csv").write_text("\n".join(lines) + "\n")
    f = tmp_path / f"{name}-{mode}.yaml"
    f.write_text(f"trace: {{file: trace.csv}}\nmodel: OPT-13B\nkv_budget: {{tokens: 4000}}\n"
                 f"allocator: {{kind: paged, block_size: 16}}\nengine: {{mode: {mode}}}\n"
                 f"timing: {{kind: extra_term, name: {name}}}\n")
    return f


def test_the_step_table_records_exactly_the_declared_names_last():
    assert BREAKDOWN_COLUMNS == list(RECORDED_BREAKDOWN)
    assert list(STEP_COLUMNS)[-len(RECORDED_BREAKDOWN):] == list(RECORDED_BREAKDOWN)
    assert all(STEP_COLUMNS[n] == "float64" for n in RECORDED_BREAKDOWN)
    assert BREAKDOWN_NAMES == set(RECORDED_BREAKDOWN) | set(UNRECORDED_BREAKDOWN)
    assert not set(RECORDED_BREAKDOWN) & set(UNRECORDED_BREAKDOWN)


def test_check_breakdown_names_the_undeclared_names():
    check_breakdown({})
    check_breakdown(dict.fromkeys(BREAKDOWN_NAMES, 1.0))
    with pytest.raises(UndeclaredBreakdown, match=r"\['queue_s', 'zz_s'\] are not declared in kvsim/timing/base.py"):
        check_breakdown({"overhead_s": 1.0, "zz_s": 2.0, "queue_s": 3.0})


@pytest.mark.parametrize("mode", ["fast", "step"])
def test_a_model_reporting_an_undeclared_name_fails_the_run(tmp_path, extra_term, mode):
    ok = api.run(scenario(tmp_path, "overhead_s", mode))
    assert ok.summary["requests_finished"] == 12
    busy = ok.steps[~ok.steps["idle"]]
    assert busy["overhead_s"].sum() == pytest.approx(busy["duration_s"].sum(), rel=1e-12)
    if mode == "fast":
        assert (busy["num_steps"] > 1).any()  # decode windows recorded breakdown sums too
    with pytest.raises(UndeclaredBreakdown, match=r"\['my_term_s'\] are not declared"):
        api.run(scenario(tmp_path, "my_term_s", mode))
