"""The seeded fuzz half of the property tests (tests/seeded_fuzz.py): it draws from the whole
operation space, reports a failing case reproducibly, and catches a planted allocator bug."""

import pytest
import seeded_fuzz
from seeded_fuzz import case_rng, int_list, replay_fuzz, run_fuzz

import kvsim.kv.paged as paged_module


def test_draws_are_deterministic_and_span_the_space():
    a = [int_list(case_rng("x", i), 50, 1, 30) for i in range(400)]
    assert a == [int_list(case_rng("x", i), 50, 1, 30) for i in range(400)]
    assert a != [int_list(case_rng("y", i), 50, 1, 30) for i in range(400)]
    lengths = {len(x) for x in a}
    values = {v for x in a for v in x}
    assert lengths == set(range(1, 31)), sorted(lengths)
    assert values == set(range(50)), sorted(values)


def test_a_failing_case_names_its_seed_index_and_ops_and_replays():
    def draw(rng):
        return {"ops": int_list(rng, 10, 1, 5)}

    def body(ops):
        assert 7 not in ops, "seven"

    with pytest.raises(AssertionError) as info:
        run_fuzz("demo", draw, body, examples=1000)
    msg = str(info.value)
    index = int(msg.split("index=")[1].split()[0])
    case = draw(case_rng("demo", index))
    assert 7 in case["ops"] and all(7 not in draw(case_rng("demo", i))["ops"] for i in range(index))
    assert f"random.Random('demo/{index}')" in msg and repr(case) in msg and "seven" in msg
    assert isinstance(info.value.__cause__, AssertionError)
    with pytest.raises(AssertionError, match="seven"):
        replay_fuzz("demo", index, draw, body)
    assert run_fuzz("demo", draw, lambda ops: None, examples=25) == 25


def test_fuzz_catches_a_planted_free_accounting_bug(monkeypatch):
    """CountingPagedAllocator.free returns one block too few once a request holds more than two
    blocks; the lazy-growth fuzz half (compared against the block-id allocator) must fail."""
    from test_lazy_growth import test_counting_paged_lazy_decode_matches_block_ids_seeded_fuzz as fuzz

    monkeypatch.setattr(seeded_fuzz, "FUZZ_EXAMPLES", 150)
    fuzz()  # unmutated: passes
    orig = paged_module.CountingPagedAllocator.free

    def leaky_free(self, request_id):
        held = self.ledger.held.get(request_id)
        orig(self, request_id)
        self.num_free_blocks -= held > 2 * self.block_size

    monkeypatch.setattr(paged_module.CountingPagedAllocator, "free", leaky_free)
    with pytest.raises(AssertionError, match="seeded fuzz case failed: name='lazy-counting-paged'"):
        fuzz()
