"""The scheduler's lazy decode group: members advance with one clock and leave in the order the
one-by-one scheduler finishes them (finish step, then admission order)."""

import pytest

from kvsim.fast.group import DecodeGroup
from kvsim.sched.request import Request


def decoding(rid, prompt, output, generated, admit_seq):
    r = Request(rid, 0.0, prompt, output, 4096)
    r.num_generated = generated
    r.num_computed_tokens = prompt + generated - 1  # one token behind: it decodes next step
    r.admit_seq = admit_seq
    return r


def test_members_advance_lazily_and_finish_in_step_then_admission_order():
    g = DecodeGroup()
    a = decoding(0, 10, 5, 1, admit_seq=2)  # 4 steps left
    b = decoding(1, 7, 3, 1, admit_seq=1)  # 2 steps left
    c = decoding(2, 3, 6, 4, admit_seq=0)  # 2 steps left, admitted first
    for r in (a, b, c):
        g.join(r)
    assert g.members == [c, b, a]
    g.check()
    g.step_count += 1
    assert g.pop_finished() == []
    assert a.num_computed_tokens == 10  # not touched yet
    g.sync()
    assert (a.num_computed_tokens, a.num_generated) == (11, 2)
    g.step_count += 1
    done = g.pop_finished()
    assert done == [c, b]
    assert [(r.num_generated, r.num_computed_tokens) for r in done] == [(6, 8), (3, 9)]
    assert all(r.group_d0 == -1 for r in done)
    g.check()
    g.step_count += 1
    g.dissolve()
    assert (a.num_generated, a.num_computed_tokens, a.group_d0) == (4, 13, -1)
    assert len(g) == 0 and g.sum_base == 0
    g.join(a)  # rejoins at the current clock with 1 step left
    assert g.finish_step() == g.step_count + 1


def test_join_refuses_requests_that_do_not_decode():
    g = DecodeGroup()
    r = decoding(0, 10, 5, 1, admit_seq=0)
    r.num_computed_tokens -= 1  # two tokens behind: still prefilling
    with pytest.raises(ValueError, match="cannot join"):
        g.join(r)
    done = decoding(1, 10, 5, 5, admit_seq=1)  # nothing left to generate
    with pytest.raises(ValueError, match="cannot join"):
        g.join(done)
    ok = decoding(2, 10, 5, 1, admit_seq=2)
    g.join(ok)
    with pytest.raises(ValueError, match="cannot join"):
        g.join(ok)  # twice


def test_check_catches_a_member_out_of_sync():
    g = DecodeGroup()
    r = decoding(0, 10, 5, 1, admit_seq=0)
    g.join(r)
    g.step_count += 1
    r.num_computed_tokens += 1  # someone advanced it behind the group's back
    with pytest.raises(AssertionError, match="out of sync"):
        g.check()
