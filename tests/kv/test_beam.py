"""Beam search on the allocators: beams share blocks by reference count, forks copy only the
partial block on paged allocators (full extents on contiguous ones), prunes free blocks, and the
divergence model is deterministic (kvsim.kv.beam, docs/beam_search.md)."""

import pytest

from kvsim.kv.base import KVRequest, SampleGeometry
from kvsim.kv.beam import BeamEvents, BeamModel, BeamTables
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.paged import CountingPagedAllocator, PagedAllocator

BS = 4


def beam_req(rid=0, prompt=10, output=30, width=4, events=None, fork_prob=0.3, seed=1):
    if events is None:
        events = BeamModel(fork_prob, seed).events(rid, prompt, output, width)
    return KVRequest(rid, prompt, output, 4096, num_samples=width, beam_events=events)


def decode_all(alloc, req, check=True):
    """Admit ``req`` with its prompt, then grow it one token a step to its final length."""
    assert alloc.allocate(req, req.prompt_tokens) is not None
    assert alloc.ensure_slots(req.request_id, req.prompt_tokens)
    held = []
    for n in range(req.prompt_tokens + 1, req.final_kv_tokens + 1):
        assert alloc.ensure_slots(req.request_id, n)
        if check:
            alloc.check_invariants()
        held.append(alloc.held_tokens(req.request_id))
    return held


def test_events_are_seeded_and_valid():
    m = BeamModel(0.2, seed=7)
    a, b = m.events(3, 100, 500, 4), m.events(3, 100, 500, 4)
    assert a == b
    assert a != BeamModel(0.2, seed=8).events(3, 100, 500, 4)
    assert a != m.events(4, 100, 500, 4)
    assert len(a) > 0
    assert all(102 <= p <= 599 for p in a.positions)
    assert list(a.positions) == sorted(a.positions)
    assert all(0 <= x < 4 and 0 <= y < 4 and x != y for x, y in zip(a.pruned, a.source))
    assert len(BeamModel(0.0, 7).events(3, 100, 500, 4)) == 0


@pytest.mark.parametrize("cls", [PagedAllocator, CountingPagedAllocator])
def test_invariants_every_step_and_free(cls):
    alloc = cls(200, BS)
    reqs = [beam_req(rid, prompt=9 + rid, output=40, seed=rid) for rid in range(3)]
    for r in reqs:
        decode_all(alloc, r)
    for r in reqs:
        alloc.free(r.request_id)
        alloc.check_invariants()
    assert alloc.num_free_blocks == 200
    assert alloc.beam_forks > 0


def test_fork_shares_full_blocks_and_copies_partial_block():
    # One fork at position 20: beam 3 is pruned and becomes a copy of beam 1 at 19 tokens.
    ev = BeamEvents(4, (20,), (3,), (1,))
    alloc = PagedAllocator(100, BS)
    req = beam_req(prompt=10, output=30, events=ev)
    alloc.allocate(req, 10)
    alloc.ensure_slots(0, 19)
    bt = alloc.seqs.beams[0]
    before = [list(t) for t in bt.tables]
    alloc.ensure_slots(0, 20)
    alloc.check_invariants()
    src, new = bt.tables[1], bt.tables[3]
    # 19 tokens = 4 full blocks + 3 tokens: the 4 full blocks are shared, the partial one copied
    assert new[:4] == before[1][:4]
    assert new[4] != before[1][4] and src[4] == before[1][4]
    for b in new[:2]:  # prompt blocks: all 4 beams
        assert alloc.ref_counts[b] == 4
    for b in new[2:4]:  # beam 1's own full blocks: now beams 1 and 3
        assert alloc.ref_counts[b] == 2
    assert alloc.ref_counts[new[4]] == 1
    # the pruned beam's own blocks went back to the pool
    for b in before[3][2:]:
        assert b in alloc.pool and alloc.ref_counts[b] == 0
    assert alloc.beam_forks == 1 and alloc.beam_copied_tokens == 3


