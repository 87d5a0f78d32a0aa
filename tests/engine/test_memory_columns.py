"""End-of-run table building keeps peak memory low without changing a value.

``requests_table`` fills typed numpy columns (optionally consuming, i.e. freeing, the Request
objects as it goes) and ``steps_frame`` turns the step table into a DataFrame column by column. Both
must give exactly what the straightforward construction gives (same values, dtypes, column order
and parquet bytes), and ``run`` must let go of the engine (Requests, recorder chunks) before it
converts the step table, or a million-request run holds them all at once.
"""

from __future__ import annotations

import gc
import io
import math
import weakref

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kvsim.simulate as simulate
from helpers import make_scenario, make_trace
from kvsim.metrics import recorder as recorder_mod
from kvsim.metrics import steps as steps_mod
from kvsim.metrics.requests import STATUS_NAMES, requests_table
from kvsim.sched.request import Request, RequestStatus


def reference_requests_table(requests: list[Request]) -> pd.DataFrame:
    """The table as it was first written: per-column lists, one consolidating DataFrame, pandas
    arithmetic for the derived columns."""
    reqs = sorted(requests, key=lambda r: r.request_id)
    attrs = [("request_id", "request_id", np.int64), ("arrival_s", "arrival_s", np.float64),
             ("admitted_s", "admitted_s", np.float64), ("first_token_s", "first_token_s", np.float64),
             ("finish_s", "finish_s", np.float64), ("prompt_tokens", "prompt_tokens", np.int64),
             ("output_tokens", "output_tokens", np.int64), ("preemptions", "num_preemptions", np.int64),
             ("recomputed_tokens", "recomputed_tokens", np.int64), ("swaps", "num_swaps", np.int64),
             ("cached_tokens", "cached_tokens", np.int64), ("cpu_hit_tokens", "cpu_hit_tokens", np.int64),
             ("ssd_hit_tokens", "ssd_hit_tokens", np.int64), ("remote_hit_tokens", "remote_hit_tokens", np.int64),
             ("transfer_s", "load_s", np.float64), ("transfer_hidden_s", "hidden_s", np.float64),
             ("priority", "priority", np.int64), ("num_samples", "num_samples", np.int64),
             ("replica", "replica", np.int64)]
    df = pd.DataFrame({
        **{name: np.array([getattr(r, attr) for r in reqs], dtype=dtype) for name, attr, dtype in attrs},
        "status": pd.Series([STATUS_NAMES[r.status] for r in reqs], dtype="string"),
        "reject_reason": pd.Series([r.reject_reason for r in reqs], dtype="string"),
    })
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2e_s"] = df["finish_s"] - df["arrival_s"]
    decode_tokens = (df["output_tokens"] - 1).where(df["output_tokens"] > 1)
    df["tpot_s"] = (df["finish_s"] - df["first_token_s"]) / decode_tokens
    df["queue_s"] = df["admitted_s"] - df["arrival_s"]
    return df


def parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def synthetic_requests(n: int, seed: int = 0) -> list[Request]:
    """Requests in every end state, shuffled, some fields at awkward values (NaN, 1-token outputs)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = Request(i, float(rng.random() * 100), int(rng.integers(1, 5000)), int(rng.integers(1, 3)),
                    4096, priority=int(rng.integers(-2, 3)), num_samples=int(rng.integers(1, 4)))
        kind = i % 4
        if kind == 0:
            r.status, r.reject_reason = RequestStatus.REJECTED, "exceeds_kv_capacity"
        elif kind == 1:
            r.status = RequestStatus.WAITING
        else:
            r.status = RequestStatus.FINISHED if kind == 2 else RequestStatus.RUNNING
            r.admitted_s = r.arrival_s + float(rng.random())
            r.first_token_s = r.admitted_s + float(rng.random())
            if kind == 2:
                r.finish_s = r.first_token_s + float(rng.random()) * 3
            r.cached_tokens = int(rng.integers(0, r.prompt_tokens + 1))
            r.num_preemptions = int(rng.integers(0, 3))
            r.load_s, r.hidden_s = float(rng.random()), float(rng.random()) / 2
        r.replica = int(rng.integers(0, 3))
        out.append(r)
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("n", [0, 1, 7, 70_000])  # 70k: more than one block of the column fill
def test_requests_table_matches_reference_exactly(n):
    reqs = synthetic_requests(n)
    ref = reference_requests_table(reqs)
    got = requests_table(reqs)
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    assert list(got.dtypes) == list(ref.dtypes)
    assert parquet_bytes(got) == parquet_bytes(ref)
    assert len(reqs) == n  # not consumed


def live_requests() -> int:
    return sum(type(o) is Request for o in gc.get_objects())  # type(): no attribute hooks run


def test_requests_table_consume_empties_the_list_and_frees_requests():
    before = live_requests()
    reqs = synthetic_requests(70_000, seed=1)
    ref = reference_requests_table(reqs)
    got = requests_table(reqs, consume=True)
    assert reqs == []
    assert live_requests() == before, "consumed Request objects are still alive"
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    assert parquet_bytes(got) == parquet_bytes(ref)


def step_table(num_rows: int, chunk_rows: int) -> pa.Table:
    """A step table made of ``chunk_rows``-row chunks, like the recorder's in-memory table."""
    rng = np.random.default_rng(5)
    schema = pa.schema([(n, pa.from_numpy_dtype(np.dtype(t))) for n, t in recorder_mod.STEP_COLUMNS.items()])

    def column(dtype, k):
        if dtype == "bool":
            return rng.integers(0, 2, k).astype(bool)
        if dtype == "float64":
            return rng.random(k)
        return rng.integers(0, 1 << 40, k)

    chunks = [pa.table({n: column(t, min(chunk_rows, num_rows - lo)) for n, t in recorder_mod.STEP_COLUMNS.items()},
                       schema=schema) for lo in range(0, num_rows, chunk_rows)]
    return pa.concat_tables(chunks) if chunks else schema.empty_table()


