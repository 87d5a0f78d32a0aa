"""Read a Hugging Face ``config.json`` (offline) into kvsim's model fields.

``model: path/to/config.json`` in a scenario (relative to the scenario file) reads the shape of any
decoder-only transformer: layers, hidden size, heads, KV heads, head dim, max length
(``max_position_embeddings``, scaled by ``rope_scaling`` as vLLM does), the attention kind
(GQA/MHA/MQA, or MLA when ``kv_lora_rank`` is set: DeepSeek-V2/V3), sliding-window layers
(Mistral, Gemma 2/3, ``layer_types``) and MoE expert counts. The parameter count (for weight
bytes) is computed from the shapes: embeddings (+ LM head unless tied), attention projections,
MLP/experts and routers per layer. Biases, norm weights and learned position embeddings are left
out (< 0.1 % of any model here). See docs/models.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError
from kvsim.hw import MODELS, experts_problem, mla_attention_gemms
from kvsim.models.names import lookup

# model_type -> MLP without a gate (two matrices, not three)
UNGATED_MLP = {"opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon", "gpt_bigcode", "phi", "starcoder2"}
# model_type whose config class ties input and output embeddings by default
TIED_BY_DEFAULT = {"opt", "gpt2", "gemma", "gemma2", "gemma3", "gemma3_text", "bloom"}

# (kvsim meaning, accepted config keys in order)
ALIASES = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
    "max_len": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"),
    "intermediate": ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"),
    "experts": ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"),
}
# model_type whose MLP is 4 x hidden wide when the config gives no width (transformers: GPT2MLP,
# GPT-J and GPTBigCode take ``n_inner`` None as 4 x hidden, BloomMLP is always 4 x hidden,
# FalconConfig sets ``ffn_hidden_size`` None to 4 x hidden); any other config must give it
MLP_4X_BY_DEFAULT = {"gpt2", "gptj", "gpt_bigcode", "bloom", "falcon"}
# RoPE types whose ``factor`` vLLM does not apply to the config's max length (vLLM 0.32
# vllm/config/model.py ``_get_and_verify_max_len``: YaRN's ``max_position_embeddings`` is already the
# scaled length; ``su`` is longrope's old name, ``telechat3-yarn`` is loaded as ``yarn``)
ROPE_UNSCALED = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling", "telechat3-yarn"}


def is_config_path(name: str, base_dir: Path | None = None) -> bool:
    """Whether a model name means a config file rather than a preset: it ends in ``.json``, or it is
    a path that exists (relative to ``base_dir``, else the current folder) and no preset's name, so
    that a folder is refused as one (:func:`read_config`) instead of as an unknown preset."""
    if name.lower().endswith(".json"):
        return True
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path.exists() and lookup(name, MODELS) is None


def _get(cfg: dict, what: str, file: str, required: bool = True, default: Any = None) -> Any:
    for key in ALIASES[what]:
        v = cfg.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{file}: {key}: expected a positive integer (got {v!r})")
            return v
    if required:
        raise ConfigError(f"{file}: {ALIASES[what][0]}: required key is missing (also accepted: "
                          f"{', '.join(ALIASES[what][1:])})")
    return default


def _positive(cfg: dict, key: str, file: str) -> int | None:
    """``cfg[key]`` as a positive integer, or None when the key is absent or null."""
    v = cfg.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
        raise ConfigError(f"{file}: {key}: expected a positive integer (got {v!r})")
    return v


def _int(cfg: dict, key: str, file: str, default: int = 0) -> int:
    v = cfg.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{file}: {key}: expected a non-negative integer (got {v!r})")
    return v


def read_config(path: Path) -> dict:
    if not path.exists():
        raise ConfigError(f"{path}: model config file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, expected a Hugging Face config.json")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read model config: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}:{e.lineno}:{e.colno}: JSON syntax error: {e.msg}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    return cfg


def sliding_window_layers(cfg: dict, model_type: str, num_layers: int, file: str) -> tuple[int, int]:
    """(window tokens, number of layers that use it); (0, 0) for none."""
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        if len(layer_types) != num_layers:
            raise ConfigError(f"{file}: layer_types: {len(layer_types)} entries for {num_layers} layers")
        n = sum(1 for t in layer_types if t == "sliding_attention")
    elif window is None:
        return 0, 0
    elif model_type == "gemma2":
        n = (num_layers + 1) // 2  # even layers (0, 2, ...) are local, odd ones global
    elif model_type.startswith("gemma3"):
        pattern = _int(cfg, "sliding_window_pattern", file, 6)  # every pattern-th layer is global
        n = num_layers - (num_layers // pattern if pattern else 0)
    elif cfg.get("use_sliding_window") is False:
        n = 0  # Qwen2/2.5: a window in the config, switched off
    elif cfg.get("use_sliding_window") is True:
        n = num_layers - min(num_layers, _int(cfg, "max_window_layers", file, 0))  # layers >= max_window_layers
    else:
        n = num_layers  # Mistral v0.1 and the like: every layer
    if n == 0:
        return 0, 0
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        raise ConfigError(f"{file}: sliding_window: expected a positive integer (got {window!r})")
    return window, n


def _rope_parameters(cfg: dict, file: str) -> tuple[str, list[dict]]:
    """(the key, its RoPE parameter mappings): ``rope_parameters`` (transformers 5) or ``rope_scaling``;
    one mapping, or one per layer type when nested (``{"full_attention": {...}, ...}``)."""
    key = "rope_parameters" if cfg.get("rope_parameters") is not None else "rope_scaling"
    rp = cfg.get(key)
    if rp is None:
        return key, []
    if not isinstance(rp, dict):
        raise ConfigError(f"{file}: {key}: expected a mapping (got {rp!r})")
    if rp and all(v is None or isinstance(v, dict) for v in rp.values()):
        return key, [v for v in rp.values() if v]
    return key, [rp] if rp else []


def _rope_type(params: dict) -> str:
    return str(params.get("rope_type") or params.get("type") or "default")


def _rope_factor(params: dict, key: str, file: str, default: float) -> float:
    f = params.get("factor", default)
    if f is None:
        return 1.0  # vLLM: a null factor falls back to 1.0
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
        raise ConfigError(f"{file}: {key}.factor: expected a positive number (got {f!r})")
    return float(f)


def rope_max_len(cfg: dict, model_type: str, max_len: int, file: str) -> int:
    """The max model length vLLM derives from ``max_len`` and the config's RoPE scaling (vLLM 0.32
    ``_get_and_verify_max_len``): times ``factor`` for linear, dynamic and the other RoPE types
    outside :data:`ROPE_UNSCALED`, except Gemma 3 (its length is already scaled); a longrope model
    defaults to ``original_max_position_embeddings``. See docs/models.md."""
    key, params = _rope_parameters(cfg, file)
    longrope = [p for p in params if _rope_type(p) in ("longrope", "su")]
    if longrope:
        orig = "original_max_position_embeddings"
        return _int(cfg, orig, file) or _int(longrope[0], orig, file) or max_len
    if "gemma3" in model_type:
        return max_len
    factor = 1.0
    for p in params:  # vLLM assumes every layer type scales alike: the last factor given wins
        if _rope_type(p) not in ROPE_UNSCALED:
            factor = _rope_factor(p, key, file, factor)
    return int(max_len * factor)


def _attention_params(cfg: dict, file: str, h: int, heads: int, kvh: int) -> tuple[str, int, int, int, int, int,
                                                                                 int, int]:
    """(attention kind, KV heads, head dim, kv_lora_rank, qk_rope_head_dim, attention parameters per
    layer, q_lora_rank, v_head_dim): MLA (DeepSeek-V2/V3, ``kv_lora_rank`` set) or GQA/MHA (the last
    two 0)."""
    kv_lora = _int(cfg, "kv_lora_rank", file)
    if kv_lora:  # MLA (DeepSeek-V2/V3)
        rope = _int(cfg, "qk_rope_head_dim", file)
        nope = _int(cfg, "qk_nope_head_dim", file)
        v_dim = _int(cfg, "v_head_dim", file)
        q_lora = _int(cfg, "q_lora_rank", file)
        if not (rope and nope and v_dim):
            raise ConfigError(f"{file}: an MLA config (kv_lora_rank set) needs qk_rope_head_dim, qk_nope_head_dim "
                              f"and v_head_dim")
        head_dim = nope + rope
        attn = sum(n * k for n, k in mla_attention_gemms(h, heads, head_dim, rope, kv_lora, q_lora, v_dim))
        attention, kvh = "mla", heads
    else:
        rope = q_lora = v_dim = 0
        given = _positive(cfg, "head_dim", file)
        head_dim = given or h // heads
        if given is None and head_dim * heads != h:
            raise ConfigError(f"{file}: hidden_size {h} is not a multiple of num_attention_heads {heads}; "
                              f"give head_dim")
        attn = 2 * h * heads * head_dim + 2 * h * kvh * head_dim
        attention = "gqa"
    if heads % kvh:
        raise ConfigError(f"{file}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kvh})")

    return attention, kvh, head_dim, kv_lora, rope, attn, q_lora, v_dim


def _mlp_params(cfg: dict, file: str, L: int, h: int, inter: int, mats: int) -> tuple[int, int, int, int]:
    """(experts, experts per token, MLP parameters in total, MLP parameters a token activates) over
    all layers: dense, or MoE layers (routed + shared experts, router) beside dense ones."""
    experts = _get(cfg, "experts", file, required=False, default=0)
    per_token = _int(cfg, "num_experts_per_tok", file) if experts else 0
    mlp_dense = mats * h * inter
    if experts:
        moe_inter = _int(cfg, "moe_intermediate_size", file) or inter
        shared = _int(cfg, "n_shared_experts", file) * mats * h * moe_inter
        shared_inter = _int(cfg, "shared_expert_intermediate_size", file)  # Qwen-MoE: one bigger shared expert
        if shared_inter:
            shared += mats * h * shared_inter + h
        expert = mats * h * moe_inter
        first_dense = _int(cfg, "first_k_dense_replace", file)
        freq = _int(cfg, "moe_layer_freq", file, 1) or 1
        moe_layers = sum(1 for i in range(first_dense, L) if i % freq == 0)
        if not per_token:
            raise ConfigError(f"{file}: num_experts_per_tok: required for an MoE config ({experts} experts)")
        why = experts_problem(experts, per_token)
        if why:
            raise ConfigError(f"{file}: num_experts_per_tok: {why} in the config")
        mlp_total = (L - moe_layers) * mlp_dense + moe_layers * (experts * expert + shared + h * experts)
        mlp_active = (L - moe_layers) * mlp_dense + moe_layers * (per_token * expert + shared + h * experts)
    else:
        mlp_total = mlp_active = L * mlp_dense
    return experts, per_token, mlp_total, mlp_active


def model_fields(cfg: dict, file: str, name: str | None = None) -> dict:
    """The fields of kvsim's ModelConfig from a parsed ``config.json``."""
    outer_type = str(cfg.get("model_type", ""))
    if isinstance(cfg.get("text_config"), dict) and not any(k in cfg for k in ALIASES["layers"]):
        cfg = {**cfg["text_config"]}  # multimodal wrappers (Gemma 3, Llava, ...): the language model
    model_type = str(cfg.get("model_type", outer_type))
    L = _get(cfg, "layers", file)
    h = _get(cfg, "hidden", file)
    heads = _get(cfg, "heads", file)
    kvh = _get(cfg, "kv_heads", file, required=False, default=heads)
    vocab = _int(cfg, "vocab_size", file)
    if vocab <= 0:
        raise ConfigError(f"{file}: vocab_size: required key is missing")
    max_len = rope_max_len(cfg, model_type, _get(cfg, "max_len", file), file)
    gated = model_type not in UNGATED_MLP
    mats = 3 if gated else 2
    tied = cfg.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)

    attention, kvh, head_dim, kv_lora, rope, attn, q_lora, v_dim = _attention_params(cfg, file, h, heads, kvh)
    inter = _get(cfg, "intermediate", file, required=model_type not in MLP_4X_BY_DEFAULT, default=4 * h)
    experts, per_token, mlp_total, mlp_active = _mlp_params(cfg, file, L, h, inter, mats)
    embed = vocab * h * (1 if tied else 2)
    total = embed + L * attn + mlp_total
    active = embed + L * attn + mlp_active

    window, window_layers = sliding_window_layers(cfg, model_type, L, file)
    if window_layers and window >= max_len:
        window, window_layers = 0, 0  # a window as long as the context changes nothing
    if name is None:  # the repo name it was saved from, else its folder (.../Llama-3-8B/config.json) or file name
        f = Path(file)
        name = str(cfg.get("_name_or_path") or "") or (f.parent.name if f.name == "config.json" else f.stem) or f.stem
    return {
        "name": name,
        "num_layers": L,
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_kv_heads": kvh,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "num_params": float(total),
        "max_model_len_tokens": max_len,
        "gated_mlp": gated,
        "source": f"{file} (Hugging Face config.json, model_type {model_type or 'unknown'})",
        "attention": attention,
        "kv_lora_rank": kv_lora,
        "qk_rope_head_dim": rope,
        "q_lora_rank": q_lora,
        "v_head_dim": v_dim,
        "sliding_window_tokens": window,
        "sliding_window_layers": window_layers,
        "num_experts": experts,
        "experts_per_token": per_token,
        "active_params": float(active) if experts else 0.0,
    }


def load_model_file(name: str, base_dir: Path | None) -> dict:
    """``name`` (a path to a config.json, relative to ``base_dir``) -> ModelConfig fields."""
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return model_fields(read_config(path), str(path))


def expand_model_file(raw: dict, base_dir: Path | None) -> dict:
    """Replace ``model: x.json`` / ``model: {preset: x.json, ...}`` in a scenario mapping by the
    fields read from the file (overrides kept), so that the mapping validates anywhere (sweep
    workers included) without knowing where the scenario file was. Returns a new mapping."""
    model = raw.get("model")
    if isinstance(model, str) and is_config_path(model, base_dir):
        return {**raw, "model": load_model_file(model, base_dir)}
    if isinstance(model, dict) and isinstance(model.get("preset"), str) and is_config_path(model["preset"], base_dir):
        over = {k: v for k, v in model.items() if k != "preset"}
        return {**raw, "model": {**load_model_file(model["preset"], base_dir), **over}}
    return raw
