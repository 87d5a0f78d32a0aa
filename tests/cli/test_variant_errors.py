"""An error in one variant names it, and an error a ``--set`` argument caused names that argument
first (docs/scenario.md), at validation and when a run is built (``kvsim validate``/``run``): one line."""

from __future__ import annotations

import pytest
import yaml

import kvsim
from kvsim.cli import main
from kvsim.config import load_scenario
from kvsim.errors import ConfigError

BASE = {
    "name": "v",
    "trace": {"synthetic": {"preset": "sharegpt", "num_requests": 20,
                            "arrival": {"process": "poisson", "rate_per_s": 4.0}}, "length_policy": "cap"},
    "model": "Llama-3-8B", "gpu": "A100-40GB", "kv_budget": {"tokens": 6000},
    "allocator": {"kind": "paged", "block_size": 16},
}


def _write(tmp_path, **extra) -> str:
    p = tmp_path / "v.yaml"
    p.write_text(yaml.safe_dump({**BASE, **extra}, sort_keys=False))
    return str(p)


def test_a_set_error_names_every_variant_it_breaks(tmp_path):
    path = _write(tmp_path, variants={"paged": {}, "cmax": {"allocator": {"kind": "contiguous"}},
                                      "cpow2": {"allocator": {"kind": "contiguous", "reservation": "pow2"}}})
    with pytest.raises(ConfigError) as e:
        load_scenario(path, ["allocator.block_size=32"])
    assert str(e.value) == (f"--set allocator.block_size=32 (applied to {path}, variants cmax, cpow2): "
                            "allocator.block_size: unknown key 'block_size'; valid keys: kind, placement, reservation")


def test_a_set_error_in_one_variant_names_it(tmp_path):
    path = _write(tmp_path, variants={"paged": {}, "cmax": {"allocator": {"kind": "contiguous"}}})
    with pytest.raises(ConfigError, match=rf"^--set allocator.block_size=32 \(applied to {path}, variant cmax\): "
                                          r"allocator.block_size: unknown key"):
        load_scenario(path, ["allocator.block_size=32"])


def test_a_variant_refused_when_its_run_is_built_is_named(tmp_path, capsys):
    path = _write(tmp_path, host_link="pcie-gen5-x16", variants={
        "link": {"allocator.offload": {"cpu": {"capacity_bytes": "4GiB"}}},
        "slowbw": {"allocator.offload": {"cpu": {"capacity_bytes": "4GiB", "bandwidth_bytes_per_s": "1MB/s"}}}})
    expected = f"{path}: variants.slowbw: give host_link or allocator.offload.cpu.bandwidth_bytes_per_s, not both"
    assert main(["validate", path]) == 2
    assert capsys.readouterr().err.startswith(f"kvsim: error: {expected}")
    with pytest.raises(ConfigError, match=f"^{expected}"):
        kvsim.run(path)


@pytest.mark.parametrize("variants, applied", [(None, ""), ({"a": {}, "b": {}}, ", variant a")])
def test_a_set_value_refused_when_the_run_is_built_names_the_set_argument(tmp_path, capsys, variants, applied):
    path = _write(tmp_path, **({"variants": variants} if variants else {}))
    assert main(["validate", path, "--set", "kv_budget.tokens=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvsim: error: --set kv_budget.tokens=1 (applied to {path}{applied}): kv_budget: "
                          "131072 bytes hold 1 tokens"), err
    assert "\n" not in err
