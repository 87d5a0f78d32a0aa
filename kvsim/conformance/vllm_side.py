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

With ``async_scheduling`` (vLLM's default since it turned async scheduling on by default; kvsim's
scheduler is the synchronous one) the driver keeps vLLM's ``AsyncScheduler`` in the order of
``EngineCore.step_with_batch_queue`` with its queue of two batches on a GPU (a batch just
launched is never done when the engine checks): it schedules step k + 1 while step k runs and
processes step k's output after that (:func:`run_vllm`).
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


def build_scheduler(case: Case, async_scheduling: bool = False):
    """A vLLM v1 Scheduler configured as ``case`` says (its ``AsyncScheduler`` with ``async_scheduling``)."""
    vllm_version()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # (torch itself stays in kvsim.calibration)
    from vllm.v1.structured_output import StructuredOutputManager

    float32 = STR_DTYPE_TO_TORCH_DTYPE["float32"]
    sc = SchedulerConfig(max_num_seqs=case.max_num_seqs, max_num_batched_tokens=case.max_num_batched_tokens,
                         max_model_len=case.max_model_len, enable_chunked_prefill=case.chunked_prefill,
                         is_encoder_decoder=False, policy=case.policy,
                         scheduler_reserve_full_isl=case.reserve_full_isl, watermark=0.0,
                         async_scheduling=async_scheduling)
    mc = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, max_model_len=case.max_model_len,
                     dtype="float32")
    cc = CacheConfig(block_size=case.block_size, enable_prefix_caching=case.prefix_caching)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc)
    blocks = case.num_blocks + 1  # + the null block
    kcc = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer"], FullAttentionSpec(block_size=case.block_size, num_kv_heads=1, head_size=1, dtype=float32))])
    cc.num_gpu_blocks = blocks
    cls = AsyncScheduler if async_scheduling else Scheduler
    return cls(vllm_config=vc, kv_cache_config=kcc, block_size=case.block_size,
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
                 block_size: int, async_scheduling: bool = False) -> dict:
    """The timeline row of one scheduled step; updates the per-request records (first scheduled
    step, tokens found cached, preemptions)."""
    prefill = decode = hits = 0
    for rid, n in out.num_scheduled_tokens.items():
        r = sched.requests[rid]
        # decode: one token for a request whose prompt and outputs but the last are computed (async:
        # whose prompt was computed before this step; its last outputs may still be placeholders)
        if async_scheduling:
            is_decode = n == 1 and r.num_computed_tokens - n >= r.num_prompt_tokens
        else:
            is_decode = n == 1 and r.num_output_tokens > 0 and r.num_computed_tokens == r.num_tokens
        if is_decode:
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


