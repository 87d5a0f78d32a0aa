"""Batch limits an engine derives when it starts, from its GPU and model (an engine profile's
``batch_rule``): ``scheduler.max_num_seqs`` and ``scheduler.max_num_batched_tokens`` where the
scenario leaves them out.

vLLM does not have one default token budget: ``EngineArgs`` picks one per usage context from the
device it finds (``get_batch_defaults``) and then adjusts it to the model's context length
(``_set_default_max_num_seqs_and_batched_tokens_args``). kvsim models ``vllm serve`` (usage
context ``OPENAI_API_SERVER``, what vLLM's serving benchmark talks to), not the offline ``LLM``
class, whose budgets are larger. The rules here are pure: they read a :class:`BatchContext` built
from the validated scenario (kvsim/config/scenario.py) and return the values and the reason.
Sources: docs/conformance.md ("Engine profiles", "Batch limits").
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30

_V1 = ("vLLM 0.32.0 vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, usage context OPENAI_API_SERVER "
       "(`vllm serve`)")
_V1_ADJUST = "then _set_default_max_num_seqs_and_batched_tokens_args"


@dataclass(frozen=True)
class BatchContext:
    """What a batch rule reads: one GPU of the scenario (vLLM reads device 0's name and total
    memory: kvsim's GPU preset stands for the device's name, ``gpu_name`` is what messages print),
    the model's context limit, whether prefills are chunked, and the two limits where the
    scenario (or the profile's fixed fills) gave them (None: left out)."""

    gpu_name: str
    gpu_memory_bytes: int
    max_model_len: int
    chunked_prefill: bool
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_preset: str = ""  # the preset the GPU is or derives from ("" = a GPU of your own: its name)
    max_prefill_tokens: int | None = None  # scheduler.max_prefill_tokens (SGLang's), as given or filled

    @property
    def device_name(self) -> str:
        """The name vLLM's tests read: the preset's (a renamed preset is still that part), else a
        custom GPU's own name."""
        return self.gpu_preset or self.gpu_name


def vllm_v1_server_tier(gpu_name: str, gpu_memory_bytes: int, device_name: str = "") -> tuple[int, int, str]:
    """``(max_num_batched_tokens, max_num_seqs, why)`` vLLM 0.32 starts from on an NVIDIA GPU under
    ``vllm serve``: 16,384 / 1,024 from 160 GiB of device memory (B200-class; a tier newer than the
    70 GiB one), 8,192 / 1,024 from 70 GiB unless the device name contains "a100" (H100, H200; vllm-project/
    vllm#12369 raised H100/H200's server budget from 2,048, #17073 made the test one of memory,
    #17885 put A100 back because its throughput fell), else 2,048 / 256. ``device_name``: the name
    vLLM would read (:attr:`BatchContext.device_name`; default ``gpu_name``), ``gpu_name`` the one
    the reason prints."""
    gib, device = gpu_memory_bytes / GiB, device_name or gpu_name
    who = gpu_name if device == gpu_name else f"{gpu_name} (preset {device})"
    if gpu_memory_bytes >= 160 * GiB:
        return 16384, 1024, f"{who}: {gib:g} GiB >= 160 GiB"
    if gpu_memory_bytes >= 70 * GiB and "a100" not in device.lower():
        return 8192, 1024, f"{who}: {gib:g} GiB >= 70 GiB and not an A100"
    if gpu_memory_bytes >= 70 * GiB:
        return 2048, 256, f"{who}: an A100 (excluded from the 70 GiB tier, vllm-project/vllm#17885)"
    return 2048, 256, f"{who}: {gib:g} GiB < 70 GiB"


def vllm_v1_server_batch(ctx: BatchContext) -> tuple[dict[str, int], str]:
    """vLLM 0.32's defaults for the limits ``ctx`` leaves out, and the reason. After the tier
    (:func:`vllm_v1_server_tier`): without chunked prefill the budget is at least max_model_len; a
    default budget is at most max_num_seqs x max_model_len; a default max_num_seqs is at most the
    budget. ``--performance-mode throughput`` (which doubles both) is not modelled: the default
    mode is ``balanced``."""
    tokens, seqs, why = vllm_v1_server_tier(ctx.gpu_name, ctx.gpu_memory_bytes, ctx.device_name)
    out: dict[str, int] = {}
    if ctx.max_num_batched_tokens is None:
        if not ctx.chunked_prefill:
            tokens = max(ctx.max_model_len, tokens)
        tokens = min((ctx.max_num_seqs or seqs) * ctx.max_model_len, tokens)
        out["max_num_batched_tokens"] = tokens
    else:
        tokens = ctx.max_num_batched_tokens
    if ctx.max_num_seqs is None:
        out["max_num_seqs"] = min(seqs, tokens)
    return out, (f"{_V1} ({why}: {out.get('max_num_batched_tokens', 'given')} tokens, "
                 f"{out.get('max_num_seqs', 'given')} seqs; {_V1_ADJUST}: at least max_model_len without "
                 "chunked prefill, at most max_num_seqs x max_model_len)")


def vllm_v0_batch(ctx: BatchContext) -> tuple[dict[str, int], str]:
    """vLLM 0.5-0.6 (v0 engine): ``SchedulerConfig`` with no budget given takes 512 with chunked
    prefill ("the best balance between ITL and TTFT on A100"; vllm-project/vllm#8378, 0.6.3, kept it
    for single-step scheduling) and ``max(max_model_len, 2048)`` without; whatever the GPU.
    ``max_num_seqs`` is ``EngineArgs``' 256, kvsim's own default, so it is not filled."""
    if ctx.max_num_batched_tokens is not None:
        return {}, ""
    tokens = 512 if ctx.chunked_prefill else max(ctx.max_model_len, 2048)
    return {"max_num_batched_tokens": tokens}, (
        "vLLM 0.5-0.6 vllm/config.py SchedulerConfig: max_num_batched_tokens None -> 512 with chunked prefill, "
        "else max(max_model_len, 2048) (any GPU)")


def sglang_server_batch(ctx: BatchContext) -> tuple[dict[str, int], str]:
    """SGLang v0.5.7's prompt budget per step (its ``chunked_prefill_size``) by the GPU's memory:
    2,048 under 35 GiB, 4,096 under 60 GiB (A100-40GB, L40S), 8,192 under 160 GiB (A100-80GB, H100,
    H200), 16,384 above (B200, MI300X). Without chunked prefill (``--chunked-prefill-size -1``) there
    is no chunk budget: ``PrefillAdder`` takes a batch's first request whole and bounds the rest by
    ``max_prefill_tokens`` (``scheduler.max_prefill_tokens``, 16,384 by default), so the budget is
    max(max_model_len, max_prefill_tokens), which that limit never lets a prefill batch exceed.
    ``max_num_seqs`` (SGLang's ``max_running_requests``, which follows the KV pool's size) is not
    filled: kvsim's 256."""
    if ctx.max_num_batched_tokens is not None:
        return {}, ""
    if not ctx.chunked_prefill:
        tokens = max(ctx.max_model_len, ctx.max_prefill_tokens or 0)
        return {"max_num_batched_tokens": tokens}, (
            f"SGLang v0.5.7 with chunked prefill off (--chunked-prefill-size -1): no chunk budget; "
            f"managers/schedule_policy.py PrefillAdder takes a batch's first request whole and stops adding at "
            f"max_prefill_tokens ({ctx.max_prefill_tokens}): max(max_model_len, max_prefill_tokens) = {tokens}")
    gib = ctx.gpu_memory_bytes / GiB
    tokens = 2048 if gib < 35 else 4096 if gib < 60 else 8192 if gib < 160 else 16384
    return {"max_num_batched_tokens": tokens}, (
        f"SGLang v0.5.7 server_args.py ServerArgs._handle_gpu_memory_settings: chunked_prefill_size by GPU "
        f"memory ({ctx.gpu_name}: {gib:g} GiB -> {tokens}; 2048 under 35 GiB, 4096 under 60, 8192 under 160, "
        "16384 above)")
