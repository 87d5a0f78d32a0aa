"""Per-request progress. Owned and mutated only by the scheduler."""

from __future__ import annotations

import enum
import math
from array import array
from collections import deque

from kvsim.kv.base import KVRequest


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2
    REJECTED = 3
    SWAPPED = 4


def batch_tokens(prompt_tokens: int, num_samples: int, new_positions: int, computed: int) -> int:
    """Tokens a step computes for a request advancing ``new_positions`` positions from ``computed``:
    prompt positions once, positions past the prompt once per sample."""
    prompt_part = max(0, min(computed + new_positions, prompt_tokens) - computed)
    return prompt_part + num_samples * (new_positions - prompt_part)


class Request:
    """Phase-free progress: ``num_tokens = prompt + generated`` and ``num_computed_tokens`` catches
    up to it. Whenever it has caught up, the step that did so samples one more output token.

    After a recompute preemption ``num_computed_tokens`` drops to 0 while generated tokens are kept,
    so the request's next "prefill" recomputes ``prompt + generated`` tokens (vLLM semantics).
    """

    __slots__ = (
        "request_id", "arrival_s", "prompt_tokens", "output_tokens", "kv", "status",
        "num_computed_tokens", "num_generated", "admitted_s", "first_token_s", "finish_s",
        "num_preemptions", "recomputed_tokens", "admit_seq", "reject_reason", "priority",
        "cached_tokens", "num_swaps", "swapped_tokens", "cpu_hit_tokens", "ssd_hit_tokens", "prefetched_s",
        "load_s", "hidden_s", "num_samples", "replica", "remote_hit_tokens", "group_d0",
    )

    def __init__(self, request_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 max_model_len_tokens: int, priority: int = 0, block_keys=None, num_samples: int = 1,
                 beam_events=None, kv: KVRequest | None = None):
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        # ``kv``: the allocator view of these same fields, built already (the waiting queue keeps it)
        self.kv = kv if kv is not None else KVRequest(
            request_id, prompt_tokens, output_tokens, max_model_len_tokens, block_keys=block_keys,
            priority=priority, num_samples=num_samples, beam_events=beam_events)
        self.num_samples = num_samples  # parallel samples decoding in lockstep from one prompt
        self.replica = 0  # the engine replica the router sent it to
        self.priority = priority
        self.cached_tokens = -1  # prefix-cache hit at first admission (-1: never admitted)
        self.num_swaps = 0
        self.swapped_tokens = 0  # token slots (whole blocks) held in the host tier while swapped out
        self.cpu_hit_tokens = 0  # prefix tokens loaded back from lower tiers at first admission
        self.ssd_hit_tokens = 0
        self.remote_hit_tokens = 0
        self.prefetched_s = 0.0  # idle link time spent prefetching this request's KV
        self.load_s = 0.0  # transfer time its admissions / swap-ins needed
        self.hidden_s = 0.0  # of which prefetch hid
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_generated = 0
        self.admitted_s = math.nan  # first admission
        self.first_token_s = math.nan
        self.finish_s = math.nan
        self.num_preemptions = 0
        self.recomputed_tokens = 0
        self.admit_seq = -1  # admission order, for "latest admitted" victim selection
        self.reject_reason = ""
        # Decode-group membership (scheduler-internal): the group step count value at which
        # ``num_computed_tokens`` and ``num_generated`` were last brought up to date, or -1.
        self.group_d0 = -1

    @classmethod
    def of_view(cls, kv: KVRequest, arrival_s: float, replica: int) -> Request:
        """A fresh (never admitted) request from its allocator view, arrival time and replica."""
        req = cls(kv.request_id, arrival_s, kv.prompt_tokens, kv.output_tokens, kv.max_model_len_tokens,
                  kv.priority, None, kv.num_samples, None, kv)
        req.replica = replica
        return req

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_generated

    def batch_tokens(self, new_positions: int, computed: int | None = None) -> int:
        """Tokens a step computes when this request advances ``new_positions`` positions from
        ``computed`` (default: its computed tokens): prompt positions once, positions past the
        prompt once per sample."""
        if self.num_samples == 1:
            return new_positions  # every position once
        return batch_tokens(self.prompt_tokens, self.num_samples, new_positions,
                            self.num_computed_tokens if computed is None else computed)

    def positions_within(self, budget_tokens: int, computed: int | None = None) -> int:
        """The most new positions (from ``computed``, default: its computed tokens) whose
        :meth:`batch_tokens` fit in ``budget_tokens``: a chunk of a prefill or recompute. Past the
        prompt a position costs one token per sample, so a multi-sample chunk may be 0."""
        c = self.num_computed_tokens if computed is None else computed
        prompt_part = max(0, self.prompt_tokens - c)
        if budget_tokens <= prompt_part or self.num_samples == 1:
            return budget_tokens
        return prompt_part + (budget_tokens - prompt_part) // self.num_samples

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def __repr__(self) -> str:
        return (f"Request({self.request_id}, {self.status.name}, computed={self.num_computed_tokens}/"
                f"{self.num_tokens}, generated={self.num_generated}/{self.output_tokens})")


_COMPACT_ROWS = 1 << 15  # popped tail rows kept before the columns are compacted


