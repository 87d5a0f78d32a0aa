"""A million-request trace loads in bounded memory (streamed, columnar)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvsim.trace.spec import SyntheticTraceSpec
from kvsim.trace.synthetic import generate_trace
from kvsim.trace.write import write_trace

REPO = Path(__file__).resolve().parents[2]
N = 1_000_000
LIMIT_BYTES = 1 << 30

# Measured in a fresh interpreter: the extra memory is the peak RSS during the load minus the RSS
# just before it (modules already imported). The peak is VmHWM of /proc/self/status, which belongs
# to this process's address space; getrusage's ru_maxrss would not do, because Linux keeps it
# across execve, so a child of a large pytest process would report its parent's size.
PROBE = """
import resource, sys, time
import numpy, pandas, pyarrow, pyarrow.compute, pyarrow.json
from kvsim.trace.load import load_trace
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * resource.getpagesize()
before = rss()
t0 = time.perf_counter()
trace = load_trace(sys.argv[1])
seconds = time.perf_counter() - t0
peak = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM:')) * 1024
keys = sum(len(k) for k in trace.prefix_keys)
print(len(trace), keys, peak - before, f"{seconds:.2f}")
"""


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    spec = SyntheticTraceSpec.model_validate({
        "num_requests": N, "preset": "sharegpt", "arrival": {"rate_per_s": 200},
        "system_prompt": {"tokens": 100, "fraction": 0.5}, "sampling": {"n": 2, "fraction": 0.2},
    })
    trace = generate_trace(spec, seed=0)
    folder = tmp_path_factory.mktemp("million")
    return trace, {ext: write_trace(trace, folder / f"t.{ext}") for ext in ("csv", "jsonl")}


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("ext", ["csv", "jsonl"])
def test_million_requests_load_under_1gb(million, ext):
    trace, files = million
    out = subprocess.run([sys.executable, "-c", PROBE, str(files[ext])], capture_output=True, text=True,
                         cwd=REPO, check=True)
    n, keys, extra_bytes, seconds = out.stdout.split()
    assert int(n) == N
    assert int(keys) == sum(len(k) for k in trace.prefix_keys)
    print(f"{ext}: {N:,} requests, {int(keys):,} prefix keys, +{int(extra_bytes) / 2**20:.0f} MiB peak, {seconds} s")
    assert int(extra_bytes) < LIMIT_BYTES
    assert np.isfinite(float(seconds))
