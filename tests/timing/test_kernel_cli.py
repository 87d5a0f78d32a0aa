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
    out = _run(capsys, "--block-size", "16")
    assert tuple(out) == JSON_KEYS
    assert out["backend"] == "vllm-paged-v1" and out["block_size"] == 16
    assert out["pages_fetched"] == 32 * 64 * 40 * 40  # pages x kv heads x layers
    assert out["time_per_page_s"] == pytest.approx(out["time_s"] / out["pages_fetched"])
    assert out["bandwidth_utilisation"] == pytest.approx(out["kv_bytes"] / out["time_s"] / 2.039e12)
    assert 0 < out["bandwidth_utilisation"] < 1


def test_contiguous_and_page_size_directions(capsys):
    paged1 = _run(capsys, "--block-size", "1")
    paged16 = _run(capsys, "--block-size", "16")
    cont = _run(capsys, "--contiguous")
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


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "A100"], "did you mean 'A100-80GB'"),
    (["--model", "llama"], "valid:"),
    (["--backend", "flashinfer"], "--backend: unknown attention backend"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, needle):
    base = {"--gpu": "A100-80GB", "--model": "Llama-2-13B", "--batch": "4", "--context": "100"}
    over = dict(zip(args[::2], args[1::2]))
    argv = ["kernel"] + [x for k, v in {**base, **over}.items() for x in (k, v)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
