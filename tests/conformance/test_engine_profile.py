"""engine_profile: defaults that follow an engine and version (issue 22 item 2, issue 23 item 5).

The default profile (vllm-v1) is checked against the defaults of the vLLM it names, read from the
installed wheel where vLLM is importable (the conformance venv); kvsim's own older defaults stay one
key away (``engine_profile: kvsim``) with the resolved form and hash they had before profiles."""

import dataclasses
import subprocess
import sys

import pytest

from kvsim.config import Scenario, load_scenario
from kvsim.config.profiles import DEFAULT_PROFILE, PROFILES, profile_fills
from kvsim.simulate import config_hash, resolved_dict

BASE = {"trace": {"file": "x.csv"}, "model": "Llama-2-7B"}


def test_the_kvsim_profile_is_the_old_default_with_its_old_resolved_form():
    s = Scenario.model_validate({**BASE, "engine_profile": "kvsim"})
    assert s.profile_filled() == {"name": "kvsim", "filled": {}}
    assert (s.scheduler.chunked_prefill, s.scheduler.prompt_blocks) == (False, "at_admission")
    assert s.allocator.watermark == 0.01 and not s.allocator.prefix_caching
    assert (s.timing.attention_backend, s.timing.step_overhead_s) == ("auto", 0.002)
    d = resolved_dict(s)
    # the resolved form before engine profiles existed: no engine_profile key, no issue-22 scheduler keys
    assert "engine_profile" not in d and "prompt_blocks" not in d["scheduler"] and "reserve_full_isl" not in d["scheduler"]
    assert config_hash(s) != config_hash(Scenario.model_validate(BASE))  # the default moved


def test_the_default_is_vllm_v1_and_vllm_0_32_is_the_same_today():
    plain = Scenario.model_validate(BASE)
    assert DEFAULT_PROFILE == "vllm-v1" and plain.engine_profile == "vllm-v1"
    assert plain == Scenario.model_validate({**BASE, "engine_profile": "vllm-v1"})
    alias = Scenario.model_validate({**BASE, "engine_profile": "vllm-0.32"})
    assert resolved_dict(alias) == {**resolved_dict(plain), "engine_profile": "vllm-0.32"}
    assert (plain.scheduler.chunked_prefill, plain.scheduler.prompt_blocks, plain.scheduler.reserve_full_isl) == \
        (True, "per_chunk", True)
    assert (plain.allocator.kind, plain.allocator.watermark, plain.allocator.prefix_caching) == ("paged", 0.0, True)
    assert plain.scheduler.token_budget(4096) == 2048
    assert plain.timing.attention_backend == "auto-flashattention"


def test_vllm_v1_matches_the_installed_vllm_defaults():
    pytest.importorskip("vllm")
    from vllm.config.cache import CacheConfig
    from vllm.config.scheduler import SchedulerConfig as VSched

    sched = {f.name: f.default for f in dataclasses.fields(VSched)}
    cache = {f.name: f.default for f in dataclasses.fields(CacheConfig)}
    default = lambda v: getattr(v, "default", v)  # pydantic FieldInfo or a plain default  # noqa: E731
    s = Scenario.model_validate(BASE)
    assert s.scheduler.chunked_prefill is default(sched["enable_chunked_prefill"])
    assert s.scheduler.reserve_full_isl is default(sched["scheduler_reserve_full_isl"])
    assert s.scheduler.token_budget(s.model.max_model_len_tokens) == default(sched["max_num_batched_tokens"])
    assert s.allocator.prefix_caching is default(cache["enable_prefix_caching"])


def test_explicit_keys_win_and_only_left_out_keys_are_recorded():
    s = Scenario.model_validate({**BASE, "scheduler": {"chunked_prefill": False},
                                 "allocator": {"kind": "paged", "watermark": 0.05},
                                 "timing": {"kind": "analytical", "attention_backend": "vllm-paged-v2"}})
    assert (s.scheduler.chunked_prefill, s.allocator.watermark, s.allocator.prefix_caching) == (False, 0.05, True)
    assert s.timing.attention_backend == "vllm-paged-v2"
    filled = s.profile_filled()["filled"]
    assert "scheduler.chunked_prefill" not in filled and "allocator.watermark" not in filled
    assert "timing.attention_backend" not in filled and filled["allocator.prefix_caching"] is True
    c = Scenario.model_validate({**BASE, "allocator": {"kind": "contiguous"}})
    assert c.allocator.kind == "contiguous" and c.scheduler.prompt_blocks == "per_chunk"
    assert "allocator.prefix_caching" not in c.profile_filled()["filled"]  # a paged-only key
    k = Scenario.model_validate({**BASE, "timing": {"kind": "constant", "step_s": 0.01}})
    assert not any(key.startswith("timing.") for key in k.profile_filled()["filled"])  # analytical only


