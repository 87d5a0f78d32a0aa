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
from kvsim.hw import GPUS
from kvsim.config.resolved import config_hash, resolved_dict

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


def test_the_default_is_vllm_v1_and_vllm_0_32_adds_async_scheduling():
    plain = Scenario.model_validate(BASE)
    assert DEFAULT_PROFILE == "vllm-v1" and plain.engine_profile == "vllm-v1"
    assert plain == Scenario.model_validate({**BASE, "engine_profile": "vllm-v1"})
    assert plain.scheduler.async_scheduling is False
    v032 = Scenario.model_validate({**BASE, "engine_profile": "vllm-0.32"})
    assert v032.scheduler.async_scheduling is True
    sync = Scenario.model_validate({**BASE, "engine_profile": "vllm-0.32", "scheduler": {"async_scheduling": False}})
    assert resolved_dict(sync) == {**resolved_dict(plain), "engine_profile": "vllm-0.32"}
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
    assert (old.timing.attention_backend, v06.timing.attention_backend) == ("auto-2023", "auto-vllm-v0")
    # vLLM v0 runs prompt-only steps; v1 (the default) and kvsim's own defaults mix prompts into decodes
    assert old.scheduler.prefill_only_steps and v06.scheduler.prefill_only_steps
    assert not Scenario.model_validate(BASE).scheduler.prefill_only_steps
    assert not Scenario.model_validate({**BASE, "engine_profile": "kvsim"}).scheduler.prefill_only_steps
    # v0 (0.5-0.6) budget: max(max_model_len, 2048), whatever the GPU; Llama-2-7B's context is 4096
    assert old.scheduler.max_num_batched_tokens == v06.scheduler.max_num_batched_tokens == 4096
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


# -- batch limits derived from the GPU (vLLM's EngineArgs.get_batch_defaults, `vllm serve`) --------------

def _sched(gpu, **extra):
    s = Scenario.model_validate({**BASE, "gpu": gpu, **extra})
    return s, s.scheduler.max_num_batched_tokens, s.scheduler.max_num_seqs


def test_vllm_v1_batch_limits_follow_the_gpu_as_vllm_serve_picks_them():
    # >= 70 GiB and not an A100: 8192 tokens, 1024 sequences; an A100 or a smaller GPU: 2048 / 256
    for gpu in ("H100-SXM-80GB", "H100-PCIe-80GB", "H200-141GB"):
        assert _sched(gpu)[1:] == (8192, 1024), gpu
    for gpu in ("A100-40GB", "A100-80GB", "L40S"):
        assert _sched(gpu)[1:] == (2048, 256), gpu
    # >= 160 GiB (B200-class, no preset): 16384 / 1024. The device name vLLM tests is the preset's: a
    # renamed A100 is still an A100; a GPU of your own (no preset) is judged by its own name
    big = {"preset": "H200-141GB", "name": "B200-180GB", "memory_bytes": 180 * 2**30}
    assert _sched(big)[1:] == (16384, 1024)
    assert _sched({"preset": "A100-80GB", "name": "A800-80GB"})[1:] == (2048, 256)
    own = {k: v for k, v in GPUS["A100-80GB"].to_dict().items() if k != "preset"}
    assert _sched({**own, "name": "A800-80GB"})[1:] == (8192, 1024)
    assert _sched({**own, "name": "my-A100"})[1:] == (2048, 256)
    assert _sched({"preset": "H100-SXM-80GB", "name": "H100-64GB", "memory_bytes": 64 * 2**30})[1:] == (2048, 256)
    # vllm-0.32 inherits the rule, kvsim fills nothing, vllm-v0.6 does not look at the GPU
    assert _sched("H100-SXM-80GB", engine_profile="vllm-0.32")[1:] == (8192, 1024)
    assert _sched("H100-SXM-80GB", engine_profile="kvsim")[1:] == (None, 256)
    assert _sched("H100-SXM-80GB", engine_profile="vllm-v0.6")[1:] == (4096, 256)