@pytest.mark.parametrize("num_rows,chunk_rows", [(0, 4), (3, 8), (8, 8), (1000, 64)])
def test_steps_frame_matches_to_pandas(num_rows, chunk_rows, tmp_path):
    table = step_table(num_rows, chunk_rows)
    ref = table.to_pandas()
    got = steps_mod.steps_frame(steps_mod._table_columns([table]))
    pd.testing.assert_frame_equal(got, ref, check_exact=True)
    assert list(got.columns) == list(recorder_mod.STEP_COLUMNS)
    path = tmp_path / "steps.parquet"
    pq.write_table(table, path)
    from_file = steps_mod.steps_frame(steps_mod._file_columns(path))
    pd.testing.assert_frame_equal(from_file, pq.read_table(path).to_pandas(), check_exact=True)


def test_table_columns_drops_the_only_reference():
    table = step_table(100, 16)
    probe = weakref.ref(table)
    box = [table]
    del table
    cols = steps_mod._table_columns(box)
    name, arr = next(cols)
    assert box == [] and probe() is None  # the generator's own (shrinking) copies remain, not the original
    assert name == "step" and arr.flags.writeable
    rest = dict(cols)
    assert len(rest) == len(recorder_mod.STEP_COLUMNS) - 1


def _scenario_and_trace(n=300, seed=2):
    rng = np.random.default_rng(seed)
    rows = list(zip(np.cumsum(rng.exponential(1 / 30, n)), rng.integers(1, 200, n), rng.integers(1, 80, n)))
    rows[5] = (rows[5][0], 5000, 10)  # longer than the model: rejected
    scn = make_scenario(kv_budget={"tokens": 2048}, allocator={"kind": "paged", "block_size": 16},
                        timing={"kind": "analytical"})
    return scn, make_trace(rows)


def test_run_releases_requests_and_recorder_before_converting_steps(monkeypatch):
    """When the step table is converted, no Request object and no StepRecorder (whose chunks would
    keep the Arrow step table alive) may be left: at a million requests they are ~1 GB together."""
    scn, trace = _scenario_and_trace()
    recorders = []
    real_init = recorder_mod.StepRecorder.__init__

    def init(self, *a, **k):
        real_init(self, *a, **k)
        recorders.append(weakref.ref(self))

    seen = {}
    real_steps_frame = steps_mod.steps_frame

    def steps_frame(columns):
        seen["requests_alive"] = live_requests()
        seen["recorder_alive"] = recorders[-1]() is not None
        return real_steps_frame(columns)

    monkeypatch.setattr(recorder_mod.StepRecorder, "__init__", init)
    monkeypatch.setattr(steps_mod, "steps_frame", steps_frame)  # where steps_table looks it up
    gc.collect()
    before = live_requests()
    res = simulate.run(scn, trace=trace)
    assert seen == {"requests_alive": before, "recorder_alive": False}
    assert res.summary["requests_total"] == len(trace)


def test_in_memory_and_streamed_runs_give_the_same_tables(tmp_path):
    """The in-memory run flushes smaller step chunks than the streamed one (whose flush size is the
    parquet row-group size): the tables and the summary must not notice."""
    scn, trace = _scenario_and_trace(n=400, seed=3)
    mem = simulate.run(scn, trace=trace)
    path = tmp_path / "steps.parquet"
    disk = simulate.run(scn, trace=trace, steps_path=path)
    assert disk.steps is None
    pd.testing.assert_frame_equal(mem.steps, pq.read_table(path).to_pandas(), check_exact=True)
    pd.testing.assert_frame_equal(mem.requests, disk.requests, check_exact=True)
    assert parquet_bytes(mem.requests) == parquet_bytes(disk.requests)
    assert mem.summary == disk.summary
    assert mem.summary["requests_rejected"] == 1
    assert not math.isnan(mem.summary["e2e_s"]["p50"])


def test_in_memory_step_chunks_do_not_change_the_table(monkeypatch):
    scn, trace = _scenario_and_trace(n=400, seed=4)
    monkeypatch.setattr(simulate, "IN_MEMORY_FLUSH_ROWS", 7)
    small = simulate.run(scn, trace=trace)
    monkeypatch.setattr(simulate, "IN_MEMORY_FLUSH_ROWS", 1 << 20)
    one = simulate.run(scn, trace=trace)
    assert small.engine_rows > 7
    pd.testing.assert_frame_equal(small.steps, one.steps, check_exact=True)
    pd.testing.assert_frame_equal(small.requests, one.requests, check_exact=True)
    assert small.summary == one.summary