def test_beams_hold_fewer_blocks_than_parallel_samples():
    # Frequent forks: beams re-converge on shared prefixes, so they hold fewer blocks than 4
    # independent samples (which never share generated tokens), and never more.
    ev_req = beam_req(prompt=10, output=200, fork_prob=0.2, seed=3)
    beams = decode_all(PagedAllocator(1000, BS), ev_req, check=False)
    geo = SampleGeometry(4, BS, 10)
    samples = [geo.blocks(n) * BS for n in range(11, ev_req.final_kv_tokens + 1)]
    assert all(b <= s for b, s in zip(beams, samples))
    assert beams[-1] < samples[-1]


def test_counting_and_named_paged_agree():
    for seed in range(5):
        req = beam_req(prompt=7, output=60, seed=seed)
        a, c = PagedAllocator(300, BS), CountingPagedAllocator(300, BS)
        assert decode_all(a, req) == decode_all(c, req)
        assert a.usage() == c.usage()
        assert (a.beam_forks, a.beam_copied_tokens) == (c.beam_forks, c.beam_copied_tokens)


@pytest.mark.parametrize("cls", [PagedAllocator, CountingPagedAllocator])
def test_ensure_fails_without_changing_anything(cls):
    alloc = cls(10, BS)
    req = beam_req(prompt=10, output=30, fork_prob=0.0)  # no forks: 4 diverged beams
    alloc.allocate(req, 10)
    # 2 shared full prompt blocks + 4 partial blocks (beam 0's original and 3 copies), then 4 more
    # blocks at position 13: exactly the 10 blocks.
    assert alloc.ensure_slots(0, 16)
    assert alloc.held_tokens(0) == 10 * BS
    usage = alloc.usage()
    assert alloc.ensure_slots(0, 17) is False
    assert alloc.held_tokens(0) == 10 * BS and alloc.usage() == usage
    alloc.check_invariants()
    alloc.free(0)
    alloc.check_invariants()


def test_prune_frees_blocks():
    # Beam 2 is pruned at 30 tokens after 20 private tokens: its 5 private blocks go back (one
    # partial copy is taken: 30 = 7 full blocks + 2).
    ev = BeamEvents(4, (31,), (2,), (0,))
    alloc = CountingPagedAllocator(100, BS)
    req = beam_req(prompt=10, output=40, events=ev)
    alloc.allocate(req, 10)
    alloc.ensure_slots(0, 30)
    free = alloc.num_free_blocks
    alloc.ensure_slots(0, 31)
    alloc.check_invariants()
    # beam 2 held blocks 3..8 privately (6 blocks incl. its copied prompt partial), now shares
    # beam 0's 7 full blocks and copies 1 partial: 6 - 1 = 5 blocks freed
    assert alloc.num_free_blocks == free + 5
    assert alloc.beam_copied_tokens == 2


def test_recomputed_readmission_replays_to_the_same_state():
    req = beam_req(prompt=10, output=80, seed=5)
    a = PagedAllocator(400, BS)
    decode_all(a, req, check=False)
    a.free(0)
    # readmitted holding its whole length (a recompute), then grown in one call
    assert a.allocate(req, req.final_kv_tokens) is not None
    assert a.ensure_slots(0, req.final_kv_tokens)
    a.check_invariants()
    assert a.held_tokens(0) <= SampleGeometry(4, BS, 10).blocks(req.final_kv_tokens) * BS
    # the replayed events re-share the beams' prefixes: fewer blocks than 4 unshared sequences
    assert a.held_tokens(0) < SampleGeometry(4, BS, 10).blocks(req.final_kv_tokens) * BS
    assert a.beam_forks == 2 * len(req.beam_events)  # counted again when replayed
    a.free(0)
    a.check_invariants()
    assert a.num_free_blocks == 400


def test_contiguous_fork_copies_the_whole_beam():
    ev = BeamEvents(4, (20, 35), (3, 0), (1, 2))
    alloc = ContiguousAllocator(100_000)
    req = beam_req(prompt=10, output=40, events=ev)
    held = decode_all(alloc, req)
    assert len(set(held)) == 1  # the extent holds all 4 beams from the start
    assert alloc.beam_forks == 2
    assert alloc.beam_copied_tokens == 19 + 34  # each fork copies the source beam's whole length
    u = alloc.usage()
    assert u.token_states_tokens == 4 * req.final_kv_tokens  # nothing is shared
