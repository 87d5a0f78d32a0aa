"""vLLM's memory profile (kvsim/models/memory.py): its constants are the fit of the shipped log
corpus, the held-out logs' KV caches come out within a few percent, scenarios use it under vllm-v1
(and keep the fixed reserve elsewhere), and bad corpus files get one line."""

import json
import math
import statistics
import subprocess
import sys

import pytest

from kvsim.config import Scenario
from kvsim.errors import ConfigError
from kvsim.hw import GPUS, GiB
from kvsim.models import memory, memory_corpus

ROWS = memory_corpus.load()


def test_constants_are_the_fit_of_the_fit_rows():
    f = memory_corpus.fit(ROWS)
    assert f["sampler_bytes_per_logit"] == pytest.approx(memory.SAMPLER_BYTES_PER_LOGIT, abs=5e-4)
    assert f["sampler_bytes_per_hidden"] == pytest.approx(memory.SAMPLER_BYTES_PER_HIDDEN, abs=5e-3)
    assert f["forward_factor"] == pytest.approx(memory.FORWARD_FACTOR, abs=5e-4)
    for kind, gib in f["non_torch_gib"].items():
        assert memory.NON_TORCH_BYTES[kind] == int(gib * GiB)
    assert f["cudagraph_base_gib"] == pytest.approx(memory.CUDAGRAPH_BASE_BYTES / GiB, abs=5e-5)
    assert f["cudagraph_per_layer_gib"] == pytest.approx(memory.CUDAGRAPH_PER_LAYER_BYTES / GiB, abs=5e-6)


def test_fit_reads_no_held_out_row():
    changed = [memory_corpus.MemoryRow(**{**r.__dict__, "printed": {k: v * 3 for k, v in r.printed.items()}})
               if r.split == "holdout" else r for r in ROWS]
    assert memory_corpus.fit(changed) == memory_corpus.fit(ROWS)


def test_printed_terms_add_up_as_vllm_0_19_sizes_the_cache():
    """KV = total x utilisation - weights - non-torch - activation peak, for every row printing them all
    (vLLM 0.19 does not subtract CUDA-graph memory): the corpus is transcribed consistently."""
    full = [r for r in ROWS if all(k in r.printed for k in
                                   ("total_gib", "weights_gib", "non_torch_gib", "activation_peak_gib", "kv_cache_gib"))]
    assert len(full) >= 20
    for r in full:
        p = r.printed
        assert p["total_gib"] * r.utilisation - p["weights_gib"] - p["non_torch_gib"] - p["activation_peak_gib"] \
            == pytest.approx(p["kv_cache_gib"], abs=0.03), r.line


def test_held_out_kv_caches_within_five_percent():
    errs = [e for e in memory_corpus.errors(ROWS) if e["split"] == "holdout" and e["term"] == "kv_cache_gib"]
    assert len(errs) >= 20
    assert max(abs(e["error"]) for e in errs) < 0.05
    assert statistics.median(abs(e["error"]) for e in errs) < 0.01


def test_held_out_activation_peaks_dense_and_moe():
    """The activation peak of every held-out log within 7 %, the two MoE ones (whose fused-MoE
    workspace comes from vLLM's source, no fitted constant) within 5 %."""
    errs = [e for e in memory_corpus.errors(ROWS) if e["split"] == "holdout" and e["term"] == "activation_peak_gib"]
    assert max(abs(e["error"]) for e in errs) < 0.07
    moe = [e for e in errs if e["model"] in ("Mixtral-8x7B", "Qwen3-30B-A3B")]
    assert len(moe) == 2 and all(abs(e["error"]) < 0.05 for e in moe)
    assert memory.moe_workspace_bytes(memory_corpus.MODELS["Llama-3.1-8B"], 1, 8192, "bf16") == 0


def _llama_h100(**over):
    return Scenario.model_validate({"trace": {"file": "t.csv"}, "model": "Llama-3.1-8B", "gpu": "H100-SXM-80GB",
                                    "weight_dtype": "bf16", "kv_dtype": "bf16",
                                    "scheduler": {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}, **over})


