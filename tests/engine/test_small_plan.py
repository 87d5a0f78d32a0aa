"""A short group window's step arrays in Python lists (kvsim.fast.group_window._small_group_steps) against
their definition, member by member and step by step: the members that finish inside the window
decode while they have output left, reading their step-0 length + j tokens in
ceil(length / block_size) pages; the staying members enter as the group's sums (count, sum of base
constants, page quotients and remainders) and each reads base + clock + 1 + j tokens."""

import numpy as np
import pytest

from kvsim.fast.group_window import _small_group_steps


def by_definition(kcap, few, stay_bases, clock, bs):
    num_seqs, kv_read, pages = [], [], []
    for j in range(kcap):
        lens = [length + j for rem, length in few if rem > j] + [b + clock + 1 + j for b in stay_bases]
        num_seqs.append(len(lens))
        kv_read.append(sum(lens))
        pages.append(len(lens) if bs is None else sum(-(-n // bs) for n in lens))
    return num_seqs, kv_read, pages


def group_sums(stay_bases, bs):
    res = [0] * (bs or 1)
    for b in stay_bases:
        if bs is not None:
            res[b % bs] += 1
    return len(stay_bases), sum(stay_bases), sum(b // bs for b in stay_bases) if bs else 0, res


@pytest.mark.parametrize("bs", [None, 1, 7, 16, 32])
@pytest.mark.parametrize("seed", range(12))
def test_small_plan_matches_the_definition(bs, seed):
    rng = np.random.default_rng(seed * 31 + (bs or 0))
    kcap = int(rng.integers(2, 41))
    clock = int(rng.integers(0, 500))
    # few members: remaining steps (some past the window, some already done), step-0 lengths >= 1
    few = [(int(rng.integers(-2, kcap + 5)), int(rng.integers(1, 3000))) for _ in range(rng.integers(0, 25))]
    # staying members' base constants: computed tokens - clock at join (>= 1 - clock)
    stay_bases = [int(rng.integers(1 - clock, 4000)) for _ in range(rng.integers(0, 40))]
    if not few and not stay_bases:
        stay_bases = [5]
    n_stay, stay_base, stay_q, stay_res = group_sums(stay_bases, bs)
    got = _small_group_steps(kcap, [r for r, _ in few], [n for _, n in few], n_stay, stay_base, stay_q, stay_res,
                             clock, bs)
    assert got == by_definition(kcap, few, stay_bases, clock, bs)
    assert all(len(col) == kcap for col in got)
