"""The scenario's plain sections: model, GPU, host link, KV budget, parallelism, engine, replicas,
limits, SLOs, metrics and beam search (each a pydantic model; presets by name for model, GPU and
host link)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field, field_validator, model_validator

from kvsim.config_base import Bytes, ByteRate, Number, StrictModel, Tokens
from kvsim.units import parse_bytes
from kvsim.errors import ConfigError, format_choices
from kvsim.hw import GPUS, KV_DTYPES, NOT_PRESETS, WEIGHT_DTYPE_BYTES, GPUSpec, ModelSpec, experts_problem
from kvsim.kv.beam import DEFAULT_FORK_PROB
from kvsim.metrics.summarize import DEFAULT_PERCENTILES
from kvsim.models import hf
from kvsim.models.names import did_you_mean_preset, lookup
from kvsim.registry import ROUTERS, policy_field
from kvsim.sched.router import DEFAULT_ROUTER

KVDTypeName = Literal["fp16", "bf16", "fp8", "int8", "int4"]
WeightDTypeName = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
assert set(get_args(KVDTypeName)) == set(KV_DTYPES) and set(get_args(WeightDTypeName)) == set(WEIGHT_DTYPE_BYTES)


def _preset(kind: str, value: Any, presets: dict) -> Any:
    """Accept a preset name (any case), or a mapping with ``preset: NAME`` plus field overrides; for
    models also a Hugging Face ``config.json`` path (load_scenario resolves it against the scenario
    file's folder first, see :func:`kvsim.models.hf.expand_model_file`; here: the current folder)."""
    name = None
    if isinstance(value, str):
        name, value = value, {}
    elif isinstance(value, dict) and "preset" in value:
        value = dict(value)
        name = value.pop("preset")
        if not isinstance(name, str):
            raise ValueError(f"preset must be a {kind} name")
    if name is None:
        return value
    if kind == "model" and hf.is_config_path(name):
        try:
            return {**hf.load_model_file(name, None), **value}
        except ConfigError as e:
            raise ValueError(str(e)) from None
    return {**presets[preset_key(kind, name, presets)].to_dict(), **value}


def preset_key(kind: str, name: str, presets: dict) -> str:
    """The preset ``name`` means (any case, separators ignored when unambiguous: :func:`lookup`), or a
    ValueError naming the valid presets (and the nearest one) for a ``kind`` (``model``, ``gpu``) preset."""
    key = lookup(name, presets)
    if key is None:
        extra = " or a Hugging Face config.json path" if kind == "model" else ""
        hint = did_you_mean_preset(name, presets, NOT_PRESETS if kind == "model" else None)
        raise ValueError(f"unknown {kind} preset {name!r}{hint}; "
                         f"valid presets: {format_choices(presets)}{extra}")
    return key


class ModelConfig(StrictModel):
    """A model's shape. Write a preset name (``model: Llama-3-8B``) or every field."""

    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    num_params: Number = Field(gt=0)
    max_model_len_tokens: Tokens = Field(gt=0)
    gated_mlp: bool = True
    source: str = ""
    attention: Literal["gqa", "mla"] = Field(
        "gqa", description="gqa: K and V per kv head (MHA/GQA/MQA); mla: one compressed latent per layer")
    kv_lora_rank: int = Field(0, ge=0, description="MLA latent width (DeepSeek-V2/V3: 512)")
    qk_rope_head_dim: int = Field(0, ge=0, description="MLA rope key width stored with the latent (64)")
    sliding_window_tokens: Tokens = Field(0, ge=0, description="window of the sliding-window layers (0: none)")
    sliding_window_layers: int = Field(0, ge=0, description="how many layers use the sliding window")
    num_experts: int = Field(0, ge=0, description="MoE routed experts per MoE layer (0: dense)")
    experts_per_token: int = Field(0, ge=0, description="MoE experts each token is routed to")
    active_params: Number = Field(0.0, ge=0, description="parameters a token goes through (0: num_params)")
    q_lora_rank: int = Field(0, ge=0, description="MLA compressed query width (DeepSeek-V3: 1536; 0: none)")
    v_head_dim: int = Field(0, ge=0, description="MLA value head width (DeepSeek-V3: 128; 0: head_dim - "
                                                 "qk_rope_head_dim)")

    @model_validator(mode="after")
    def _gqa(self):
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.attention == "mla" and not (self.kv_lora_rank and self.qk_rope_head_dim):
            raise ValueError("attention mla needs kv_lora_rank and qk_rope_head_dim (DeepSeek-V3: 512 and 64)")
        if self.attention == "mla" and self.head_dim <= self.qk_rope_head_dim:
            raise ValueError(f"attention mla: head_dim ({self.head_dim}) is qk_nope_head_dim + qk_rope_head_dim, so "
                             f"more than qk_rope_head_dim ({self.qk_rope_head_dim}) (DeepSeek-V3: 192 and 64)")
        if self.sliding_window_layers > self.num_layers:
            raise ValueError(f"sliding_window_layers ({self.sliding_window_layers}) is more than num_layers "
                             f"({self.num_layers})")
        if self.sliding_window_layers and not self.sliding_window_tokens:
            raise ValueError("sliding_window_layers needs sliding_window_tokens")
        why = experts_problem(self.num_experts, self.experts_per_token)
        if why:
            raise ValueError(f"experts_per_token: {why} (num_experts)")
        if self.active_params > self.num_params:
            raise ValueError(f"active_params ({self.active_params:g}) is more than num_params ({self.num_params:g})")
        return self

    def spec(self) -> ModelSpec:
        return ModelSpec(**self.model_dump())


DEFAULT_GPU = "A100-80GB"  # the GPU preset of a scenario without gpu:


class GPUConfig(StrictModel):
    """A GPU. Write a preset name (``gpu: A100-80GB``), ``{preset: NAME, field: override...}`` or
    every field; the scenario's ``gpu`` parsing records which preset in the ``preset`` field."""

    name: str
    memory_bytes: Bytes = Field(gt=0)
    hbm_bandwidth_bytes_per_s: ByteRate = Field(gt=0)
    bf16_flops_per_s: Number = Field(gt=0)
    source: str = ""
    preset: str = Field("", description="the preset this GPU is or was derived from ('' = a GPU of your own): "
                                        "which real GPU's measured data apply, whatever its name")
    interconnect: str = ""
    interconnect_bandwidth_bytes_per_s: ByteRate = Field(
        0.0, ge=0, description="GPU-GPU link, bytes/s per GPU in one direction (0: none; needed by parallel)")
    allreduce_efficiency: float = Field(1.0, gt=0, le=1, description="achieved all-reduce bus bandwidth / peak")
    allreduce_latency_s: float = Field(0.0, ge=0, description="fixed cost of one all-reduce")
    allreduce_latency_per_step_s: float = Field(
        0.0, ge=0, description="NCCL ring latency per ring step, added 2 (T-1) times (PCIe presets: NCCL's model)")
    allreduce_ll: bool = Field(False, description="small all-reduces may take NCCL's LL protocol (PCIe presets)")
    num_sms: int | None = Field(None, gt=0, description="streaming multiprocessors (attention-kernel parallelism); "
                                                          "unknown: the kernel model assumes enough parallelism")
    host_link: str = Field("", description="GPU<->host link preset used without host_link: ('' = none known)")
    compute_capability: float | None = Field(
        None, gt=0, description="CUDA compute capability, e.g. 9.0 (Hopper): which kernel vLLM's default "
                                "runs for fp8 KV (docs/kernel_model.md, 'Selecting a backend'); unknown: None")

    @field_validator("host_link")
    @classmethod
    def _known_link(cls, v):
        from kvsim.timing.transfer import link_presets

        if v and v not in link_presets():
            raise ValueError(f"unknown host link {v!r}; valid links: {', '.join(sorted(link_presets()))}")
        return v

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v):
        return preset_key("gpu", v, GPUS) if v else v  # unknown: a one-line ValueError naming the presets

    def spec(self) -> GPUSpec:
        return GPUSpec(**self.model_dump())