def test_profiles_inherit_and_override():
    old = Scenario.model_validate({**BASE, "engine_profile": "vllm-2023"})
    v06 = Scenario.model_validate({**BASE, "engine_profile": "vllm-v0.6"})
    assert (old.allocator.watermark, old.allocator.prefix_caching, old.scheduler.prompt_blocks) == \
        (v06.allocator.watermark, v06.allocator.prefix_caching, v06.scheduler.prompt_blocks) == (0.01, False, "at_admission")
    assert (old.timing.attention_backend, v06.timing.attention_backend) == ("auto-2023", "flashattention-paged")
    # vLLM v0 runs prompt-only steps; v1 (the default) and kvsim's own defaults mix prompts into decodes
    assert old.scheduler.prefill_only_steps and v06.scheduler.prefill_only_steps
    assert not Scenario.model_validate(BASE).scheduler.prefill_only_steps
    assert not Scenario.model_validate({**BASE, "engine_profile": "kvsim"}).scheduler.prefill_only_steps
    assert old.scheduler.max_num_batched_tokens is None and old.scheduler.token_budget(2048) == 2048
    sg = Scenario.model_validate({**BASE, "engine_profile": "sglang"})
    assert (sg.allocator.kind, sg.allocator.block_size, sg.scheduler.token_budget(4096)) == ("radix", 1, 8192)
    assert sg.timing.step_overhead_s == 0.0
    for name in PROFILES:  # every value of every profile names its source
        assert all(f.source for f in profile_fills(name).values()), name


def test_variants_inherit_the_profile(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("trace: {file: x.csv}\nmodel: Llama-2-7B\nengine_profile: vllm-v1\n"
                 "variants:\n  old: {engine_profile: kvsim}\n  new: {}\n")
    runs = load_scenario(f).runs
    assert runs["new"].allocator.prefix_caching and runs["new"].scheduler.prompt_blocks == "per_chunk"
    assert not runs["old"].allocator.prefix_caching and runs["old"].scheduler.prompt_blocks == "at_admission"
    assert runs["old"].profile_filled()["filled"] == {}


def test_an_unknown_profile_is_one_line_naming_file_key_and_choices(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("trace: {file: x.csv}\nmodel: Llama-2-7B\nengine_profile: vllm-0.1\n")
    r = subprocess.run([sys.executable, "-m", "kvsim", "validate", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert str(f) in r.stderr and "engine_profile" in r.stderr
    assert all(name in r.stderr for name in PROFILES)


@pytest.mark.parametrize("gpu,budget", [
    ("H200-141GB", 8192), ("H100-SXM-80GB", 8192), ("A100-80GB", 8192), ("A100-40GB", 4096), ("L40S", 4096),
    ({"preset": "L40S", "memory_bytes": 24 << 30}, 2048), ({"preset": "H200-141GB", "memory_bytes": 192 << 30}, 16384),
])
def test_sglang_chunk_size_follows_the_gpu_memory(gpu, budget):
    # SGLang v0.5.7 ServerArgs._handle_gpu_memory_settings: chunked_prefill_size by GPU memory
    s = Scenario.model_validate({**BASE, "engine_profile": "sglang", "gpu": gpu})
    assert s.scheduler.max_num_batched_tokens == budget
    assert s.profile_filled()["filled"]["scheduler.max_num_batched_tokens"] == budget
    assert (s.scheduler.mixed_chunk, s.scheduler.prefill_only_steps, s.scheduler.max_prefill_tokens) == \
        (False, True, 16384)
    own = Scenario.model_validate({**BASE, "engine_profile": "sglang", "gpu": gpu,
                                   "scheduler": {"max_num_batched_tokens": 1000}})
    assert own.scheduler.max_num_batched_tokens == 1000  # an explicit key wins
    assert "scheduler.max_num_batched_tokens" not in own.profile_filled()["filled"]


def test_only_sglang_runs_prompt_only_chunked_steps():
    for name in PROFILES:
        s = Scenario.model_validate({**BASE, "engine_profile": name})
        assert s.scheduler.mixed_chunk is (name != "sglang"), name
        assert (s.scheduler.max_prefill_tokens is None) is (name != "sglang"), name
        if name != "sglang":
            assert "mixed_chunk" not in resolved_dict(s)["scheduler"], name
