"""block_keys: prefix keys at any block size from 512-token (or other) source keys."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.trace.prefix import block_keys, shared_prefix_blocks
from kvsim.trace.schema import Trace


def make_trace(prompts, ids, source_block=512) -> Trace:
    n = len(prompts)
    return Trace(
        arrival_s=np.arange(n, dtype=np.float64),
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        output_tokens=np.ones(n, dtype=np.int64),
        prefix_keys=[np.asarray(k, dtype=np.int64) for k in ids],
        prefix_block_tokens=source_block,
    )


# Two requests of 2048 tokens sharing their first two 512-token blocks (ids 10, 11).
TWO = make_trace([2048, 2048], [[10, 11, 12, 13], [10, 11, 98, 99]])


@pytest.mark.parametrize(
    "block, shared",
    [
        (16, 64),  # 2 * 512 / 16
        (64, 16),
        (512, 2),
        (1024, 1),  # covers ids 10, 11: both shared and fully covered
        (48, 21),  # 21 * 48 = 1008 <= 1024; block 22 reaches into the differing third block
        (100, 10),  # 10 * 100 = 1000; block 11 ends at 1100 > 1024
        (2048, 0),  # the only block covers the differing ids
        (1, 1024),
    ],
)
def test_shared_blocks_at_any_size(block, shared):
    a, b = block_keys(TWO, block)
    assert len(a) == len(b) == 2048 // block
    assert shared_prefix_blocks(a, b) == shared
    # Nothing after the first difference is shared either (keys are chained).
    assert not np.any(np.isin(a[shared:], b))


@pytest.mark.parametrize("block", [16, 48, 64, 100, 512, 1024, 3000])
def test_counts_are_full_blocks_only(block):
    t = make_trace([1, 511, 512, 513, 5000], [[1], [2], [3], [4, 5], list(range(6, 16))])
    keys = block_keys(t, block)
    assert [len(k) for k in keys] == [p // block for p in t.prompt_tokens]
    assert all(k.dtype == np.int64 for k in keys)


def test_identical_requests_share_everything():
    t = make_trace([1500, 1500], [[1, 2, 3], [1, 2, 3]])
    for block in (16, 48, 512, 1024):
        a, b = block_keys(t, block)
        assert np.array_equal(a, b)


def test_partial_last_source_block_needs_equal_length():
    """Equal last ids prove equality only up to each request's length: a 16-block inside a
    partial source block is shared only by requests of the same prompt length."""
    t = make_trace([600, 700, 600, 1024], [[1, 2], [1, 2], [1, 2], [1, 2]])
    k600, k700, k600b, k1024 = block_keys(t, 16)
    assert shared_prefix_blocks(k600, k700) == 32  # only the full first source block
    assert shared_prefix_blocks(k600, k600b) == len(k600) == 37
    assert shared_prefix_blocks(k600, k1024) == 32  # id 2 is partial in one, full in the other
    # A block fully inside the full source block 0 is shared by all.
    assert len({int(k[31]) for k in (k600, k700, k600b, k1024)}) == 1


def test_block_spanning_a_partial_source_block():
    # 1024-token block of a 1100-token prompt covers source blocks 0 and 1 (both full): shared
    # with a 1024-token prompt that has the same ids.
    t = make_trace([1100, 1024], [[1, 2, 3], [1, 2]])
    a, b = block_keys(t, 1024)
    assert a[0] == b[0]
    # 1200-token blocks: [0, 1200) touches source block 2, which is partial in 1300- and
    # 1400-token prompts: shared only between equal lengths.
    t = make_trace([1300, 1300, 1400], [[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    a, b, c = block_keys(t, 1200)
    assert a[0] == b[0] and a[0] != c[0]
    # ... whereas when source block 2 is full in both, lengths may differ.
    t = make_trace([1600, 1700], [[1, 2, 3, 4], [1, 2, 3, 4]])
    a, b = block_keys(t, 1536)
    assert a[0] == b[0]


def test_keys_are_distinct_per_position_and_deterministic():
    t = make_trace([4096], [list(range(8))])
    (k,) = block_keys(t, 16)
    assert len(np.unique(k)) == len(k)
    (k2,) = block_keys(make_trace([4096], [list(range(8))]), 16)
    assert np.array_equal(k, k2)


def test_pinned_key_value():
    """The mixing must never change silently: cached results and reports depend on it."""
    (k,) = block_keys(make_trace([512], [[0]]), 512)
    assert k.tolist() == [-855483717982944971]


def test_same_keys_in_a_fresh_process():
    import subprocess
    import sys

    code = ("import numpy as np; from kvsim.trace.schema import Trace; from kvsim.trace.prefix import block_keys;"
            "t=Trace(np.zeros(1),np.array([1024]),np.array([1]),[np.array([5,6])],512);"
            "print(block_keys(t,16)[0].sum())")
    here = block_keys(make_trace([1024], [[5, 6]]), 16)[0].sum()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert int(out.stdout) == int(here)


def test_source_block_other_than_512():
    # Synthetic traces use 16-token source blocks; 64-token blocks group 4 of them.
    t = make_trace([128, 128], [list(range(8)), [0, 1, 2, 3, 4, 9, 9, 9]], source_block=16)
    a, b = block_keys(t, 64)
    assert shared_prefix_blocks(a, b) == 1
    a, b = block_keys(t, 80)  # 80 = 5 source blocks: ids 0..4 shared
    assert shared_prefix_blocks(a, b) == 1


def test_missing_source_keys_are_never_shared():
    t = make_trace([1024, 1024], [[1], [1]])  # hand-built: fewer ids than the prompt needs
    a, b = block_keys(t, 16)
    assert shared_prefix_blocks(a, b) == 32
    assert not np.any(np.isin(a[32:], b[32:]))


def test_no_prefix_info_gives_none():
    t = Trace(np.zeros(2), np.array([10, 20]), np.array([1, 1]))
    assert block_keys(t, 16) is None


def test_mooncake_block_keys_match_source_sharing(mooncake_conv_trace):
    """At b = 512 the leading shared blocks equal those of the hash_ids (full blocks only)."""
    t = mooncake_conv_trace.select(np.arange(400))
    keys = block_keys(t, 512)
    seen_src, seen = set(), set()
    for src, k, p in zip(t.prefix_keys, keys, t.prompt_tokens):
        full = int(p) // 512
        hits_src = next((i for i, h in enumerate(src[:full].tolist()) if h not in seen_src), full)
        hits = next((i for i, h in enumerate(k.tolist()) if h not in seen), len(k))
        assert hits == hits_src
        seen_src.update(src[:full].tolist())
        seen.update(k.tolist())


# ---- property: keys agree with the token contents they summarise ------------------------------

SRC = 8  # small source blocks keep the examples small


def chained_ids(prompts: list[list[int]]) -> list[list[int]]:
    """Mooncake-style ids: block j's id names the whole prefix up to the end of block j (the
    last, partial block names the partial prefix)."""
    table: dict[tuple, int] = {}
    out = []
    for toks in prompts:
        ids = []
        for j in range(-(-len(toks) // SRC)):
            ids.append(table.setdefault(tuple(toks[: (j + 1) * SRC]), len(table)))
        out.append(ids)
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


prompt_pairs = st.tuples(
    st.lists(st.integers(0, 2), min_size=1, max_size=60),  # shared stem
    st.lists(st.integers(0, 2), max_size=30),
    st.lists(st.integers(0, 2), max_size=30),
).filter(lambda t: len(t[0]) + len(t[1]) > 0 and len(t[0]) + len(t[2]) > 0)


@settings(max_examples=300, deadline=None)
@given(prompt_pairs, st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 20]))
def test_keys_share_exactly_what_the_ids_prove(pair, block):
    stem, tail_a, tail_b = pair
    a, b = stem + tail_a, stem + tail_b
    trace = make_trace([len(a), len(b)], chained_ids([a, b]), source_block=SRC)
    ka, kb = block_keys(trace, block)
    shared = shared_prefix_blocks(ka, kb)
    true_common = common_prefix(a, b)
    # Safety: shared blocks really hold equal tokens.
    assert shared * block <= true_common
    # Completeness: every block the ids prove equal is shared.
    shortest = min(len(a), len(b))
    expected = 0
    for k in range(shortest // block):
        j1 = ((k + 1) * block - 1) // SRC
        end = (j1 + 1) * SRC
        proven = (end <= shortest and true_common >= end) or (len(a) == len(b) == true_common)
        if not proven:
            break
        expected += 1
    assert shared == expected
