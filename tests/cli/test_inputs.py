"""Inputs as people write them: units and scientific notation in scenarios, sweep files, generator
specs and ``--set`` (docs/scenario.md, "Numbers and units"), and a bad ``--set`` value blamed on the
``--set`` argument, not on the file: one line, exit 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.config import load_scenario
from kvsim.errors import ConfigError
from kvsim.sweep.spec import load_sweep
from kvsim.trace.spec import SyntheticTraceSpec

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """\
trace: {file: %s, end_s: 60}
model: Llama-3-8B
gpu: {preset: A100-80GB, hbm_bandwidth_bytes_per_s: 2.039 TB/s, memory_bytes: 80 GiB}
kv_budget: {bytes: 16 GiB, activation_reserve_bytes: 1e9}
scheduler: {swap_space_bytes: 4e9, max_num_batched_tokens: 8K}
allocator:
  kind: paged
  block_size: 16
  prefix_caching: true
  offload: {ssd: {capacity_bytes: 1.0e12, bandwidth_bytes_per_s: 7 GB/s}}
timing: {kind: analytical, host_link_bandwidth_bytes_per_s: 64.0e9}
"""


@pytest.fixture()
def scenario(tmp_path):
    p = tmp_path / "units.yaml"
    p.write_text(SCENARIO % (ROOT / "traces" / "azure_conv_2023.csv.gz"))
    return p


def kvsim(*args):
    return subprocess.run([sys.executable, "-m", "kvsim", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_units_in_a_scenario_are_exact(scenario):
    s = load_scenario(scenario).base
    assert s.kv_budget.bytes == 16 * 2**30 and s.kv_budget.activation_reserve_bytes == 10**9
    assert s.gpu.memory_bytes == 80 * 2**30 and s.gpu.hbm_bandwidth_bytes_per_s == 2.039e12
    assert s.scheduler.swap_space_bytes == 4 * 10**9 and s.scheduler.max_num_batched_tokens == 8192
    assert s.allocator.offload.ssd.capacity_bytes == 10**12 and s.allocator.offload.ssd.bandwidth_bytes_per_s == 7e9
    assert type(s.kv_budget.bytes) is int


def test_set_takes_units(scenario):
    s = load_scenario(scenario, ["kv_budget.bytes=null", "kv_budget.tokens=128k",
                                 "model.max_model_len_tokens=128K"]).base
    assert s.kv_budget.tokens == 128_000 and s.model.max_model_len_tokens == 131_072


def test_docs_example_tier_line_validates(scenario):
    """docs/scenario.md's own example (capacity_bytes: 1.0e12) used to fail."""
    doc = (ROOT / "docs" / "scenario.md").read_text()
    line = next(ln for ln in doc.splitlines() if "ssd: {capacity_bytes: 1.0e12" in ln)
    value = line.split("ssd:", 1)[1].split("#", 1)[0].strip()
    s = load_scenario(scenario, [f"allocator.offload.ssd={value}"]).base
    assert s.allocator.offload.ssd.capacity_bytes == 10**12


