"""``kvsim servebench``: kvsim's prediction beside a serving-benchmark result of your own.

A result file of vLLM's serving benchmark (``vllm bench serve --save-result [--save-detailed]``,
before it ``benchmarks/benchmark_serving.py --save-result``; SGLang's ``bench_serving.py
--output-file`` writes the same keys) becomes a trace (:mod:`kvsim.servebench.result`), the trace and
the deployment you name become a scenario (:mod:`kvsim.servebench.build`), kvsim runs it, and the
benchmark's own metrics, computed the way the client computes them (:mod:`kvsim.servebench.metrics`),
are printed beside the published ones (:mod:`kvsim.servebench.cli`).
"""