def test_vllm_v1_batch_limits_adjust_to_the_model_and_explicit_values_win():
    # without chunked prefill a whole prompt must fit: at least max_model_len (Llama-3.1-8B: 131072)
    s, tokens, _ = _sched("H100-SXM-80GB", model="Llama-3.1-8B", scheduler={"chunked_prefill": False})
    assert tokens == 131072 and s.scheduler.token_budget(131072) == 131072
    # a default budget is at most max_num_seqs x max_model_len; a default max_num_seqs at most the budget
    assert _sched("H100-SXM-80GB", model={"preset": "Llama-2-7B", "max_model_len_tokens": 512},
                  scheduler={"max_num_seqs": 4})[1:] == (2048, 4)
    assert _sched("H100-SXM-80GB", scheduler={"max_num_batched_tokens": 512})[1:] == (512, 512)
    s, tokens, seqs = _sched("H100-SXM-80GB", scheduler={"max_num_batched_tokens": 4096, "max_num_seqs": 64})
    assert (tokens, seqs) == (4096, 64)
    assert not any(k.startswith("scheduler.max_num") for k in s.profile_filled()["filled"])
    # vllm-v0.6 with chunked prefill: vLLM 0.5-0.6's SchedulerConfig took 512
    assert _sched("A100-80GB", engine_profile="vllm-v0.6", scheduler={"chunked_prefill": True})[1] == 512


def test_the_derived_limits_are_recorded_with_their_source():
    s, _, _ = _sched("H100-SXM-80GB")
    filled, sources = s.profile_filled()["filled"], s.profile_sources()
    assert (filled["scheduler.max_num_batched_tokens"], filled["scheduler.max_num_seqs"]) == (8192, 1024)
    src = sources["scheduler.max_num_batched_tokens"]
    assert "get_batch_defaults" in src and "OPENAI_API_SERVER" in src and "H100-SXM-80GB" in src
    assert set(sources) == set(filled) and all(sources.values())
    assert resolved_dict(s)["scheduler"]["max_num_batched_tokens"] == 8192
    a100 = _sched("A100-80GB")[0]
    assert "A100" in a100.profile_sources()["scheduler.max_num_batched_tokens"]


