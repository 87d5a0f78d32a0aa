"""The conformance cases: requests + an engine configuration both sides understand.

A request's prompt is a tuple of token ids, so prefix sharing is exact on both sides: vLLM hashes
the ids block by block; kvsim gets chained per-token content keys (``prefix_block_tokens = 1``,
:mod:`kvsim.trace.prefix` turns them into keys at any block size). Slices of the shipped Azure and
Mooncake traces become cases by :func:`from_trace` (Mooncake's ``hash_ids`` become token ids: the
512-token block with id ``h`` is ``h``'s tokens; a prompt that ends inside a block keeps only its
first tokens, so prompts with equal ids share prefixes that end inside a block).

``exceptions`` names the deliberate kvsim/vLLM differences a case is expected to show
(:data:`EXCEPTIONS`, docs/conformance.md): the comparison must find a difference there, and none
anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

# Named, documented exceptions: places where kvsim deliberately does not follow vLLM 0.32.
EXCEPTIONS: dict[str, str] = {
    "prompt-blocks-at-admission": (
        "with scheduler.prompt_blocks: at_admission (kvsim's default) kvsim takes the blocks for a "
        "request's whole prompt when it admits it; vLLM 0.32 checks that the whole prompt fits "
        "(scheduler_reserve_full_isl) but takes blocks chunk by chunk (kvsim's per_chunk). The decisions "
        "are the same; kvsim's kv_blocks_used is higher by the blocks of the prompt chunks not yet "
        "scheduled, and the comparison checks exactly that."),
    "priority-waiting-queue": (
        "kvsim's waiting queue is FCFS; a trace's priority only chooses preemption victims "
        "(scheduler.victim: lowest_priority) and eviction order. vLLM's priority policy also orders the "
        "waiting queue by (priority, arrival)."),
    "parallel-samples-as-group": (
        "kvsim runs a request's n parallel samples as one sequence group (vLLM v0): the prompt is "
        "computed once, its blocks shared by reference count without prefix caching, the samples "
        "admitted and preempted together. vLLM v1 fans the request out into n requests that share "
        "prompt blocks only through the prefix cache."),
}


@dataclass(frozen=True)
class Req:
    prompt: tuple[int, ...]  # token ids
    output_tokens: int
    arrival_s: float = 0.0
    priority: int = 0  # vLLM's sense: lower is served first (kvsim's trace column is negated)
    n: int = 1  # parallel samples


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    requests: tuple[Req, ...]
    num_blocks: int  # usable KV blocks (vLLM gets one more: its reserved null block)
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    chunked_prefill: bool = True
    prefix_caching: bool = False
    reserve_full_isl: bool = True
    policy: str = "fcfs"  # or "priority"
    prompt_blocks: str = "per_chunk"  # kvsim's scheduler.prompt_blocks (at_admission: the exception below)
    step_s: float = 0.01  # the fixed step time on both sides
    exceptions: tuple[str, ...] = ()  # named exceptions that change decisions: a difference is expected
    # a closed-loop client of this many slots (kvsim/client.py) on both sides: a request is added when
    # one in flight finishes; None: every request at its arrival
    max_concurrency: int | None = None
    # vLLM's AsyncScheduler in its engine core's order (vllm_side.run_vllm) and kvsim's
    # scheduler.async_scheduling; False: both synchronous (vLLM --no-async-scheduling)
    async_scheduling: bool = False

    @property
    def blocks_ahead(self) -> bool:
        """kvsim holds whole prompts from admission (exception prompt-blocks-at-admission)."""
        return self.prompt_blocks == "at_admission"

    def __post_init__(self):
        unknown = set(self.exceptions) - set(EXCEPTIONS)
        if unknown:
            raise ValueError(f"case {self.name}: unknown exception(s) {sorted(unknown)}")
        if self.max_concurrency is not None and any(q.n > 1 for q in self.requests):
            raise ValueError(f"case {self.name}: a client case has one sample per request (vLLM fans samples out)")

    def client(self):
        """A fresh closed-loop client over the case's arrivals (None without ``max_concurrency``)."""
        if self.max_concurrency is None:
            return None
        from kvsim.client import ClosedLoopClient

        return ClosedLoopClient(np.array([q.arrival_s for q in self.requests], dtype=np.float64), self.max_concurrency)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _unique_prompt(i: int, length: int) -> tuple[int, ...]:
    """Token ids no other request's prompt contains (so nothing is shared by accident)."""
    base = 1_000 + 100_000 * (i + 1)
    return tuple(range(base, base + length))