def test_vllm_v1_scenario_sizes_the_cache_as_the_logged_engine():
    """The corpus's Llama-3.1-8B H100 log (util 0.95, vLLM 0.19: no CUDA-graph term): 58.11 GiB."""
    s = _llama_h100(kv_budget={"gpu_memory_utilization": 0.95, "activation_reserve_bytes": "vllm-no-cudagraph"})
    assert s.derived_kv_budget_bytes() / GiB == pytest.approx(58.11, abs=0.3)  # kvsim's 8.03B weights, not 14.99 GiB
    r = s.memory_reserve()
    assert r.cudagraph == 0 and r.activation == r.sampler > r.forward
    # the default profile fills `vllm`: from vLLM 0.21 the CUDA graphs come off too
    d = _llama_h100(kv_budget={"gpu_memory_utilization": 0.95})
    assert d.kv_budget.activation_reserve_bytes == "vllm"
    assert s.derived_kv_budget_bytes() - d.derived_kv_budget_bytes() == memory.cudagraph_bytes(32)


def test_other_profiles_keep_the_fixed_reserve():
    s = _llama_h100(engine_profile="kvsim")
    assert s.kv_budget.activation_reserve_bytes == 1 << 30 and s.memory_reserve() is None
    assert s.derived_kv_budget_bytes() == int(GPUS["H100-SXM-80GB"].memory_bytes * 0.9) - s.weight_bytes - (1 << 30)


def test_reserve_follows_the_engine_limits_and_the_plan():
    small = _llama_h100(scheduler={"max_num_seqs": 256, "max_num_batched_tokens": 2048}).memory_reserve()
    big = _llama_h100().memory_reserve()
    assert small.sampler * 4 == pytest.approx(big.sampler, rel=1e-6) and small.forward * 4 == pytest.approx(big.forward, rel=1e-6)
    tp = _llama_h100(parallel={"tensor": 2}).memory_reserve()
    no_p2p = _llama_h100(parallel={"tensor": 2, "gpu_p2p": False}).memory_reserve()
    assert tp.non_torch == memory.NON_TORCH_BYTES["tensor"] and no_p2p.non_torch == memory.NON_TORCH_BYTES["single"]
    assert tp.forward < big.forward and tp.sampler == big.sampler  # the sampler sees every logit on one rank


def test_unknown_gpu_counts_its_nominal_memory():
    s = _llama_h100(gpu={"name": "mine", "memory_bytes": 100 * GiB, "hbm_bandwidth_bytes_per_s": 3e12,
                         "bf16_flops_per_s": 1e15})
    assert s.usable_memory_bytes() == 100 * GiB
    assert _llama_h100().usable_memory_bytes() == memory.CUDA_TOTAL["H100-SXM-80GB"][0] < 80 * GiB
    # a preset with its memory overridden is the user's GPU: its memory counts, not the preset's printed total
    smaller = _llama_h100(gpu={"preset": "H100-SXM-80GB", "memory_bytes": 40 * GiB})
    assert smaller.usable_memory_bytes() == 40 * GiB
    same = _llama_h100(gpu={"preset": "H100-SXM-80GB", "memory_bytes": GPUS["H100-SXM-80GB"].memory_bytes})
    assert same.usable_memory_bytes() == memory.CUDA_TOTAL["H100-SXM-80GB"][0]


