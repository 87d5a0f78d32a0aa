"""KV bytes per token from Hugging Face config.json files, checked by hand (docs/models.md)."""

from pathlib import Path

import pytest

from kvsim.errors import ConfigError
from kvsim.hw import MODELS, ModelSpec
from kvsim.models.hf import load_model_file, model_fields

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def spec(name: str) -> ModelSpec:
    return ModelSpec(**load_model_file(str(HF / name), None))


def test_gqa_llama_3_8b():
    m = spec("llama-3-8b.json")
    # 2 (K, V) x 32 layers x 8 kv heads x 128 dims x 2 bytes
    assert m.kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert m.kv_bytes_per_token("fp8") == 65_536
    assert (m.attention, m.num_kv_heads, m.head_dim, m.max_model_len_tokens) == ("gqa", 8, 128, 8192)
    assert m.kv_bytes_for_context(5000, "bf16") == 5000 * 131_072  # no window: every token, every layer


def test_mla_deepseek_v3_stores_one_latent_per_layer():
    m = spec("deepseek-v3.json")
    assert m.attention == "mla" and (m.kv_lora_rank, m.qk_rope_head_dim) == (512, 64)
    assert (m.q_lora_rank, m.v_head_dim) == (1536, 128)  # the shapes of its attention GEMMs
    # 61 layers x (512 latent + 64 rope) x 2 bytes; no factor 2 for K/V, no per-head copies
    assert m.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2 == 70_272
    assert m.kv_bytes_per_token("fp8") == 61 * 576 == 35_136
    # the same model as 128-head MHA would hold 2 x 61 x 128 x 192 x 2 bytes: 85x more
    assert 2 * 61 * 128 * 192 * 2 / m.kv_bytes_per_token("bf16") > 80
    assert m.max_model_len_tokens == 163_840
    assert MODELS["DeepSeek-V3"].kv_bytes_per_token("bf16") == 70_272


def test_sliding_window_mistral_7b_v01():
    m = spec("mistral-7b-v0.1.json")
    assert (m.sliding_window_tokens, m.sliding_window_layers) == (4096, 32)
    per_token = 2 * 32 * 8 * 128 * 2
    assert m.kv_bytes_per_token("fp16") == per_token  # what the allocator charges: every token
    assert m.kv_bytes_for_context(1000, "fp16") == 1000 * per_token  # inside the window: exact
    assert m.kv_bytes_for_context(10_000, "fp16") == 4096 * per_token  # past it: the window only
    assert MODELS["Mistral-7B"].kv_bytes_per_token("fp16") == per_token


def test_hybrid_gemma_2_alternates_window_and_global_layers():
    m = spec("gemma-2-9b.json")
    assert (m.num_layers, m.num_kv_heads, m.head_dim) == (42, 8, 256)
    assert (m.sliding_window_tokens, m.sliding_window_layers) == (4096, 21)  # even layers local
    layer = 2 * 8 * 256 * 2
    assert m.kv_bytes_per_token("bf16") == 42 * layer == 344_064
    assert m.kv_bytes_for_context(8192, "bf16") == 21 * layer * 8192 + 21 * layer * 4096
    assert m.kv_bytes_for_context(4096, "bf16") == 42 * layer * 4096


def test_gemma_3_pattern_and_layer_types():
    base = {"model_type": "gemma3_text", "num_hidden_layers": 26, "hidden_size": 1152, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912, "vocab_size": 262144,
            "max_position_embeddings": 32768, "sliding_window": 512, "sliding_window_pattern": 6}
    f = model_fields(base, "g3.json")
    assert (f["sliding_window_tokens"], f["sliding_window_layers"]) == (512, 26 - 4)  # layers 5, 11, 17, 23 global
    types = ["sliding_attention"] * 20 + ["full_attention"] * 6
    f = model_fields({**base, "model_type": "whatever", "layer_types": types}, "g3.json")
    assert f["sliding_window_layers"] == 20
    wrapped = model_fields({"model_type": "gemma3", "text_config": base}, "g3.json")  # multimodal wrapper
    assert wrapped["num_layers"] == 26 and wrapped["sliding_window_layers"] == 22


def test_gemma_3_27b_windows_are_why_it_is_not_a_preset():
    """Gemma-3-27B (text_config of the Gemma3Config in maxtext's hf_model_configs.py): 52 of 62 layers keep a
    1024-token window; kvsim's allocators charge every layer for every token, so a preset would overstate its
    KV 3.8x at 8K tokens and 6x at 128K (docs/models.md, "Presets")."""
    m = spec("gemma-3-27b.json")
    assert (m.num_layers, m.sliding_window_layers, m.sliding_window_tokens) == (62, 52, 1024)
    assert m.num_params == pytest.approx(27e9, rel=0.01)
    charged = lambda n: n * m.kv_bytes_per_token("bf16")  # noqa: E731
    assert charged(1024) == m.kv_bytes_for_context(1024, "bf16")
    assert charged(8192) / m.kv_bytes_for_context(8192, "bf16") == pytest.approx(3.76, abs=0.01)
    assert charged(131072) / m.kv_bytes_for_context(131072, "bf16") == pytest.approx(5.96, abs=0.01)
    assert not any(name.lower().startswith("gemma-3") for name in MODELS)


def test_qwen_window_switched_off():
    m = spec("qwen2.5-72b.json")
    assert m.sliding_window_layers == 0 and m.kv_bytes_per_token("bf16") == 2 * 80 * 8 * 128 * 2


