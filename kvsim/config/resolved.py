"""The scenario's resolved form (every default filled in; keys added later dropped at their
defaults, so old scenarios keep their form) and the run's config hash over it and the trace."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.config.scenario import Scenario

# analytical timing keys whose default is the arithmetic before they existed (dropped from the resolved form)
_TIMING_KEYS_AT_DEFAULT = (("allreduce", "nccl"), ("moe_align_kernel", "none"), ("moe_layer_s", 0.0))


def resolved_dict(scn: Scenario) -> dict:
    """The scenario with every default filled in (JSON-able), minus the variants table."""
    d = scn.model_dump(mode="json")
    d.pop("variants", None)
    if d.get("host_link") is None:
        d.pop("host_link", None)  # absent = legacy link: old scenarios keep their resolved form and hash
    for key in ("frontend", "client"):
        if d.get(key, 0) is None:
            d.pop(key)  # absent = none: old scenarios keep their resolved form and hash
    gpu = d.get("gpu")
    if isinstance(gpu, dict) and gpu.get("preset") in ("", gpu.get("name")):
        # a preset under its own name, or a GPU of your own: the form before gpu.preset (loading it again
        # gives the same preset: Scenario._gpu_preset); a renamed preset keeps it
        gpu.pop("preset")
    model = d.get("model")
    if isinstance(model, dict):
        for key in ("q_lora_rank", "v_head_dim"):  # MLA shapes (issue 23), at their default 0: the form before them
            if model.get(key) == 0:
                model.pop(key)
    timing = d.get("timing")
    if isinstance(timing, dict) and "overhead" in timing and timing["overhead"] is None:
        timing.pop("overhead")  # absent = no batch-dependent CPU overhead: old resolved forms and hashes stay
    if isinstance(timing, dict):
        # keys added with the serving validation (issue 23 item 8), at their defaults: the form before them
        for key, default in _TIMING_KEYS_AT_DEFAULT:
            if key in timing and timing[key] == default:
                timing.pop(key)
        if timing.get("async_overlap") is True and not (d.get("scheduler") or {}).get("async_scheduling"):
            timing.pop("async_overlap")  # issue 23: it acts only under async scheduling
        ov = timing.get("overhead")
        if isinstance(ov, dict):
            for key in ("per_prefill_seq_s", "per_arrival_s"):  # added with issue 23, at their default 0
                if ov.get(key) == 0.0:
                    ov.pop(key)
    # likewise the defaults added by issue 22 (engine_profile, scheduler.prompt_blocks / reserve_full_isl)
    par = d.get("parallel") or {}
    if par.get("host_allreduce_ll") is None:
        par.pop("host_allreduce_ll", None)  # added with the LL protocol (issue 23), at its default
    if par.get("gpu_p2p") is True and par.get("host_allreduce_efficiency") is None \
            and par.get("host_allreduce_latency_s") is None:
        for key in ("gpu_p2p", "host_allreduce_efficiency", "host_allreduce_latency_s"):
            par.pop(key, None)  # added with issue 23's host-memory path, at their defaults: the form before them
    if d.get("engine_profile") == "kvsim":
        d.pop("engine_profile")
    sched = d.get("scheduler") or {}
    if sched.get("prompt_blocks") == "at_admission" and sched.get("reserve_full_isl") is True:
        del sched["prompt_blocks"], sched["reserve_full_isl"]
    if sched.get("prefill_only_steps") is False:
        del sched["prefill_only_steps"]  # absent = mixed steps, as before the key existed
    if sched.get("num_scheduler_steps") == 1:
        del sched["num_scheduler_steps"]  # likewise (issue 23: vLLM 0.6's multi-step scheduling)
    if sched.get("mixed_chunk") is True:
        del sched["mixed_chunk"]  # likewise (issue 23: SGLang's prefill batches)
    if sched.get("async_scheduling") is False:
        del sched["async_scheduling"]  # likewise (issue 23: vLLM V1's async scheduling)
    if "max_prefill_tokens" in sched and sched["max_prefill_tokens"] is None:
        del sched["max_prefill_tokens"]
    return d


def config_hash(scn: Scenario, trace_report: dict | None = None) -> str:
    payload = {"scenario": resolved_dict(scn), "trace": (trace_report or {}).get("sha256")}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:8]
