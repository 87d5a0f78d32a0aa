"""The Python API (kvsim.api): in-memory results, result directories and reading them back agree
on one order (the scenario's, baseline first) and one layout; bad input is one TypeError line."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest
import yaml

import kvsim

SCENARIO = {
    "name": "tiny",
    "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 30,
                            "arrival": {"process": "poisson", "rate_per_s": 4.0}}, "length_policy": "cap"},
    "model": "OPT-13B", "gpu": "A100-40GB",
    "baseline": "paged-16",  # not the first variant, and not first by name either
    "variants": {"contiguous-max": {"allocator": {"kind": "contiguous", "reservation": "max"}},
                 "contiguous-pow2": {"allocator": {"kind": "contiguous", "reservation": "pow2"}},
                 "paged-16": {"allocator": {"kind": "paged", "block_size": 16}}},
}
ORDER = ["paged-16", "contiguous-max", "contiguous-pow2"]


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """(scenario path, in-memory results, result directory) of SCENARIO."""
    tmp = tmp_path_factory.mktemp("api")
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    loaded = kvsim.load_scenario(path)
    out = kvsim.run_to_dir(loaded, tmp / "out", plots=False, progress=False, warn=lambda m: None)
    return path, kvsim.run(loaded), out


def _csv_round_trip(df: pd.DataFrame) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(df.drop(columns="source").to_csv(index=False)))


def test_comparison_table_of_run_results_is_comparison_csv(done):
    _, results, out = done
    table, csv = kvsim.comparison_table(results), pd.read_csv(out / "comparison.csv")
    assert list(table["label"]) == ORDER == list(csv["label"])
    assert list(table.columns) == list(csv.columns)
    pd.testing.assert_frame_equal(_csv_round_trip(table), csv.drop(columns="source"))


def test_load_results_lists_variants_in_scenario_order_baseline_first(done):
    assert list(kvsim.load_results(done[2])) == ORDER


def test_comparison_table_of_loaded_results_is_comparison_csv(done):
    out = done[2]
    table = kvsim.comparison_table(kvsim.load_results(out))
    pd.testing.assert_frame_equal(_csv_round_trip(table), pd.read_csv(out / "comparison.csv").drop(columns="source"))


@pytest.mark.parametrize("bad, what", [([1], "got list"), ({"a": 3}, "'a': expected a RunResult"),
                                       ("dir", "got str")])
def test_comparison_table_refuses_other_input_in_one_line(bad, what):
    with pytest.raises(TypeError, match="comparison_table\\(\\): .*RunResult, LoadedRun or summary") as e:
        kvsim.comparison_table(bad)
    assert what in str(e.value) and "\n" not in str(e.value)


def test_run_returns_variants_in_display_order_baseline_first(done):
    results = done[1]
    assert list(results) == ORDER
    summaries = kvsim.comparison_table({k: v.summary for k, v in results.items()})
    assert list(summaries["label"]) == ORDER


def test_run_of_a_mapping_expands_variants_and_checks_baseline_as_a_file(done):
    path, results, _ = done
    from_dict = kvsim.run(SCENARIO, base_dir=path.parent)
    assert list(from_dict) == list(results) == ORDER
    assert all(from_dict[n].summary == results[n].summary for n in results)
    with pytest.raises(kvsim.errors.ConfigError, match="^scenario: baseline: 'nope' is not a variant"):
        kvsim.run(dict(SCENARIO, baseline="nope"))


def test_run_result_is_named_after_its_variant(done):
    assert {n: r.name for n, r in done[1].items()} == {n: n for n in done[1]}
    one = {k: v for k, v in SCENARIO.items() if k not in ("name", "variants", "baseline")}
    assert kvsim.run(one).name == "scenario"  # a mapping without name: is called "scenario" (as in messages)


@pytest.mark.parametrize("kind", ["mapping", "Scenario"])
def test_run_to_dir_takes_what_run_takes(done, tmp_path, kind):
    one = {k: v for k, v in SCENARIO.items() if k not in ("variants", "baseline")}
    given = one if kind == "mapping" else kvsim.load_scenario(done[0]).base
    out = kvsim.run_to_dir(given, tmp_path / "out", plots=False, progress=False, warn=lambda m: None)
    assert (out / "summary.json").is_file()
    with pytest.raises(TypeError, match=r"^run_to_dir\(\): expected a scenario path, mapping, Scenario or "
                                        r"LoadedScenario, got int$"):
        kvsim.run_to_dir(3, tmp_path / "x")


@pytest.mark.parametrize("overrides", ["trace.end_s=60", [1]])
def test_load_scenario_overrides_are_a_list_of_strings(done, overrides):
    with pytest.raises(TypeError, match=r'^load_scenario\(\): overrides are a list of "path.to.key=value" strings'):
        kvsim.load_scenario(done[0], overrides)


def test_run_names_file_and_variant_when_a_limit_stops_it(done):
    loaded = kvsim.load_scenario(done[0], ["limits.max_sim_time_s=0.5"])
    with pytest.raises(kvsim.errors.SimulationLimitError, match=f"^{done[0]}: contiguous-max: simulated time"):
        kvsim.run(loaded)


def test_dir_lists_the_lazy_public_api():
    assert set(kvsim.__all__) <= set(dir(kvsim))


@pytest.mark.parametrize("damage, expected", [
    ("steps", "steps.parquet: missing (a kvsim run directory has summary.json"),
    ("requests", "requests.parquet: cannot read the parquet file"),
    ("garbage{", "summary.json: not valid JSON (line 1 col 1"),
    ("{}", "not a kvsim run directory (its summary.json has no name, kv, concurrency keys)"),
])
def test_load_results_of_a_damaged_directory_is_one_error_line(done, tmp_path, damage, expected):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(done[2] / "paged-16", run)
    if damage == "steps":
        (run / "steps.parquet").unlink()
    elif damage == "requests":
        (run / "requests.parquet").write_bytes(b"not parquet")
    else:
        (run / "summary.json").write_text(damage)
    with pytest.raises(kvsim.errors.KvsimError) as e:
        kvsim.load_results(run)
    assert expected in str(e.value) and "\n" not in str(e.value)
