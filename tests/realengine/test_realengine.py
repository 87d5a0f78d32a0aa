"""kvsim.realengine: engine calibration and replay (issue 22 items 3-4).

The first tests need no vLLM: bad input gets one line and exit 2, prompts keep a trace's prefix
structure, and the decomposition of whole-step times is exact at every measured point when read
back by the calibrated timing model. The last two run a tiny calibrate and a tiny replay on a real
vLLM and skip cleanly where it is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvsim.realengine.calibrate import EngineGrid, decompose, holdout_errors, _timing_for, model_spec
from kvsim.realengine.measure import StepPoint
from kvsim.realengine.tokens import prompt_tokens
from kvsim.trace.schema import Trace

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "scenarios" / "studies" / "models" / "tiny-llama-2l" / "config.json"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def kvsim(*args, cwd=ROOT, timeout=900):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def one_line_exit_2(r, *words):
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("kvsim")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_unsupported_cpu_block_size_is_one_line(tmp_path):
    r = kvsim("calibrate", "--engine", "vllm", "--model", str(MODEL), "--device", "cpu", "--block-sizes", "48",
              "--out", str(tmp_path / "c"))
    one_line_exit_2(r, "48", "multiple of 32")


def test_missing_model_config_is_one_line(tmp_path):
    r = kvsim("calibrate", "--engine", "vllm", "--model", str(tmp_path / "nope.json"), "--device", "cpu",
              "--out", str(tmp_path / "c"))
    one_line_exit_2(r, "nope.json", "config")


def test_model_without_architectures_is_refused(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    r = kvsim("calibrate", "--engine", "vllm", "--model", str(bad), "--device", "cpu", "--out", str(tmp_path / "c"))
    one_line_exit_2(r, "architectures")


@pytest.mark.skipif(HAVE_VLLM, reason="checks the message given where vLLM is not installed")
def test_replay_without_vllm_is_one_line(tmp_path):
    r = kvsim("replay", "--engine", "vllm", str(ROOT / "scenarios" / "studies" / "vllm_cpu_replay.yaml"),
              "--out", str(tmp_path / "r"))
    one_line_exit_2(r, "vLLM is not importable")


def test_prompts_share_exactly_the_trace_prefixes():
    keys = [np.array([1, 2, 3]), np.array([1, 2, 9]), np.array([7])]
    tr = Trace(arrival_s=np.zeros(3), prompt_tokens=np.array([80, 70, 20]), output_tokens=np.ones(3, dtype=np.int64),
               prefix_keys=keys, prefix_block_tokens=32)
    a, b, c = (prompt_tokens(tr, i, 4096, 0) for i in range(3))
    assert (len(a), len(b), len(c)) == (80, 70, 20)
    assert a[:64] == b[:64] and a[64:70] != b[64:70]
    assert a[:20] != c
    assert min(a + b + c) >= 3 and max(a + b + c) < 4096
    plain = Trace(arrival_s=np.zeros(2), prompt_tokens=np.array([50, 50]), output_tokens=np.ones(2, dtype=np.int64))
    assert prompt_tokens(plain, 0, 4096, 0) != prompt_tokens(plain, 1, 4096, 0)
    assert prompt_tokens(plain, 0, 4096, 0) == prompt_tokens(plain, 0, 4096, 0)


def _synthetic_points(bs=32):
    """Step times from a made-up engine: 3 ms per step + 20 us/seq + 5 us/token + 1 ns per KV token read."""
    def t(seqs, tokens, kv):
        return 3e-3 + 2e-5 * seqs + 5e-6 * tokens + 1e-9 * kv

    pts = []
    for b in (1, 2, 8):
        for c in (128, 1024):
            pts.append(StepPoint("decode", bs, b, c + 1.0, 0, 0, [t(b, b, b * (c + 1))] * 3))
    for n in (32, 256, 1024):
        for k in (0, 512):
            pts.append(StepPoint("prefill", bs, 0, 0.0, n, k, [t(1, n, n * k + n * n / 2) * (1 + 1e-4 * n / 32)] * 3))
    pts.append(StepPoint("mixed", bs, 8, 513.0, 256, 0, [t(9, 264, 8 * 513 + 256 * 128)] * 3))
    return pts


def _write_cal(d, rows, spec):
    import pandas as pd

    from kvsim.calibration_data import schema as S

    d.mkdir()
    pd.DataFrame(rows, columns=list(S.COLUMNS)).assign(device="cpu").to_csv(d / S.CSV_FILE, index=False)
    meta = {"schema_version": S.SCHEMA_VERSION, "device": "cpu", "gpu_name": "vllm-cpu", "source": "engine",
            "copy_bandwidth_bytes_per_s": 1e10, "kv_dtypes": ["bf16"], "decode_impl": "vllm_engine_step",
            "model": {"name": spec.name, **{k: getattr(spec, k) for k in S.MODEL_GEOMETRY_KEYS}}}
    (d / S.META_FILE).write_text(json.dumps(meta))
    return _timing_for(d, spec, "bf16", 32)


def test_decomposition_is_exact_at_measured_points(tmp_path):
    from kvsim.models.hf import read_config
    from kvsim.timing.base import BatchShape

    cfg = read_config(MODEL)
    spec = model_spec(MODEL, cfg)
    pts = _synthetic_points()
    rows, fitted = decompose(pts, spec.num_layers, "bf16", (4, 2, 64))
    assert fitted["per_token_s"] > 0
    timing = _write_cal(tmp_path / "cal", rows, spec)  # an engine calibration: no allow_cpu_data, no extra overhead
    assert timing.step_overhead_s == 0.0
    for p in pts:
        meas = p.durations_s[0]
        if p.kind == "decode":
            b, c = p.decode_seqs, p.decode_context
            shape = BatchShape(num_seqs=b, num_prefill_seqs=0, num_decode_seqs=b, num_prefill_tokens=0,
                               num_decode_tokens=b, kv_tokens_read=int(b * c), attention_pairs=int(b * c))
        elif p.kind == "prefill":
            n, k = p.prefill_tokens, p.prefill_cached
            shape = BatchShape(num_seqs=1, num_prefill_seqs=1, num_decode_seqs=0, num_prefill_tokens=n,
                               num_decode_tokens=0, kv_tokens_read=n + k, attention_pairs=n * k + n * (n + 1) // 2)
        else:
            continue
        assert timing.step_time(shape).duration_s == pytest.approx(meas, rel=1e-9), p
    hold = holdout_errors(pts, timing)
    assert len(hold) == 1 and abs(hold[0]["error"]) < 0.25  # additive engine: the mixed step adds up


def test_linear_fit_recovers_a_five_term_engine_and_prices_unseen_shapes(tmp_path):
    """An engine that is exactly the five-term model: the fit finds its terms, and the calibrated timing
    model reading the tables prices shapes off the grid (ragged mixed steps, two prefill chunks, contexts
    past the grid) within 3 % (the log-log interpolation between the dense rows)."""
    from kvsim.models.hf import read_config
    from kvsim.realengine.stepfit import TERMS, features, linear_tables
    from kvsim.realengine.vllm_engine import StepShape

    true = dict(zip(TERMS, (3e-3, 6e-5, 2e-5, 1.8e-7, 2.7e-8)))
    rng = np.random.default_rng(0)

    def t(p, noise=True):
        v = float(np.dot(features(p), [true[k] for k in TERMS]))
        return v * (1 + 0.05 * rng.standard_normal()) if noise else v

    pts = [StepPoint("decode", 32, b, c + 1.0, 0, 0) for b in (1, 2, 4, 8, 16, 32) for c in (128, 512, 2048)]
    pts += [StepPoint("prefill", 32, 0, 0.0, n, k) for n in (32, 128, 512, 2048) for k in (0, 1024)]
    for p in pts:
        p.durations_s = [t(p) for _ in range(9)]
    spec = model_spec(MODEL, read_config(MODEL))
    rows, fit = linear_tables(pts, spec.num_layers, "bf16", (4, 2, 64), spec.max_model_len_tokens)
    for k in TERMS:
        assert fit["terms"][k] == pytest.approx(true[k], rel=0.25), k
    assert fit["fit_mape"] < 0.1
    timing = _write_cal(tmp_path / "cal", rows, spec)
    for sh in (StepShape(decode_seqs=24, decode_tokens=24, decode_context=24 * 1500),
               StepShape(decode_seqs=3, decode_tokens=3, decode_context=3 * 5000),
               StepShape(decode_seqs=20, decode_tokens=20, decode_context=20 * 900, prefill_seqs=1,
                         prefill_tokens=700, prefill_cached=2500, prefill_pairs=700 * 2500 + 700 * 701 // 2),
               StepShape(prefill_seqs=2, prefill_tokens=1000, prefill_cached=3000,
                         prefill_pairs=500 * 1000 + 500 * 501 // 2 + 500 * 2000 + 500 * 501 // 2)):
        p = StepPoint("mixed", 32, sh.decode_seqs, sh.decode_context / max(sh.decode_seqs, 1), sh.prefill_tokens,
                      sh.prefill_cached)
        exact = np.dot([1.0, sh.decode_seqs + sh.prefill_seqs, sh.decode_seqs + sh.prefill_tokens,
                        sh.decode_context, sh.prefill_pairs], [fit["terms"][k] for k in TERMS])
        assert timing.step_time(sh.batch_shape()).duration_s == pytest.approx(exact, rel=0.03), (p, exact)


def test_a_points_time_is_the_median_of_its_rounds_medians():
    """Rounds weigh equally however many steps each kept: one slow round of many steps does not win."""
    p = StepPoint("decode", 32, 4, 128.0, 0, 0, [1.0, 1.1, 1.2], [0.5, 0.6, 0.7], [0, 0, 0])
    p.merge(StepPoint("decode", 32, 4, 130.0, 0, 0, [3.0] * 5, [2.0] * 5), 1)
    p.merge(StepPoint("decode", 32, 4, 129.0, 0, 0, [2.0, 2.2], [1.0, 1.2]), 2)
    assert p.rounds == [0] * 3 + [1] * 5 + [2] * 2
    assert p.round_medians() == pytest.approx([1.1, 3.0, 2.1])
    assert p.median_s() == pytest.approx(2.1)  # pooled, the median would be 3.0 (the slow round's 5 steps)
    assert p.median_s(p.cpu_s) == pytest.approx(1.1)
    assert p.decode_context == pytest.approx((128 * 3 + 130 * 5 + 129 * 2) / 10)
    row = p.row()
    assert row["rounds"] == 3 and row["repeats"] == 10 and row["median_s"] == pytest.approx(2.1)
    assert row["cpu_round_spread"] == pytest.approx((2.0 - 0.6) / 1.1)
    one = StepPoint("prefill", 32, 0, 0.0, 64, 0, [1.0, 5.0, 2.0])
    assert one.median_s() == 2.0 and one.row()["rounds"] == 1


def test_the_kv_pool_keeps_the_decoder_prefixes_and_a_rounds_fresh_blocks():
    g = EngineGrid()
    need = g.needs()
    out_tokens = g.warmup + g.repeats + 5 + -(-max(g.batches) * max(g.contexts) // 2048)
    # the decoder slots' longest prompts alone, and the largest decode point with its outputs
    assert need["tokens"] > max(g.batches) * max(g.contexts) + 2 * (g.warmup + g.repeats) * sum(g.chunks)
    assert need["tokens"] >= max(g.batches) * (max(g.contexts) + out_tokens)
    with pytest.raises(Exception, match="--rounds"):
        EngineGrid(rounds=0).check("cpu")


def test_grid_needs_the_points_the_fit_uses():
    from kvsim.realengine.vllm_engine import EngineError

    with pytest.raises(EngineError, match="--batches"):
        EngineGrid(batches=(2, 4)).check("cpu")
    with pytest.raises(EngineError, match="--cached"):
        EngineGrid(cached=(512,)).check("cpu")


needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed in this Python (docs/replay.md)")


@needs_vllm
def test_tiny_engine_calibration(tmp_path):
    out = tmp_path / "cal"
    r = kvsim("calibrate", "--engine", "vllm", "--model", str(MODEL), "--device", "cpu", "--eager",
              "--block-sizes", "32", "--batches", "1", "4", "--contexts", "64", "1024", "--chunks", "32", "64", "256",
              "--cached", "0", "64", "--mixed-batches", "4", "--mixed-chunks", "64", "--repeats", "2",
              "--warmup", "1", "--rounds", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["grid"]["rounds"] == 2 and meta["rounds"] == 2 and meta["drift"]["median"] is not None
    assert meta["source"] == "engine" and meta["engine"]["name"] == "vllm" and meta["engine"]["version"]
    assert meta["host"]["threads"] == 1 and meta["date"] and meta["mismatched_steps"] >= 0
    import pandas as pd

    steps = pd.read_csv(out / "engine_steps.csv")
    assert set(steps["kind"]) == {"decode", "prefill", "mixed"} and (steps["median_s"] > 0).all()
    assert len(steps) == 2 * 2 + 3 * 2 + 1
    assert (steps["rounds"] == 2).all() and (steps["repeats"] == 4).all()
    rounds = pd.read_csv(out / "engine_rounds.csv")
    assert len(rounds) == 2 * len(steps) and sorted(set(rounds["round"])) == [0, 1]
    assert (rounds.groupby("round")["start_s"].min().diff().dropna() > 0).all()  # round 2 after round 1
    big = rounds[(rounds["kind"] == "decode") & (rounds["decode_seqs"] == 4) & (rounds["decode_context"] > 1000)]
    # 3 x 960 new prompt tokens need 2 steps of 2,048 in round 1; round 2 re-creates the same decoders from
    # the prefix cache (only each prompt's last block is computed): one step
    setup = big.sort_values("round")["setup_steps"].tolist()
    assert len(setup) == 2 and setup[0] >= 2 and setup[1] == 1, setup
    # engine_steps.csv's median is the median of the two rounds' medians (here: their mean)
    dec = steps[steps["kind"] == "decode"].iloc[0]
    r2 = rounds[(rounds["kind"] == "decode") & (rounds["decode_seqs"] == dec["decode_seqs"])
                & (abs(rounds["decode_context"] - dec["decode_context"]) < 2)]
    assert dec["median_s"] == pytest.approx(r2["median_s"].mean(), rel=1e-9)
    assert meta["holdout"]["points"] and meta["holdout"]["mape"] is not None
    assert meta["fitted"]["fit"] == "linear" and not os.path.isabs(meta["scenario_timing"]["file"])
    assert not os.path.isabs(meta["model"]["config_file"]) and (steps["cpu_median_s"] > 0).all()


@needs_vllm
def test_tiny_replay_matches_the_engine_counters(tmp_path):
    import pandas as pd

    out = tmp_path / "rep"
    r = kvsim("replay", "--engine", "vllm", str(ROOT / "scenarios" / "studies" / "vllm_cpu_replay.yaml"), "--eager",
              "--no-plots", "--set", "trace.max_requests=6", "--set", "variants.moderate.trace.rate_scale=20",
              "--set", "variants.overloaded.trace.rate_scale=50", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    for v in ("moderate", "overloaded"):
        req = pd.read_parquet(out / v / "requests.parquet")
        st = pd.read_parquet(out / v / "steps.parquet")
        s = json.loads((out / v / "summary.json").read_text())
        assert len(req) == 6 and (req["status"] == "finished").all()
        # every prompt and output token went through an engine step, as the engine scheduled them: the
        # first token of a request (and of each resumption after a preemption) ends a prefill
        assert st["prefill_tokens"].sum() >= req["prompt_tokens"].sum() - req["cached_tokens"].sum()
        assert st["decode_tokens"].sum() == (req["output_tokens"] - 1).sum() - int(req["preemptions"].sum())
        assert (req["first_token_s"] >= req["admitted_s"]).all() and (req["finish_s"] >= req["first_token_s"]).all()
        assert (req["ttft_s"] > 0).all() and s["requests_finished"] == 6
        assert s["preemptions"] == int(req["preemptions"].sum())
        assert 0 < s["kv"]["token_states_frac"] < 1 and s["measured"]["engine"] == "vllm"
        eng = pd.read_parquet(out / v / "engine_steps.parquet")
        assert len(eng) == int((~st["idle"]).sum()) and (eng["cpu_s"] > 0).all()
        assert (eng["gc_s"] >= 0).all() and (eng["probe_s"] > 0).all() and (eng["probe_s"] < eng["cpu_s"]).all()
        assert (eng["thread_s"] > 0).all() and (eng["thread_s"] <= eng["cpu_s"] + 1e-4).all()
        assert s["measured"]["busy_gc_s"] <= s["measured"]["busy_cpu_s"]
        assert eng["prefill_tokens"].sum() == st["prefill_tokens"].sum()


@needs_vllm
def test_cpu_clock_replay_times_steps_by_their_cpu_time(tmp_path):
    import pandas as pd

    out = tmp_path / "rep"
    r = kvsim("replay", "--engine", "vllm", str(ROOT / "scenarios" / "studies" / "vllm_cpu_replay.yaml"), "--eager",
              "--no-plots", "--clock", "cpu", "--set", "trace.max_requests=4", "--set", "variants={}", "--set",
              "baseline=null", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    st = pd.read_parquet(out / "steps.parquet")
    eng = pd.read_parquet(out / "engine_steps.parquet")
    busy = st[~st["idle"]]
    assert np.allclose(busy["duration_s"].to_numpy(), eng["cpu_s"].to_numpy())
    assert np.allclose(busy["start_s"].to_numpy(), eng["start_s"].to_numpy())
    s = json.loads((out / "summary.json").read_text())
    assert s["measured"]["clock"] == "cpu" and s["requests_finished"] == 4
    assert s["measured"]["busy_cpu_s"] == pytest.approx(eng["cpu_s"].sum(), abs=1e-3)
    r = kvsim("replay", "--engine", "vllm", str(ROOT / "scenarios" / "studies" / "vllm_cpu_replay.yaml"),
              "--device", "cuda", "--clock", "cpu", "--out", str(tmp_path / "bad"))
    one_line_exit_2(r, "--clock")


@needs_vllm
def test_reference_step_probe_reports_one_json_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "kvsim.realengine.probe", "--model", str(MODEL), "--eager",
                        "--batch", "2", "--context", "64", "--rounds", "2", "--repeats", "3"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["batch"] == 2 and out["context"] == 64 and out["kept_steps"] == 6 and out["mismatched_steps"] == 0
    assert len(out["cpu_round_medians_s"]) == 2 and out["cpu_median_s"] == pytest.approx(
        sum(out["cpu_round_medians_s"]) / 2)
    assert 0 <= out["gc_share"] < 1 and 0 < out["probe_share"] < 1
    r = subprocess.run([sys.executable, "-m", "kvsim.realengine.probe", "--model", "/nonexistent/config.json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nonexistent" in r.stderr


@needs_vllm
def test_replay_with_a_closed_loop_client_keeps_its_bound(tmp_path):
    import pandas as pd

    out = tmp_path / "rep"
    r = kvsim("replay", "--engine", "vllm", str(ROOT / "scenarios" / "studies" / "vllm_cpu_replay.yaml"), "--eager",
              "--no-plots", "--clock", "cpu", "--set", "trace.max_requests=6", "--set", "trace.rate_scale=50",
              "--set", "variants={}", "--set", "baseline=null", "--set", "client.max_concurrency=2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 6 and (req["status"] == "finished").all()
    sent, fin = req["arrival_s"].to_numpy(), req["finish_s"].to_numpy()
    level = top = 0
    for _, d in sorted([(t, 1) for t in sent] + [(t, -1) for t in fin]):
        level += d
        top = max(top, level)
    assert top <= 2 and (req["client_queue_s"] >= 0).all() and (req["client_queue_s"] > 0).any()
    s = json.loads((out / "summary.json").read_text())
    assert s["client"]["max_concurrency"] == 2 and s["client"]["queue_max_s"] > 0
