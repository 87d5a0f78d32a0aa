"""A GPU derived from a preset keeps that preset (``gpu.preset``) whatever it is called: the GEMM
profile, DRAM latency, CUDA-visible memory, vLLM's batch tier and FP8 tensor cores follow the preset,
never the display name (docs/models.md, "Choosing a GPU"). A GPU of your own keeps the fallbacks."""

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvsim.api import run
from kvsim.config import Scenario, load_scenario
from kvsim.config.sections import GPUConfig
from kvsim.errors import ConfigError
from kvsim.hw import GPUS
from kvsim.models.memory import CUDA_TOTAL
from kvsim.config.resolved import resolved_dict
from kvsim.timing import gemm
from kvsim.timing.gpu_memory import FALLBACK_GPU, dram_latency_s
from kvsim.timing.moe_kernel import peak_flops_s

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "traces" / "azure_conv_2023.csv.gz"


def scenario_file(tmp_path, gpu="A100-80GB", **over):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "trace": {"file": str(TRACE), "max_requests": 60, "rate_scale": 20},
                                 "model": "Llama-3.1-8B", "gpu": gpu, "kv_dtype": "bf16", "weight_dtype": "bf16",
                                 **over}))
    return f


def own_gpu(name: str, memory_gib: int = 80) -> dict:
    """Every field of A100-80GB, under ``name``: a GPU of your own (no preset:)."""
    d = {k: v for k, v in GPUS["A100-80GB"].to_dict().items() if k != "preset"}
    return {**d, "name": name, "memory_bytes": memory_gib * 2**30}


def test_three_spellings_of_a_renamed_preset_simulate_identically(tmp_path):
    """The QA case: Llama-3.1-8B on A100-80GB as `gpu: A100-80GB`, `--set gpu.name=my-gpu` and
    `gpu: {preset: A100-80GB, name: A100-80GB-rack2}` (was: TPOT, KV capacity and batch limits changed
    with the name). Requests and summaries are equal; only the name (and the preset it records) differ."""
    plain = load_scenario(scenario_file(tmp_path))
    renamed = load_scenario(scenario_file(tmp_path), ["gpu.name=my-gpu"])
    mapping = load_scenario(scenario_file(tmp_path, gpu={"preset": "A100-80GB", "name": "A100-80GB-rack2"}))
    results = [run(s) for s in (plain, renamed, mapping)]
    assert [r.scenario.gpu.name for r in results] == ["A100-80GB", "my-gpu", "A100-80GB-rack2"]
    assert {r.scenario.gpu.preset for r in results} == {"A100-80GB"}
    ref = results[0]
    assert (ref.scenario.scheduler.max_num_batched_tokens, ref.scenario.scheduler.max_num_seqs) == (2048, 256)
    for r in results[1:]:
        pd.testing.assert_frame_equal(r.requests, ref.requests)
        pd.testing.assert_frame_equal(r.steps, ref.steps)
        assert r.summary == ref.summary
        assert r.scenario.kv_budget_bytes() == ref.scenario.kv_budget_bytes()
        # the resolved scenario shows the user's name, and the preset it came from
        got, want = resolved_dict(r.scenario), resolved_dict(ref.scenario)
        assert got["gpu"].pop("name") == r.scenario.gpu.name and got["gpu"].pop("preset") == "A100-80GB"
        want["gpu"].pop("name")
        assert got == want


@pytest.mark.parametrize("preset,profile", [("A100-80GB", "a100"), ("A100-40GB", "a100"), ("H100-SXM-80GB", "h100"),
                                            ("H200-141GB", "h100"), ("L40S", "generic")])
def test_lookups_follow_the_preset_not_the_name(preset, profile):
    gpu = dataclasses.replace(GPUS[preset], name="rack2")
    assert gpu.preset == preset
    assert gemm.profile_for(gpu) is gemm.profile_for(GPUS[preset]) and gemm.profile_for(gpu).name == profile
    assert dram_latency_s(gpu.preset) == dram_latency_s(preset)
    fp8 = preset.startswith(("H1", "H2", "L40S"))
    assert peak_flops_s(gpu, True) == GPUS[preset].bf16_flops_per_s * (2.0 if fp8 else 1.0)


