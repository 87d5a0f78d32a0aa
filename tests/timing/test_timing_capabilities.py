"""timing_capabilities(): the optional members the build and the summary read, checked once."""

import pytest

from kvsim.timing.base import TimingCapabilities, timing_capabilities


class Plain:
    def step_time(self, shape):
        raise AssertionError("not called")


class Full(Plain):
    needs_context_lens = True
    copy_bandwidth_bytes_per_s = 1.5e12


class Off(Plain):
    needs_context_lens = False


def test_declared_members_are_read_once_into_a_frozen_record():
    assert timing_capabilities(Plain()) == TimingCapabilities(False, None)
    assert timing_capabilities(Full()) == TimingCapabilities(True, 1.5e12)
    assert timing_capabilities(Off()) == TimingCapabilities(False, None)
    caps = timing_capabilities(Full())
    with pytest.raises(AttributeError):
        caps.needs_context_lens = False  # frozen: nothing changes it during a run


def test_an_object_without_step_time_is_refused():
    with pytest.raises(TypeError, match="is not a timing model: missing step_time"):
        timing_capabilities(object())
