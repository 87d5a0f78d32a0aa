"""KV allocators. Importing this package registers the built-in kinds."""

from kvsim.kv import buddy, contiguous, paged, radix  # noqa: F401  (registration side effect)
from kvsim.kv.base import KVAllocator, KVRequest, KVUsage

__all__ = ["KVAllocator", "KVRequest", "KVUsage"]