def test_a_gpu_of_your_own_keeps_the_fallbacks(tmp_path):
    """No preset: the generic GEMM profile, the A100's DRAM latency, its own memory_bytes, vLLM's
    tier by its own name; named exactly like a preset it is that preset (old resolved scenarios)."""
    mine = load_scenario(scenario_file(tmp_path, gpu=own_gpu("mine"))).base
    spec = mine.gpu_spec()
    assert spec.preset == "" and gemm.profile_for(spec) is gemm.GENERIC
    assert dram_latency_s(spec.preset) == dram_latency_s(FALLBACK_GPU)
    assert mine.usable_memory_bytes() == spec.memory_bytes  # vllm reserve: no CUDA total printed for it
    assert (mine.scheduler.max_num_batched_tokens, mine.scheduler.max_num_seqs) == (8192, 1024)  # not "a100"
    a100 = load_scenario(scenario_file(tmp_path, gpu=own_gpu("my-a100"))).base
    assert (a100.scheduler.max_num_batched_tokens, a100.scheduler.max_num_seqs) == (2048, 256)
    old = load_scenario(scenario_file(tmp_path, gpu=own_gpu("A100-80GB"))).base
    assert old.gpu.preset == "A100-80GB" and "preset" not in resolved_dict(old)["gpu"]


def test_a_renamed_h100_keeps_its_batch_tier_and_memory(tmp_path):
    s = load_scenario(scenario_file(tmp_path, gpu="H100-SXM-80GB"), ["gpu.name=my-a100-lookalike"]).base
    assert (s.scheduler.max_num_batched_tokens, s.scheduler.max_num_seqs) == (8192, 1024)
    assert s.usable_memory_bytes() == CUDA_TOTAL["H100-SXM-80GB"][0]
    assert "my-a100-lookalike (preset H100-SXM-80GB)" in s.profile_sources()["scheduler.max_num_batched_tokens"]


def test_overrides_keep_the_preset_and_its_measured_data(tmp_path):
    """A preset with other hardware fields is still that part: its GEMM profile and DRAM latency, at
    the overridden peaks; an overridden memory_bytes is counted as given (no CUDA-visible total)."""
    s = load_scenario(scenario_file(tmp_path, gpu={"preset": "A100-80GB", "hbm_bandwidth_bytes_per_s": 3e12,
                                                   "memory_bytes": "96 GiB"})).base
    spec = s.gpu_spec()
    assert (spec.preset, spec.name, spec.hbm_bandwidth_bytes_per_s) == ("A100-80GB", "A100-80GB", 3e12)
    assert gemm.profile_for(spec).name == "a100"
    assert s.usable_memory_bytes() == 96 * 2**30
    assert (s.scheduler.max_num_batched_tokens, s.scheduler.max_num_seqs) == (2048, 256)  # still an A100


def test_resolved_form_loads_back_to_the_same_preset(tmp_path):
    for sets in ([], ["gpu.name=my-gpu"], ["gpu.preset=h200-141gb", "gpu.name=x"]):
        s = load_scenario(scenario_file(tmp_path), sets).base
        again = Scenario.model_validate(resolved_dict(s))
        assert again.gpu == s.gpu and resolved_dict(again) == resolved_dict(s)


def test_preset_is_checked(tmp_path):
    f = scenario_file(tmp_path)
    with pytest.raises(ConfigError) as e:
        load_scenario(f, ["gpu.preset=B300"])
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg and "gpu.preset" in msg and "valid presets: A100-40GB" in msg
    with pytest.raises(ValueError, match="unknown gpu preset 'B300'.*valid presets"):
        GPUConfig(**{**GPUS["A100-80GB"].to_dict(), "preset": "B300"})
    assert GPUConfig(**{**GPUS["A100-80GB"].to_dict(), "preset": "a100-80gb"}).preset == "A100-80GB"


def test_docs_gpu_examples_validate():
    """docs/models.md "Choosing a GPU": every example line is a GPU kvsim reads as the text says."""
    doc = (ROOT / "docs" / "models.md").read_text()
    block = doc.split("## Choosing a GPU", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    gpus = [yaml.safe_load(line.split("#", 1)[0])["gpu"] for line in block.splitlines()]
    got = [Scenario.model_validate({"trace": {"file": "x.csv"}, "model": "Llama-3-8B", "gpu": g}).gpu for g in gpus]
    assert [(g.name, g.preset) for g in got] == [("H100-SXM-80GB", "H100-SXM-80GB"), ("A100-80GB-rack2", "A100-80GB"),
                                                  ("H200-141GB", "H200-141GB"), ("mine", "")]
