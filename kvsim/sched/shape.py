"""What one ``schedule()`` call builds up (:class:`StepDraft`) and the batch shape made of it.

The scheduler's phases add scheduled requests, preemptions, admissions and host copies (bytes and
copies; tier loads as the transfer model priced them) to a draft; :func:`batch_shape` turns it into
the :class:`~kvsim.timing.base.BatchShape` the timing model prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvsim.sched.request import Request
from kvsim.timing.base import BatchShape


@dataclass(slots=True)
class StepDraft:
    """What the phases of one ``schedule()`` call build up (private to it)."""

    budget: int
    scheduled: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (new positions, tokens)
    preempted: list[int] = field(default_factory=list)
    admitted: list[int] = field(default_factory=list)
    swap_in_bytes: int = 0  # swap-in bytes this step pays (priced by the timing model): prefetch's part is off
    swap_out_bytes: int = 0
    swapped_in: int = 0  # requests swapped in (their bytes may be 0: all found in the prefix cache)
    swapped_in_bytes: int = 0  # the bytes those swap-ins moved back, hidden by prefetch or not (the step row's)
    swap_in_copies: int = 0
    swap_out_copies: int = 0
    tier_load_s: float = 0.0  # unhidden tier loads, as kvsim.timing.transfer priced them
    group_kv_tokens: int = 0  # the decode group's members (phase 0): KV tokens and pages they read
    group_kv_pages: int = 0
    # a multi-step round's requests past their last token (kvsim.sched.rounds): requests, sequences
    # (samples), KV tokens and pages they read, and (for timing that needs them) their context lengths
    overrun_requests: int = 0
    overrun_seqs: int = 0
    overrun_kv_tokens: int = 0
    overrun_kv_pages: int = 0
    overrun_ctx: list[int] = field(default_factory=list)


def batch_shape(step: StepDraft, requests: Mapping[int, Request], block_size: int | None,
                want_context_lens: bool, group_decodes: int, round_continuation: bool = False,
                num_arrivals: int = 0) -> BatchShape:
    """THE batch shape of a step: the decode group's members (aggregates from phase 0) and a
    multi-step round's overrun sequences (aggregates, decodes whose tokens are dropped), then
    each request scheduled one by one. A sequence reads ``c + n`` KV tokens in
    ``ceil((c + n) / block_size)`` pages (one run without pages); each of a request's parallel
    samples is a sequence once they diverged (past the prompt). ``round_continuation``: the step
    is a multi-step round's second or later (kvsim.sched.rounds); ``num_arrivals``: requests the
    scheduler received since its last plan."""
    bs = block_size
    want_ctx = want_context_lens
    n_pre_seqs = pre_tok = 0
    n_dec_seqs = dec_tok = group_decodes + step.overrun_seqs
    kv_read = pairs = step.group_kv_tokens + step.overrun_kv_tokens
    pages = step.group_kv_pages + step.overrun_kv_pages
    ctx: list[int] = list(step.overrun_ctx) if want_ctx else []
    for rid, (n, cost) in step.scheduled.items():
        req = requests[rid]
        c = req.num_computed_tokens
        s = req.num_samples  # each sample is a sequence reading its own context
        if n == 1 and req.num_generated > 0 and c == req.num_tokens - 1:
            n_dec_seqs += s
            dec_tok += s
            kv_read += s * (c + 1)
            pairs += s * (c + 1)
            pages += s if bs is None else s * -(-(c + 1) // bs)
            if want_ctx:
                ctx.extend([c + 1] * s)
            continue
        n_pre_seqs += 1
        pre_tok += cost
        kv_read += c + n if s == 1 else cost + c
        pairs += n * c + n * (n + 1) // 2
        seqs = 1 if s == 1 or c + n <= req.prompt_tokens else s
        pages += seqs if bs is None else seqs * -(-(c + n) // bs)
        if want_ctx:
            ctx.append(c + n)
    return BatchShape(
        num_seqs=group_decodes + step.overrun_requests + len(step.scheduled), num_prefill_seqs=n_pre_seqs, num_decode_seqs=n_dec_seqs,
        num_prefill_tokens=pre_tok, num_decode_tokens=dec_tok, kv_tokens_read=kv_read,
        attention_pairs=pairs, kv_pages_read=pages, swap_in_bytes=step.swap_in_bytes,
        swap_out_bytes=step.swap_out_bytes, swap_in_copies=step.swap_in_copies,
        swap_out_copies=step.swap_out_copies, tier_load_s=step.tier_load_s, round_continuation=round_continuation,
        num_arrivals=num_arrivals, context_lens=tuple(ctx),
    )
