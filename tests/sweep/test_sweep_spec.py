"""Sweep files: schema, expansion, point ids, up-front validation and its error messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from sweep_helpers import REPO, STUDY_SWEEP, kvsim_main

from kvsim.errors import ConfigError
from kvsim.sweep import load_sweep
from kvsim.sweep.spec import point_hash, point_slug

TRACE = str(REPO / "traces" / "azure_conv_2023.csv.gz")
BASE = {"trace": {"file": TRACE, "end_s": 60}, "model": "OPT-13B", "gpu": "A100-40GB"}


def write(tmp_path: Path, doc: dict, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_grid_is_a_cartesian_product_last_key_fastest(tmp_path):
    s = load_sweep(write(tmp_path, {"base": BASE, "grid": {"kv_dtype": ["fp16", "fp8"],
                                                           "allocator.block_size": [16, 32, 64]}}))
    assert [(p.overrides["kv_dtype"], p.overrides["allocator.block_size"]) for p in s.points] == [
        ("fp16", 16), ("fp16", 32), ("fp16", 64), ("fp8", 16), ("fp8", 32), ("fp8", 64)]
    assert s.override_keys == ["kv_dtype", "allocator.block_size"]
    assert s.points[4].scenario.kv_dtype == "fp8" and s.points[4].scenario.allocator.block_size == 32
    assert s.name == "sweep" and not s.has_variants


def test_point_ids_are_deterministic_slug_plus_hash(tmp_path):
    doc = {"base": BASE, "grid": {"allocator.block_size": [1, 512], "trace.rate_scale": [0.5]}}
    a = load_sweep(write(tmp_path, doc))
    b = load_sweep(write(tmp_path, doc, "other.yaml"))
    assert [p.id for p in a.points] == [p.id for p in b.points]
    h = point_hash(None, {"allocator.block_size": 1, "trace.rate_scale": 0.5})
    assert a.points[0].id == f"block_size-1_rate_scale-0.5-{h}"
    for p in a.points:
        assert re.fullmatch(r"[A-Za-z0-9._-]+-[0-9a-f]{8}", p.id)
        assert p.scenario.name == p.id
    # the hash ignores key order; the name goes into the slug only
    assert point_hash(None, {"a": 1, "b": 2}) == point_hash(None, {"b": 2, "a": 1})
    assert point_slug("my-point", None, {"x": 1}) == "my-point"
    assert len(point_slug(None, None, {f"k{i}": "v" * 30 for i in range(5)})) <= 48


def test_a_long_slug_never_cuts_a_value():
    """Over 48 characters: keys shortened to their words' initials, whole parts only (not
    ``...max_num_batched_tokens-204`` for 2048); a slug that fits is unchanged (existing point dirs)."""
    keys = ("scheduler.chunked_prefill", "scheduler.max_num_batched_tokens")
    assert point_slug(None, None, dict(zip(keys, (False, 2048)))) == "cp-False_mnbt-2048"
    assert point_slug(None, None, dict(zip(keys, (False, 16)))) == "chunked_prefill-False_max_num_batched_tokens-16"
    slug = point_slug(None, "v", {"allocator.block_size": 16, "trace.synthetic.arrival.rate_per_s": 12.5,
                                   "scheduler.max_num_batched_tokens": 123456789, "model.name": "x" * 30})
    assert slug == "v_bs-16_rps-12.5_mnbt-123456789", slug  # the part that does not fit is left out whole
    assert point_slug("n" * 60, None, {}) == "n" * 48


@pytest.mark.parametrize("values", [[5, 5.0], [16, 16]])
def test_numerically_equal_grid_values_are_one_point(tmp_path, values):
    p = write(tmp_path, {"base": BASE, "grid": {"trace.rate_scale": values}})
    with pytest.raises(ConfigError, match="is listed twice with identical overrides") as e:
        load_sweep(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_points_times_grid_and_names(tmp_path):
    s = load_sweep(write(tmp_path, {
        "base": BASE,
        "points": [{"name": "orca-max", "allocator": {"kind": "contiguous", "reservation": "max"}},
                   {"name": "paged-16", "allocator.block_size": 16}],
        "grid": {"trace.rate_scale": [1, 2]},
    }))
    assert [(p.name, p.overrides["trace.rate_scale"]) for p in s.points] == [
        ("orca-max", 1), ("orca-max", 2), ("paged-16", 1), ("paged-16", 2)]
    assert s.points[0].scenario.allocator.kind == "contiguous"
    assert s.points[0].id.startswith("orca-max-")
    assert s.points[3].scenario.trace.rate_scale == 2


def test_no_grid_no_points_is_one_point(tmp_path):
    s = load_sweep(write(tmp_path, {"base": BASE}))
    assert len(s.points) == 1 and s.points[0].overrides == {} and s.points[0].id.startswith("base-")


def test_base_variants_are_expanded_as_points(tmp_path):
    scn = dict(BASE, variants={"max": {"allocator": {"kind": "contiguous", "reservation": "max"}},
                               "paged": {"allocator.block_size": 32}})
    write(tmp_path, scn, "base.yaml")
    s = load_sweep(write(tmp_path, {"base_file": "base.yaml", "grid": {"trace.rate_scale": [1, 4]}}))
    assert s.has_variants
    assert [(p.variant, p.overrides["trace.rate_scale"]) for p in s.points] == [
        ("max", 1), ("max", 4), ("paged", 1), ("paged", 4)]
    assert s.points[0].scenario.allocator.kind == "contiguous"
    assert s.points[2].scenario.allocator.block_size == 32
    assert s.points[2].id.startswith("paged_rate_scale-1-")
    assert all(not p.scenario.variants for p in s.points)


def test_base_file_paths_resolve_against_the_base_file(tmp_path):
    (tmp_path / "scn").mkdir()
    (tmp_path / "sw").mkdir()
    write(tmp_path / "scn", dict(BASE, trace={"file": "../t.csv"}), "base.yaml")
    with pytest.raises(ConfigError, match=r"point base-[0-9a-f]{8}: trace.file: ../t.csv: trace file does not exist"):
        load_sweep(write(tmp_path / "sw", {"base_file": "../scn/base.yaml"}))
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    s = load_sweep(write(tmp_path / "sw", {"base_file": "../scn/base.yaml"}))
    assert s.anchor == (tmp_path / "scn" / "base.yaml").resolve()
    s2 = load_sweep(write(tmp_path / "sw", {"base": dict(BASE)}, "inline.yaml"))
    assert s2.anchor == (tmp_path / "sw" / "inline.yaml").resolve()
    assert s2.loaded_scenario(s2.points[0]).path == s2.anchor


def test_set_and_cli_overrides_apply_to_every_point(tmp_path):
    p = write(tmp_path, {"base": BASE, "set": {"trace.end_s": 30, "kv_dtype": "fp8"},
                         "grid": {"allocator.block_size": [8, 16]}})
    s = load_sweep(p, overrides=["kv_dtype=int8"])
    assert all(pt.scenario.trace.end_s == 30 and pt.scenario.kv_dtype == "int8" for pt in s.points)
    assert s.resolved()["set"] == {"trace.end_s": 30, "kv_dtype": "int8"}


def test_in_memory_spec_resolves_against_base_dir(tmp_path):
    spec = {"name": "mem", "base": dict(BASE, trace={"file": "t.csv"}), "grid": {"kv_dtype": ["fp16"]}}
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n")
    s = load_sweep(spec, base_dir=tmp_path)
    assert s.name == "mem" and s.anchor.parent == tmp_path.resolve()


@pytest.mark.parametrize("doc, pieces", [
    ({"base": BASE, "grdi": {}}, ["grdi: unknown key 'grdi'", "did you mean 'grid'", "valid keys:"]),
    ({"grid": {}}, ["exactly one of 'base'"]),
    ({"base": BASE, "base_file": "x.yaml"}, ["exactly one of 'base'"]),
    ({"base": BASE, "grid": {"kv_dtype": []}}, ["empty list"]),
    ({"base": BASE, "grid": {"name": ["a"]}}, ["cannot override 'name'"]),
    ({"base": BASE, "grid": {"variants.x": [1]}}, ["cannot override 'variants'"]),
    ({"base": BASE, "points": [{"name": "a"}, {"name": "a"}]}, ["used twice"]),
    ({"base": BASE, "points": [{"name": "bad name"}]}, ["must start with a letter or digit, then letters"]),
    ({"base": BASE, "points": [{"name": ".hidden"}]}, ["'.hidden' must start with a letter or digit"]),
    ({"base": BASE, "points": [{"kv_dtype": "fp8"}], "grid": {"kv_dtype": ["fp16"]}}, ["also a grid key"]),
    ({"base": BASE, "points": [{"kv_dtype": "fp8"}, {"kv_dtype": "fp8"}]}, ["listed twice"]),
    # set: of a grid key would apply to no point (QA, twenty-ninth session: silently overridden)
    ({"base": BASE, "set": {"kv_dtype": "fp8"}, "grid": {"kv_dtype": ["fp16", "bf16"]}},
     ["set: 'kv_dtype' is also a grid key"]),
])
def test_sweep_file_errors_name_the_file_and_key(tmp_path, doc, pieces):
    p = write(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        load_sweep(p)
    msg = str(e.value)
    assert str(p) in msg
    for piece in pieces:
        assert piece in msg


def test_invalid_points_name_sweep_point_and_key(tmp_path):
    p = write(tmp_path, {"base": BASE, "grid": {"allocator.block_size": [16, 1024], "kv_dtype": ["fp16", "fp7"]}})
    with pytest.raises(ConfigError) as e:
        load_sweep(p)
    msg = str(e.value)
    assert msg.startswith("3 invalid points:")
    bad = [line.strip() for line in msg.splitlines()[1:]]
    assert len(bad) == 3 and all(line.startswith(f"{p}: point ") for line in bad)
    assert any(re.search(r"point block_size-1024_kv_dtype-fp16-[0-9a-f]{8}: allocator\.block_size: ", b) for b in bad)
    assert any("kv_dtype: Input should be" in b and "fp7" in b for b in bad)


def test_unknown_override_key_and_impossible_capacity(tmp_path):
    p = write(tmp_path, {"base": dict(BASE, kv_budget={"tokens": 100}),
                         "points": [{"name": "typo", "allocator.blok_size": 4},
                                    {"name": "big", "allocator.block_size": 512}]})
    with pytest.raises(ConfigError) as e:
        load_sweep(p)
    msg = str(e.value)
    assert re.search(r"point typo-[0-9a-f]{8}: allocator\.blok_size: unknown key 'blok_size'", msg)
    assert "did you mean 'block_size'" in msg
    assert re.search(r"point big-[0-9a-f]{8}: kv_budget: .*less than one 512-token block", msg)


def test_bad_base_file(tmp_path):
    p = write(tmp_path, {"base_file": "missing.yaml"})
    with pytest.raises(ConfigError, match="missing.yaml: base scenario file not found"):
        load_sweep(p)
    write(tmp_path, {"trace": {"file": "x"}, "model": "GPT-9"}, "b.yaml")
    with pytest.raises(ConfigError, match=r"base_file b.yaml: model: unknown model preset 'GPT-9'"):
        load_sweep(write(tmp_path, {"base_file": "b.yaml"}))


def test_shipped_study_sweeps_validate():
    studies = sorted((REPO / "scenarios" / "studies").glob("*sweep*.yaml"))
    assert STUDY_SWEEP in studies and len(studies) >= 4
    for f in studies:
        assert load_sweep(f).points, f


def test_cli_dry_run_lists_points(tmp_path, capsys):
    rc = kvsim_main(["sweep", str(STUDY_SWEEP), "--set", "trace.end_s=60", "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0
    lines = out.out.strip().splitlines()
    assert len(lines) == 10 and lines[0].startswith("block_size-1-") and "allocator.block_size=1" in lines[0]
    assert "10 points, all valid" in out.err


@pytest.mark.parametrize("flag, value", [("--retries", "-1"), ("--jobs", "0")])
def test_bad_retries_or_jobs_are_refused_before_anything_is_written(tmp_path, capsys, flag, value):
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as e:
        kvsim_main(["sweep", str(STUDY_SWEEP), "--set", "trace.end_s=60", "--out", str(out), flag, value])
    assert e.value.code == 2 and f"{flag}: expected an integer" in capsys.readouterr().err.splitlines()[-1]
    assert not out.exists()


def test_a_trace_file_that_cannot_be_read_stops_the_sweep_before_any_point(tmp_path, capsys):
    """Every point would fail on it (and retry): one line naming the sweep, a point and the trace, exit 2,
    nothing written."""
    broken = tmp_path / "broken.csv.gz"
    broken.write_bytes((REPO / "traces" / "azure_conv_2023.csv.gz").read_bytes()[:2000])
    p = write(tmp_path, {"base": {**BASE, "trace": {"file": str(broken)}}, "grid": {"allocator.block_size": [16, 32]}})
    out = tmp_path / "o"
    assert kvsim_main(["sweep", str(p), "--out", str(out), "--jobs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvsim: error: {p}: point ") and f"trace.file: {broken}" in err[0]
    assert not out.exists()


def test_errors_name_the_sweeps_key(tmp_path):
    with pytest.raises(ConfigError, match=r"sweep.yaml: base_file: .*nope.yaml: base scenario file not found"):
        load_sweep(write(tmp_path, {"base_file": "nope.yaml", "grid": {"kv_dtype": ["fp16"]}}))
    with pytest.raises(ConfigError, match=r"sweep.yaml: base \(with set: trace.end_s\): trace.end_s: "):
        load_sweep(write(tmp_path, {"base": BASE, "set": {"trace.end_s": -5}, "grid": {"kv_dtype": ["fp16"]}}))


def test_a_ray_address_needs_the_ray_executor(tmp_path, capsys):
    out = tmp_path / "o"
    assert kvsim_main(["sweep", str(STUDY_SWEEP), "--out", str(out), "--address", "auto"]) == 2
    assert "--address auto: a Ray cluster address, for --executor ray only" in capsys.readouterr().err
    assert not out.exists()


def test_cli_invalid_sweep_exits_2(tmp_path, capsys):
    p = write(tmp_path, {"base": BASE, "grid": {"allocator.block_size": [0]}})
    assert kvsim_main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ") and "allocator.block_size" in err
    assert not (tmp_path / "o").exists()


def test_a_set_override_of_a_grid_key_is_refused(tmp_path):
    p = write(tmp_path, {"base": BASE, "grid": {"kv_dtype": ["fp16", "fp8"]}})
    with pytest.raises(ConfigError, match="--set 'kv_dtype' is also a grid key"):
        load_sweep(p, overrides=["kv_dtype=bf16"])
    assert len(load_sweep(p, overrides=["allocator.block_size=32"]).points) == 2
