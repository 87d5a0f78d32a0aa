"""Reading a Hugging Face config.json: the max length under RoPE scaling (vLLM's rule) and the keys
that have no silent default (docs/models.md, "What a config.json gives")."""

import json
from pathlib import Path

import pytest

from kvsim.errors import ConfigError
from kvsim.models.hf import model_fields

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
QWEN = json.loads((HF / "qwen2.5-7b.json").read_text())
LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,
         "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096}
PHI3 = {"model_type": "phi3", "num_hidden_layers": 2, "hidden_size": 3072, "num_attention_heads": 32,
        "intermediate_size": 8192, "vocab_size": 32064, "max_position_embeddings": 131072}


def max_len(cfg: dict) -> int:
    return model_fields(cfg, "c.json")["max_model_len_tokens"]


# Expected lengths: what vLLM 0.32's _get_and_verify_max_len (vllm/config/model.py) returned for the
# same configs, run through transformers 5.19 (the .venv-conformance install, 2026-12).
@pytest.mark.parametrize("cfg,expected", [
    ({**QWEN, "max_position_embeddings": 32768,  # the Qwen2.5-Instruct card's YaRN: not scaled again
      "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 32768),
    ({**LLAMA, "rope_scaling": {"type": "linear", "factor": 4.0}}, 16384),
    ({**LLAMA, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 8192),
    ({**LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 2.5}}, 10240),
    ({**LLAMA, "rope_scaling": {"rope_type": "default", "factor": 2.0}}, 8192),
    ({**LLAMA, "rope_scaling": {"type": "linear", "factor": None}}, 4096),  # null factor: 1.0
    ({**LLAMA, "rope_parameters": {"rope_type": "linear", "factor": 3.0}}, 12288),  # transformers 5 key
    ({**LLAMA, "rope_scaling": {"rope_type": "deepseek_yarn", "factor": 4.0,
                                "original_max_position_embeddings": 1024}}, 4096),
    ({**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}, 4096),
    ({**PHI3, "original_max_position_embeddings": 4096,  # longrope: the original length by default
      "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, 4096),
    ({**PHI3, "original_max_position_embeddings": 4096,
      "rope_scaling": {"type": "su", "short_factor": [1.0], "long_factor": [1.0]}}, 4096),
    ({**LLAMA, "model_type": "gemma3_text", "head_dim": 128, "max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 131072),  # Gemma 3's length is already scaled
    ({**LLAMA, "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0},
                                   "sliding_attention": {"rope_type": "default"}}}, 8192),
])
def test_max_length_follows_vllms_rope_scaling_rule(cfg, expected):
    assert max_len(cfg) == expected


def test_a_rope_factor_that_is_not_a_number_is_one_line():
    with pytest.raises(ConfigError) as e:
        model_fields({**LLAMA, "rope_scaling": {"type": "linear", "factor": "4"}}, "c.json")
    assert str(e.value) == "c.json: rope_scaling.factor: expected a positive number (got '4')"


def test_missing_intermediate_size_is_refused_where_no_default_is_sourced():
    cfg = {k: v for k, v in LLAMA.items() if k != "intermediate_size"}
    with pytest.raises(ConfigError) as e:
        model_fields(cfg, "c.json")
    assert str(e.value).startswith("c.json: intermediate_size: required key is missing")
    # GPT-2's MLP is 4 x hidden when n_inner is null (transformers GPT2MLP)
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 768, "n_head": 12, "n_inner": None,
            "vocab_size": 50257, "n_positions": 1024}
    assert model_fields(gpt2, "g.json")["intermediate_size"] == 3072
    falcon = {**gpt2, "model_type": "falcon", "ffn_hidden_size": 2048}
    assert model_fields(falcon, "f.json")["intermediate_size"] == 2048


@pytest.mark.parametrize("value", [0, -128, "128", True])
def test_head_dim_that_is_not_positive_is_refused(value):
    with pytest.raises(ConfigError) as e:
        model_fields({**LLAMA, "head_dim": value}, "c.json")
    assert str(e.value) == f"c.json: head_dim: expected a positive integer (got {value!r})"


def test_null_head_dim_is_hidden_over_heads():
    assert model_fields({**LLAMA, "head_dim": None}, "c.json")["head_dim"] == 128


def test_a_name_on_disk_is_a_config_path_unless_it_is_a_preset(tmp_path, monkeypatch):
    from kvsim.models.hf import is_config_path

    (tmp_path / "mine").mkdir()
    (tmp_path / "Llama-3-8B").mkdir()  # a downloaded model's folder named as the preset
    (tmp_path / "cfg").write_text(json.dumps(LLAMA))
    assert is_config_path("x.JSON") and is_config_path("mine", tmp_path) and is_config_path("cfg", tmp_path)
    assert not is_config_path("Llama-3-8B", tmp_path) and not is_config_path("llama3-8b", tmp_path)
    assert not is_config_path("absent", tmp_path)
    monkeypatch.chdir(tmp_path)
    assert is_config_path("mine") and is_config_path(str(tmp_path / "mine"))


def _write(tmp_path, cfg, name="hdodd.json"):
    f = tmp_path / name
    f.write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    return f


@pytest.mark.parametrize("extra", [{"head_dim": 127}, {"hidden_size": 4000}])  # 4000 / 32 heads = 125
def test_an_odd_head_dim_with_int4_kv_is_one_line_naming_kv_dtype_and_the_valid_choices(tmp_path, capsys, extra):
    # QA: `kvsim models --config` and `kvsim kernel --kv-dtype int4` were "internal error: ValueError: head_dim
    # 127 x 4 bits is not a whole number of bytes" (exit 1); `kvsim validate` named neither field nor choices
    from kvsim.cli import main

    f = _write(tmp_path, {**LLAMA, **extra, "num_key_value_heads": 8})
    assert main(["models", "--config", str(f)]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("hdodd")][0]
    assert row.split()[-1] == "n/a" and row.split()[-2].isdigit()  # int4 n/a, int8 priced
    assert main(["kernel", "--gpu", "H100-SXM-80GB", "--model", str(f), "--batch", "4", "--context", "100",
                 "--kv-dtype", "int4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--kv-dtype: int4" in err and "valid for this model: fp16, bf16, fp8, int8" in err
    scn = tmp_path / "s.yaml"
    scn.write_text(f"model: {f.name}\ngpu: H100-SXM-80GB\nkv_dtype: int4\ntrace: {{synthetic: {{preset: sharegpt, "
                   "num_requests: 2, arrival: {process: poisson, rate_per_s: 1}}}\n")
    assert main(["validate", str(scn)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "s.yaml" in err and "kv_dtype: int4" in err and "valid for this model" in err
    assert "Traceback" not in err


def test_more_experts_per_token_than_experts_is_refused_in_a_config_json_as_in_a_scenario(tmp_path):
    # QA: `kvsim models --config` printed 46.8B active of 30.5B total; one check (kvsim.hw.experts_problem)
    from kvsim.config import load_mapping
    from kvsim.hw import experts_problem

    moe = {**LLAMA, "num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 1024}
    with pytest.raises(ConfigError, match=r"x\.json: num_experts_per_tok: 9 experts per token is more than the 8"):
        model_fields(moe, "x.json")
    assert model_fields({**moe, "num_experts_per_tok": 8}, "x.json")["num_experts"] == 8
    with pytest.raises(ConfigError, match="experts_per_token: 9 experts per token is more than the 8 experts"):
        load_mapping({"model": {"preset": "Llama-2-7B", "num_experts": 8, "experts_per_token": 9},
                      "gpu": "H100-SXM-80GB", "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 1}}},
                     Path("."))
    assert experts_problem(8, 8) is None
