"""Drive vLLM's own v1 ``Scheduler`` + ``KVCacheManager`` step by step, without a model.

As vLLM's scheduler tests do (tests/v1/core/utils.py ``create_scheduler``): a ``VllmConfig`` from a
local two-layer Llama ``config.json`` (no weights, no tokenizer), a ``KVCacheConfig`` with one
full-attention group of ``num_blocks + 1`` blocks (vLLM reserves block 0 as its null block), and
after each ``schedule()`` a fake ``ModelRunnerOutput`` with one sampled token for every scheduled
request whose prefill is complete. The clock is kvsim's: a fixed step time, arrivals at or before a
step's start are added before it is scheduled, an idle scheduler jumps to the next arrival.

Parallel samples (n > 1) are fanned out into n requests, as vLLM's engine does before its
scheduler sees them. Sampled token ids are unique per request so generated blocks are never shared
by accident. vLLM is imported here only, when a case runs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from kvsim.conformance.cases import Case
from kvsim.conformance.timeline import Timeline
from kvsim.errors import KvsimError


class VllmMissing(KvsimError):
    """vLLM (the ``conformance`` extra) is not importable."""


def vllm_version() -> str:
    """The installed vLLM's version, or raise :class:`VllmMissing` (one line)."""
    try:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import vllm
    except Exception as e:  # noqa: BLE001 -- any import failure means "not usable"
        raise VllmMissing(f"vLLM is not importable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                          f"install the conformance extra: pip install 'kvsim[conformance]' "
                          f"(docs/conformance.md)") from None
    return str(vllm.__version__)


_MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
          "vocab_size": 32000, "max_position_embeddings": 65536, "torch_dtype": "float32"}


def _model_dir() -> str:
    d = Path(tempfile.gettempdir()) / "kvsim-conformance-model"
    d.mkdir(exist_ok=True)
    cfg = d / "config.json"
    if not cfg.exists():
        tmp = d / f".config.{os.getpid()}.json"
        tmp.write_text(json.dumps(_MODEL))
        tmp.replace(cfg)
    return str(d)


def build_scheduler(case: Case):
    """A vLLM v1 Scheduler configured as ``case`` says."""
    vllm_version()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # (torch itself stays in kvsim.calibration)
    from vllm.v1.structured_output import StructuredOutputManager

    float32 = STR_DTYPE_TO_TORCH_DTYPE["float32"]
    sc = SchedulerConfig(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                         max_model_len=case.max_model_len, enable_chunked_prefill=case.chunked_prefill,
                         is_encoder_decoder=False, policy=case.policy,
                         scheduler_reserve_full_isl=case.reserve_full_isl, watermark=0.0)
    mc = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, max_model_len=case.max_model_len,
                     dtype="float32")
    cc = CacheConfig(block_size=case.block_size, enable_prefix_caching=case.prefix_caching)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc)
    blocks = case.num_blocks + 1  # + the null block
    kcc = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=case.block_size, num_kv_heads=1, head_size=1, dtype=float32))])
    cc.num_gpu_blocks = blocks
    return Scheduler(vllm_config=vc, kv_cache_config=kcc, block_size=case.block_size,
                     structured_output_manager=StructuredOutputManager(vc), log_stats=False)


