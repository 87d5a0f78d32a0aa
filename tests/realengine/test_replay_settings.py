"""kvsim replay's resolution of what the engine runs, without vLLM: each run's own model file (from the
file, a variant or --set), the requests kvsim run would reject (recorded, never sent), and the scenario
keys vLLM 0.32 is told or that are refused in one line (docs/replay.md, "What runs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvsim.config import load_scenario
from kvsim.realengine.replay import engine_settings, run_trace
from kvsim.realengine.vllm_engine import EngineError
from kvsim.sched.request import RequestStatus

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "azure_conv_2023.csv.gz"


def _config(path: Path, layers: int = 2, max_len: int = 8192) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": 4096, "max_position_embeddings": max_len, "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "tie_word_embeddings": False}))
    return str(path)


def _scenario(tmp: Path, extra: str = "", max_requests: int = 5) -> Path:
    _config(tmp / "m" / "config.json", 2)
    _config(tmp / "n4" / "config.json", 4)
    _config(tmp / "short" / "config.json", 2, max_len=1024)
    f = tmp / "s.yaml"
    f.write_text(f"""name: s
engine_profile: vllm-v1
trace: {{file: {TRACE}, max_requests: {max_requests}}}
model: m/config.json
kv_dtype: bf16
weight_dtype: bf16
kv_budget: {{tokens: 16384}}
allocator: {{kind: paged, block_size: 32, watermark: 0.0}}
scheduler: {{max_num_seqs: 8, max_num_batched_tokens: 2048, chunked_prefill: true}}
timing: {{kind: analytical}}
""" + extra)
    return f


VARIANTS = "variants:\n  two: {}\n  four: {model: n4/config.json}\n"


def test_each_variant_replays_its_own_model_file(tmp_path):
    f = _scenario(tmp_path, VARIANTS)
    st = engine_settings(load_scenario(f))
    assert st["two"].model_config == tmp_path / "m" / "config.json"
    assert st["four"].model_config == tmp_path / "n4" / "config.json"
    assert st["four"].provenance()["model_config"] == str(tmp_path / "n4" / "config.json")
    # a --set of the model (a file) replaces every run's, as kvsim run reads it
    st = engine_settings(load_scenario(f, ["model=short/config.json"]))
    assert {s.model_config for s in st.values()} == {tmp_path / "short" / "config.json"}
    assert {s.max_model_len for s in st.values()} == {1024}
    # a --set of one model field keeps the file underneath
    st = engine_settings(load_scenario(f, ["model.max_model_len_tokens=512"]))
    assert st["four"].model_config == tmp_path / "n4" / "config.json" and st["four"].max_model_len == 512


def test_a_preset_model_from_set_or_a_variant_is_refused_naming_the_key(tmp_path):
    f = _scenario(tmp_path, VARIANTS)
    with pytest.raises(EngineError, match=r"^--set model=Llama-3-8B: model: 'Llama-3-8B'.*preset.*--model"):
        engine_settings(load_scenario(f, ["model=Llama-3-8B"]))
    g = _scenario(tmp_path, "variants:\n  two: {}\n  big: {model: Llama-3-8B}\n")
    with pytest.raises(EngineError, match=r"s\.yaml: variants\.big\.model: model: 'Llama-3-8B' \(run 'big'\)"):
        engine_settings(load_scenario(g))


def test_a_model_file_that_is_not_the_scenarios_model_is_refused(tmp_path):
    f = _scenario(tmp_path, VARIANTS)
    # --model with a preset: the file must be that preset's model, or vLLM runs another model than reported
    with pytest.raises(EngineError, match=r"^--model: .*m/config.json has num_layers 2 .*'Llama-3-8B'.* has 32"):
        engine_settings(load_scenario(f, ["model=Llama-3-8B"]), model=str(tmp_path / "m" / "config.json"))
    # field overrides on a config file that change what vLLM computes
    with pytest.raises(EngineError, match=r"variants\.four\.model: .*n4/config.json has num_layers 4 .* has 8"):
        engine_settings(load_scenario(f, ["variants.four.model={preset: n4/config.json, num_layers: 8}"]))
    # --model that no run needs would be ignored
    with pytest.raises(EngineError, match=r"^--model .*already a config.json.*drop it"):
        engine_settings(load_scenario(f), model=str(tmp_path / "m" / "config.json"))


def test_replay_of_a_preset_set_on_the_command_line_is_one_line(tmp_path):
    """Refused before vLLM is imported: the same line with or without it."""
    f = _scenario(tmp_path, VARIANTS)
    r = subprocess.run([sys.executable, "-m", "kvsim", "replay", "--engine", "vllm", str(f), "--set",
                        "model=Llama-3-8B", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("kvsim")]
    assert len(lines) == 1 and "--set model=Llama-3-8B" in lines[0] and "preset" in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


def test_a_frontend_or_a_trace_with_samples_is_refused_before_vllm(tmp_path):
    """The replay has no API server to measure and sends one sample per request: a scenario with
    ``frontend:`` or a trace with num_samples > 1 is one line, exit 2, before vLLM is needed."""
    f = _scenario(tmp_path)
    with pytest.raises(EngineError, match=r"frontend is set; .*without an API server"):
        engine_settings(load_scenario(f, ["frontend={servers: 2, per_request_s: 0.001}"]))
    with pytest.raises(EngineError, match="preemption_mode is 'swap'; vLLM v1 preempts by recompute only"):
        engine_settings(load_scenario(f, ["scheduler.preemption_mode=swap"]))
    # vLLM V0's rule recomputes one-sequence requests (a trace with samples is refused below): not the refusal
    assert engine_settings(load_scenario(f, ["scheduler.preemption_mode=auto-vllm-v0"]))["s"].max_num_seqs == 8
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens,num_samples\n0,10,5,1\n0.5,10,5,3\n")
    r = subprocess.run([sys.executable, "-m", "kvsim", "replay", "--engine", "vllm", str(f), "--set",
                        f"trace={{file: {tmp_path / 't.csv'}}}", "--out", str(tmp_path / "o")], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("kvsim")]
    assert len(lines) == 1 and "1 request(s) with num_samples > 1" in lines[0] and str(f) in lines[0], r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("sets,words", [
    (["kv_dtype=int8"], ["kv_dtype is 'int8'", "bf16", "fp8"]),
    (["weight_dtype=fp16"], ["kv_dtype is 'bf16'", "fp16"]),
    (["weight_dtype=int4", "kv_dtype=fp8"], ["weight_dtype is 'int4'", "bf16, fp16, fp32"]),
    (["allocator.watermark=0.01"], ["allocator.watermark is 0.01", "set it to 0"]),
    (["scheduler.prompt_blocks=at_admission"], ["scheduler.prompt_blocks is 'at_admission'", "per_chunk"]),
    (["scheduler.chunked_prefill=false", "scheduler.prefill_only_steps=true"],
     ["scheduler.prefill_only_steps is True", "false"]),
    (["engine_profile=vllm-v0.6", "scheduler.chunked_prefill=false", "allocator.watermark=0"],
     ["prefill_only_steps is True (filled by engine_profile vllm-v0.6)"]),
    (["scheduler.mixed_chunk=false"], ["scheduler.mixed_chunk is False"]),
    (["scheduler.max_prefill_tokens=4096"], ["scheduler.max_prefill_tokens is 4096"]),
    (["scheduler.victim=largest_kv"], ["scheduler.victim is 'largest_kv'", "latest_admitted"]),
    (["allocator.prefix_caching=true", "allocator.eviction=fifo"], ["allocator.eviction is 'fifo'", "lru"]),
    (["parallel.tensor=2"], ["parallel is", "tensor 1"]),
])
def test_settings_vllm_would_not_run_are_refused(tmp_path, sets, words):
    f = _scenario(tmp_path)
    with pytest.raises(EngineError) as e:
        engine_settings(load_scenario(f, sets))
    msg = str(e.value)
    assert "\n" not in msg and "vLLM 0.32 would run" in msg and str(f) in msg, msg
    for w in words:
        assert w in msg, msg


def test_settings_vllm_runs_are_passed_to_it(tmp_path):
    f = _scenario(tmp_path)
    st = engine_settings(load_scenario(f))["s"]
    assert (st.dtype, st.kv_cache_dtype, st.reserve_full_isl) == ("bfloat16", "auto", True)
    st = engine_settings(load_scenario(f, ["kv_dtype=fp8", "scheduler.reserve_full_isl=false"]))["s"]
    assert (st.kv_cache_dtype, st.reserve_full_isl) == ("fp8", False)
    p = st.provenance()
    assert p["kv_cache_dtype"] == "fp8" and p["scheduler_reserve_full_isl"] is False
    st = engine_settings(load_scenario(f, ["weight_dtype=fp16", "kv_dtype=fp16"]))["s"]
    assert (st.dtype, st.kv_cache_dtype) == ("float16", "auto")
    # without chunked prefill a whole prompt is one chunk: at_admission is what vLLM does (engine_profile kvsim)
    st = engine_settings(load_scenario(f, ["engine_profile=kvsim", "scheduler.chunked_prefill=false",
                                           "allocator.watermark=0"]))["s"]
    assert st.chunked_prefill is False


class _FakeEngine:
    """Run_trace's view of an engine: every request it is given finishes in its next step."""

    def __init__(self):
        self.settings = SimpleNamespace(block_size=32)
        self.added: list[str] = []
        self._pending: list[str] = []
        self.probe = SimpleNamespace(last=None, last_probe_s=0.0)
        self.last_cpu_s = self.last_gc_s = self.last_thread_s = 1e-3

    def usable_blocks(self):
        return 512

    def add(self, rid, tokens, out):
        self.added.append(rid)
        self._pending.append(rid)

    def has_unfinished(self):
        return bool(self._pending)

    def step(self):
        from kvsim.realengine.vllm_engine import StepShape

        ids, self._pending = self._pending, []
        self.probe.last = StepShape(scheduled={i: 1 for i in ids}, decode_tokens=len(ids), decode_seqs=len(ids))
        outs = [SimpleNamespace(request_id=f"{i}-x", outputs=[SimpleNamespace(token_ids=[1])], finished=True,
                                num_cached_tokens=0, metrics=None) for i in ids]
        return 0.0, 1e-3, outs


