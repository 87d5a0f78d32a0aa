"""Preset names (any case, did-you-mean on distinctive parts), `model: config.json` in scenarios,
sweeps and the CLI, and the refusal of a KV budget larger than the GPUs hold."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvsim.config import Scenario, load_scenario
from kvsim.errors import ConfigError
from kvsim.hw import GPUS, MODELS
from kvsim.models.names import closest

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "data" / "hf"


def write(tmp_path, tree, name="s.yaml"):
    f = tmp_path / name
    f.write_text(yaml.safe_dump(tree))
    return f


def base(**over):
    return {"trace": {"file": "t.csv"}, "model": "Llama-3-8B", "gpu": "H100-SXM-80GB", **over}


def error(f) -> str:
    with pytest.raises(ConfigError) as e:
        load_scenario(f)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(f))
    return msg


@pytest.mark.parametrize("typed,meant", [
    ("H100-80GB", "H100-SXM-80GB"), ("h100", "H100-SXM-80GB"), ("A100-40G", "A100-40GB"), ("H200", "H200-141GB"),
])
def test_gpu_did_you_mean_matches_distinctive_parts(tmp_path, typed, meant):
    assert closest(typed, GPUS) == meant
    msg = error(write(tmp_path, base(gpu=typed)))
    assert f"did you mean '{meant}'" in msg and "valid presets" in msg


@pytest.mark.parametrize("typed,meant", [("OPT-13", "OPT-13B"), ("Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
                                         ("deepseek-v2", "DeepSeek-V3"), ("mixtral", "Mixtral-8x7B"),
                                         ("Meta-Llama-3.1-405B", "Llama-3.1-405B"), ("qwen3-30b", "Qwen3-30B-A3B"),
                                         ("Gemma-2-27B", "Gemma-2-9B"), ("Lama-3-8B", "Llama-3-8B"),
                                         # Hugging Face repository ids, as users copy them from the hub
                                         ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B"),
                                         ("Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen3-235B-A22B"),
                                         ("mistralai/Mistral-Nemo-Instruct-2407", "Mistral-Nemo-12B"),
                                         ("mistralai/Mixtral-8x22B-Instruct-v0.1", "Mixtral-8x22B"),
                                         ("meta-llama/Llama-3.2-1B-Instruct", "Llama-3.2-1B")])
def test_model_did_you_mean(tmp_path, typed, meant):
    assert f"did you mean '{meant}'" in error(write(tmp_path, base(model=typed)))


def test_no_preset_of_another_family_is_offered(tmp_path):
    """Phi-3 is not near anything kvsim has: no did-you-mean, the list of presets and the config.json way."""
    msg = error(write(tmp_path, base(model="Phi-3-mini")))
    assert "did you mean" not in msg and "valid presets" in msg and "config.json" in msg
    assert closest("Phi-3-mini", MODELS) is None


def test_gemma_3_says_why_it_is_not_a_preset(tmp_path):
    """No Gemma-2 did-you-mean for a Gemma 3 name: the error says why there is no preset and the way in."""
    for typed in ("gemma-3-27b-it", "google/gemma-3-1b-pt", "Gemma3-12B"):
        msg = error(write(tmp_path, base(model=typed)))
        assert "did you mean" not in msg and "Gemma 3 is not a preset" in msg and "config.json" in msg


def test_separators_and_case_find_current_presets(tmp_path):
    s = load_scenario(write(tmp_path, base(model="llama3.1-8b"))).base
    assert s.model.name == "Llama-3.1-8B" and s.model.max_model_len_tokens == 131072
    assert load_scenario(write(tmp_path, base(model="QWEN3-8B"))).base.model.name == "Qwen3-8B"


def test_names_are_case_insensitive(tmp_path):
    s = load_scenario(write(tmp_path, base(model="llama-3-8b", gpu="h100-sxm-80gb"))).base
    assert (s.model.name, s.gpu.name) == ("Llama-3-8B", "H100-SXM-80GB")
    s = load_scenario(write(tmp_path, base(model={"preset": "MISTRAL-7B", "max_model_len_tokens": 8192}))).base
    assert s.model.name == "Mistral-7B" and s.model.max_model_len_tokens == 8192


def test_new_presets_exist():
    assert {"Mistral-7B", "Mixtral-8x7B", "Qwen2.5-72B", "DeepSeek-V3", "Llama-3.1-405B", "OPT-66B", "OPT-175B"} <= set(MODELS)
    assert all(g.interconnect_bandwidth_bytes_per_s > 0 for g in GPUS.values())


# -- model: config.json ----------------------------------------------------------------------------

def test_model_config_json_relative_to_the_scenario_file(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    shutil.copy(HF / "deepseek-v3.json", tmp_path / "models" / "config.json")
    shutil.copy(HF / "mistral-7b-v0.1.json", tmp_path / "mistral.json")
    f = write(tmp_path, base(model="models/config.json", gpu="H200-141GB", weight_dtype="fp8", kv_dtype="fp8",
                             parallel={"tensor": 8},
                             variants={"mistral": {"model": "mistral.json", "parallel": {"tensor": 1}},
                                       "short": {"model": {"max_model_len_tokens": 4096}}}))
    monkeypatch.chdir(ROOT)  # not the scenario's folder
    loaded = load_scenario(f)
    ds = loaded.variants["short"]
    assert ds.model.attention == "mla" and ds.model.max_model_len_tokens == 4096
    assert ds.kv_geometry().bytes_per_token == 61 * 576  # fp8 latent, replicated on every tensor rank
    assert loaded.variants["mistral"].model.sliding_window_layers == 32
    assert loaded.variants["mistral"].model.name == "mistral"  # the file's name (a config.json: its folder's)
    assert "models/config.json" in ds.model.source


def test_a_variant_or_point_naming_another_preset_replaces_the_base_model(tmp_path):
    """``model: {preset: other}`` (a preset or a config.json) in a variant is that model, not the base's
    fields on top of it (the base's expanded config.json used to win: Qwen3-14B stayed Qwen3-14B); a
    variant of the same preset keeps the base's overrides."""
    shutil.copy(HF / "qwen3-14b.json", tmp_path / "q.json")
    shutil.copy(HF / "mixtral-8x7b-v0.1.json", tmp_path / "mx.json")
    f = write(tmp_path, base(model={"preset": "q.json", "max_model_len_tokens": 4096},
                             gpu={"preset": "A100-80GB", "memory_bytes": 40 * 2**30},
                             variants={"mx": {"model": {"preset": "mx.json"}}, "llama": {"model": {"preset": "Llama-2-7B"}},
                                       "same": {"model": {"preset": "q.json", "num_layers": 20}},
                                       "h100": {"gpu": {"preset": "H100-SXM-80GB"}}}))
    v = load_scenario(f).variants
    assert (v["mx"].model.num_experts, v["mx"].model.hidden_size, v["mx"].model.max_model_len_tokens) == (8, 4096, 32768)
    assert (v["llama"].model.name, v["llama"].model.num_kv_heads, v["llama"].model.max_model_len_tokens) == \
        ("Llama-2-7B", 32, 4096)
    assert (v["same"].model.hidden_size, v["same"].model.num_layers, v["same"].model.max_model_len_tokens) == \
        (5120, 20, 4096)
    assert v["h100"].gpu.memory_bytes == GPUS["H100-SXM-80GB"].memory_bytes != 40 * 2**30


def test_missing_or_broken_config_json_is_one_line(tmp_path):
    msg = error(write(tmp_path, base(model="nope/config.json")))
    assert "model:" in msg and "not found" in msg
    (tmp_path / "bad.json").write_text('{"num_hidden_layers": 2,')
    assert "JSON syntax error" in error(write(tmp_path, base(model="bad.json")))
    (tmp_path / "half.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    msg = error(write(tmp_path, base(model="half.json")))
    assert "num_attention_heads" in msg and "required" in msg


def test_sweep_points_carry_the_models_fields(tmp_path):
    from kvsim.sweep.spec import load_sweep, validate_point_raw

    shutil.copy(HF / "llama-3-8b.json", tmp_path / "llama.json")
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    write(tmp_path, base(model="llama.json"), "base.yaml")
    sweep = tmp_path / "sw.sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base_file": "base.yaml", "grid": {"kv_dtype": ["fp16", "fp8"]}}))
    loaded = load_sweep(sweep, check_capacity=False)
    assert len(loaded.points) == 2
    for p in loaded.points:  # a worker validates the raw mapping without knowing the folder
        assert isinstance(p.raw["model"], dict)
        assert validate_point_raw(p.raw, "w").model.num_kv_heads == 8


