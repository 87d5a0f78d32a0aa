"""Synthetic generator: presets, distributions, arrival processes, structure, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from kvsim.trace.prefix import shared_prefix_blocks
from kvsim.trace.spec import SyntheticTraceSpec
from kvsim.trace.stats import trace_stats
from kvsim.trace.synthetic import PRESETS, generate_trace

AZURE = Path(__file__).resolve().parents[2] / "traces" / "azure_conv_2023.csv.gz"


def spec(**kw) -> SyntheticTraceSpec:
    kw.setdefault("arrival", {"rate_per_s": 10})
    if "prompt_tokens" not in kw and "preset" not in kw:
        kw["preset"] = "sharegpt"
    if "duration_s" not in kw:
        kw.setdefault("num_requests", 2000)
    return SyntheticTraceSpec.model_validate(kw)


@pytest.mark.parametrize("preset, prompt_mean, output_mean", [("sharegpt", 161.31, 337.99), ("alpaca", 19.31, 58.45)])
def test_presets_match_published_means(preset, prompt_mean, output_mean):
    t = generate_trace(spec(preset=preset, num_requests=20_000), seed=7)
    assert len(t) == 20_000
    assert t.prompt_tokens.mean() == pytest.approx(prompt_mean, rel=0.05)
    assert t.output_tokens.mean() == pytest.approx(output_mean, rel=0.05)
    assert t.prompt_tokens.min() >= 1 and t.output_tokens.min() >= 1
    assert t.prefix_keys is None and t.session_id is None and t.num_samples is None


def test_preset_distributions_are_explicit():
    assert PRESETS["sharegpt"]["prompt_tokens"].mean == 161.31
    assert PRESETS["alpaca"]["output_tokens"].mean == 58.45


def test_same_seed_same_trace_and_different_seed_differs():
    a = generate_trace(spec(), seed=3)
    b = generate_trace(spec(), seed=3)
    c = generate_trace(spec(), seed=4)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


def test_spec_seed_is_used_when_none_given():
    a = generate_trace(spec(seed=11))
    b = generate_trace(spec(), seed=11)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert a.source["seed"] == 11


def test_adding_an_input_does_not_perturb_the_others():
    base = generate_trace(spec(), seed=5)
    more = generate_trace(spec(sampling={"n": 4, "fraction": 0.5}, priority={"values": [0, 1]},
                               output_tokens={"kind": "fixed", "value": 9}), seed=5)
    assert np.array_equal(base.arrival_s, more.arrival_s)
    assert np.array_equal(base.prompt_tokens, more.prompt_tokens)
    assert (more.output_tokens == 9).all()
    faster = generate_trace(spec(arrival={"rate_per_s": 20}), seed=5)
    assert np.array_equal(base.prompt_tokens, faster.prompt_tokens)
    assert np.allclose(faster.arrival_s * 2, base.arrival_s)


def test_poisson_rate_and_cv():
    t = generate_trace(spec(num_requests=20_000, arrival={"rate_per_s": 4}), seed=1)
    s = trace_stats(t)
    assert t.arrival_s[0] == 0.0
    assert s["mean_rate_per_s"] == pytest.approx(4, rel=0.03)
    assert s["interarrival_cv"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_burstiness(cv):
    t = generate_trace(spec(num_requests=20_000, arrival={"process": "gamma", "rate_per_s": 4, "cv": cv}), seed=1)
    s = trace_stats(t)
    assert s["mean_rate_per_s"] == pytest.approx(4, rel=0.06)
    assert s["interarrival_cv"] == pytest.approx(cv, rel=0.08)


def test_constant_arrivals():
    t = generate_trace(spec(num_requests=5, arrival={"process": "constant", "rate_per_s": 2}), seed=0)
    assert np.allclose(t.arrival_s, [0, 0.5, 1.0, 1.5, 2.0])


def test_duration_bound():
    t = generate_trace(spec(duration_s=50.0, num_requests=None, arrival={"rate_per_s": 10}), seed=2)
    assert t.arrival_s.max() < 50.0
    assert 400 < len(t) < 600


@pytest.mark.parametrize(
    "dist, check",
    [
        ({"kind": "fixed", "value": 42}, lambda x: (x == 42).all()),
        ({"kind": "uniform", "low": 5, "high": 8}, lambda x: set(np.unique(x)) == {5, 6, 7, 8}),
        ({"kind": "lognormal", "mean": 500, "cv": 0.5}, lambda x: abs(x.mean() / 500 - 1) < 0.03 and abs(x.std() / x.mean() - 0.5) < 0.05),
        ({"kind": "lognormal", "mean": 500, "sigma": 0.3, "max_tokens": 600}, lambda x: x.max() == 600),
        ({"kind": "zipf", "exponent": 1.2, "min_tokens": 10, "max_tokens": 1000},
         lambda x: x.min() == 10 and x.max() <= 1000 and np.argmax(np.bincount(x)) == 10),
    ],
)
def test_length_distributions(dist, check):
    t = generate_trace(spec(prompt_tokens=dist, output_tokens={"kind": "fixed", "value": 1}, num_requests=20_000), seed=0)
    assert check(t.prompt_tokens)


def test_empirical_lengths_resample_a_real_trace(azure_trace):
    t = generate_trace(spec(prompt_tokens={"kind": "empirical", "file": "azure_conv_2023.csv.gz"},
                            output_tokens={"kind": "empirical", "file": "azure_conv_2023.csv.gz"},
                            num_requests=20_000), seed=0, base_dir=AZURE.parent)
    assert set(np.unique(t.prompt_tokens)) <= set(np.unique(azure_trace.prompt_tokens))
    assert t.prompt_tokens.mean() == pytest.approx(azure_trace.prompt_tokens.mean(), rel=0.05)
    assert t.output_tokens.mean() == pytest.approx(azure_trace.output_tokens.mean(), rel=0.05)


def test_shared_system_prompt():
    t = generate_trace(spec(system_prompt={"tokens": 100, "fraction": 0.25}, prefix_block_tokens=16,
                            prompt_tokens={"kind": "uniform", "low": 50, "high": 60},
                            output_tokens={"kind": "fixed", "value": 1}, num_requests=4000), seed=0)
    assert t.prefix_block_tokens == 16
    with_sys = t.prompt_tokens >= 150
    assert with_sys.mean() == pytest.approx(0.25, abs=0.03)
    first = [k[0] for k in t.prefix_keys]
    sys_keys = [k for k, s in zip(t.prefix_keys, with_sys) if s]
    # Every request with the system prompt shares exactly its 100 // 16 = 6 full blocks.
    assert all(shared_prefix_blocks(sys_keys[0], k) == 6 for k in sys_keys[1:])
    plain = [k for k, s in zip(t.prefix_keys, with_sys) if not s]
    assert len({int(k[0]) for k in plain}) == len(plain)
    assert len(set(map(int, first))) == len(plain) + 1
    assert all(len(k) == -(-p // 16) for k, p in zip(t.prefix_keys, t.prompt_tokens))


def test_multi_turn_conversations():
    t = generate_trace(spec(conversation={"turns": {"kind": "fixed", "value": 3},
                                          "think_time_s": {"kind": "fixed", "mean_s": 100.0}},
                            arrival={"rate_per_s": 0.01}, num_requests=30), seed=0)
    assert len(t) == 30 and t.session_id is not None
    for sid in np.unique(t.session_id):
        idx = np.flatnonzero(t.session_id == sid)
        assert len(idx) == 3
        assert np.allclose(np.diff(t.arrival_s[idx]), 100.0)
        for prev, nxt in zip(idx[:-1], idx[1:]):
            p, o = int(t.prompt_tokens[prev]), int(t.output_tokens[prev])
            assert t.prompt_tokens[nxt] > p + o  # history + a new message
            full = p // 16
            assert np.array_equal(t.prefix_keys[nxt][:full], t.prefix_keys[prev][:full])
            assert shared_prefix_blocks(t.prefix_keys[nxt], t.prefix_keys[prev]) == full
    # Different conversations share nothing.
    firsts = {int(k[0]) for k in t.prefix_keys}
    assert len(firsts) == 10


def test_multi_turn_with_system_prompt_and_truncation():
    t = generate_trace(spec(conversation={"turns": {"kind": "uniform", "low": 1, "high": 5}},
                            system_prompt={"tokens": 64}, num_requests=1001), seed=1)
    assert len(t) == 1001
    assert all(k[:4].tolist() == [0, 1, 2, 3] for k in t.prefix_keys)
    assert np.all(np.diff(t.arrival_s) >= 0)
    stats = trace_stats(t)
    assert stats["prefix"]["ideal_hit_ratio_blocks"] > 0.3


def test_parallel_sampling_and_beam_search():
    t = generate_trace(spec(sampling={"n": 4, "fraction": 0.5}, num_requests=4000), seed=0)
    assert set(np.unique(t.num_samples)) == {1, 4}
    assert (t.num_samples == 4).mean() == pytest.approx(0.5, abs=0.03)
    assert t.source["num_samples_kind"] == "parallel_sampling"
    b = generate_trace(spec(sampling={"beam_width": 3}), seed=0)
    assert (b.num_samples == 3).all() and b.source["num_samples_kind"] == "beam_search"


def test_priorities():
    t = generate_trace(spec(priority={"values": [0, 5], "weights": [3, 1]}, num_requests=8000), seed=0)
    assert (t.priority == 5).mean() == pytest.approx(0.25, abs=0.02)


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"arrival": {"rate_per_s": 1}, "preset": "sharegpt"}, "num_requests or duration_s"),
        ({"arrival": {"rate_per_s": 1}, "num_requests": 5}, "preset"),
        ({"arrival": {"rate_per_s": 1}, "num_requests": 5, "preset": "sharegpt", "colour": 1}, "Extra inputs"),
        ({"arrival": {"rate_per_s": 0}, "num_requests": 5, "preset": "sharegpt"}, "greater than 0"),
        ({"arrival": {"rate_per_s": 1, "cv": 2}, "num_requests": 5, "preset": "sharegpt"}, "cv applies only"),
        ({"arrival": {"rate_per_s": 1}, "num_requests": 5, "preset": "sharegpt",
          "prompt_tokens": {"kind": "lognormal", "mean": 5, "cv": 1, "sigma": 1}}, "exactly one of sigma or cv"),
        ({"arrival": {"rate_per_s": 1}, "num_requests": 5, "preset": "sharegpt", "sampling": {"n": 2, "beam_width": 2}}, "not both"),
        ({"arrival": {"rate_per_s": 1}, "num_requests": 5, "preset": "gpt"}, "sharegpt"),
    ],
)
def test_spec_validation(bad, needle):
    with pytest.raises(ValidationError) as info:
        SyntheticTraceSpec.model_validate(bad)
    assert needle in str(info.value)


# ---- every length field is bounded like a trace file's token counts (coerce.MAX_TOKENS) --------

BIG = 5_000_000_000  # above 2**32


@pytest.mark.parametrize("field, dist", [
    ("prompt_tokens", {"kind": "fixed", "value": BIG}),
    ("output_tokens", {"kind": "uniform", "low": 1, "high": 1e25}),
    ("prompt_tokens", {"kind": "uniform", "low": BIG, "high": BIG}),
    ("prompt_tokens", {"kind": "lognormal", "mean": 1e25, "cv": 1}),
    ("prompt_tokens", {"kind": "lognormal", "mean": 5, "cv": 1, "max_tokens": BIG}),
    ("prompt_tokens", {"kind": "lognormal", "mean": 5, "cv": 1, "min_tokens": BIG}),
    ("prompt_tokens", {"kind": "zipf", "exponent": 1, "min_tokens": BIG}),
])
def test_length_fields_are_bounded_by_max_tokens(field, dist):
    from kvsim.trace.coerce import MAX_TOKENS

    with pytest.raises(ValidationError) as info:
        spec(**{"preset": "sharegpt", field: dist, "num_requests": 3})
    assert f"less than or equal to {MAX_TOKENS}" in str(info.value)
    with pytest.raises(ValidationError, match=str(MAX_TOKENS)):
        spec(preset="sharegpt", num_requests=3, system_prompt={"tokens": BIG})


def test_lognormal_without_max_tokens_is_clipped_to_max_tokens():
    from kvsim.trace.coerce import MAX_TOKENS

    t = generate_trace(spec(prompt_tokens={"kind": "lognormal", "mean": MAX_TOKENS, "sigma": 3},
                            output_tokens={"kind": "fixed", "value": 1}, num_requests=200))
    assert t.prompt_tokens.max() == MAX_TOKENS


def test_system_prompt_plus_message_and_accumulated_turns_are_bounded():
    from kvsim.errors import TraceError

    with pytest.raises(TraceError, match=r"request 0: system_prompt.tokens \+ prompt_tokens = 4294967312"):
        generate_trace(spec(prompt_tokens={"kind": "fixed", "value": 2**32}, output_tokens={"kind": "fixed", "value": 1},
                            system_prompt={"tokens": 16}, prefix_block_tokens=1 << 20, num_requests=3))
    with pytest.raises(TraceError, match=r"conversation 0, turn 3: the accumulated prompt .* 6000000010 tokens"):
        generate_trace(spec(prompt_tokens={"kind": "fixed", "value": 2_000_000_000},
                            output_tokens={"kind": "fixed", "value": 5}, prefix_block_tokens=1 << 20,
                            conversation={"turns": {"kind": "fixed", "value": 3}}, num_requests=3))


def test_duration_times_rate_is_capped_like_num_requests():
    with pytest.raises(ValidationError, match=r"expects 1e\+12 requests; at most 100,000,000"):
        spec(duration_s=1e9, arrival={"rate_per_s": 1000})
    assert len(generate_trace(spec(duration_s=10, arrival={"rate_per_s": 10}))) > 0


def test_conversation_turns_over_a_duration_are_capped():
    from kvsim.errors import TraceError

    with pytest.raises(TraceError, match=r"make 4000000000 requests; at most 100,000,000"):
        generate_trace(spec(duration_s=1, arrival={"rate_per_s": 1, "process": "constant"},
                            conversation={"turns": {"kind": "fixed", "value": 4_000_000_000}}))