class _Replay:
    """One case's requests, clock-free state and records on the vLLM side (both driving orders)."""

    def __init__(self, case: Case, async_scheduling: bool):
        from vllm.v1.outputs import ModelRunnerOutput

        self.case, self.async_scheduling = case, async_scheduling
        self.sched = build_scheduler(case, async_scheduling)
        self.output_cls = ModelRunnerOutput
        self.reqs = _requests(case)
        self.tl = Timeline("vllm")
        self.index = {r.request_id: i for i, _, r in self.reqs}
        self.token = {r.request_id: 10_000_000 + k for k, (_, _, r) in enumerate(self.reqs)}  # unique sampled ids
        self.per_req: dict[int, dict] = {}
        self.nxt = 0
        self.carried_preemptions = 0  # preemptions of an empty batch, counted in the next step's row
        self.client = case.client()  # the same closed-loop client as kvsim's side (kvsim/client.py), or None
        self.arrival = [t for _, t, _ in self.reqs] if self.client is None else self.client.engine_arrival_s

    def pending_arrivals(self) -> bool:
        return self.nxt < len(self.reqs)

    def arrive(self, t: float) -> None:
        while self.nxt < len(self.reqs) and self.arrival[self.nxt] <= t:
            self.sched.add_request(self.reqs[self.nxt][2])
            self.nxt += 1

    def schedule(self, step: int, start_s: float):
        """Schedule a step starting at ``start_s``; record it; return (output, its ModelRunnerOutput):
        one sampled token for each request whose prompt is done after this step (recording its first
        token step), nothing for a request still in prefill."""
        sched, per_req, index = self.sched, self.per_req, self.index
        out = sched.schedule()
        if self.async_scheduling and not out.total_num_scheduled_tokens:
            # an empty batch (every running request awaits its last output): nothing runs, no step;
            # a preemption it made counts, in the row of the next step
            for rid in out.preempted_req_ids:
                per_req[index[rid]]["preemptions"] += 1
            self.carried_preemptions += len(out.preempted_req_ids)
            return out, self.output_cls(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
        pool = sched.kv_cache_manager.block_pool
        row = _step_record(sched, out, per_req, index, step, start_s,
                           self.case.num_blocks - pool.get_num_free_blocks(), self.case.block_size, self.async_scheduling)
        row["preemptions"] += self.carried_preemptions
        self.carried_preemptions = 0
        self.tl.steps.append(row)
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = sched.requests[rid]
            samples = not r.is_prefill_chunk if self.async_scheduling else r.num_computed_tokens >= r.num_tokens
            sampled.append([self.token[rid]] if samples else [])
            rec = per_req[index[rid]]
            if samples and rec["first_token_step"] is None:
                rec["first_token_step"] = step
        mro = self.output_cls(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                              sampled_token_ids=sampled)
        return out, mro

    def update(self, out, mro, step: int, now: float) -> None:
        """Process step ``step``'s output at ``now``: finishes, and the client's next sends."""
        eco = self.sched.update_from_output(out, mro)
        finished = 0
        for outputs in eco.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    self.per_req[self.index[o.request_id]]["finish_step"] = step
                    finished += 1
        if self.client is not None and finished:  # their slots send the next requests now: added before the next step
            self.client.ended(finished, now)
            self.arrive(now)


def run_vllm(case: Case, max_steps: int = 200_000, async_scheduling: bool = False) -> Timeline:
    """Replay ``case`` through vLLM's scheduler; per-step and per-request records. Each scheduled
    step takes ``case.step_s``; ``async_scheduling``: vLLM's AsyncScheduler in its engine's order."""
    rp = _Replay(case, async_scheduling)
    (_run_async if async_scheduling else _run_sync)(rp, max_steps)
    rp.tl.requests = rp.per_req
    return rp.tl


def _run_sync(rp: _Replay, max_steps: int) -> None:
    """Schedule, run for a step, take the step's output, schedule the next (vLLM without async
    scheduling); an idle scheduler jumps to the next arrival."""
    sched, now, step = rp.sched, 0.0, 0
    rp.arrive(now)
    while sched.get_num_unfinished_requests() or rp.pending_arrivals():
        if not sched.get_num_unfinished_requests():
            now = float(rp.arrival[rp.nxt])
            rp.arrive(now)
            continue
        if step >= max_steps:
            raise RuntimeError(f"case {rp.case.name}: vLLM ran {max_steps} steps without finishing")
        out, mro = rp.schedule(step, now)
        now = now + rp.case.step_s
        rp.arrive(now)
        rp.update(out, mro, step, now)
        step += 1


def _run_async(rp: _Replay, max_steps: int) -> None:
    """``EngineCore.step_with_batch_queue`` with a queue of two on a GPU: each engine iteration takes
    its arrivals, schedules a batch if the scheduler has requests (an empty batch too) and returns at
    once while the queue has room and the batch ran something, else waits for the oldest batch and
    processes its output. A non-empty batch runs ``step_s`` on the GPU after the one before it; an
    empty one is done at once. An idle engine jumps to the next arrival."""
    from collections import deque

    sched, case = rp.sched, rp.case
    queue: deque = deque()  # (output, model output, step index, done at)
    now = gpu_free = 0.0  # the engine's clock; when the GPU finishes its last batch
    step = calls = 0
    while sched.has_requests() or queue or rp.pending_arrivals():
        rp.arrive(now)
        calls += 1
        if step >= max_steps or calls >= 4 * max_steps:
            raise RuntimeError(f"case {case.name}: vLLM ran {step} steps without finishing")
        if sched.has_requests():
            start = max(now, gpu_free)
            out, mro = rp.schedule(step, start)
            ran = out.total_num_scheduled_tokens > 0
            done = start + case.step_s if ran else now
            gpu_free = done if ran else gpu_free
            queue.appendleft((out, mro, step, done))
            step += ran
            if len(queue) < 2 and (ran or sched.has_requests()):
                continue
        elif not queue:
            now = max(now, float(rp.arrival[rp.nxt]))
            continue
        out, mro, k, done = queue.pop()
        now = max(now, done)
        rp.arrive(now)
        rp.update(out, mro, k, now)
