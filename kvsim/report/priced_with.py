"""What the runs of a report were priced with: the attention-kernel backend, the MoE kernel and the
engine profile of each (``summary.json``'s ``kv_access.attention_backend``, ``moe_kernel`` and
``engine_profile``), one line each under the headline table. A comparison whose runs differ in
these is also a comparison of kernels or engines, and the lines say so."""

from __future__ import annotations

import html


def _esc(v) -> str:
    return html.escape(str(v), quote=True)


def priced_with_lines(summaries: dict[str, dict]) -> list[str]:
    """The backend line, the MoE-kernel line (MoE runs only) and the profile line (when recorded)."""
    return [line for line in (backends_line(summaries), moe_kernel_line(summaries), profiles_line(summaries))
            if line]


def profiles_line(summaries: dict[str, dict]) -> str:
    """Which engine profile each run took its defaults from (``engine_profile``) and the keys it
    filled (which depend on the run's allocator and timing kinds); empty for results written
    before the key existed."""
    names: dict[str, list[str]] = {}
    fills: dict[str, list[str]] = {}
    for lab, s in summaries.items():
        p = s.get("engine_profile")
        if isinstance(p, dict):
            names.setdefault(str(p.get("name")), []).append(lab)
            filled = ", ".join(f"{k}={v}" for k, v in (p.get("filled") or {}).items()) or "nothing"
            fills.setdefault(filled, []).append(lab)
    if not names:
        return ""
    if len(names) == 1:
        head = f"Engine profile: {_esc(next(iter(names)))} (every run)"
    else:
        head = "Engine profiles differ between runs: " + "; ".join(
            f"{_esc(n)}: {_esc(', '.join(labs))}" for n, labs in names.items())
    if len(fills) == 1:
        return f'<p class="meta">{head}; it filled {_esc(next(iter(fills)))}.</p>'
    parts = "; ".join(f"{_esc(f)} ({_esc(', '.join(labs))})" for f, labs in fills.items())
    return f'<p class="meta">{head}; it filled {parts}.</p>'


def backends_line(summaries: dict[str, dict]) -> str:
    """Which attention-kernel backend each run used (``kv_access.attention_backend``): a layout or
    page-size comparison read by different kernels is also a kernel comparison."""
    by: dict[str, list[str]] = {}
    for lab, s in summaries.items():
        name = (s.get("kv_access") or {}).get("attention_backend") or "none (no kernel model)"
        by.setdefault(str(name), []).append(lab)
    if len(by) == 1:
        return f'<p class="meta">Attention backend: {_esc(next(iter(by)))} (every run).</p>'
    parts = "; ".join(f"{_esc(b)}: {_esc(', '.join(labs))}" for b, labs in by.items())
    return f'<p class="meta">Attention backends differ between runs (a kernel comparison too): {parts}.</p>'


def moe_kernel_line(summaries: dict[str, dict]) -> str | None:
    """How each MoE run priced its routed experts (``moe_kernel``); None when no run is MoE."""
    by: dict[str, list[str]] = {}
    for lab, s in summaries.items():
        name = s.get("moe_kernel")
        if name is not None:
            by.setdefault("none (weight roofline and fixed MoE-layer terms)" if name == "none" else str(name),
                          []).append(lab)
    if not by:
        return None
    if len(by) == 1 and sum(map(len, by.values())) == len(summaries):
        return f'<p class="meta">MoE kernel: {_esc(next(iter(by)))} (every run).</p>'
    parts = "; ".join(f"{_esc(b)}: {_esc(', '.join(labs))}" for b, labs in by.items())
    return f'<p class="meta">MoE kernel: {parts}.</p>'
