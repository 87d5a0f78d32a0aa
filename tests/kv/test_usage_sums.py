"""``usage_parts`` (the decode-window sums, a :class:`UsageSums`) agrees with ``usage`` (the step
snapshot) for every built-in window-capable allocator: the window means are built from the one, the
step engine's rows from the other, so a disagreement would make fast and step mode differ."""

import numpy as np
import pytest

from kvsim.kv.base import KVRequest, UsageSums
from kvsim.kv.buddy import BuddyAllocator
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.paged import CountingPagedAllocator, PagedAllocator
from kvsim.kv.protocol import WindowAllocator
from kvsim.kv.radix import RadixAllocator

ALLOCATORS = {
    "paged": lambda: PagedAllocator(64, 4),
    "paged-prefix": lambda: PagedAllocator(64, 4, prefix_caching=True),
    "counting-paged": lambda: CountingPagedAllocator(64, 4),
    "contiguous": lambda: ContiguousAllocator(512, "max"),
    "buddy": lambda: BuddyAllocator(256, 8, "pow2"),
    "radix": lambda: RadixAllocator(64, 4),
}


def check(alloc, head):
    p = alloc.usage_parts(head)
    u = alloc.usage(head)
    assert isinstance(p, UsageSums)
    assert p.held_tokens - p.useful_tokens == u.internal_frag_tokens
    assert p.held_tokens - p.shared_tokens == u.used_tokens
    assert p.external_tokens == u.external_frag_tokens
    assert p.cached_free_tokens == u.cached_free_tokens
    assert u.capacity_tokens - (p.held_tokens - p.shared_tokens) - p.external_tokens == u.free_tokens
    return p


@pytest.mark.parametrize("kind", sorted(ALLOCATORS))
def test_usage_parts_agree_with_usage(kind):
    alloc = ALLOCATORS[kind]()
    assert isinstance(alloc, WindowAllocator)
    rng = np.random.default_rng(7)
    keys = np.arange(1, 9, dtype=np.int64)  # two requests with the same 8-block prompt prefix
    live: dict[int, tuple[KVRequest, int]] = {}
    seen = set()
    for rid in range(12):
        prompt, output = int(rng.integers(5, 40)), int(rng.integers(1, 20))
        req = KVRequest(rid, prompt, output, 128, block_keys=keys[:prompt // 4] if rid % 3 == 0 else None)
        if alloc.max_footprint_fits(req) and alloc.allocate(req, prompt) is not None:
            alloc.ensure_slots(rid, prompt)
            live[rid] = (req, prompt)
        seen.add(check(alloc, req))
        for r, (q, n) in list(live.items()):  # one decode step each, or a finish
            if n < q.prompt_tokens + q.output_tokens - 1 and alloc.ensure_slots(r, n + 1):
                live[r] = (q, n + 1)
            elif rng.random() < 0.5:
                alloc.free(r)
                del live[r]
        seen.add(check(alloc, None))
        alloc.check_invariants()
    assert len(seen) > 3  # the sums did move
    assert any(p.held_tokens for p in seen)


def test_usage_sums_is_a_frozen_record():
    s = UsageSums(held_tokens=10, useful_tokens=8, shared_tokens=0, cached_free_tokens=2, external_tokens=1)
    with pytest.raises(AttributeError):
        s.held_tokens = 3  # type: ignore[misc]
    assert s == UsageSums(10, 8, 0, 2, 1) and hash(s) == hash(UsageSums(10, 8, 0, 2, 1))