def random_requests(seed: int, num: int, prompt: tuple[int, int], output: tuple[int, int],
                    rate_per_s: float | None = None, shared_prefix: int = 0, groups: int = 1) -> tuple[Req, ...]:
    """``num`` requests with uniform prompt/output lengths in the given inclusive ranges, all at 0
    or Poisson arrivals at ``rate_per_s``; ``shared_prefix`` leading tokens shared within each of
    ``groups`` prefix groups (any length: the shared part may end inside a block)."""
    g = _rng(seed)
    t = 0.0
    out = []
    for i in range(num):
        p = int(g.integers(prompt[0], prompt[1] + 1))
        o = int(g.integers(output[0], output[1] + 1))
        if rate_per_s:
            t += float(g.exponential(1.0 / rate_per_s))
        ids = _unique_prompt(i, p)
        if shared_prefix:
            grp = int(g.integers(0, groups))
            k = min(shared_prefix, p - 1)
            ids = tuple(range(50 + 10_000 * grp, 50 + 10_000 * grp + k)) + ids[k:]
        out.append(Req(ids, o, round(t, 6)))
    return tuple(out)


def from_trace(path: Path, num: int, max_prompt: int, max_output: int, time_scale: float = 1.0,
               skip: int = 0) -> tuple[Req, ...]:
    """The first ``num`` requests (after ``skip``) of a shipped trace, lengths capped, arrival
    times relative to the first and multiplied by ``time_scale``. Mooncake ``hash_ids`` become
    token ids (block id ``h``, position ``j`` -> ``h * 512 + j``)."""
    from kvsim.trace.load import load_trace

    trace = load_trace(path)
    sl = slice(skip, skip + num)
    arr = trace.arrival_s[sl]
    t0 = float(arr[0]) if len(arr) else 0.0
    out = []
    for k, i in enumerate(range(*sl.indices(len(trace)))):
        p = int(min(trace.prompt_tokens[i], max_prompt))
        o = int(max(1, min(trace.output_tokens[i], max_output)))
        if trace.prefix_keys is not None:
            S = int(trace.prefix_block_tokens)
            ids = [int(h) * S + j for h in trace.prefix_keys[i] for j in range(S)][:p]
            ids += list(_unique_prompt(skip + k, p))[len(ids):]
            prompt = tuple(ids)
        else:
            prompt = _unique_prompt(skip + k, p)
        out.append(Req(prompt, o, round((float(arr[k]) - t0) * time_scale, 6)))
    return tuple(out)


def _traces_dir() -> Path | None:
    here = Path(__file__).resolve().parents[2] / "traces"
    return here if here.is_dir() else None


