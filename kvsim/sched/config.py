"""Scheduler settings (the ``scheduler:`` section of a scenario)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

import kvsim.sched.victim  # noqa: F401  (registers the built-in victim kinds)
from kvsim.config_base import Bytes, StrictModel, Tokens
from kvsim.registry import VICTIMS, policy_field
from kvsim.sched.victim import DEFAULT_VICTIM

VictimConfig = policy_field(VICTIMS, DEFAULT_VICTIM)

# vLLM V0's rule when the user names no preemption mode (Scheduler._preempt, vllm/core/scheduler.py):
# a group with one running sequence is recomputed, a parallel-sampling or beam group is swapped
AUTO_VLLM_V0 = "auto-vllm-v0"


class SchedulerConfig(StrictModel):
    max_num_seqs: int = Field(256, ge=1, description="most requests running in one step (the vllm-v1 engine "
                                                    "profile fills it by GPU: docs/conformance.md, 'Batch limits')")
    max_num_batched_tokens: Tokens | None = Field(
        None, ge=1,
        description="token budget per step; default max(max_model_len, 2048), or 2048 with chunked prefill "
                    "(engine profiles fill it: vllm-v1 by GPU as `vllm serve` does, 8192 on H100/H200)",
    )
    chunked_prefill: bool = False
    prefill_only_steps: bool = Field(
        False,
        description="without chunked prefill: a step that admits prompts runs only those prompts, the running "
                    "requests decode from the next step on (vLLM v0's default scheduler); false: admitted prompts "
                    "join the running requests' decode step (vLLM v1). No effect with chunked_prefill: true "
                    "(see mixed_chunk)")
    mixed_chunk: bool = Field(
        True,
        description="with chunked_prefill: prompt chunks join the running requests' decode step (vLLM v1; SGLang's "
                    "--enable-mixed-chunk); false: a step with prompt work runs only that (the prompt the last step "
                    "cut continues first, then admissions with the rest of the budget) and the running requests "
                    "decode when no prompt can go on (SGLang's default). No effect without chunked_prefill")
    max_prefill_tokens: Tokens | None = Field(
        None, ge=1,
        description="a waiting request joins a step that already admitted or continued a prompt only if its "
                    "uncached prompt tokens are fewer than this minus the tokens the step holds so far (SGLang's "
                    "max_prefill_tokens, PrefillAdder.add_one_req); null: no such limit")
    prompt_blocks: Literal["at_admission", "per_chunk"] = Field(
        "at_admission",
        description="at_admission: a request takes blocks for its whole prompt when admitted; per_chunk: "
                    "blocks for each prefill chunk as it is scheduled (vLLM v1)")
    reserve_full_isl: bool = Field(
        True, description="per_chunk only: admit a request only if its whole prompt fits now "
                          "(vLLM's scheduler_reserve_full_isl); false: if its first chunk fits")
    num_scheduler_steps: int = Field(
        1, ge=1, le=1024,
        description="vLLM 0.6's multi-step scheduling (--num-scheduler-steps, V0 engine): a decode step opens a "
                    "round of this many decode steps with the same batch, planned once: slots for the round's "
                    "tokens are reserved at its start, nobody is admitted, swapped or preempted during it, and its "
                    "tokens reach the client at its end (requests that complete mid-round run on to it); the "
                    "engine's CPU overhead is paid once per round. A step with prompt work is a round of one. "
                    "Needs prefill_only_steps: true and chunked_prefill: false (docs/scenario.md, "
                    "docs/engine_overhead.md 'Multi-step scheduling')")
    async_scheduling: bool = Field(
        False,
        description="vLLM V1's async scheduling (its AsyncScheduler, on by default in vLLM 0.32; "
                    "--no-async-scheduling turns it off): step k+1 is planned while step k runs, so that plan sees "
                    "the arrivals up to step k's start only, and a request that finishes in step k keeps its KV "
                    "and its max_num_seqs place, unscheduled, until step k+1 ends (docs/scenario.md, "
                    "docs/conformance.md 'Async scheduling'). Token times do not move. Not with "
                    "num_scheduler_steps > 1, prompt-only steps (prefill_only_steps, mixed_chunk: false) or swap "
                    "(preemption_mode: swap or auto-vllm-v0)")
    preemption_mode: Literal["recompute", "swap", "auto-vllm-v0"] = Field(
        "recompute", description="recompute: drop the victim's KV; swap: move it to the host tier; auto-vllm-v0 "
                                 "(vllm-v0.6 and vllm-2023 fill it): vLLM V0's rule, recompute a request with one "
                                 "sequence and swap one with num_samples > 1 (parallel samples, beams); with "
                                 "num_scheduler_steps > 1 it recomputes every request (docs/scenario.md)")
    swap_space_bytes: Bytes = Field(4 << 30, ge=0, description="host (CPU DRAM) capacity for swapped KV")
    victim: VictimConfig = Field(  # type: ignore[valid-type]
        default_factory=lambda: VICTIMS.default_config(DEFAULT_VICTIM),
        description="which running request to preempt; a kind name or {kind: NAME, ...} (kvsim/sched/victim.py)")
    prefetch: bool = Field(
        False, description="load the next request's swapped or offloaded KV while the link is idle")

    @model_validator(mode="after")
    def _multi_step_is_v0(self):
        if self.num_scheduler_steps > 1 and (self.chunked_prefill or not self.prefill_only_steps):
            raise ValueError(
                f"num_scheduler_steps: {self.num_scheduler_steps} is vLLM 0.6's multi-step scheduling, which ran "
                f"on its V0 scheduler without chunked prefill: set chunked_prefill: false and prefill_only_steps: "
                f"true (engine_profile: vllm-v0.6 fills both), or num_scheduler_steps: 1")
        if self.num_scheduler_steps > 1 and self.preemption_mode == "swap":
            raise ValueError(f"num_scheduler_steps: {self.num_scheduler_steps} with preemption_mode: swap is not "
                             f"modelled (a round reserves its slots when it opens; swap-ins would need them too): "
                             f"use preemption_mode: recompute (vLLM's V1 and V0 default) or num_scheduler_steps: 1")
        if self.async_scheduling:
            prompt_only = not self.mixed_chunk if self.chunked_prefill else self.prefill_only_steps
            why = ("num_scheduler_steps > 1" if self.num_scheduler_steps > 1 else
                   "prompt-only steps (prefill_only_steps / mixed_chunk: false)" if prompt_only else
                   f"preemption_mode: {self.preemption_mode}" if self.preemption_mode != "recompute" else "")
            if why:
                raise ValueError(f"async_scheduling: true is vLLM V1's async scheduling, modelled with neither V0's "
                                 f"nor SGLang's step rules: not with {why}; set async_scheduling: false")
        return self

    def swaps(self, num_samples: int) -> bool:
        """THE preemption rule: does a preempted request with ``num_samples`` sequences go to the host
        tier (False: it is recomputed)? ``auto-vllm-v0`` swaps groups only, and none under multi-step
        scheduling: kvsim's rounds cannot swap, and vLLM 0.6's multi-step runs only one-sequence groups
        (vllm/engine/output_processor/multi_step.py: "Beam search not supported in multi-step
        decoding"), which its rule recomputes."""
        if self.preemption_mode == "swap":
            return True
        return self.preemption_mode == AUTO_VLLM_V0 and num_samples > 1 and self.num_scheduler_steps == 1

    @property
    def may_swap(self) -> bool:
        """Can any request be swapped (its rule swaps some group or every request)?"""
        return self.swaps(2)

    def token_budget(self, max_model_len_tokens: int) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.chunked_prefill else max(max_model_len_tokens, 2048)