@pytest.mark.parametrize("file,preset", [
    ("llama-3-8b.json", "Llama-3-8B"), ("mistral-7b-v0.1.json", "Mistral-7B"), ("mixtral-8x7b-v0.1.json", "Mixtral-8x7B"),
    ("deepseek-v3.json", "DeepSeek-V3"), ("qwen2.5-72b.json", "Qwen2.5-72B"), ("opt-66b.json", "OPT-66B"),
    ("llama-3.1-405b.json", "Llama-3.1-405B"),
])
def test_parameter_count_from_the_shapes_matches_the_published_one(file, preset):
    m, p = spec(file), MODELS[preset]
    assert m.num_params == pytest.approx(p.num_params, rel=0.005)
    assert m.params_per_token == pytest.approx(p.params_per_token, rel=0.015)
    for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "max_model_len_tokens", "attention", "sliding_window_tokens", "num_experts",
                  "experts_per_token", "gated_mlp", "kv_lora_rank", "qk_rope_head_dim", "q_lora_rank", "v_head_dim"):
        assert getattr(m, field) == getattr(p, field), field
    assert m.kv_bytes_per_token("bf16") == p.kv_bytes_per_token("bf16")


CURRENT = {"llama-3.1-8b.json": "Llama-3.1-8B", "llama-3.1-70b.json": "Llama-3.1-70B",
           "llama-3.3-70b.json": "Llama-3.3-70B", "llama-3.2-3b.json": "Llama-3.2-3B", "qwen2.5-3b.json": "Qwen2.5-3B",
           "qwen2.5-14b.json": "Qwen2.5-14B", "qwen2.5-32b.json": "Qwen2.5-32B", "qwen3-4b.json": "Qwen3-4B",
           "qwen3-8b.json": "Qwen3-8B", "qwen3-14b.json": "Qwen3-14B", "qwen3-32b.json": "Qwen3-32B",
           "qwen3-30b-a3b.json": "Qwen3-30B-A3B", "gemma-2-9b.json": "Gemma-2-9B",
           "qwen2.5-7b.json": "Qwen2.5-7B", "llama-3.2-1b.json": "Llama-3.2-1B", "qwen3-0.6b.json": "Qwen3-0.6B",
           "qwen3-1.7b.json": "Qwen3-1.7B", "qwen3-235b-a22b.json": "Qwen3-235B-A22B",
           "mixtral-8x22b-v0.1.json": "Mixtral-8x22B", "mistral-nemo-base-2407.json": "Mistral-Nemo-12B"}


@pytest.mark.parametrize("file,preset", sorted(CURRENT.items()))
def test_current_presets_are_their_config_files(file, preset):
    """Every shape field of the preset is what its config.json gives; the parameter count is the one
    computed from those shapes (rounded to 10M in the preset)."""
    m, p = spec(file), MODELS[preset]
    for field in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "max_model_len_tokens", "attention", "sliding_window_tokens", "sliding_window_layers",
                  "num_experts", "experts_per_token", "gated_mlp"):
        assert getattr(m, field) == getattr(p, field), field
    assert abs(m.num_params - p.num_params) <= 5e6 and abs(m.active_params - p.active_params) <= 5e6
    assert p.source


def test_llama_3_1_presets_take_128k_prompts():
    for name in ("Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-3.3-70B", "Llama-3.2-3B", "Llama-3.2-1B",
                 "Qwen2.5-7B"):
        assert MODELS[name].max_model_len_tokens == 131072 == 128 * 1024


@pytest.mark.parametrize("preset,total,active", [
    # published totals: model cards (Llama-3.2-1B 1.23B, Qwen3 0.6B/1.7B/235B-A22B, Mistral-Nemo 12B) and
    # Mistral AI's Mixtral-8x22B announcement (141B total, 39B active)
    ("Llama-3.2-1B", 1.23e9, None), ("Qwen3-0.6B", 0.6e9, None), ("Qwen3-1.7B", 1.7e9, None),
    ("Qwen3-235B-A22B", 235e9, 22e9), ("Mixtral-8x22B", 141e9, 39e9), ("Mistral-Nemo-12B", 12.2e9, None),
])
def test_new_presets_weigh_what_their_model_cards_say(preset, total, active):
    """The shape-derived counts land within 2 % of the published (rounded) totals: a typo'd shape in a
    preset or its test copy would move them by far more."""
    p = MODELS[preset]
    assert p.num_params == pytest.approx(total, rel=0.02)
    if active is not None:
        assert p.params_per_token == pytest.approx(active, rel=0.02)


def test_moe_weights_count_every_expert_and_flops_only_the_active_ones():
    m = spec("mixtral-8x7b-v0.1.json")
    assert (m.num_experts, m.experts_per_token) == (8, 2)
    assert m.weight_bytes("bf16") == pytest.approx(46.7e9 * 2, rel=0.005)
    assert m.params_per_token == pytest.approx(12.9e9, rel=0.005)
    d = spec("deepseek-v3.json")
    assert d.num_params == pytest.approx(671e9, rel=0.002) and d.params_per_token == pytest.approx(37e9, rel=0.02)


@pytest.mark.parametrize("cfg,words", [
    ({"hidden_size": 64}, ["num_hidden_layers", "required"]),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": "8", "vocab_size": 10,
      "max_position_embeddings": 128}, ["num_attention_heads", "positive integer"]),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 3,
      "vocab_size": 10, "max_position_embeddings": 128}, ["multiple of num_key_value_heads"]),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 8, "vocab_size": 10,
      "max_position_embeddings": 128, "kv_lora_rank": 16}, ["MLA", "qk_rope_head_dim"]),
])
def test_bad_configs_name_the_field(cfg, words):
    with pytest.raises(ConfigError) as e:
        model_fields(cfg, "bad.json")
    msg = str(e.value)
    assert msg.startswith("bad.json: ") and "\n" not in msg
    for w in words:
        assert w in msg
