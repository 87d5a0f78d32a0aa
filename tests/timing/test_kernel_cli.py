"""`kvsim kernel`: JSON keys, directions, one-line errors."""

from __future__ import annotations

import json

import pytest

from kvsim.cli import main
from kvsim.kernel_cli import JSON_KEYS


def _run(capsys, *args) -> dict:
    assert main(["kernel", "--gpu", "A100-80GB", "--model", "Llama-2-13B", "--batch", "32", "--context", "1024",
                 *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_keys_and_consistency(capsys):
    out = _run(capsys, "--block-size", "16", "--backend", "auto-2023")
    assert tuple(out) == JSON_KEYS
    assert out["backend"] == "vllm-paged-v1" and out["block_size"] == 16
    assert out["kv_load_latency_ns"] == pytest.approx(out["time_s"] / (32 * 1024 * 40) * 1e9)
    assert _run(capsys, "--block-size", "16")["backend"] == "flashinfer-paged"  # auto
    assert out["pages_fetched"] == 32 * 64 * 40 * 40  # pages x kv heads x layers
    assert out["time_per_page_s"] == pytest.approx(out["time_s"] / out["pages_fetched"])
    assert out["bandwidth_utilisation"] == pytest.approx(out["kv_bytes"] / out["time_s"] / 2.039e12)
    assert 0 < out["bandwidth_utilisation"] < 1


def test_contiguous_and_page_size_directions(capsys):
    paged1 = _run(capsys, "--block-size", "1", "--backend", "auto-2023")
    paged16 = _run(capsys, "--block-size", "16", "--backend", "auto-2023")
    cont = _run(capsys, "--contiguous", "--backend", "auto-2023")
    assert cont["backend"] == "contiguous" and cont["block_size"] is None
    assert paged1["time_s"] > paged16["time_s"] > cont["time_s"]
    fi1 = _run(capsys, "--block-size", "1", "--backend", "flashinfer-paged")
    fi16 = _run(capsys, "--block-size", "16", "--backend", "flashinfer-paged")
    assert fi1["time_s"] / fi16["time_s"] < 1.12


def test_help_lists_json_keys(capsys):
    with pytest.raises(SystemExit):
        main(["kernel", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for key in JSON_KEYS:
        assert key in text


def test_tensor_parallel_launch_is_one_gpus_heads(capsys):
    one = _run(capsys, "--block-size", "16", "--backend", "vllm-2023-paged")
    assert one["tensor"] == 1 and one["kv_heads_per_gpu"] == 40
    prev = one
    for t in (2, 4, 8):
        out = _run(capsys, "--block-size", "16", "--backend", "vllm-2023-paged", "--tensor", str(t))
        assert out["kv_heads_per_gpu"] == 40 // t and out["kv_bytes"] * t == one["kv_bytes"]
        assert out["pages_fetched"] * t == one["pages_fetched"]
        assert out["time_s"] < prev["time_s"]  # each GPU reads 1/T of the heads
        prev = out
    # T = 8: launch costs keep it above 1/8, and 32 x 5 query-head units keep fewer bytes in flight
    # (Little's-law saturation) than 32 x 40: about 1/4 for the 2023 kernel, below for auto's
    assert prev["time_s"] < 0.30 * one["time_s"]
    auto1, auto8 = (_run(capsys, "--block-size", "16", "--tensor", str(t))["time_s"] for t in (1, 8))
    assert auto8 < 0.25 * auto1


def test_model_from_a_config_json(capsys, tmp_path):
    import json as _json

    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192}
    f = tmp_path / "config.json"
    f.write_text(_json.dumps(cfg))
    assert main(["kernel", "--gpu", "H100-SXM-80GB", "--model", str(f), "--tensor", "2", "--batch", "8",
                 "--context", "512", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_heads_per_gpu"] == 4 and out["kv_bytes"] == 8 * 512 * 32 * 2 * 4 * 128 * 2


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "A100"], "--gpu: unknown gpu preset 'A100' (did you mean"),
    (["--tensor", "3"], "--tensor: 3 does not divide"),
    (["--model", "missing/config.json"], "--model:"),
    (["--model", "llama"], "valid presets:"),
    (["--backend", "flashinfer"], "--backend: unknown attention backend"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    base = {"--gpu": "A100-80GB", "--model": "Llama-2-13B", "--batch": "4", "--context": "100"}
    over = dict(zip(args[::2], args[1::2]))
    argv = ["kernel"] + [x for k, v in {**base, **over}.items() for x in (k, v)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("flag, value, bound", [("--batch", "300000000", "1..1,048,576"),
                                                ("--context", "100000000000", "1..16,777,216"),
                                                ("--block-size", "1000000", "1..512")])
def test_a_launch_past_the_bounds_is_a_usage_error(capsys, flag, value, bound):
    """No launch so large that the model's per-batch tables exhaust memory: argparse's usage error, exit 2."""
    base = {"--gpu": "A100-80GB", "--model": "Llama-2-13B", "--batch": "4", "--context": "100", flag: value}
    code = 0
    try:
        code = main(["kernel"] + [x for kv in base.items() for x in kv])
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert f"argument {flag}: expected an integer in {bound}" in capsys.readouterr().err.strip().splitlines()[-1]


def test_presets_are_read_as_a_scenario_reads_them(capsys):
    """Any case, as in a scenario (kvsim.models.names.lookup); the old backend name gives the same launch."""
    base = _run(capsys, "--block-size", "16", "--backend", "vllm-paged-v1")
    assert main(["kernel", "--gpu", "a100-80gb", "--model", "llama-2-13b", "--batch", "32", "--context", "1024",
                 "--block-size", "16", "--backend", "vllm-2023-paged", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == base


@pytest.mark.parametrize("extra", [["--gpu", "A100-80GB"], ["--tensor", "2"], ["--backend", "flashmla"],
                                   ["--contiguous"], ["--kv-dtype", "fp8"]])
def test_check_refuses_the_launch_options(capsys, extra):
    """--check compares every backend on every row: a launch option would be silently ignored, so it is refused."""
    assert main(["kernel", "--check", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvsim: error: {extra[0]}: --check compares every built-in backend")


def test_check_lists_the_rows_it_does_not_evaluate(capsys):
    from kvsim.hw import GPUS
    from kvsim.timing.kernel import builtin_backends
    from kvsim.timing.kernel_corpus import load_corpus

    left = [p for p in load_corpus() if p.gpu_preset not in GPUS or p.backend not in builtin_backends()]
    assert main(["kernel", "--check"]) == 0
    out = capsys.readouterr().out
    assert f"not evaluated ({len(left)} rows:" in out
    for src in {p.source_id for p in left}:
        n = sum(p.source_id == src for p in left)
        assert f"    {src}: {n} row{'s' * (n != 1)} (" in out


@pytest.mark.parametrize("argv, words", [
    (["kernel", "--tensor", "0"], ["argument --tensor: expected an integer >= 1, got 0", "kvsim kernel --help"]),
    (["kernel", "--batch", "0"], ["argument --batch: expected an integer in 1..1,048,576"]),
    (["kernel", "--context", "0"], ["argument --context: expected an integer in 1..16,777,216"]),
    (["kernel", "--block-size", "513"], ["argument --block-size: expected an integer in 1..512"]),
    (["kernel", "--kv-dtype", "fp4"], ["argument --kv-dtype: invalid choice: 'fp4'", "'fp8'"]),
    (["sweep", "s.yaml", "--jobs", "0"], ["argument -j/--jobs: expected an integer >= 1", "kvsim sweep --help"]),
    (["trace", "generate", "s.yaml", "t.csv", "--seed", "-1"], ["argument --seed", "kvsim trace generate --help"]),
    (["run"], ["the following arguments are required: file", "kvsim run --help"]),
    (["models", "--jsn"], ["unrecognized arguments: --jsn"]),
])
def test_a_bad_flag_is_one_line_for_every_command(capsys, argv, words):
    """argparse's errors are one ``kvsim: error:`` line, exit 2, as README promises (they printed the usage block)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("kvsim: error: ")
    assert "usage:" not in err and all(w in err for w in words), err


def test_a_model_folder_is_refused_as_models_config_refuses_it(capsys, tmp_path):
    """--model DIR (a folder holding config.json) said "unknown model preset"; now what models --config says."""
    (tmp_path / "config.json").write_text("{}")
    assert main(["kernel", "--gpu", "H100-SXM-80GB", "--model", str(tmp_path), "--batch", "4", "--context", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kvsim: error: --model: {tmp_path}: is a directory, expected a Hugging Face config.json"
    assert main(["models", "--config", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"kvsim: error: {tmp_path}: is a directory, expected a Hugging Face config.json"