class HostLinkConfig(StrictModel):
    """The GPU<->host link that swaps, tier loads, offload and prefetch use (kvsim.timing.transfer).
    Write a preset name (``host_link: pcie-gen5-x16``) or ``{preset: NAME, field: value...}``, or
    every field. Absent: the GPU preset's link (``gpu.host_link``), else the legacy
    size-independent ``timing.host_link_bandwidth_bytes_per_s``."""

    name: str
    h2d_bandwidth_bytes_per_s: ByteRate = Field(gt=0, description="sustained host-to-device copy rate")
    d2h_bandwidth_bytes_per_s: ByteRate = Field(gt=0, description="sustained device-to-host copy rate")
    per_transfer_latency_s: float = Field(ge=0, description="fixed cost of one copy")
    signalling_bandwidth_bytes_per_s: ByteRate = Field(0.0, ge=0, description="nominal rate, for reference")
    source: str = ""
    granularity: Literal["block", "run"] = Field(
        "block", description="one copy per block, or per run of consecutive block ids")
    layout: Literal["per_layer_kv", "per_layer", "contiguous"] = Field(
        "per_layer_kv", description="copies per block: 2 x layers, layers, or 1")

    def link(self):
        from kvsim.timing.transfer import LinkProfile

        return LinkProfile(self.name, self.h2d_bandwidth_bytes_per_s, self.d2h_bandwidth_bytes_per_s,
                           self.per_transfer_latency_s, self.signalling_bandwidth_bytes_per_s, self.source)


