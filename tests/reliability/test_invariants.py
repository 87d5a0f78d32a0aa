"""Invariant checking works: ``kvsim run --check-invariants`` passes on real scenarios, and a
deliberately planted off-by-one is caught (a mutation test of the checkers themselves).

The mutations are monkeypatched in for one test only; nothing in ``kvsim/`` is modified.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys

import pytest

import kvsim.kv.paged as paged_module
from kvsim.kv.base import KVRequest
from kvsim.kv.ledger import SlotLedger
from kvsim.kv.buddy import BuddyAllocator
from kvsim.kv.contiguous import ContiguousAllocator
from kvsim.kv.paged import PagedAllocator

from ._cli import (
    REPO,
    TRACEBACK,
    Result,
    assert_no_complete_dir,
    copy_corpus,
    kvsim_env,
    run_kvsim,
)


def _property_driver():
    """``drive`` from tests/kv/test_properties.py: random allocate/grow/free sequences with
    ``check_invariants()`` and the capacity-sum checks after every operation."""
    spec = importlib.util.spec_from_file_location("_kv_properties", REPO / "tests" / "kv" / "test_properties.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.drive


# A fixed operation sequence (verb, request slot, size a, size b) that allocates, grows and frees
# several requests, so every allocator frees blocks and reuses them.
OPS = [("alloc", 0, 20, 10), ("alloc", 1, 7, 5), ("grow", 0, 1, 9), ("alloc", 2, 33, 3), ("free", 1, 1, 1),
       ("grow", 2, 1, 2), ("alloc", 3, 5, 30), ("free", 0, 1, 1), ("grow", 3, 1, 30), ("free", 2, 1, 1),
       ("alloc", 4, 12, 12), ("free", 3, 1, 1), ("free", 4, 1, 1)]


def _allocators():
    return [PagedAllocator(16, 4), PagedAllocator(40, 1, 0.1), ContiguousAllocator(120, "pow2", "first-fit"),
            BuddyAllocator(128, 4, "oracle")]


@pytest.mark.parametrize("alloc", _allocators(), ids=lambda a: f"{type(a).__name__}-{a.capacity_tokens}")
def test_property_driver_passes_unmutated(alloc):
    _property_driver()(alloc, OPS)


# -- mutation 1: the shared ledger over-reports the reservation by one token -------------------------


def _reservation_plus_one(monkeypatch):
    original = SlotLedger.usage

    def usage(self, *args, **kwargs):
        u = original(self, *args, **kwargs)
        return dataclasses.replace(u, reservation_tokens=u.reservation_tokens + 1)

    monkeypatch.setattr(SlotLedger, "usage", usage)


@pytest.mark.parametrize("make", [lambda: PagedAllocator(16, 4), lambda: ContiguousAllocator(120, "max", "best-fit"),
                                  lambda: BuddyAllocator(128, 4, "pow2")], ids=["paged", "contiguous", "buddy"])
def test_reservation_off_by_one_is_caught_by_the_property_driver(monkeypatch, make):
    drive = _property_driver()
    _reservation_plus_one(monkeypatch)
    with pytest.raises(AssertionError):
        drive(make(), OPS)


# -- mutation 2: the paged allocator forgets one ref-count decrement on free --------------------------


def _leaky_free(monkeypatch):
    """After a normal free, leave the request's first block with ref count 1, as if the loop over
    its block table had skipped one decrement."""
    original = PagedAllocator.free

    def free(self, request_id):
        table = self.block_table(request_id)
        original(self, request_id)
        self.ref_counts[table[0]] += 1

    monkeypatch.setattr(PagedAllocator, "free", free)


def test_skipped_ref_count_decrement_is_caught_by_check_invariants(monkeypatch):
    alloc = PagedAllocator(8, 4)
    req = KVRequest(0, 10, 5, 64)
    assert alloc.allocate(req, 10)
    assert alloc.ensure_slots(0, 10)
    alloc.check_invariants()
    _leaky_free(monkeypatch)
    alloc.free(0)
    with pytest.raises(AssertionError, match="ref count"):
        alloc.check_invariants()


def test_skipped_ref_count_decrement_is_caught_by_the_property_driver(monkeypatch):
    drive = _property_driver()
    _leaky_free(monkeypatch)
    with pytest.raises(AssertionError, match="ref count"):
        drive(PagedAllocator(16, 4), OPS)


def test_unreturned_block_is_caught_by_check_invariants_of_the_counting_allocator(monkeypatch):
    """The block-counting paged allocator (no block ids; used without prefix caching)."""
    cls = getattr(paged_module, "CountingPagedAllocator", None)
    if cls is None:
        pytest.skip("kvsim.kv.paged has no CountingPagedAllocator")
    drive = _property_driver()
    drive(cls(16, 4), OPS)  # unmutated: passes
    original = cls.free

    def free(self, request_id):
        original(self, request_id)
        self.num_free_blocks -= 1

    monkeypatch.setattr(cls, "free", free)
    with pytest.raises(AssertionError, match="free blocks"):
        drive(cls(16, 4), OPS)


# -- end to end: kvsim run --check-invariants ----------------------------------------------------------


@pytest.mark.parametrize("name", ["allocators.yaml", "features.yaml"])
def test_check_invariants_passes_on_corpus_scenarios(tmp_path, name):
    copy_corpus(name, tmp_path)
    res = run_kvsim(["run", name, "--out", "out", "--no-plots", "-q", "--check-invariants"], tmp_path)
    assert res.returncode == 0, res.describe()
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/summary.json")]
    assert summaries and all(s["requests_finished"] == s["requests_total"] for s in summaries)
    assert sum(s["preemptions"] for s in summaries) > 0, "the scenario should exercise preemption"


def test_check_invariants_passes_on_quickstart(tmp_path):
    scenario = REPO / "scenarios" / "quickstart.yaml"
    res = run_kvsim(["run", str(scenario), "--out", "out", "--no-plots", "-q", "--check-invariants",
                     "--set", "trace.max_requests=150"], tmp_path)
    assert res.returncode == 0, res.describe()


LEAKY_RUN = """
import sys
import kvsim.kv.paged as paged