def test_replay_rejects_what_kvsim_run_rejects_and_never_sends_it(tmp_path):
    """A prompt past the model's max length: kvsim run rejects it on arrival; the replay records the same
    row (status rejected, the same reject_reason) and does not send it to vLLM, which would refuse it
    part-way through the replay (VLLMValidationError)."""
    from kvsim.dropped import reject_reasons
    from kvsim.simulate import build_trace, run

    f = _scenario(tmp_path, max_requests=12)
    scn = load_scenario(f, ["model=short/config.json"]).base
    trace, _ = build_trace(scn, tmp_path)
    reasons = reject_reasons(scn, trace, str(f))
    predicted = run(scn, tmp_path, trace=trace).requests
    assert list(predicted["reject_reason"].fillna("")) == reasons
    assert reasons.count("exceeds_max_model_len") == 1 and reasons.count("") == 11
    eng = _FakeEngine()
    reqs, rec, _, _ = run_trace(eng, trace, 4096, 0, scn.kv_geometry(), None, clock="cpu", reject=reasons)
    bad = reasons.index("exceeds_max_model_len")
    assert str(bad) not in eng.added and len(eng.added) == 11
    assert reqs[bad].status == RequestStatus.REJECTED and reqs[bad].reject_reason == "exceeds_max_model_len"
    assert np.isnan(reqs[bad].admitted_s) and reqs[bad].arrival_s == pytest.approx(trace.arrival_s[bad])
    assert all(r.status == RequestStatus.FINISHED for i, r in enumerate(reqs) if i != bad)
    # with a closed-loop client the rejected request's slot frees at once (kvsim/client.py)
    from kvsim.client import ClosedLoopClient

    eng = _FakeEngine()
    client = ClosedLoopClient(trace.arrival_s, 1)
    reqs, *_ = run_trace(eng, trace, 4096, 0, scn.kv_geometry(), None, clock="cpu", client=client, reject=reasons)
    assert len(eng.added) == 11 and sum(r.status == RequestStatus.FINISHED for r in reqs) == 11