def test_variants_derive_their_own_limits(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("trace: {file: x.csv}\nmodel: Llama-2-7B\ngpu: A100-80GB\n"
                 "variants:\n  a100: {}\n  h100: {gpu: H100-SXM-80GB}\n  pinned: {gpu: H100-SXM-80GB, "
                 "scheduler: {max_num_batched_tokens: 2048}}\n")
    runs = load_scenario(f).runs
    assert {n: r.scheduler.token_budget(4096) for n, r in runs.items()} == {"a100": 2048, "h100": 8192, "pinned": 2048}
    assert runs["pinned"].scheduler.max_num_seqs == 1024  # the H100 tier's, the budget being given


class _FakeGPU:
    """vLLM's current_platform as get_batch_defaults reads it, on an NVIDIA GPU."""

    def __init__(self, name: str, memory_bytes: int):
        self.name, self.memory_bytes = name, memory_bytes

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return self.memory_bytes

    def get_device_name(self, device_id: int = 0) -> str:
        return self.name

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


def _vllm_serve_defaults(monkeypatch, gpu, max_model_len, chunked, seqs, tokens):
    """What the installed vLLM's EngineArgs sets for `vllm serve` on ``gpu`` (its own code, run on a
    stand-in platform and model config)."""
    import types

    import vllm.engine.arg_utils as au
    from vllm.usage.usage_lib import UsageContext

    monkeypatch.setattr(au, "current_platform", _FakeGPU(f"NVIDIA {gpu.name}", gpu.memory_bytes))
    args = au.EngineArgs.__new__(au.EngineArgs)  # only the fields the method reads
    args.pipeline_parallel_size = args.tensor_parallel_size = 1
    args.max_num_batched_tokens, args.max_num_seqs, args.enable_chunked_prefill = tokens, seqs, chunked
    args.performance_mode = "balanced"
    model = types.SimpleNamespace(max_model_len=max_model_len, is_multimodal_model=False, is_mm_prefix_lm=False)
    args._set_default_max_num_seqs_and_batched_tokens_args(
        UsageContext.OPENAI_API_SERVER, model, types.SimpleNamespace(use_batched_dp_moe=False))
    return args.max_num_batched_tokens, args.max_num_seqs


def test_vllm_v1_batch_limits_match_the_installed_vllm(monkeypatch):
    pytest.importorskip("vllm")

    gpus = [*GPUS.values(), dataclasses.replace(GPUS["H200-141GB"], name="B200-180GB", memory_bytes=180 * 2**30)]
    checked = 0
    for gpu in gpus:
        for mml in (512, 4096, 131072):
            for chunked in (True, False):
                for seqs, tokens in ((None, None), (4, None), (None, 1024), (64, 256)):
                    sched = {"chunked_prefill": chunked, **({"max_num_seqs": seqs} if seqs else {}),
                             **({"max_num_batched_tokens": tokens} if tokens else {})}
                    s = Scenario.model_validate({**BASE, "gpu": gpu.to_dict(), "scheduler": sched,
                                                 "model": {"preset": "Llama-2-7B", "max_model_len_tokens": mml}})
                    want = _vllm_serve_defaults(monkeypatch, gpu, mml, chunked, seqs, tokens)
                    assert (s.scheduler.token_budget(mml), s.scheduler.max_num_seqs) == want, (gpu.name, sched, mml)
                    checked += 1
    assert checked == len(gpus) * 24


@pytest.mark.parametrize("gpu", ["A100-40GB", "H100-SXM-80GB"])
def test_sglang_without_chunked_prefill_fills_no_chunk_budget(gpu):
    """QA (thirtieth session): sglang with chunked_prefill: false filled the GPU's chunk size (4096 on
    an A100-40GB) and refused an 8192-token model. SGLang with --chunked-prefill-size -1 takes a
    batch's first prompt whole and bounds the rest by max_prefill_tokens (16384)."""
    base = {**BASE, "engine_profile": "sglang", "gpu": gpu, "model": "Llama-3-8B"}
    s = Scenario.model_validate({**base, "scheduler": {"chunked_prefill": False}})
    assert s.scheduler.max_num_batched_tokens == 16384
    assert s.profile_filled()["filled"]["scheduler.max_num_batched_tokens"] == 16384
    long = Scenario.model_validate({**base, "model": {"preset": "Llama-3-8B", "max_model_len_tokens": 32768},
                                    "scheduler": {"chunked_prefill": False, "max_prefill_tokens": 1000}})
    assert long.scheduler.max_num_batched_tokens == 32768
    chunked = Scenario.model_validate(base)
    assert chunked.scheduler.max_num_batched_tokens == (4096 if gpu == "A100-40GB" else 8192)


def test_sglang_with_paged_allocator_keeps_its_prefix_cache_and_no_watermark():
    """QA (thirtieth session): allocator kind paged under sglang fell back to kvsim's prefix_caching
    false and watermark 0.01; SGLang with page_size > 1 keeps its radix cache and no watermark."""
    s = Scenario.model_validate({**BASE, "engine_profile": "sglang", "allocator": {"kind": "paged"}})
    assert (s.allocator.prefix_caching, s.allocator.watermark) == (True, 0.0)
    filled = s.profile_filled()["filled"]
    assert filled["allocator.prefix_caching"] is True and filled["allocator.watermark"] == 0.0
    own = Scenario.model_validate({**BASE, "engine_profile": "sglang",
                                   "allocator": {"kind": "paged", "prefix_caching": False, "watermark": 0.02}})
    assert (own.allocator.prefix_caching, own.allocator.watermark) == (False, 0.02)


def test_vllm_v06_notes_its_long_context_chunked_prefill_default():
    """QA (thirtieth session): vLLM 0.5-0.6 turns chunked prefill on for max_model_len > 32K; the
    profile keeps it off and says so in one note (not when the scenario sets the key)."""
    long = {**BASE, "engine_profile": "vllm-v0.6", "model": {"preset": "Llama-3-8B", "max_model_len_tokens": 65536}}
    notes = Scenario.model_validate(long).notes()
    assert len(notes) == 1 and "max_model_len > 32K" in notes[0] and "chunked_prefill: true" in notes[0]
    assert Scenario.model_validate({**long, "scheduler": {"chunked_prefill": False}}).notes() == []
    assert Scenario.model_validate({**BASE, "engine_profile": "vllm-v0.6", "model": "Llama-3-8B"}).notes() == []
    assert Scenario.model_validate({**long, "engine_profile": "vllm-v1"}).notes() == []