class WaitingQueue:
    """The scheduler's FCFS waiting queue, deque-like (``append``, ``appendleft``, ``popleft``,
    ``pop``, ``[0]``, ``len``, iteration, truth), with its head always at hand as :attr:`head`.

    Memory: ShareGPT-like traffic at 20 req/s on one A100 (bench/run_bench.py) queues over half of
    a million-request trace at once. A request that has never been admitted holds nothing but its
    trace fields, all in its immutable allocator view (:class:`~kvsim.kv.base.KVRequest`) but the
    arrival time and replica. So the queue keeps such a request as a row: its KVRequest and two
    typed columns (about 200 bytes instead of about 500 for the Request with it), and builds the
    :class:`Request`, with the same fields and the same KVRequest, when it becomes the head. An
    arrival given only as a row (:meth:`append_row`, the engine's path) is built once, then.

    The queue is ``front + tail``: ``front`` holds Request objects (the head, built as soon as the
    request becomes the head, and requests preempted back to the queue by ``appendleft``), ``tail``
    the rows in arrival order. ``front`` is empty only when the whole queue is, so :attr:`head`
    (``front[0]`` or None) is a plain attribute read: the scheduler asks for it many times a step.
    A request appended after it was admitted (or credited with prefetch) stays a Request object,
    in its place in the tail.

    Iteration yields the front's objects and a freshly built Request for each tail row: for reading
    only (a change to a tail row's object would be lost).
    """

    __slots__ = ("_front", "_obj", "_arrival", "_replica", "_head", "num_seqs", "head")

    def __init__(self) -> None:
        self._front: deque[Request] = deque()
        # tail rows, from index ``_head`` of the columns on: the KVRequest of a fresh arrival (then
        # its arrival time and replica are in the columns), or a Request (the columns unused)
        self._obj: deque = deque()
        self._arrival = array("d")
        self._replica = array("q")
        self._head = 0
        self.num_seqs = 0  # sequences queued: sum of num_samples (what a load-aware router reads)
        self.head: Request | None = None  # the first request (front[0]); None when the queue is empty

    def __len__(self) -> int:
        return len(self._front) + len(self._obj)

    def __bool__(self) -> bool:
        return self.head is not None

    def append(self, req: Request) -> None:
        self.num_seqs += req.num_samples
        if self.head is None:
            self._front.append(req)
            self.head = req
        elif req.admit_seq < 0 and req.status == RequestStatus.WAITING and not req.num_generated \
                and not req.prefetched_s:
            self._append_row(req.kv, req.arrival_s, req.replica)  # fresh: the allocator view holds the rest
        else:
            self._obj.append(req)
            self._arrival.append(req.arrival_s)
            self._replica.append(req.replica)

    def append_row(self, kv: KVRequest, arrival_s: float, replica: int) -> None:
        """Append a fresh arrival given by its allocator view, arrival time and replica (its
        Request is built when it becomes the head)."""
        self.num_seqs += kv.num_samples
        if self.head is None:
            self.head = Request.of_view(kv, arrival_s, replica)
            self._front.append(self.head)
        else:
            self._append_row(kv, arrival_s, replica)

    def _append_row(self, kv: KVRequest, arrival_s: float, replica: int) -> None:
        self._obj.append(kv)
        self._arrival.append(arrival_s)
        self._replica.append(replica)

    def appendleft(self, req: Request) -> None:
        self.num_seqs += req.num_samples
        self._front.appendleft(req)
        self.head = req

    def _build(self, i: int, obj) -> Request:
        """The Request of tail row ``i`` (index into the columns) whose object is ``obj``."""
        if type(obj) is not KVRequest:
            return obj
        return Request.of_view(obj, self._arrival[i], self._replica[i])

    def _take_head_row(self) -> Request:
        """Remove the tail's first row and return its Request."""
        i = self._head
        req = self._obj.popleft()
        if type(req) is KVRequest:  # (_build, inlined: once per queued arrival)
            req = Request.of_view(req, self._arrival[i], self._replica[i])
        if not self._obj:
            del self._arrival[:], self._replica[:]
            self._head = 0
        elif i + 1 >= _COMPACT_ROWS and 2 * (i + 1) >= len(self._arrival):
            del self._arrival[:i + 1], self._replica[:i + 1]
            self._head = 0
        else:
            self._head = i + 1
        return req

    def _refill(self) -> None:
        """Keep the invariant after the front lost its head: the next request becomes it."""
        front = self._front
        if not front and self._obj:
            front.append(self._take_head_row())
        self.head = front[0] if front else None

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("WaitingQueue: only the head ([0]) can be indexed")
        if self.head is None:
            raise IndexError("WaitingQueue is empty")
        return self.head

    def remove_front(self, req: Request) -> None:
        """Remove ``req``, a request put back at the front (a preemption victim), from the queue."""
        self._front.remove(req)  # ValueError if it is not there
        self._refill()
        self.num_seqs -= req.num_samples

    def popleft(self) -> Request:
        front = self._front
        req = front.popleft()  # IndexError when empty, as a deque's
        if front:
            self.head = front[0]
        elif self._obj:
            self.head = self._take_head_row()
            front.append(self.head)
        else:
            self.head = None
        self.num_seqs -= req.num_samples
        return req

    def pop(self) -> Request:
        """Remove and return the last request."""
        if self._obj:
            req = self._build(len(self._arrival) - 1, self._obj.pop())
            self._arrival.pop()
            self._replica.pop()
            if not self._obj:
                del self._arrival[:], self._replica[:]
                self._head = 0
        else:
            req = self._front.pop()
            self._refill()
        self.num_seqs -= req.num_samples
        return req

    def __iter__(self):
        yield from self._front
        for j, obj in enumerate(list(self._obj)):
            yield self._build(self._head + j, obj)

    def __repr__(self) -> str:
        return f"WaitingQueue({len(self._front)} built + {len(self._obj)} rows)"
