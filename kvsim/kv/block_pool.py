"""Block pool data structures: a free-block queue with O(1) removal from the middle.

:class:`FreeBlockQueue` is a doubly linked list over integer block ids kept in two flat lists
(``prev``/``next``), with a head and a tail sentinel. Allocation takes from the front
(``popleft``); a freed block is appended at the back. Hence, without prefix caching, the order is
simply FIFO over frees and the initial order is ``0, 1, ..., n-1``.

Eviction order (once cached blocks stay in the queue, see the prefix-caching allocator):
1. the front is the least recently freed block, so it is evicted first (LRU);
2. a request's blocks are freed tail first (reverse block-table order), so among blocks freed at
   the same time the tail of a prefix chain is evicted before its head.
The second rule is maintained by the caller, which appends in reverse order.
"""

from __future__ import annotations


class FreeBlockQueue:
    __slots__ = ("_prev", "_next", "_head", "_tail", "_in_queue", "num_free")

    def __init__(self, num_blocks: int):
        n = num_blocks
        self._head = n  # sentinel ids live past the real blocks
        self._tail = n + 1
        self._prev = [i - 1 for i in range(n + 2)]
        self._next = [i + 1 for i in range(n + 2)]
        self._in_queue = [True] * n
        if n:
            self._prev[0] = self._head
            self._next[n - 1] = self._tail
            self._next[self._head] = 0
            self._prev[self._tail] = n - 1
        else:
            self._next[self._head] = self._tail
            self._prev[self._tail] = self._head
        self._prev[self._head] = -1
        self._next[self._tail] = -1
        self.num_free = n

    def __len__(self) -> int:
        return self.num_free

    def __contains__(self, block_id: int) -> bool:
        return self._in_queue[block_id]

    def popleft(self) -> int:
        first = self._next[self._head]
        if first == self._tail:
            raise ValueError("no free blocks to pop")
        self.remove(first)
        return first

    def peekleft(self) -> int | None:
        first = self._next[self._head]
        return None if first == self._tail else first

    def remove(self, block_id: int) -> None:
        if not self._in_queue[block_id]:
            raise RuntimeError(f"remove() called on block {block_id}, which is not in the free queue")
        p, n = self._prev[block_id], self._next[block_id]
        self._next[p] = n
        self._prev[n] = p
        self._in_queue[block_id] = False
        self.num_free -= 1

    def append(self, block_id: int) -> None:
        if self._in_queue[block_id]:
            raise RuntimeError(f"append() called on block {block_id}, which is already free")
        last = self._prev[self._tail]
        self._next[last] = block_id
        self._prev[block_id] = last
        self._next[block_id] = self._tail
        self._prev[self._tail] = block_id
        self._in_queue[block_id] = True
        self.num_free += 1

    def popleft_many(self, n: int) -> list[int]:
        """``popleft`` ``n`` times: the first ``n`` blocks, unlinked as one run."""
        if n > self.num_free:
            raise ValueError(f"popleft_many({n}) with {self.num_free} free blocks")
        nxt = self._next
        in_queue = self._in_queue
        out = []
        b = nxt[self._head]
        for _ in range(n):
            out.append(b)
            in_queue[b] = False
            b = nxt[b]
        nxt[self._head] = b
        self._prev[b] = self._head
        self.num_free -= n
        return out

    def append_many(self, blocks) -> None:
        """``append`` each of ``blocks`` in order, linked as one run."""
        prev, nxt, in_queue = self._prev, self._next, self._in_queue
        last = prev[self._tail]
        added = 0
        for b in blocks:
            if in_queue[b]:
                break
            nxt[last] = b
            prev[b] = last
            in_queue[b] = True
            last = b
            added += 1
        else:
            b = None
        nxt[last] = self._tail
        prev[self._tail] = last
        self.num_free += added
        if b is not None:
            raise RuntimeError(f"append_many() called with block {b}, which is already free")

    def prepend_many(self, blocks) -> None:
        """Put ``blocks`` at the front, in order (the first is popped first), linked as one run."""
        prev, nxt, in_queue = self._prev, self._next, self._in_queue
        first = nxt[self._head]
        last = self._head
        for b in blocks:
            if in_queue[b]:
                raise RuntimeError(f"prepend_many() called with block {b}, which is already free")
            nxt[last] = b
            prev[b] = last
            in_queue[b] = True
            last = b
            self.num_free += 1
        nxt[last] = first
        prev[first] = last

    def all_free_blocks(self) -> list[int]:
        """Front-to-back order. Mainly for tests and invariant checks (O(n))."""
        out = []
        b = self._next[self._head]
        while b != self._tail:
            out.append(b)
            b = self._next[b]
        return out

    def check_invariants(self) -> None:
        order = self.all_free_blocks()
        assert len(order) == self.num_free, (
            f"num_free ({self.num_free}) is out of sync with the free list ({len(order)})"
        )
        assert len(set(order)) == len(order), "a block appears twice in the free list"
        flagged = sum(self._in_queue)
        assert flagged == self.num_free, f"in-queue flags ({flagged}) out of sync with num_free"
        for b in order:
            assert self._in_queue[b], f"block {b} is linked but not flagged free"