def _requests(case: Case):
    """vLLM Requests (n > 1 fanned out), each with its kvsim request index."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(case.block_size, sha256)
    out = []
    for i, q in enumerate(case.requests):
        sp = SamplingParams(max_tokens=q.output_tokens, min_tokens=q.output_tokens, ignore_eos=True)
        for s in range(q.n):
            rid = f"{i}" if q.n == 1 else f"{i}_{s}"
            out.append((i, q.arrival_s, Request(request_id=rid, prompt_token_ids=list(q.prompt), sampling_params=sp,
                                                pooling_params=None, arrival_time=q.arrival_s,
                                                priority=q.priority, block_hasher=hasher)))
    return out


def _blocks_ahead(sched, block_size: int) -> int:
    """Blocks kvsim holds that vLLM does not yet: the rest of each running prefill's prompt
    (exception ``prompt-blocks-at-admission``)."""
    ahead = 0
    for r in sched.running:
        if r.num_computed_tokens < r.num_tokens:
            held = len(sched.kv_cache_manager.get_block_ids(r.request_id)[0])
            ahead += max(0, -(-r.num_tokens // block_size) - held)
    return ahead


def _step_record(sched, out, per_req: dict, index: dict, step: int, now: float, blocks_used: int,
                 block_size: int) -> dict:
    """The timeline row of one scheduled step; updates the per-request records (first scheduled
    step, tokens found cached, preemptions)."""
    prefill = decode = hits = 0
    for rid, n in out.num_scheduled_tokens.items():
        r = sched.requests[rid]
        # decode: one token for a request whose prompt and outputs but the last are computed
        if n == 1 and r.num_output_tokens > 0 and r.num_computed_tokens == r.num_tokens:
            decode += 1
        else:
            prefill += 1
    for nr in out.scheduled_new_reqs:
        hits += nr.num_computed_tokens
    for rid in out.scheduled_cached_reqs.resumed_req_ids:
        r = sched.requests[rid]
        hits += r.num_computed_tokens - out.num_scheduled_tokens[rid]
    for rid in out.num_scheduled_tokens:
        i = index[rid]
        rec = per_req.setdefault(i, {"first_scheduled_step": step, "first_token_step": None,
                                     "finish_step": None, "preemptions": 0, "cached_tokens": None})
        if rec["cached_tokens"] is None:
            rec["cached_tokens"] = sched.requests[rid].num_computed_tokens - out.num_scheduled_tokens[rid]
    preempted = [rid for rid in out.preempted_req_ids]
    for rid in preempted:
        per_req[index[rid]]["preemptions"] += 1
    return {
        "start_s": now, "running": len(sched.running), "waiting": len(sched.waiting) + len(sched.kv_holding_waiting),
        "scheduled_tokens": out.total_num_scheduled_tokens, "prefill_reqs": prefill, "decode_reqs": decode,
        "kv_blocks_used": blocks_used, "preemptions": len(preempted),
        "prefix_hit_tokens": hits, "kv_blocks_ahead": _blocks_ahead(sched, block_size),
    }


def _sampled_output(model_runner_output, sched, out, token: dict, per_req: dict, index: dict, step: int):
    """The ModelRunnerOutput of a step: one sampled token for each request whose prompt is done
    (recording its first token step), nothing for a request still in prefill."""
    ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        r = sched.requests[rid]
        done_prefill = r.num_computed_tokens >= r.num_tokens
        sampled.append([token[rid]] if done_prefill else [])
        if done_prefill:
            rec = per_req[index[rid]]
            if rec["first_token_step"] is None:
                rec["first_token_step"] = step
    return model_runner_output(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                               sampled_token_ids=sampled)


def run_vllm(case: Case, max_steps: int = 200_000) -> Timeline:
    """Replay ``case`` through vLLM's scheduler; per-step and per-request records."""
    sched = build_scheduler(case)
    from vllm.v1.outputs import ModelRunnerOutput

    reqs = _requests(case)
    tl = Timeline("vllm")
    index = {r.request_id: i for i, _, r in reqs}
    token = {r.request_id: 10_000_000 + k for k, (_, _, r) in enumerate(reqs)}  # unique sampled ids
    pool = sched.kv_cache_manager.block_pool
    usable = case.num_blocks
    per_req: dict[int, dict] = {}
    nxt = 0
    now = 0.0
    client = case.client()  # the same closed-loop client as kvsim's side (kvsim/client.py), or None
    arrival = [t for _, t, _ in reqs] if client is None else client.engine_arrival_s

    def arrive(t: float) -> None:
        nonlocal nxt
        while nxt < len(reqs) and arrival[nxt] <= t:
            sched.add_request(reqs[nxt][2])
            nxt += 1

    arrive(now)
    step = 0
    while sched.get_num_unfinished_requests() or nxt < len(reqs):
        if not sched.get_num_unfinished_requests():
            now = float(arrival[nxt])
            arrive(now)
            continue
        if step >= max_steps:
            raise RuntimeError(f"case {case.name}: vLLM ran {max_steps} steps without finishing")
        out = sched.schedule()
        tl.steps.append(_step_record(sched, out, per_req, index, step, now, usable - pool.get_num_free_blocks(),
                                     case.block_size))
        now = now + case.step_s
        arrive(now)
        mro = _sampled_output(ModelRunnerOutput, sched, out, token, per_req, index, step)
        eco = sched.update_from_output(out, mro)
        finished = 0
        for outputs in eco.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    per_req[index[o.request_id]]["finish_step"] = step
                    finished += 1
        if client is not None and finished:  # their slots send the next requests now: added before the next step
            client.ended(finished, now)
            arrive(now)
        step += 1
    tl.requests = per_req
    return tl
