"""Conformance of kvsim's capacity model against vLLM's own v1 scheduler (issue 22, item 1).

Each :class:`~kvsim.conformance.cases.Case` is a list of requests (prompt token ids, output
lengths, arrival times, priorities, parallel samples) and an engine configuration. The same
requests go through vLLM's ``Scheduler`` + ``KVCacheManager`` driven step by step without a model
(:mod:`kvsim.conformance.vllm_side`, the way vLLM's own scheduler tests drive it) and through kvsim's
engine in ``step`` and ``fast`` mode with a constant step time (:mod:`kvsim.conformance.kvsim_side`);
:mod:`kvsim.conformance.compare` reports the first difference per step and per request.

vLLM is imported lazily, only by :mod:`kvsim.conformance.vllm_side`: nothing in kvsim's default
install needs it (the ``conformance`` extra installs it). docs/conformance.md has the table.
"""
