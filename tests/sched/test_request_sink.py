"""The scheduler writes ended requests to a RequestSink (kvsim/sched/sink.py) handed down by the run;
the metrics side's RequestLog is one. The scheduler does not import kvsim.metrics (tests/test_layering.py)."""

from __future__ import annotations

import pytest

from kvsim.kv.paged import PagedAllocator
from kvsim.metrics.request_log import RequestLog
from kvsim.sched.config import SchedulerConfig
from kvsim.sched.scheduler import Scheduler
from kvsim.sched.sink import RequestSink


def test_the_request_log_is_a_request_sink():
    assert isinstance(RequestLog(), RequestSink)
    assert not isinstance(object(), RequestSink)


def test_the_scheduler_needs_a_sink():
    with pytest.raises(TypeError, match="request_log"):
        Scheduler(SchedulerConfig(), PagedAllocator(64, 16), 4096)


class ListSink:
    """A minimal sink: what the scheduler appends, in order."""

    def __init__(self):
        self.rows = []

    def append(self, req):
        self.rows.append((req.request_id, req.status.name, req.reject_reason))

    def column(self, name):
        raise NotImplementedError

    @property
    def num_finished(self):
        return sum(status == "FINISHED" for _, status, _ in self.rows)


def test_a_rejected_arrival_goes_to_the_sink_handed_in():
    from kvsim.kv.base import KVRequest

    sink = ListSink()
    assert isinstance(sink, RequestSink)
    sched = Scheduler(SchedulerConfig(), PagedAllocator(64, 16), 4096, request_log=sink)
    too_long = KVRequest(7, 5000, 10, 4096)
    assert sched.add_arrival(too_long, 0.0) is False
    assert sink.rows == [(7, "REJECTED", "exceeds_max_model_len")]
    assert sched.num_rejected == 1