def test_summary_records_the_reserve(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,100,5\n0.1,200,5\n")
    (tmp_path / "s.yaml").write_text(
        "name: s\ntrace: {file: t.csv}\nmodel: Llama-3.1-8B\ngpu: H100-SXM-80GB\ntiming: {kind: constant, step_s: 0.01}\n")
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "kvsim", "run", str(tmp_path / "s.yaml"), "--out", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    kv = json.loads((out / "summary.json").read_text())["kv"]
    res = kv["reserve"]
    assert res["model"] == "vllm" and res["memory_bytes"] == memory.CUDA_TOTAL["H100-SXM-80GB"][0]
    assert res["reserve_bytes"] == res["non_torch_bytes"] + res["activation_bytes"] + res["cudagraph_bytes"]
    assert res["activation_bytes"] == max(res["forward_bytes"], res["sampler_bytes"]) and res["moe_workspace_bytes"] == 0
    assert math.isclose(kv["budget_bytes"], int(res["memory_bytes"] * 0.9) - 8.03e9 * 2 - res["reserve_bytes"],
                        abs_tol=4)


@pytest.mark.parametrize("tensor, expect", [("0", "tensor: 0 must be at least 1"),
                                            ("3", "tensor: 3 does not divide Llama-3.1-8B's 32 attention heads")])
def test_a_corpus_split_that_cannot_be_is_one_line(tmp_path, tensor, expect):
    """It was a ZeroDivisionError (tensor 0) or a fit 732 % off (a tensor size vLLM refuses)."""
    import csv
    import io

    text = memory_corpus.CORPUS.read_text()
    lines = text.splitlines()
    header = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    cols = next(csv.reader([lines[header]]))
    row = next(i for i in range(header + 1, len(lines)) if ",Llama-3.1-8B," in lines[i])
    cells = next(csv.reader([lines[row]]))
    cells[cols.index("tensor")] = tensor
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(cells)
    lines[row] = out.getvalue()
    f = tmp_path / "c.csv"
    f.write_text("\n".join(lines) + "\n")
    # the file's own line number (comment lines counted: an editor's line; they were skipped before)
    with pytest.raises(ConfigError, match=rf"^{f}: line {row + 1}: {expect}"):
        memory_corpus.load(f)


def test_a_corpus_without_a_required_column_names_the_column(tmp_path):
    lines = memory_corpus.CORPUS.read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    lines[header] = lines[header].replace("source_url", "url", 1)
    f = tmp_path / "c.csv"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"^{f}: column 'source_url' is missing from the header \(required: "):
        memory_corpus.load(f)


@pytest.mark.parametrize("edit, expect", [
    (lambda t: t.replace(",Llama-3.1-8B,", ",Llama-9-8B,", 1), "model: 'Llama-9-8B' is not one of"),
    (lambda t: t.replace(",fit,", ",train,", 1), "split: 'train' is not one of"),
    (lambda t: t.replace(",8192,1024,0.95,", ",8192,,0.95,", 1), "max_num_seqs: required field is empty"),
    (lambda t: t.replace(",0.95,79.19,14.99,", ",0.95,79.19,lots,", 1), "weights_gib: 'lots' is not a number"),
    (lambda t: t.replace(",0.95,79.19,14.99,", ",0.95,79.19,nan,", 1), "weights_gib: 'nan' must be a finite number"),
    (lambda t: t.replace(",8192,1024,0.95,", ",8192,1024,-0.5,", 1), "gpu_memory_utilization: '-0.5' must be a finite"),
    (lambda t: t.replace(",8192,1024,0.95,", ",8192,0,0.95,", 1), "max_num_seqs: 0 must be at least 1"),
])
def test_bad_corpus_row_is_one_line(tmp_path, edit, expect):
    f = tmp_path / "c.csv"
    f.write_text(edit(memory_corpus.CORPUS.read_text()))
    with pytest.raises(ConfigError) as e:
        memory_corpus.load(f)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{f}: line ") and expect in msg


def test_a_header_only_corpus_or_a_directory_is_refused(tmp_path, capsys):
    """A header-only corpus printed 'Empty DataFrame', exit 0; --corpus DIR said 'no such file'."""
    from kvsim.cli import main

    lines = memory_corpus.CORPUS.read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    f = tmp_path / "c.csv"
    f.write_text("\n".join(lines[:header + 1]) + "\n")
    with pytest.raises(ConfigError, match=rf"^{f}: no rows \(only the header\)"):
        memory_corpus.load(f)
    assert main(["memory", "--check", "--corpus", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kvsim: error: --corpus: {tmp_path}: is a directory; give the corpus CSV file"]