def leaky_ref_count_free(original):
    def free(self, request_id):
        table = self.block_table(request_id)
        original(self, request_id)
        self.ref_counts[table[0]] += 1          # one decrement "skipped"
    return free

def leaky_counting_free(original):
    def free(self, request_id):
        original(self, request_id)
        self.num_free_blocks -= 1               # one block never returned
    return free

paged.PagedAllocator.free = leaky_ref_count_free(paged.PagedAllocator.free)
if hasattr(paged, "CountingPagedAllocator"):
    paged.CountingPagedAllocator.free = leaky_counting_free(paged.CountingPagedAllocator.free)
from kvsim.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("prefix_caching,expect", [("true", "ref count"), ("false", "free blocks")],
                         ids=["block-ids", "block-counts"])
def test_check_invariants_catches_a_planted_leak_in_a_real_run(tmp_path, prefix_caching, expect):
    """A leak planted into the CLI process (the paged allocator that names blocks, used with prefix
    caching, and the one that only counts them): ``--check-invariants`` stops the run with a
    one-line internal error (exit 1) naming the broken invariant; no result directory appears."""
    copy_corpus("tiny.yaml", tmp_path)
    argv = ["run", "tiny.yaml", "--out", "out", "--no-plots", "-q", "--check-invariants",
            "--set", f"allocator.prefix_caching={prefix_caching}"]
    proc = subprocess.run([sys.executable, "-c", LEAKY_RUN, *argv], cwd=tmp_path, env=kvsim_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    res = Result(argv, tmp_path, proc.returncode, proc.stdout, proc.stderr)
    assert res.returncode == 1, res.describe()
    assert TRACEBACK not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: internal error: AssertionError"), res.describe()
    assert expect in lines[0], res.describe()
    assert not (tmp_path / "out").exists()
    assert_no_complete_dir(tmp_path / "out")
