"""engine_profile: defaults that follow an engine version (issue 22 item 2), one key away."""

import subprocess
import sys

from kvsim.config import Scenario, load_scenario
from kvsim.simulate import config_hash, resolved_dict

BASE = {"trace": {"file": "x.csv"}, "model": "Llama-2-7B"}


def test_the_default_profile_changes_nothing_and_keeps_old_hashes():
    plain, named = Scenario.model_validate(BASE), Scenario.model_validate({**BASE, "engine_profile": "kvsim"})
    assert plain == named and plain.scheduler.prompt_blocks == "at_admission"
    assert plain.allocator.watermark == 0.01 and not plain.allocator.prefix_caching
    d = resolved_dict(plain)
    assert "engine_profile" not in d and "prompt_blocks" not in d["scheduler"] and "reserve_full_isl" not in d["scheduler"]
    assert config_hash(plain) == config_hash(named)


def test_vllm_profile_sets_vllm_0_32_defaults_and_explicit_keys_win():
    s = Scenario.model_validate({**BASE, "engine_profile": "vllm-0.32"})
    assert (s.scheduler.chunked_prefill, s.scheduler.prompt_blocks, s.scheduler.reserve_full_isl) == (True, "per_chunk", True)
    assert (s.allocator.kind, s.allocator.watermark, s.allocator.prefix_caching) == ("paged", 0.0, True)
    assert s.scheduler.token_budget(4096) == 2048  # vLLM's default max_num_batched_tokens
    s = Scenario.model_validate({**BASE, "engine_profile": "vllm-0.32", "scheduler": {"chunked_prefill": False},
                                 "allocator": {"kind": "paged", "watermark": 0.05}})
    assert (s.scheduler.chunked_prefill, s.allocator.watermark, s.allocator.prefix_caching) == (False, 0.05, True)
    c = Scenario.model_validate({**BASE, "engine_profile": "vllm-0.32", "allocator": {"kind": "contiguous"}})
    assert c.allocator.kind == "contiguous" and c.scheduler.prompt_blocks == "per_chunk"
    assert resolved_dict(c)["engine_profile"] == "vllm-0.32"


def test_variants_inherit_the_profile(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("trace: {file: x.csv}\nmodel: Llama-2-7B\nengine_profile: vllm-0.32\n"
                 "variants:\n  old: {engine_profile: kvsim}\n  new: {}\n")
    runs = load_scenario(f).runs
    assert runs["new"].allocator.prefix_caching and runs["new"].scheduler.prompt_blocks == "per_chunk"
    assert not runs["old"].allocator.prefix_caching and runs["old"].scheduler.prompt_blocks == "at_admission"


def test_an_unknown_profile_is_one_line_naming_the_choices(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("trace: {file: x.csv}\nmodel: Llama-2-7B\nengine_profile: vllm-0.1\n")
    r = subprocess.run([sys.executable, "-m", "kvsim", "validate", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "engine_profile" in r.stderr and "vllm-0.32" in r.stderr and "kvsim" in r.stderr
