"""Determinism: the same scenario and seed give byte-identical result files, across processes with
different ``PYTHONHASHSEED`` values (so no decision may depend on set or dict-of-str iteration order
or on ``hash()``).

Every shipped scenario (``scenarios/**/*.yaml``) is run twice, shortened with
``--set trace.max_requests=N``. ``corpus/allocators.yaml`` (every allocator kind) and
``corpus/features.yaml`` (prefix caching with eviction policies, swap, chunked prefill, victim
policies) run on stochastic synthetic traces, so the features most prone to order-dependence are
covered even if the shipped scenarios change. A shipped scenario that
``kvsim validate`` rejects (a feature still being built) is skipped with its error as the reason,
so ``pytest -rs`` lists it; so are sweep specs (``grid:``), which ``kvsim run`` does not take.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ._cli import CORPUS, REPO, finish, run_kvsim, start_kvsim

# every scenario and sweep file; scenarios/studies/profiles/ holds attention-backend profiles, not scenarios
SCENARIOS = sorted(p for p in (REPO / "scenarios").glob("**/*.yaml") if "profiles" not in p.relative_to(REPO).parts)
# scenarios/validation/ holds one generated scenario per serving-corpus case, all of one form
# (bench/validate_serving.py --write-scenarios); one of each model family stands for them here
# (~9 s per scenario on 2 cores; tests/studies/test_validate_serving.py runs a case twice in-process)
_VALIDATION = [p for p in SCENARIOS if p.parent.name == "validation"]
_FAMILIES = {p.stem.split("-")[0]: p for p in reversed(_VALIDATION)}
SCENARIOS = [p for p in SCENARIOS if p.parent.name != "validation" or p in _FAMILIES.values()]
MAX_REQUESTS = 100
COMPARED = ("requests.parquet", "steps.parquet", "summary.json")


def _result_files(out: Path) -> dict[str, bytes]:
    """Every file of a result directory except plots, by relative path."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.suffix != ".png"}


def _run_twice(scenario: Path, tmp_path: Path, extra: list[str]) -> tuple[dict, dict]:
    argvs, procs = [], []
    for name, seed in (("a", "0"), ("b", "4242")):
        argv = ["run", str(scenario), "--out", f"out-{name}", "--no-plots", "-q", *extra]
        argvs.append(argv)
        procs.append(start_kvsim(argv, tmp_path, hashseed=seed))  # both at once: two cores, half the time
    results = [finish(p, a, tmp_path, timeout=300) for p, a in zip(procs, argvs)]
    for res in results:
        assert res.returncode == 0, res.describe()
    return _result_files(tmp_path / "out-a"), _result_files(tmp_path / "out-b")


def _assert_identical(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    assert sorted(a) == sorted(b), "the two runs wrote different files"
    for required in COMPARED:
        assert any(Path(k).name == required for k in a), f"no {required} written"
    differing = [k for k in a if a[k] != b[k]]
    assert not differing, f"files differ between runs with different PYTHONHASHSEED: {differing}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: str(p.relative_to(REPO / "scenarios")))
def test_shipped_scenario_is_byte_identical_across_runs(scenario, tmp_path):
    raw = yaml.safe_load(scenario.read_text())
    if isinstance(raw, dict) and "grid" in raw:
        pytest.skip("a sweep spec (top-level 'grid:', for `kvsim sweep`), not a `kvsim run` scenario")
    check = run_kvsim(["validate", str(scenario)], tmp_path)
    if check.returncode != 0:
        pytest.skip(f"kvsim validate rejects it (feature still missing?): {check.stderr.strip()}")
    a, b = _run_twice(scenario, tmp_path, ["--set", f"trace.max_requests={MAX_REQUESTS}"])
    _assert_identical(a, b)


CORPUS_VARIANTS = {
    "allocators.yaml": {"paged-16", "paged-4", "contiguous-max", "contiguous-oracle", "buddy-pow2"},
    "features.yaml": {"prefix-lru", "prefix-fifo-swap", "chunked", "contiguous-swap"},
}


@pytest.mark.parametrize("name", list(CORPUS_VARIANTS))
def test_corpus_scenario_is_byte_identical_across_runs(name, tmp_path):
    a, b = _run_twice(CORPUS / name, tmp_path, [])
    _assert_identical(a, b)
    assert {Path(k).parts[0] for k in a if "/" in k} == CORPUS_VARIANTS[name]


def test_shipped_scenarios_exist():
    assert SCENARIOS, "no scenarios/**/*.yaml found"
