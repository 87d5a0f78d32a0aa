"""Beam-search requests through the whole engine: invariants after every step, fast == step,
determinism with the seed, and the memory saving of paged beams over parallel samples and over
contiguous full copies (docs/beam_search.md)."""

import numpy as np
import pytest

from helpers import make_scenario, make_trace
from test_fast_engine import TIMING, assert_same, random_rows
from kvsim.simulate import run


def beam_trace(rows, width=4, every=3, beam=True):
    """Every ``every``-th request has ``width`` beams (or parallel samples with ``beam=False``)."""
    trace = make_trace(rows)
    samples = np.ones(len(rows), dtype=np.int64)
    samples[::every] = width
    object.__setattr__(trace, "num_samples", samples)
    if beam:
        object.__setattr__(trace, "beam", (samples > 1).astype(np.int64))
    return trace


def go(alloc, mode="fast", seed=0, fork_prob=0.1, beam=True, tokens=12000, rows=None, every=3):
    rows = rows or random_rows(120, seed=4, rate=20.0, prompt=(1, 200), output=(2, 150))
    scn = make_scenario(engine={"mode": mode}, kv_budget={"tokens": tokens}, allocator=alloc, timing=TIMING,
                        seed=seed, beam_search={"fork_prob": fork_prob})
    return run(scn, trace=beam_trace(rows, beam=beam, every=every), check_invariants=True)


PAGED = {"kind": "paged", "block_size": 16, "watermark": 0.01}
NAMED = {"kind": "paged", "block_size": 16, "watermark": 0.01, "track_block_ids": "always"}
CONTIG = {"kind": "contiguous", "reservation": "max"}


@pytest.mark.parametrize("alloc", [PAGED, NAMED, CONTIG, {"kind": "buddy", "min_block_tokens": 16},
                                   {"kind": "paged", "block_size": 16, "prefix_caching": True}])
def test_fast_equals_step_with_beams(alloc):
    step, fast = go(alloc, "step"), go(alloc, "fast")
    assert_same(step, fast, fast_has_windows=False)
    assert fast.summary["kv"]["beam_forks"] > 0
    req = fast.requests
    assert ((req["status"] == "finished") & (req["num_samples"] == 4)).sum() >= 10


def test_beam_runs_are_deterministic_and_follow_the_seed():
    a, b, c = go(PAGED, seed=1), go(PAGED, seed=1), go(PAGED, seed=2)
    assert a.summary["kv"] == b.summary["kv"]
    assert a.requests.equals(b.requests)
    assert a.summary["kv"]["beam_forks"] != c.summary["kv"]["beam_forks"]


def test_named_and_counting_paged_agree_on_beams():
    a, b = go(PAGED), go(NAMED)
    assert a.requests.equals(b.requests)
    assert a.summary["kv"]["beam_forks"] == b.summary["kv"]["beam_forks"]
    assert a.summary["kv"]["sharing_saving_frac"] == pytest.approx(b.summary["kv"]["sharing_saving_frac"])


def test_paged_beams_save_memory_over_samples_and_copies():
    beams, samples = go(PAGED, fork_prob=0.2, tokens=60_000), go(PAGED, beam=False, tokens=60_000)
    contig = go(CONTIG, fork_prob=0.2, tokens=60_000)
    # same requests, no memory pressure: forks re-share prefixes, so beams hold fewer token states
    assert beams.summary["kv"]["sharing_saving_frac"] > samples.summary["kv"]["sharing_saving_frac"]
    assert contig.summary["kv"]["sharing_saving_frac"] == 0.0  # full copies share nothing
    # a paged fork copies at most a partial block; a contiguous fork copies the whole beam
    assert beams.summary["kv"]["beam_copied_bytes"] < contig.summary["kv"]["beam_copied_bytes"]
    assert "beam_forks" not in samples.summary["kv"]


def test_old_traces_without_beam_column_are_parallel_samples():
    rows = random_rows(40, seed=2, rate=20.0, prompt=(1, 100), output=(2, 50))
    scn = make_scenario(kv_budget={"tokens": 12000}, allocator=PAGED, timing=TIMING)
    out = run(scn, trace=beam_trace(rows, beam=False), check_invariants=True)
    assert "beam_forks" not in out.summary["kv"]


@pytest.mark.parametrize("name", ["t.csv", "t.jsonl", "t.parquet"])
def test_beam_column_round_trips_and_is_validated(tmp_path, name):
    from kvsim.errors import TraceError
    from kvsim.trace.load import load_trace
    from kvsim.trace.spec import SyntheticTraceSpec
    from kvsim.trace.synthetic import generate_trace
    from kvsim.trace.write import write_trace

    spec = SyntheticTraceSpec.model_validate({"preset": "alpaca", "num_requests": 50,
                                              "arrival": {"rate_per_s": 5},
                                              "sampling": {"beam_width": 3, "fraction": 0.5}})
    t = generate_trace(spec, seed=1)
    assert set(np.unique(t.beam)) == {0, 1} and ((t.beam == 1) == (t.num_samples == 3)).all()
    assert generate_trace(spec.model_copy(update={"sampling": spec.sampling.model_copy(
        update={"n": 3, "beam_width": 1})}), seed=1).beam is None
    path = write_trace(t, tmp_path / name)
    back = load_trace(path)
    assert np.array_equal(back.beam, t.beam) and np.array_equal(back.num_samples, t.num_samples)
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens,num_samples,beam\n0,5,5,2,1\n1,5,5,2,2\n")
    with pytest.raises(TraceError, match="beam.*0 .*1"):
        load_trace(bad)


@pytest.mark.parametrize("alloc", [PAGED, NAMED])
def test_beams_under_memory_pressure_preempt_and_readmit(alloc):
    step, fast = go(alloc, "step", tokens=2500), go(alloc, "fast", tokens=2500)
    assert_same(step, fast, fast_has_windows=False)
    req = fast.requests
    assert req.loc[req["num_samples"] == 4, "preemptions"].sum() > 0  # beams were recomputed
    assert (req["status"] == "finished").all()


@pytest.mark.parametrize("alloc", [PAGED, NAMED, CONTIG])
def test_windows_run_between_beam_requests(alloc):
    # Sparse beam requests at a light load: steps while one runs go one by one, the others in
    # windows; the tables equal step mode's.
    rows = random_rows(150, seed=9, rate=4.0, prompt=(1, 200), output=(2, 150))
    step, fast = (go(alloc, m, rows=rows, every=25) for m in ("step", "fast"))
    assert_same(step, fast, fast_has_windows=True)
    assert fast.summary["kv"]["beam_forks"] > 0
