"""scheduler.prompt_blocks and reserve_full_isl (issue 22; vLLM v1's chunk-by-chunk prompt blocks)."""

import pytest

from kvsim.errors import ConfigError
from kvsim.kv.base import KVRequest
from kvsim.kv.paged import PagedAllocator
from kvsim.metrics.request_log import RequestLog
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.scheduler import Scheduler


def _sched(num_blocks=20, **cfg):
    alloc = PagedAllocator(num_blocks, 16)
    cfg = SchedulerConfig(chunked_prefill=True, max_num_batched_tokens=64, **cfg)
    return Scheduler(cfg, alloc, 2048, request_log=RequestLog()), alloc


def _step(s, t=0.0):
    plan = s.schedule(t)
    s.on_step_done(t + 0.01)
    return plan


def test_at_admission_holds_the_whole_prompt_per_chunk_one_chunk_at_a_time():
    whole, wa = _sched()
    chunk, ca = _sched(prompt_blocks="per_chunk")
    for s in (whole, chunk):
        s.add_arrival(KVRequest(0, 200, 4, 2048), 0.0)  # 13 blocks; chunks of 64 tokens = 4 blocks
        _step(s)
    assert wa.num_blocks - wa.num_free_blocks == 13
    assert ca.num_blocks - ca.num_free_blocks == 4
    _step(chunk, 0.01)
    assert ca.num_blocks - ca.num_free_blocks == 8  # the second chunk took its blocks when scheduled


def test_reserve_full_isl_false_admits_once_the_first_chunk_fits():
    for reserve, admitted in ((True, ()), (False, (1,))):
        s, alloc = _sched(num_blocks=12, prompt_blocks="per_chunk", reserve_full_isl=reserve)
        s.add_arrival(KVRequest(0, 100, 40, 2048), 0.0)  # 7 blocks at the end of its prompt
        _step(s)
        _step(s, 0.01)
        s.add_arrival(KVRequest(1, 150, 2, 2048), 0.02)  # 10 blocks: no room for all, room for a chunk
        plan = s.schedule(0.02)
        assert plan.admitted == admitted
        if reserve:  # windows may treat the head as blocked: its whole prompt does not fit
            assert not s.head_might_fit(1)


class RequiredOnly:
    """A KVAllocator with the required protocol only (no can_allocate)."""

    def __init__(self):
        self._a = PagedAllocator(8, 16)
        self.capacity_tokens, self.block_size = self._a.capacity_tokens, 16
        for name in ("max_footprint_fits", "allocate", "ensure_slots", "free", "held_tokens", "usage",
                     "check_invariants"):
            setattr(self, name, getattr(self._a, name))


def test_per_chunk_needs_an_allocator_that_can_check_without_allocating():
    Scheduler(SchedulerConfig(), RequiredOnly(), 2048, request_log=RequestLog())  # at_admission: fine
    with pytest.raises(ConfigError, match="per_chunk needs an allocator with can_allocate"):
        Scheduler(SchedulerConfig(prompt_blocks="per_chunk"), RequiredOnly(), 2048, request_log=RequestLog())
