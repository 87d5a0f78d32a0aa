"""`kvsim trace` sub-commands and generic-format round trips."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.errors import ConfigError, TraceError
from kvsim.trace.cli import main, register
from kvsim.trace.load import load_trace
from kvsim.trace.write import write_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
AZURE = TRACES / "azure_conv_2023.csv.gz"
MOONCAKE = TRACES / "mooncake_conversation_0-40min.jsonl.gz"


def run(argv: list[str]) -> int:
    """Parse like the real `kvsim` entry point would, then call the handler."""
    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def assert_same(a, b):
    assert np.array_equal(a.arrival_s, b.arrival_s)  # bit-identical floats
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert np.array_equal(a.output_tokens, b.output_tokens)
    assert (a.prefix_keys is None) == (b.prefix_keys is None)
    if a.prefix_keys is not None:
        assert a.prefix_block_tokens == b.prefix_block_tokens
        assert len(a.prefix_keys) == len(b.prefix_keys)
        assert all(np.array_equal(x, y) for x, y in zip(a.prefix_keys, b.prefix_keys))
    for col in ("session_id", "priority", "num_samples"):
        x, y = getattr(a, col), getattr(b, col)
        assert (x is None and y is None) or np.array_equal(x, y)


@pytest.mark.parametrize("ext", ["parquet", "jsonl", "csv", "csv.gz", "jsonl.gz"])
@pytest.mark.parametrize("source", [AZURE, MOONCAKE], ids=["azure", "mooncake"])
def test_convert_round_trip(tmp_path, source, ext, capsys):
    out = tmp_path / f"out.{ext}"
    assert run(["trace", "convert", str(source), str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    original, converted = load_trace(source), load_trace(out)
    assert converted.source["format"] == "generic"
    assert_same(original, converted)


def test_round_trip_all_optional_columns(tmp_path):
    from kvsim.trace.spec import SyntheticTraceSpec
    from kvsim.trace.synthetic import generate_trace

    spec = SyntheticTraceSpec.model_validate({
        "num_requests": 500, "preset": "sharegpt", "arrival": {"process": "gamma", "rate_per_s": 3, "cv": 2},
        "conversation": {"turns": {"kind": "uniform", "low": 1, "high": 4}}, "system_prompt": {"tokens": 40},
        "sampling": {"n": 3, "fraction": 0.5}, "priority": {"values": [-1, 0, 2]},
    })
    trace = generate_trace(spec, seed=4)
    for ext in ("csv", "jsonl", "parquet", "jsonl.gz"):
        path = write_trace(trace, tmp_path / f"t.{ext}")
        assert_same(trace, load_trace(path))


def test_gzip_output_is_reproducible(tmp_path):
    trace = load_trace(AZURE)
    a = write_trace(trace, tmp_path / "a.csv.gz").read_bytes()
    b = write_trace(trace, tmp_path / "b.csv.gz").read_bytes()
    assert a == b


def test_stats_table_and_json(capsys):
    assert run(["trace", "stats", str(MOONCAKE)]) == 0
    out = capsys.readouterr().out
    assert "35.09 % of blocks, 35.77 % of tokens" in out and "7,851" in out
    # Aligned table: every value starts in the same column.
    rows = [line for line in out.splitlines()[1:] if line.strip()]
    starts = {len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in rows}
    assert len(starts) == 1
    assert run(["trace", "stats", str(AZURE), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 19_366 and data["format"] == "azure" and data["prefix"] is None


def test_stats_bad_input_raises_trace_error(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        run(["trace", "stats", str(tmp_path / "missing.csv")])
    with pytest.raises(TraceError, match="cannot tell the output format"):
        run(["trace", "convert", str(AZURE), str(tmp_path / "out.txt")])


def test_generate_from_yaml(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "num_requests: 1000\n"
        "preset: sharegpt\n"
        "arrival: {process: gamma, rate_per_s: 5, cv: 2}\n"
        "system_prompt: {tokens: 64, fraction: 0.5}\n"
        "seed: 3\n"
    )
    out = tmp_path / "gen.jsonl"
    assert run(["trace", "generate", str(spec), str(out)]) == 0
    assert "seed 3" in capsys.readouterr().out
    t = load_trace(out)
    assert len(t) == 1000 and t.prefix_block_tokens == 16
    assert run(["trace", "generate", str(spec), str(tmp_path / "gen2.jsonl"), "--seed", "4"]) == 0
    assert not np.array_equal(load_trace(tmp_path / "gen2.jsonl").arrival_s, t.arrival_s)
    # Deterministic: same spec, same seed, same bytes.
    assert run(["trace", "generate", str(spec), str(tmp_path / "gen3.jsonl")]) == 0
    assert (tmp_path / "gen3.jsonl").read_bytes() == out.read_bytes()


def test_generate_empirical_path_relative_to_spec(tmp_path):
    spec = tmp_path / "spec.yaml"
    (tmp_path / "sub").mkdir()
    write_trace(load_trace(AZURE).select(np.arange(100)), tmp_path / "sub" / "lens.csv")
    spec.write_text("num_requests: 50\narrival: {rate_per_s: 1}\n"
                    "prompt_tokens: {kind: empirical, file: sub/lens.csv}\n"
                    "output_tokens: {kind: empirical, file: sub/lens.csv}\n")
    assert run(["trace", "generate", str(spec), str(tmp_path / "o.csv")]) == 0


@pytest.mark.parametrize(
    "text, needle",
    [
        ("num_requests: 10\npreset: sharegpt\narrival: {rate_per_s: 1}\nrate: 3\n", "rate: unknown key"),
        ("num_requests: 10\npreset: sharegpt\narrival: {rate_per_s: -1}\n", "arrival.rate_per_s: Input should be greater than 0"),
        ("num_requests: [10\n", "bad.yaml:2:1: YAML syntax error"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("num_requests: 10\npreset: sharegpt\narrival: {rate_per_s: 1}\nprompt_tokens: {kind: normal, mean: 3}\n",
         "prompt_tokens"),
        ("num_reqests: 10\npreset: sharegpt\narrival: {rate_per_s: 1}\n",
         "num_reqests: unknown key (did you mean 'num_requests'?); valid keys: arrival, "),
        ("num_requests: 10\narrival: {rate_per_s: 1, burst: 2}\n", "arrival.burst: unknown key; valid keys: cv, process, rate_per_s"),
        ("num_requests: 10\npreset: sharegpt\narrival: {rate_per_s: 1.0e-320}\n",
         "arrival.rate_per_s: 9.99989e-321 requests/s is below 1e-12"),
        ("num_requests: 10\narrival: {rate_per_s: 1}\nprompt_tokens: {value: 3}\noutput_tokens: {kind: fixed, value: 3}\n",
         "prompt_tokens: key 'kind' is missing; valid kinds: empirical, fixed, lognormal, uniform, zipf"),
    ],
)
def test_generate_bad_spec_is_config_error(tmp_path, text, needle):
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    with pytest.raises(ConfigError) as info:
        run(["trace", "generate", str(spec), str(tmp_path / "o.csv")])
    assert str(spec) in str(info.value) and needle in str(info.value)


def test_generate_spec_directory_says_directory(tmp_path):
    with pytest.raises(ConfigError) as info:
        run(["trace", "generate", str(tmp_path), str(tmp_path / "o.csv")])
    assert str(tmp_path) in str(info.value) and "is a directory" in str(info.value)
    assert "does not exist" not in str(info.value)


def test_generate_length_above_max_tokens_is_config_error_naming_the_field(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text("num_requests: 3\narrival: {rate_per_s: 1}\nprompt_tokens: {kind: fixed, value: 5000000000}\n"
                    "output_tokens: {kind: fixed, value: 5}\n")
    with pytest.raises(ConfigError) as info:
        run(["trace", "generate", str(spec), str(tmp_path / "o.csv")])
    assert "prompt_tokens.fixed.value" in str(info.value) and "4294967296" in str(info.value)
    assert not (tmp_path / "o.csv").exists()


def test_standalone_main_prints_one_line_errors(tmp_path, capsys):
    assert main(["stats", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim: error: ") and err.count("\n") == 1


def test_standalone_main_prints_repair_warnings(tmp_path, capsys):
    path = tmp_path / "u.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n2,5,5\n1,5,5\n")
    assert main(["stats", str(path), "--on-unsorted", "sort"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"kvsim: warning: {path}: sorted") and err.count("\n") == 1, err


UNSORTED = "arrival_s,prompt_tokens,output_tokens\n2,5,5\n1,5,5\n"
ZERO_OUTPUT = "arrival_s,prompt_tokens,output_tokens\n0,5,0\n1,5,5\n"


@pytest.mark.parametrize("text, argv, needle", [
    (UNSORTED, ["trace", "stats", "{p}", "--on-unsorted", "sort"], "sorted the requests"),
    (ZERO_OUTPUT, ["trace", "convert", "{p}", "{o}", "--on-zero-output", "drop"], "dropped 1 request"),
])
def test_kvsim_main_prints_repair_warnings_as_one_line(tmp_path, capsys, text, argv, needle):
    from kvsim.cli import main as kvsim_main

    path = tmp_path / "t.csv"
    path.write_text(text)
    argv = [a.format(p=path, o=tmp_path / "o.jsonl") for a in argv]
    assert kvsim_main(argv) == 0
    err = capsys.readouterr().err
    assert err == f"kvsim: warning: {path}: " + err.split(f"{path}: ", 1)[1] and err.count("\n") == 1, err
    assert needle in err and "TraceWarning" not in err


def test_one_line_warnings_leaves_other_warnings_alone(capsys):
    import warnings

    from kvsim.errors import one_line_warnings
    from kvsim.errors import KvsimWarning

    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, category, *a, **k: seen.append((category, str(message)))
        with one_line_warnings():
            warnings.warn("ours", KvsimWarning)
            warnings.warn("theirs", UserWarning)
    assert capsys.readouterr().err == "kvsim: warning: ours\n"
    assert seen == [(UserWarning, "theirs")]  # shown the way it would have been


def test_kvsim_process_prints_one_warning_line(tmp_path):
    """The real entry point (`python -m kvsim`): no file:line prefix, no source line."""
    import subprocess
    import sys

    path = tmp_path / "u.csv"
    path.write_text(UNSORTED)
    proc = subprocess.run([sys.executable, "-m", "kvsim", "trace", "stats", str(path), "--on-unsorted", "sort"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [f"kvsim: warning: {path}: sorted the requests by arrival time: 1 arrival(s) "
                                        f"were earlier than the one before (first at line 3; on_unsorted: sort)"]


def test_convert_help_names_every_output_extension(capsys):
    from kvsim.trace.write import container_of

    with pytest.raises(SystemExit):
        run(["trace", "convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for ext in (".csv", ".jsonl", ".json", ".ndjson", ".parquet", ".pq", ".gz"):
        assert ext in text, ext
    assert container_of(Path("x.json")) == ("jsonl", False)
