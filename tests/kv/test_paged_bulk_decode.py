"""The block-id paged allocator's bulk decode step (``grow_all_by_one``, the decode group's
allocator call) against one ``ensure_slots`` per request in allocation order: the same block ids,
free-block order, prefix-cache keys, registrations and evictions after every operation, with
prefix hits (shared chained keys), evictions and steps that do not fit."""

import random

import numpy as np
import pytest

from kvsim.kv.base import KVRequest
from kvsim.kv.eviction import FIFOEvictionConfig, LRUEvictionConfig, LRUKEvictionConfig
from kvsim.kv.paged import PagedAllocator
from kvsim.kv.protocol import allocator_capabilities

MAX_LEN = 400
EVICTIONS = {"lru": LRUEvictionConfig(), "fifo": FIFOEvictionConfig(), "lru-2": LRUKEvictionConfig(k=2)}


def state(a: PagedAllocator) -> tuple:
    return (dict(a.block_tables), list(a.ref_counts), dict(a.key_to_block), a.free_block_order(), a.evictions,
            a.blocks.cached_free, a.blocks.shared_extra, dict(a._registered), a.num_free_blocks,
            {r: (a.held_tokens(r), a.ledger.written_of(r)) for r in a.block_tables})


def drive(seed: int, block_size: int, num_blocks: int, eviction: str, prefix_caching: bool = True,
          known: bool = False) -> dict:
    """Random admissions (prompts from four families of chained keys), grows, frees and decode
    steps on two allocators; returns what happened (so the test can insist the cases were hit).
    ``known`` (async scheduling): decode steps register blocks up to the tokens known before them
    (``grow_all_by_one_known`` against ``ensure_slots_known(r, w + 1, w)``), and some requests are
    paused (finished, KV held: the ledger's ``pause``), growing no more until freed."""
    rng = random.Random(seed)
    lazy, ref = (PagedAllocator(num_blocks, block_size, 0.0, prefix_caching, EVICTIONS[eviction]) for _ in range(2))
    written: dict[int, int] = {}  # allocation order (dict order) = the order ensure_slots runs in
    reqs: dict[int, KVRequest] = {}
    seen = {"bulk": 0, "refused": 0, "hits": 0}
    paused: set[int] = set()
    verbs = ["alloc", "alloc", "free", "grow", "decode", "decode", "decode", "decode"] + (["pause"] if known else [])
    for rid in range(120):
        verb = rng.choice(verbs)
        if verb == "alloc":
            prompt = rng.randint(1, 6 * block_size)
            family = rng.randrange(4)
            keys = np.array([100 * family + k for k in range(prompt // block_size)], dtype=np.int64)
            r = KVRequest(rid, prompt, rng.randint(1, 8 * block_size), MAX_LEN, block_keys=keys)
            got = lazy.allocate(r, prompt)
            assert (got is None) == (ref.allocate(r, prompt) is None)
            if got is not None:
                seen["hits"] += got.cached_tokens > 0
                assert lazy.ensure_slots(rid, prompt) and ref.ensure_slots(rid, prompt)
                written[rid], reqs[rid] = prompt, r
        elif verb == "free" and written:
            victim = rng.choice(list(written))
            lazy.free(victim)
            ref.free(victim)
            del written[victim]
            paused.discard(victim)
        elif verb == "pause" and len(written) > len(paused):
            r = rng.choice([r for r in written if r not in paused])
            lazy.ledger.pause(r)
            paused.add(r)
        elif verb == "grow" and written and len(written) > len(paused):
            r = rng.choice([r for r in written if r not in paused])
            target = min(written[r] + rng.randint(0, 2 * block_size), reqs[r].final_kv_tokens)
            ok = lazy.ensure_slots(r, target)
            assert ok == ref.ensure_slots(r, target)
            if ok:
                written[r] = target
        elif verb == "decode" and written and all(w < reqs[r].final_kv_tokens for r, w in written.items()):
            growing = [r for r in written if r not in paused]
            need = sum(1 for r in growing if written[r] == ref.held_tokens(r))
            fits = need <= ref.num_free_blocks
            assert (lazy.grow_all_by_one_known() if known else lazy.grow_all_by_one()) == fits
            if fits:
                seen["bulk"] += 1
                for r in growing:
                    written[r] += 1
                    assert (ref.ensure_slots_known(r, written[r], written[r] - 1) if known
                            else ref.ensure_slots(r, written[r]))
            else:
                seen["refused"] += 1
        lazy.check_invariants()
        ref.check_invariants()
        assert state(lazy) == state(ref)
    return seen


@pytest.mark.parametrize("eviction", list(EVICTIONS))
@pytest.mark.parametrize("block_size", [1, 2, 4, 16])
def test_bulk_decode_step_equals_ensure_slots_in_allocation_order(block_size, eviction):
    totals = {"bulk": 0, "refused": 0, "hits": 0}
    for seed in range(40):
        for k, v in drive(seed, block_size, num_blocks=random.Random(seed).randint(4, 40), eviction=eviction).items():
            totals[k] += v
    assert totals["bulk"] > 100 and totals["refused"] > 5 and totals["hits"] > 20, totals


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_known_token_bulk_step_equals_ensure_slots_known_with_paused_requests(block_size):
    """KnownTokenBulkGrowth (async scheduling): a block filled in a step is registered at the next,
    when its request takes its next block; paused requests neither grow nor take blocks."""
    totals = {"bulk": 0, "refused": 0, "hits": 0}
    for seed in range(40):
        for k, v in drive(seed, block_size, num_blocks=random.Random(seed).randint(4, 40), eviction="lru",
                          known=True).items():
            totals[k] += v
    assert totals["bulk"] > 100 and totals["refused"] > 5 and totals["hits"] > 20, totals


def test_bulk_decode_step_without_prefix_caching_names_the_same_blocks():
    for seed in range(20):
        drive(seed, 4, 24, "lru", prefix_caching=False)


def test_the_block_id_allocator_offers_the_decode_group():
    caps = allocator_capabilities(PagedAllocator(10, 4, prefix_caching=True))
    assert caps.decode_group and not caps.decode_steps and caps.block_runs
