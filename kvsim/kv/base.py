"""The allocator boundary: what the scheduler may ask of any KV allocator (the protocol itself, and
the optional capabilities behind the fast paths, are declared in :mod:`kvsim.kv.protocol`).

The scheduler never sees block ids or addresses. It talks to an allocator in tokens:

* ``max_footprint_fits(req)`` -- could ``req`` ever be held, alone, in an empty cache? Requests
  that cannot are rejected at arrival instead of looping forever in preemption.
* ``allocate(req, hold_tokens)`` -- admit ``req`` holding room for ``hold_tokens`` tokens (all or
  nothing). Returns an :class:`Allocation` (how many leading tokens were found in a prefix cache and
  need no computing), or ``None``: "does not fit now", and nothing changed.
* ``ensure_slots(request_id, num_tokens)`` -- before a step computes tokens ``[c, num_tokens)``:
  make room for ``num_tokens`` tokens. On success the first ``num_tokens`` slots count as written
  (token states); ``False`` means "does not fit" and changes nothing, so the scheduler preempts
  and retries.
* ``free(request_id)`` -- release everything the request holds.
* ``usage(head)`` -- a :class:`KVUsage` snapshot; ``head`` is the request at the head of the waiting
  queue (external fragmentation is defined relative to it).
* ``check_invariants()`` -- raise ``AssertionError`` with a diagnostic message if internal state is
  inconsistent. Cheap enough to run after every step in tests.

Misuse (allocating a request twice, touching an unknown request, shrinking) raises ``ValueError``.

Memory accounting (all allocators; see docs/metrics.md). For each admitted request let ``A`` be the
slots it holds, ``W`` the slots written and ``F`` its final KV length (``prompt + output - 1``: the
last sampled token's KV is never computed). Then ``token_states = W``, ``reservation = min(A, F) - W``
and ``internal = A - min(A, F)``. ``free`` splits into ``external`` (free but unusable, below) and
``free``; the five parts sum to ``capacity``.
"""

from __future__ import annotations

from dataclasses import field

from kvsim.kv.protocol import KVAllocator  # noqa: F401  (re-exported: the declared boundary)
from kvsim.record import record


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@record  # one per request: slots keep a million of them small
class KVRequest:
    """What an allocator is told about a request when it is admitted (immutable)."""

    request_id: int
    prompt_tokens: int
    output_tokens: int  # the true output length; only the `oracle` reservation may look at it
    max_model_len_tokens: int
    # Content keys of the prompt's full blocks at the allocator's block size (equal key at index k
    # <=> equal prompt prefix up to block k's end); None = no prefix information.
    block_keys: object = field(default=None, compare=False, repr=False)
    priority: int = 0
    num_samples: int = 1  # parallel samples (or beams) decoding from the same prompt
    # Beam search: the request's prune/fork events (kvsim.kv.beam.BeamEvents); None = its
    # num_samples are independent parallel samples.
    beam_events: object = field(default=None, compare=False, repr=False)

    @property
    def final_kv_tokens(self) -> int:
        """Final KV length of one sequence (per sample)."""
        return self.prompt_tokens + self.output_tokens - 1


class SampleGeometry:
    """KV layout of a request with ``n`` parallel samples on ``bs``-token blocks (copy-on-write).

    The prompt's full blocks are shared by all samples (one physical copy, referenced n times).
    The prompt's partial last block is shared too until the first divergent write (the first
    generated token): then sample 0 keeps it and samples 1..n-1 each get a copy. Every sample's
    generated tokens go to its own blocks. ``num_tokens`` is a sequence's length (the same for
    every sample: they decode in lockstep).
    """

    __slots__ = ("n", "bs", "prompt", "full", "base", "partial")

    def __init__(self, num_samples: int, block_size: int, prompt_tokens: int):
        self.n = num_samples
        self.bs = block_size
        self.prompt = prompt_tokens
        self.full = prompt_tokens // block_size  # shared full prompt blocks
        self.base = self.full * block_size
        self.partial = prompt_tokens - self.base  # tokens in the shared partial block

    def blocks(self, num_tokens: int) -> int:
        """Distinct physical blocks holding sequences of ``num_tokens`` tokens."""
        if num_tokens <= self.prompt:
            return cdiv(num_tokens, self.bs)
        return self.full + self.n * cdiv(num_tokens - self.base, self.bs)

    def written(self, num_tokens: int) -> int:
        """Physical KV slots written, counting the copies of the partial block."""
        if num_tokens <= self.prompt:
            return num_tokens
        return self.prompt + (self.n - 1) * self.partial + self.n * (num_tokens - self.prompt)

    def seq_capacity(self, blocks: int) -> int:
        """Tokens one sequence can hold in ``blocks`` physical blocks once the samples diverged
        (for one sample: ``blocks * bs``)."""
        return self.base + (blocks - self.full) // self.n * self.bs


@record
class Allocation:
    """A successful admission. ``cached_tokens`` leading tokens were found in the prefix cache
    (already computed); the request's first step computes only the rest."""

    cached_tokens: int = 0
    # Of those, tokens found in lower tiers (offloaded prefix blocks) and loaded back, and the time
    # the loads take at the tiers' bandwidths.
    cpu_tokens: int = 0
    ssd_tokens: int = 0
    remote_tokens: int = 0  # from a prefix store shared by replicas
    load_s: float = 0.0


NO_HIT = Allocation(0)

# the largest page a paged, radix or buddy allocator takes (tokens; engines use 16-512, the brief's range)
MAX_BLOCK_TOKENS = 512


@record
class KVUsage:
    """A snapshot of KV memory in token slots. The five parts sum to ``capacity_tokens``."""

    capacity_tokens: int
    token_states_tokens: int
    reservation_tokens: int
    internal_frag_tokens: int
    external_frag_tokens: int
    free_tokens: int
    num_requests: int
    cached_free_tokens: int = 0  # part of `free` holding reusable prefix-cache content
    # What the token states would occupy if nothing were shared (prefix blocks stored once per
    # owner, every parallel sample holding its own prompt copy); >= token_states_tokens.
    unshared_tokens: int = 0

    @property
    def used_tokens(self) -> int:
        return self.token_states_tokens + self.reservation_tokens + self.internal_frag_tokens


@record
class MemoryParts:
    """KV memory of a row in tokens: a snapshot (ints, :meth:`of`) or time-weighted means over the
    row's steps (floats). The first five parts sum to the capacity; ``peak_used`` is the most used
    (held) at any step of the row."""

    token_states: float
    reservation: float
    internal_frag: float
    external_frag: float
    free: float
    cached_free: float
    peak_used: float
    unshared: float

    @classmethod
    def of(cls, u: KVUsage) -> MemoryParts:
        return cls(u.token_states_tokens, u.reservation_tokens, u.internal_frag_tokens, u.external_frag_tokens,
                   u.free_tokens, u.cached_free_tokens, u.used_tokens, u.unshared_tokens)


@record
class UsageSums:
    """The allocator sums, in tokens, that a decode window's time-weighted memory means are built
    from (``WindowAllocator.usage_parts``): piecewise constant between the window's boundaries."""

    held_tokens: int  # sum over requests of the slots held
    useful_tokens: int  # sum of min(held, final): held slots the request will still write
    shared_tokens: int  # written slots shared with another owner (counted once in memory)
    cached_free_tokens: int  # free slots holding reusable prefix-cache content
    external_tokens: int  # free slots no request can use (external fragmentation)