def test_docs_reference_scenario_validates(tmp_path):
    """docs/scenario.md's reference block (every section, its variants) is a scenario that validates, with
    the defaults it names where it names one."""
    doc = (ROOT / "docs" / "scenario.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    f = tmp_path / "ref.yaml"
    f.write_text(block.replace("../traces/", f"{ROOT / 'traces'}/"))
    loaded = load_scenario(f)
    s = loaded.base
    assert s.trace.start_s is None and s.allocator.offload is not None and len(loaded.runs) >= 2
    # the block is the defaults: swaps go over the GPU's link, not the legacy size-independent rate
    assert "host_link_bandwidth_bytes_per_s" not in s.timing.model_fields_set
    assert s.default_link_name() == s.gpu.host_link != ""


def test_null_unsets_the_legacy_link_rate(scenario):
    """``--set timing.host_link_bandwidth_bytes_per_s=null`` unsets the key the file gives (it was
    "Input should be a valid number"): the GPU's link prices swaps again."""
    s = load_scenario(scenario, ["timing.host_link_bandwidth_bytes_per_s=null"]).base
    assert "host_link_bandwidth_bytes_per_s" not in s.timing.model_fields_set
    assert s.default_link_name() == s.gpu.host_link != ""
    assert load_scenario(scenario).base.default_link_name() == ""  # the file's 64.0e9: the legacy rate


@pytest.mark.parametrize("expr, key, hint", [
    ("kv_budget.bytes=16.5 B", "kv_budget.bytes", "16 GiB"),
    ("allocator.block_size=1.5", "allocator.block_size", "128k"),
    ("scheduler.preemption_mode=swp", "scheduler.preemption_mode", "'recompute', 'swap' or 'auto-vllm-v0'"),
    ("allocator.kind=pagd", "allocator", "valid kinds: buddy, contiguous, paged, radix"),
    ("allocator.block_sise=4", "allocator.block_sise", "valid keys:"),
    ("kv_budget.tokens=10M", "kv_budget.tokens", "at most"),
    ("model={preset: DeepSeek-V3, head_dim: 64}", "model", "more than qk_rope_head_dim (64)"),
    ("model={preset: DeepSeek-V3, q_lora_rank: -1}", "model.q_lora_rank", "greater than or equal to 0"),
])
def test_a_bad_set_value_names_the_set_argument(scenario, expr, key, hint):
    over = ["kv_budget.bytes=null", expr] if "tokens" in expr else [expr]
    with pytest.raises(ConfigError) as e:
        load_scenario(scenario, over)
    msg = str(e.value)
    assert msg.startswith(f"--set {expr} (applied to {scenario}): {key}"), msg
    assert hint in msg and "\n" not in msg


@pytest.mark.parametrize("dist, why", [("{kind: constant, value: 3}", "unknown prompt_tokens kind 'constant'"),
                                       ("{value: 3}", "missing 'kind'")])
def test_a_synthetic_length_distribution_lists_its_kinds(scenario, dist, why):
    """A length distribution is a tagged union outside the plugin registries: its valid kinds are
    still listed (they were printed empty)."""
    spec = ("trace={synthetic: {num_requests: 5, arrival: {process: poisson, rate_per_s: 1}, "
            f"prompt_tokens: {dist}, output_tokens: {{kind: fixed, value: 4}}}}}}")
    with pytest.raises(ConfigError) as e:
        load_scenario(scenario, [spec])
    msg = str(e.value)
    assert f"trace.synthetic.prompt_tokens: {why}" in msg and "\n" not in msg
    assert msg.endswith("valid kinds: empirical, fixed, lognormal, uniform, zipf"), msg


def test_a_bad_file_value_still_names_the_file(scenario):
    scenario.write_text(scenario.read_text().replace("bytes: 16 GiB", "bytes: 16.5 B"))
    with pytest.raises(ConfigError, match=rf"^{scenario}: kv_budget.bytes: '16.5 B' is not a whole number of bytes"):
        load_scenario(scenario, ["allocator.block_size=32"])


def test_cli_exit_2_one_line(scenario):
    out = kvsim("validate", str(scenario), "--set", "kv_budget.bytes=16 GX")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvsim: error: --set kv_budget.bytes=16 GX (applied to {scenario}): kv_budget.bytes:")
    assert "unknown unit 'GX'" in lines[0] and "Traceback" not in out.stderr


def test_a_negative_seed_is_refused(scenario, tmp_path):
    """numpy's generators take seeds >= 0: a negative one is one line naming ``seed`` (it was an internal error)."""
    with pytest.raises(ConfigError, match=rf"^--set seed=-1 \(applied to {scenario}\): seed: .*greater than or equal to 0"):
        load_scenario(scenario, ["seed=-1"])
    spec = tmp_path / "spec.yaml"
    spec.write_text("num_requests: 5\narrival: {process: poisson, rate_per_s: 2}\n"
                    "prompt_tokens: {kind: fixed, value: 10}\noutput_tokens: {kind: fixed, value: 5}\n")
    out = kvsim("trace", "generate", str(spec), str(tmp_path / "t.csv"), "--seed", "-5")
    assert out.returncode == 2 and "argument --seed: expected an integer >= 0, got -5" in out.stderr
    assert not (tmp_path / "t.csv").exists()


def test_generator_spec_takes_counts_and_rates():
    spec = SyntheticTraceSpec.model_validate({
        "num_requests": "10k", "arrival": {"rate_per_s": "2.5e1"},
        "prompt_tokens": {"kind": "uniform", "low": "1k", "high": "2K"},
        "output_tokens": {"kind": "lognormal", "mean": "2e2", "cv": 1, "max_tokens": "4K"},
        "system_prompt": {"tokens": 1.0e+3},
    })
    assert spec.num_requests == 10_000 and spec.arrival.rate_per_s == 25.0
    assert (spec.prompt_tokens.low, spec.prompt_tokens.high) == (1000, 2048)
    assert spec.output_tokens.max_tokens == 4096 and spec.system_prompt.tokens == 1000
    with pytest.raises(ValueError, match="not a whole number of tokens"):
        SyntheticTraceSpec.model_validate({"num_requests": 10, "arrival": {"rate_per_s": 1},
                                           "prompt_tokens": {"kind": "fixed", "value": 1.5},
                                           "output_tokens": {"kind": "fixed", "value": 4}})


def test_sweep_grid_takes_units(scenario, tmp_path):
    sweep = tmp_path / "s.sweep.yaml"
    sweep.write_text(f"base_file: {scenario}\ngrid:\n  kv_budget.bytes: [8 GiB, 16e9]\n")
    loaded = load_sweep(sweep, check_capacity=False)
    got = sorted(p.scenario.kv_budget.bytes for p in loaded.points)
    assert got == [8 * 2**30, 16 * 10**9]
    sweep.write_text(f"base_file: {scenario}\ngrid:\n  kv_budget.bytes: [8 GiB, 16.5 B]\n")
    with pytest.raises(ConfigError, match=r"kv_budget.bytes: '16.5 B' is not a whole number of bytes"):
        load_sweep(sweep, check_capacity=False)
    with pytest.raises(ConfigError, match=r"^--set kv_budget.bytes=1.5 \(applied to .*\): kv_budget.bytes"):
        load_sweep(sweep, overrides=["kv_budget.bytes=1.5"], check_capacity=False)


@pytest.mark.parametrize("timing, needle", [
    ("{kind: calibrated, file: no/such/dir}", "calibration directory"),
    ("{kind: analytical, attention_backend: no/such/profile.yaml}", "timing.attention_backend: backend profile file"),
])
def test_validate_reads_what_the_timing_model_reads(tmp_path, timing, needle):
    """`kvsim validate` builds each run's timing model as `kvsim run` does, so a calibration directory or a
    backend profile file that a run would refuse is refused here too (it validated, then the run failed)."""
    scn = tmp_path / "s.yaml"
    scn.write_text("model: OPT-13B\ngpu: A100-40GB\ntrace: {synthetic: {preset: sharegpt, num_requests: 5, "
                   f"arrival: {{process: poisson, rate_per_s: 1}}}}}}\ntiming: {timing}\n")
    out = kvsim("validate", str(scn))
    assert out.returncode == 2 and needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("extra, needle", [
    ("allocator: {kind: radix}\n", "allocator.kind: radix models one sequence per request, and trace request 0"),
    ("engine_profile: vllm-v0.6\nscheduler: {num_scheduler_steps: 4}\n",
     "scheduler.num_scheduler_steps > 1 with beam-search requests"),
])
def test_what_a_trace_needs_is_checked_by_validate_and_run_alike(tmp_path, extra, needle):
    """The radix allocator with parallel samples was an internal error (a ValueError) in both; multi-step
    with beams validated, then the run refused it. Now both refuse each in one line."""
    sampling = "{n: 2, fraction: 1.0}" if "radix" in extra else "{beam_width: 2, fraction: 1.0}"
    scn = tmp_path / "s.yaml"
    scn.write_text("model: Llama-3.1-8B\ngpu: A100-40GB\ntrace: {synthetic: {num_requests: 20, preset: alpaca, "
                   f"arrival: {{process: poisson, rate_per_s: 5}}, sampling: {sampling}}}}}\n" + extra)
    for args in (["validate", str(scn)], ["run", str(scn), "--out", str(tmp_path / "o"), "-q", "--no-plots"]):
        out = kvsim(*args)
        # (a 131,072-token model under vllm-v0.6 also gets the profile's chunked-prefill note first)
        errors = [ln for ln in out.stderr.strip().splitlines() if not ln.startswith("kvsim: note:")]
        assert out.returncode == 2 and needle in out.stderr and len(errors) == 1, out.stderr


def test_a_later_variant_the_trace_refuses_is_refused_before_any_run(tmp_path):
    """`kvsim run` checked a variant's trace-dependent settings only when it reached that variant: the
    variants before it were simulated first, and a hidden partial directory was left behind. Now every
    run is checked up front: one line, no output directory, nothing simulated."""
    scn = tmp_path / "s.yaml"
    scn.write_text("model: Llama-3.1-8B\ngpu: A100-40GB\ntrace: {synthetic: {num_requests: 20, preset: alpaca, "
                   "arrival: {process: poisson, rate_per_s: 5}, sampling: {n: 2, fraction: 1.0}}}\n"
                   "variants:\n  ok: {}\n  bad: {allocator: {kind: radix}}\n")
    out = kvsim("run", str(scn), "--out", str(tmp_path / "o"), "-q", "--no-plots")
    errors = [ln for ln in out.stderr.strip().splitlines() if not ln.startswith("kvsim: note:")]
    assert out.returncode == 2 and "variants.bad.allocator.kind: radix" in out.stderr and len(errors) == 1, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # no output, no hidden partial directory


@pytest.mark.parametrize("expr, key", [
    ("replicas.shared_prefix_store={capacity_bytes: 1KiB}", "replicas.shared_prefix_store.capacity_bytes"),
    ("allocator.offload.cpu={capacity_bytes: 2097151}", "allocator.offload.cpu.capacity_bytes"),
    ("allocator.offload.ssd={capacity_bytes: 1 MiB, bandwidth_bytes_per_s: 7 GB/s}",
     "allocator.offload.ssd.capacity_bytes"),
])
def test_a_lower_tier_smaller_than_one_block_is_refused(scenario, expr, key):
    """A tier below one KV block (Llama-3-8B: 16 tokens x 128 KiB = 2 MiB) held no block and validated ok."""
    with pytest.raises(ConfigError) as e:
        load_scenario(scenario, [expr])
    msg = str(e.value)
    assert msg.startswith(f"--set {expr} (applied to {scenario}): {key}: ") and "\n" not in msg
    assert "less than one KV block" in msg and "the minimum is 2,097,152 bytes" in msg
    ok = expr.replace("1KiB", "2 MiB").replace("2097151", "2097152").replace("1 MiB", "2 MiB")
    assert load_scenario(scenario, [ok]).base is not None


@pytest.mark.parametrize("raw, key", [({"parallel": {"tensor": True}}, "parallel: tensor"),
                                      ({"replicas": {"count": True}}, "replicas: count"),
                                      ({"scheduler": {"max_num_seqs": True}}, "scheduler: max_num_seqs"),
                                      ({"seed": False}, "seed")])
def test_a_boolean_is_not_a_number(raw, key):
    """QA (twenty-ninth session): pydantic's lax mode read `tensor: true` (YAML `yes`) as 1; config.json's
    loader already refused it. Boolean fields still take booleans."""
    from kvsim.config import Scenario
    from kvsim.config.messages import format_validation_error
    from pydantic import ValidationError

    base = {"model": "Llama-3-8B", "gpu": "H100-SXM-80GB", "trace": {"file": "t.csv"}}
    with pytest.raises(ValidationError) as e:
        Scenario.model_validate({**base, **raw})
    assert f"{key}: expected a number, got the boolean" in format_validation_error(e.value, "s.yaml")
    Scenario.model_validate({**base, "parallel": {"tensor": 1, "gpu_p2p": False},
                             "allocator": {"kind": "paged", "prefix_caching": True}})