def kvsim(*args, cwd):
    return subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_cli_validate_with_a_config_json(tmp_path):
    shutil.copy(HF / "gemma-2-9b.json", tmp_path / "config.json")
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    f = write(tmp_path, base(model="config.json", gpu="A100-80GB"))
    out = kvsim("validate", str(f), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "ok (" in out.stdout and "config.json" not in out.stderr
    bad = write(tmp_path, base(model="missing.json"), "bad.yaml")
    out = kvsim("validate", str(bad), cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "missing.json" in out.stderr and "not found" in out.stderr


# -- kv_budget beyond the GPU ----------------------------------------------------------------------

def test_budget_beyond_the_gpu_is_refused_with_the_limit(tmp_path):
    s = Scenario.model_validate(base())
    fits = s.derived_kv_budget_bytes() // s.kv_geometry().bytes_per_token
    Scenario.model_validate(base(kv_budget={"tokens": fits}))  # exactly what fits: accepted
    msg = error(write(tmp_path, base(kv_budget={"tokens": fits + 1})))
    assert "kv_budget.tokens" in msg and f"at most {fits:,} tokens" in msg and "H100-SXM-80GB" in msg
    assert "allow_beyond_gpu" in msg
    msg = error(write(tmp_path, base(kv_budget={"bytes": 80 << 30})))
    assert "kv_budget.bytes" in msg and "80.00 GiB per GPU" in msg
    # a what-if beyond the GPU says so explicitly
    Scenario.model_validate(base(kv_budget={"tokens": 10 * fits, "allow_beyond_gpu": True}))
    # two GPUs hold twice the tokens (KV heads split over them)
    Scenario.model_validate(base(kv_budget={"tokens": 2 * fits}, parallel={"tensor": 2}))


def test_budget_refusal_in_a_variant_names_the_variant(tmp_path):
    msg = error(write(tmp_path, base(variants={"big": {"kv_budget": {"tokens": 10**8}}})))
    assert "variants.big.kv_budget.tokens" in msg


def test_shipped_unbounded_what_ifs_still_load():
    from kvsim.sweep.spec import load_sweep

    load_scenario(ROOT / "scenarios" / "studies" / "prefix_caching_mooncake.yaml")
    load_sweep(ROOT / "scenarios" / "studies" / "prefix_caching_capacity_sweep.yaml", check_capacity=False)


def test_cli_validate_notes_the_sliding_window_upper_bound(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    f = write(tmp_path, base(model="mistral-7b"))
    out = kvsim("validate", str(f), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "32 of 32 layers use a 4096-token sliding window" in out.stdout and "upper bound" in out.stdout


def test_cli_models_shows_a_config_json():
    out = kvsim("models", "--json", "--config", str(HF / "deepseek-v3.json"), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["models"]["deepseek-v3"]
    assert m["attention"] == "mla" and m["kv_bytes_per_token"]["bf16"] == 70_272
    out = kvsim("models", "--config", "nope.json", cwd=ROOT)
    assert out.returncode == 2 and "nope.json" in out.stderr and "not found" in out.stderr