RESERVE_MODELS = ("vllm", "vllm-no-cudagraph")


def _reserve(value):
    """``kv_budget.activation_reserve_bytes``: one of RESERVE_MODELS, or a byte count."""
    if isinstance(value, str) and value.strip() in RESERVE_MODELS:
        return value.strip()
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise ValueError(f"{e}; or one of {', '.join(RESERVE_MODELS)}") from None


class KVBudgetConfig(StrictModel):
    """KV memory, per GPU. Derived by default: ``memory x gpu_memory_utilization - weights -
    activation reserve``; or given explicitly with exactly one of ``bytes`` (per GPU) / ``tokens``
    (the replica's token capacity), which must fit in that derived amount unless
    ``allow_beyond_gpu: true`` (an "unbounded cache" what-if)."""

    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    activation_reserve_bytes: Annotated[int | str, BeforeValidator(_reserve)] = Field(1 << 30, description=(
        "memory per GPU kept off the KV cache besides the weights: bytes, or vllm (vLLM V1's memory profile: "
        "non-torch memory, the profile run's activation peak and, from vLLM 0.21, CUDA-graph memory, on the "
        "CUDA-visible total; the vllm-v1 profile's default) or vllm-no-cudagraph (vLLM 0.8-0.20, or "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0); docs/models.md, 'The KV budget: vLLM's memory profile'"))
    bytes: Bytes | None = Field(None, gt=0, description="KV bytes per GPU")
    tokens: Tokens | None = Field(None, gt=0, description="KV capacity in tokens")
    allow_beyond_gpu: bool = Field(
        False, description="accept bytes/tokens beyond what the GPU memory holds (what-if studies)")

    @field_validator("activation_reserve_bytes")
    @classmethod
    def _not_negative(cls, v):
        if isinstance(v, int) and v < 0:
            raise ValueError("Input should be greater than or equal to 0 (bytes), or one of vllm, vllm-no-cudagraph")
        return v

    @model_validator(mode="after")
    def _one(self):
        if self.bytes is not None and self.tokens is not None:
            raise ValueError("give at most one of bytes and tokens")
        return self


class ParallelConfig(StrictModel):
    """GPUs per replica: ``tensor`` share every layer (Megatron-style), ``pipeline`` stages split the
    layers. See docs/models.md#parallelism."""

    tensor: int = Field(1, ge=1, le=1024, description="tensor-parallel GPUs (vLLM tensor_parallel_size)")
    pipeline: int = Field(1, ge=1, le=1024, description="pipeline stages (vLLM pipeline_parallel_size)")
    gpu_p2p: bool = Field(True, description=(
        "false: the GPUs cannot reach each other directly (no NVLink, no PCIe peer access; vLLM logs 'Custom "
        "allreduce is disabled because your platform lacks GPU P2P capability'): all-reduces and stage sends go "
        "through host memory at the host link's copy rate, and engines' own all-reduce is off"))
    host_allreduce_efficiency: float | None = Field(None, gt=0, le=1, description=(
        "with gpu_p2p: false, achieved bus bandwidth / the host link's copy rate (absent: kvsim's fitted value)"))
    host_allreduce_latency_s: float | None = Field(None, ge=0, description=(
        "with gpu_p2p: false, fixed cost of one all-reduce (absent: kvsim's fitted value)"))
    host_allreduce_ll: bool | None = Field(None, description=(
        "with gpu_p2p: false, small all-reduces may take NCCL's LL protocol (absent: true; false: NCCL_PROTO=Simple, "
        "every all-reduce on the ring protocol priced by host_allreduce_efficiency / host_allreduce_latency_s)"))

    @model_validator(mode="after")
    def _host_keys_need_no_p2p(self):
        if self.gpu_p2p and (self.host_allreduce_efficiency is not None or self.host_allreduce_latency_s is not None
                             or self.host_allreduce_ll is not None):
            raise ValueError("host_allreduce_efficiency / host_allreduce_latency_s / host_allreduce_ll apply only "
                             "with gpu_p2p: false")
        return self

    def host_path(self) -> tuple[float, float]:
        """(efficiency, latency_s) of an all-reduce through host memory: these keys, else kvsim's fit."""
        from kvsim.hw import HOST_PATH_ALLREDUCE

        eff = self.host_allreduce_efficiency
        lat = self.host_allreduce_latency_s
        return (HOST_PATH_ALLREDUCE["efficiency"] if eff is None else eff,
                HOST_PATH_ALLREDUCE["latency_s"] if lat is None else lat)

    @property
    def nccl_ll(self) -> bool:
        """Small all-reduces may take NCCL's LL protocol: through host memory unless host_allreduce_ll
        is false (over a GPU preset's link the measured all-reduce times already include it)."""
        return not self.gpu_p2p and self.host_allreduce_ll is not False


class EngineConfig(StrictModel):
    mode: Literal["fast", "step"] = Field(
        "fast", description="fast: advance runs of pure decode steps at once (exact); step: one event per step")
    max_window_steps: int = Field(4096, ge=2, description="most steps one decode window may cover")


class SharedStoreConfig(StrictModel):
    """A prefix store shared by all replicas (the Mooncake idea): blocks evicted by any replica land
    there, and any replica can load them back at ``bandwidth_bytes_per_s``."""

    capacity_bytes: Bytes = Field(gt=0)
    bandwidth_bytes_per_s: ByteRate = Field(25e9, gt=0, description="e.g. an RDMA NIC, ~25 GB/s")


class ReplicasConfig(StrictModel):
    count: int = Field(1, ge=1, le=1024, description="engine replicas, each with the whole KV budget")
    router: policy_field(ROUTERS, DEFAULT_ROUTER) = Field(  # type: ignore[valid-type]
        DEFAULT_ROUTER, description="which replica gets an arriving request; a kind name or {kind: NAME} "
                                    "(kvsim/sched/router.py)")
    shared_prefix_store: SharedStoreConfig | None = None


class LimitsConfig(StrictModel):
    max_sim_time_s: float | None = Field(None, gt=0, description="stop with an error past this simulated time")
    max_wall_time_s: float | None = Field(None, gt=0, description="stop with an error past this wall time")


class FrontendConfig(StrictModel):
    """The API-server processes in front of the engine (kvsim/frontend.py; docs/scenario.md,
    ``frontend:``): each request costs one of ``servers`` FIFO servers
    ``per_request_s + per_prompt_token_s x prompt + per_output_token_s x output`` before the engine
    sees it. No value is a default: the figures measured for vLLM 0.32's server on one host are in
    docs/engine_overhead.md ("The API server, measured")."""

    servers: int = Field(1, ge=1, description="API-server processes (vLLM --api-server-count)")
    per_request_s: float = Field(0.0, ge=0, allow_inf_nan=False, description="CPU seconds per request")
    per_prompt_token_s: float = Field(0.0, ge=0, allow_inf_nan=False,
                                      description="CPU seconds per prompt token (tokenisation)")
    per_output_token_s: float = Field(0.0, ge=0, allow_inf_nan=False,
                                      description="CPU seconds per output token (output processing, streaming)")


class ClientConfig(StrictModel):
    """The benchmark client's concurrency bound (kvsim/client.py; docs/scenario.md, ``client:``):
    ``vllm bench serve --max-concurrency N`` / SGLang ``bench_serving.py --max-concurrency N``. At
    most ``max_concurrency`` requests are in flight; a request waits at the client until one ends,
    and its latencies count from when it is sent."""

    max_concurrency: int = Field(..., ge=1, description="requests in flight at most (the client's semaphore)")


class SLOConfig(StrictModel):
    """Service-level objectives per request, as vLLM's ``--goodput ttft:MS tpot:MS e2el:MS``: a
    finished request is *good* when it meets every objective given (docs/metrics.md, goodput)."""

    ttft_ms: float | None = Field(None, gt=0, allow_inf_nan=False, description="time to first token, ms")
    tpot_ms: float | None = Field(None, gt=0, allow_inf_nan=False,
                                  description="time per output token after the first, ms")
    e2e_ms: float | None = Field(None, gt=0, allow_inf_nan=False, description="end-to-end latency, ms")

    @model_validator(mode="after")
    def _at_least_one(self):
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("give at least one of ttft_ms, tpot_ms, e2e_ms")
        return self

    def as_dict(self) -> dict[str, float]:
        """The objectives given, ``{name: ms}``."""
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms), ("e2e_ms", self.e2e_ms))
                if v is not None}


class MetricsConfig(StrictModel):
    """What ``summary.json`` reports beyond the fixed keys."""

    percentiles: list[float] = Field(
        default_factory=lambda: list(DEFAULT_PERCENTILES),
        description="percentiles of TTFT, TPOT, ITL and E2EL in summary.json's serving section, each in (0, 100)")

    @field_validator("percentiles")
    @classmethod
    def _valid_percentiles(cls, v):
        if not v:
            raise ValueError("give at least one percentile")
        for q in v:
            if not (0 < q < 100) or q != q:
                raise ValueError(f"percentile {q} must be between 0 and 100 (exclusive)")
        return sorted(set(float(q) for q in v))


class BeamSearchConfig(StrictModel):
    """The divergence model of beam-search requests (trace column ``beam``; docs/beam_search.md)."""

    fork_prob: float = Field(DEFAULT_FORK_PROB, ge=0.0, le=1.0,
                             description="per decode position and beam request: probability that one beam "
                                         "is pruned and another forks (no public number; see docs/beam_search.md)")