def builtin_cases() -> list[Case]:
    """The suite (docs/conformance.md lists it with the results)."""
    cases: list[Case] = []
    r = random_requests
    base = r(1, 24, (20, 300), (1, 40))
    cases.append(Case("basic", "24 requests at t=0, ample memory", base, num_blocks=2000))
    cases.append(Case("pressure", "memory pressure: 40 requests, 60 blocks, many preemptions",
                      r(2, 40, (40, 200), (20, 120)), num_blocks=60))
    cases.append(Case("pressure_no_chunk", "memory pressure without chunked prefill",
                      r(2, 40, (40, 200), (20, 120)), num_blocks=60, chunked_prefill=False))
    cases.append(Case("no_chunked_prefill", "chunked prefill off, budget 512",
                      r(3, 30, (20, 500), (1, 30)), num_blocks=400, chunked_prefill=False,
                      max_num_batched_tokens=512, max_model_len=512))
    cases.append(Case("chunked_small_budget", "chunked prefill, token budget 64",
                      r(4, 20, (30, 400), (1, 20)), num_blocks=400, max_num_batched_tokens=64, max_num_seqs=32))
    cases.append(Case("max_num_seqs", "max_num_seqs 4", r(5, 20, (10, 100), (5, 30)), num_blocks=500,
                      max_num_seqs=4))
    cases.append(Case("long_prompts", "prompts of 1000-1900 tokens, chunked by 256",
                      r(6, 10, (1000, 1900), (1, 10)), num_blocks=300, max_num_batched_tokens=256))
    cases.append(Case("prompt_blocks_at_admission", "long prompts, kvsim's scheduler.prompt_blocks: at_admission "
                      "(exception prompt-blocks-at-admission: blocks checked with the allowance)",
                      r(6, 10, (1000, 1900), (1, 10)), num_blocks=300, max_num_batched_tokens=256,
                      prompt_blocks="at_admission"))
    cases.append(Case("arrivals", "Poisson arrivals at 30/s (0.01 s steps), idle gaps",
                      r(7, 40, (10, 200), (1, 40), rate_per_s=30.0), num_blocks=150))
    cases.append(Case("client_closed_loop", "a closed-loop client of 6 (kvsim/client.py): 40 requests at t=0, "
                      "each added when one in flight finishes; memory pressure",
                      r(14, 40, (40, 300), (5, 80)), num_blocks=60, max_concurrency=6))
    cases.append(Case("client_prefix_arrivals", "a client of 4 over Poisson arrivals at 60/s with prefix caching",
                      r(15, 40, (120, 300), (1, 40), rate_per_s=60.0, shared_prefix=100, groups=3),
                      num_blocks=200, prefix_caching=True, max_concurrency=4))
    cases.append(Case("prefix_on", "prefix caching, 3 groups sharing 100-token prefixes (ends inside a block)",
                      r(8, 30, (120, 300), (1, 20), shared_prefix=100, groups=3), num_blocks=400,
                      prefix_caching=True))
    cases.append(Case("prefix_on_pressure", "prefix caching under memory pressure",
                      r(9, 30, (60, 300), (10, 60), shared_prefix=70, groups=2), num_blocks=70,
                      prefix_caching=True))
    cases.append(Case("prefix_off_shared", "the same shared prefixes, prefix caching off",
                      r(8, 30, (120, 300), (1, 20), shared_prefix=100, groups=3), num_blocks=400))
    for bs in (16, 32, 64, 128):
        cases.append(Case(f"block_{bs}", f"block size {bs}, memory pressure",
                          r(10, 30, (20, 400), (5, 80)), num_blocks=max(8, 2400 // bs), block_size=bs))
    cases.append(Case("reserve_full_isl_off", "scheduler_reserve_full_isl false, chunks of 128",
                      r(11, 20, (100, 800), (5, 40)), num_blocks=80, max_num_batched_tokens=128, max_num_seqs=64,
                      reserve_full_isl=False))
    cases.append(Case("reserve_full_isl_on", "scheduler_reserve_full_isl true, chunks of 128",
                      r(11, 20, (100, 800), (5, 40)), num_blocks=80, max_num_batched_tokens=128, max_num_seqs=64))
    cases.append(Case("priority", "priority policy (exception: FCFS waiting queue in kvsim)",
                      tuple(replace(q, priority=i % 3) for i, q in enumerate(r(12, 20, (20, 200), (5, 40)))),
                      num_blocks=50, policy="priority", exceptions=("priority-waiting-queue",)))
    cases.append(Case("parallel_sampling", "n=3 parallel samples (exception: sequence groups in kvsim)",
                      tuple(replace(q, n=3) for q in r(13, 6, (20, 100), (5, 20))), num_blocks=300,
                      exceptions=("parallel-samples-as-group",)))
    traces = _traces_dir()
    if traces is not None:
        azure = traces / "azure_conv_2023.csv.gz"
        if azure.exists():
            cases.append(Case("azure_slice", "Azure conversation trace, first 60 requests, 1/10 time",
                              from_trace(azure, 60, 1500, 200, time_scale=0.1), num_blocks=250))
        mooncake = traces / "mooncake_conversation_0-40min.jsonl.gz"
        if mooncake.exists():
            for pc in (False, True):
                cases.append(Case(f"mooncake_prefix_{'on' if pc else 'off'}",
                                  f"Mooncake conversation trace, 40 requests, hash_ids as token ids, prefix caching {'on' if pc else 'off'}",
                                  from_trace(mooncake, 40, 1800, 100, time_scale=0.02), num_blocks=300,
                                  prefix_caching=pc))
    # every case again under async scheduling (vLLM 0.32's default, vllm-project/vllm#27614 since 0.14.0;
    # kvsim's scheduler.async_scheduling): not the exception cases, nor kvsim's own at_admission blocks
    cases += [replace(c, name=f"{c.name}_async", description=f"{c.description}; async scheduling", async_scheduling=True)
              for c in list(cases) if not c.exceptions and not c.blocks_ahead]
    return cases
