"""Loader behaviour: format detection, containers, options, and one test per bad input."""

from __future__ import annotations

import gzip
import warnings

import numpy as np
import pytest

from kvsim.errors import TraceError
from kvsim.trace import load as load_mod
from kvsim.trace.load import TraceWarning, load_trace

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def azure_rows(n: int, start_s: int = 0) -> str:
    return "".join(f"2023-11-16 18:{15 + (start_s + i) // 60:02d}:{(start_s + i) % 60:02d}.5000000,{100 + i},{10 + i}\n"
                   for i in range(n))


def mooncake_line(ts_ms: int, inp: int, out: int, ids=None) -> str:
    ids = ids if ids is not None else list(range(-(-inp // 512)))
    return f'{{"timestamp": {ts_ms}, "input_length": {inp}, "output_length": {out}, "hash_ids": {ids}}}\n'


def expect_error(path, *needles, **kwargs) -> str:
    with pytest.raises(TraceError) as info:
        load_trace(path, **kwargs)
    msg = str(info.value)
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    assert "\n" not in msg
    return msg


# ---- good input --------------------------------------------------------------------------------


def test_azure_csv_detected_and_rebased(write_text):
    path = write_text("a.csv", AZURE_HEADER + azure_rows(3, start_s=5))
    t = load_trace(path)
    assert t.source["format"] == "azure" and t.source["container"] == "csv"
    assert np.allclose(t.arrival_s, [0, 1, 2])
    assert t.prompt_tokens.tolist() == [100, 101, 102]
    assert t.output_tokens.tolist() == [10, 11, 12]
    assert t.prefix_keys is None


def test_mooncake_jsonl_gz(write_text):
    path = write_text("m.jsonl.gz", mooncake_line(0, 600, 5, [0, 1]) + mooncake_line(3000, 512, 7, [0]))
    t = load_trace(path)
    assert t.source["format"] == "mooncake" and t.source["compressed"]
    assert t.arrival_s.tolist() == [0.0, 3.0]  # milliseconds -> seconds
    assert t.prefix_block_tokens == 512
    assert [k.tolist() for k in t.prefix_keys] == [[0, 1], [0]]


def test_duplicate_timestamps_are_legal(write_text):
    path = write_text("m.jsonl", mooncake_line(1000, 10, 5) * 3 + mooncake_line(4000, 10, 5))
    t = load_trace(path)
    assert t.arrival_s.tolist() == [1.0, 1.0, 1.0, 4.0]  # not rebased


def test_generic_csv_with_optional_columns(write_text):
    text = ("arrival_s,prompt_tokens,output_tokens,prefix_block_tokens,prefix_keys,session_id,priority,num_samples\n"
            "0.5,20,3,16,7 8,1,0,1\n"
            "\n"  # blank lines are skipped
            "1.25,16,4,16,7,1,2,4\n")
    t = load_trace(write_text("g.csv", text))
    assert t.source["format"] == "generic"
    assert t.arrival_s.tolist() == [0.5, 1.25]
    assert [k.tolist() for k in t.prefix_keys] == [[7, 8], [7]]
    assert t.prefix_block_tokens == 16
    assert t.session_id.tolist() == [1, 1] and t.priority.tolist() == [0, 2] and t.num_samples.tolist() == [1, 4]


def test_explicit_format_overrides_detection(write_text):
    # A Mooncake trace stored as CSV loads with format=mooncake (containers are independent).
    path = write_text("m.csv", "timestamp,input_length,output_length,hash_ids\n0,600,3,4 5\n10,100,2,4\n")
    t = load_trace(path, format="mooncake")
    assert [k.tolist() for k in t.prefix_keys] == [[4, 5], [4]]
    assert t.arrival_s.tolist() == [0.0, 0.01]


def test_chunked_loading_matches_whole(write_text, monkeypatch):
    path = write_text("a.csv", AZURE_HEADER + azure_rows(25))
    whole = load_trace(path)
    monkeypatch.setattr(load_mod, "CHUNK_LINES", 4)
    chunked = load_trace(path)
    assert np.array_equal(whole.arrival_s, chunked.arrival_s)
    assert np.array_equal(whole.prompt_tokens, chunked.prompt_tokens)


def test_unsorted_sort_option_repairs_with_warning(write_text):
    path = write_text("m.jsonl", mooncake_line(2000, 10, 1) + mooncake_line(1000, 20, 2) + mooncake_line(3000, 30, 3))
    with pytest.warns(TraceWarning, match="sorted the requests"):
        t = load_trace(path, on_unsorted="sort")
    assert t.arrival_s.tolist() == [1.0, 2.0, 3.0]
    assert t.prompt_tokens.tolist() == [20, 10, 30]  # rows move with their times
    assert "line 2" in t.source["repairs"][0]


def test_zero_output_drop_option(write_text):
    path = write_text("a.csv", AZURE_HEADER + "2023-11-16 18:00:00.0,10,0\n2023-11-16 18:00:01.0,10,5\n")
    with pytest.warns(TraceWarning, match="dropped 1 request"):
        t = load_trace(path, on_zero_output="drop")
    assert len(t) == 1 and t.output_tokens.tolist() == [5]
    assert t.source["requests_in_file"] == 2


# ---- bad input: each names the file and the line/row ----------------------------------------


def test_missing_path(tmp_path):
    path = tmp_path / "nope.csv"
    expect_error(path, "does not exist")


def test_missing_column_given_format(write_text):
    path = write_text("a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:00:00,5\n")
    expect_error(path, "line 1", "missing column(s) 'GeneratedTokens'", format="azure")


def test_undetectable_columns(write_text):
    path = write_text("a.csv", "time,in,out\n1,2,3\n")
    expect_error(path, "line 1", "cannot detect the trace format", "TIMESTAMP")


def test_non_numeric_length(write_text):
    path = write_text("a.csv", AZURE_HEADER + azure_rows(2) + "2023-11-16 18:20:00.0,abc,5\n")
    expect_error(path, "line 4", "'ContextTokens' must be a number", "'abc'")


def test_non_numeric_length_in_later_chunk(write_text, monkeypatch):
    monkeypatch.setattr(load_mod, "CHUNK_LINES", 3)
    path = write_text("a.csv", AZURE_HEADER + azure_rows(8) + "2023-11-16 18:20:00.0,12,x\n")
    expect_error(path, "line 10", "'GeneratedTokens'")


def test_fractional_length(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + '{"timestamp": 1, "input_length": 10.5, "output_length": 5, "hash_ids": [0]}\n')
    expect_error(path, "line 2", "whole number")


def test_negative_length(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + mooncake_line(10, 10, -3))
    expect_error(path, "line 2", "'output_length' is negative")


def test_zero_output_is_error_by_default(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + mooncake_line(10, 10, 5) + mooncake_line(20, 10, 0))
    expect_error(path, "line 3", "'output_length' is 0", "trace.on_zero_output: drop in a scenario",
                 "--on-zero-output drop in kvsim trace")


def test_zero_prompt_is_error(write_text):
    path = write_text("g.csv", "arrival_s,prompt_tokens,output_tokens\n0,0,5\n")
    expect_error(path, "line 2", "'prompt_tokens' is 0")


def test_unsorted_is_error_by_default(write_text):
    path = write_text("a.csv", AZURE_HEADER + azure_rows(3, start_s=10) + azure_rows(1))
    expect_error(path, "line 5", "not sorted", "trace.on_unsorted: sort in a scenario", "--on-unsorted sort in kvsim trace")


def test_unsorted_across_chunks(write_text, monkeypatch):
    monkeypatch.setattr(load_mod, "CHUNK_LINES", 2)
    lines = [mooncake_line(t, 10, 1) for t in (0, 10, 20, 5, 30)]
    expect_error(write_text("m.jsonl", "".join(lines)), "line 4", "not sorted")


def test_empty_file(write_text):
    expect_error(write_text("e.csv", ""), "line 1", "empty")
    expect_error(write_text("e.jsonl.gz", ""), "line 1", "empty")
    expect_error(write_text("e2.csv", "\n\n"), "line 1", "empty")


def test_header_without_requests(write_text):
    expect_error(write_text("h.csv", AZURE_HEADER), "line 2", "no requests")


def test_truncated_gzip(tmp_path):
    rows = "".join(mooncake_line(i * 10, 1000 + i % 97, 1 + i % 13) for i in range(20_000))
    data = gzip.compress(rows.encode(), mtime=0)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    msg = expect_error(path, "truncated")
    line = int(msg.split(": line ")[1].split(":")[0])
    assert 1000 < line < 20_000  # names the line where reading stopped


def test_truncated_gzip_csv(tmp_path):
    data = gzip.compress((AZURE_HEADER + azure_rows(3000)).encode(), mtime=0)
    path = tmp_path / "cut.csv.gz"
    path.write_bytes(data[: len(data) - 20])
    expect_error(path, "line ", "truncated")


def test_corrupt_gzip_header(tmp_path):
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage-garbage")
    expect_error(path, "line 1", "gzip")


def test_bad_json_line(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + mooncake_line(1, 10, 5) + '{"timestamp": 2, "input_len\n')
    expect_error(path, "line 3", "not a valid JSON object")


def test_json_line_not_an_object(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + "[1, 2, 3]\n")
    expect_error(path, "line 2", "expected a JSON object")


def test_json_missing_field(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + '\n{"timestamp": 1, "input_length": 10, "hash_ids": [0]}\n')
    expect_error(path, "line 3", "missing value for column 'output_length'")


def test_json_string_in_numeric_field(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + '{"timestamp": 1, "input_length": "ten", "output_length": 5, "hash_ids": [0]}\n')
    expect_error(path, "line 2", "'input_length' must be a number", "'ten'")


def test_hash_ids_count_must_match_length(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 1000, 5, [0, 1]) + mooncake_line(1, 1100, 5, [0, 1]))
    expect_error(path, "line 2", "has 2 keys", "need 3")


def test_hash_ids_must_be_integers(write_text):
    path = write_text("m.jsonl", mooncake_line(0, 10, 5, [0]) + mooncake_line(1, 10, 5, [1.5]))
    expect_error(path, "line 2", "64-bit integers", "1.5")


def test_bad_timestamp_string(write_text):
    path = write_text("a.csv", AZURE_HEADER + azure_rows(1) + "yesterday,10,5\n")
    expect_error(path, "line 3", "'TIMESTAMP' is not a date-time", "yesterday")


def test_negative_arrival(write_text):
    path = write_text("g.csv", "arrival_s,prompt_tokens,output_tokens\n-1,5,5\n")
    expect_error(path, "line 2", "negative")


def test_too_many_csv_fields(write_text):
    path = write_text("a.csv", AZURE_HEADER + azure_rows(2) + "2023-11-16 18:20:00.0,1,2,3\n")
    expect_error(path, "line 4", "expected 3 comma-separated fields")


def test_missing_csv_value(write_text):
    path = write_text("a.csv", AZURE_HEADER + "2023-11-16 18:20:00.0,,2\n")
    expect_error(path, "line 2", "missing value for column 'ContextTokens'")


def test_bad_prefix_key_string(write_text):
    text = "arrival_s,prompt_tokens,output_tokens,prefix_block_tokens,prefix_keys\n0,16,1,16,3\n1,32,1,16,3 x\n"
    expect_error(write_text("g.csv", text), "line 3", "64-bit integers", "'x'")


def test_inconsistent_block_size(write_text):
    text = "arrival_s,prompt_tokens,output_tokens,prefix_block_tokens,prefix_keys\n0,16,1,16,3\n1,32,1,32,3\n"
    expect_error(write_text("g.csv", text), "line 3", "prefix_block_tokens")


def test_prefix_keys_without_block_size(write_text):
    text = "arrival_s,prompt_tokens,output_tokens,prefix_keys\n0,16,1,3\n"
    expect_error(write_text("g.csv", text), "block size")


def test_bad_parquet_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "g.parquet"
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [5, 5, -5], "output_tokens": [1, 1, 1]}), path)
    expect_error(path, "row 3", "'prompt_tokens' is negative")


def test_unknown_format_name(write_text):
    expect_error(write_text("a.csv", AZURE_HEADER + azure_rows(1)), "unknown trace format", format="mooncak")


def test_not_a_file(tmp_path):
    expect_error(tmp_path, "directory")


def test_no_traceback_types_escape(write_text):
    """Binary junk is a TraceError, not a UnicodeDecodeError or pandas exception."""
    path = write_text("junk.csv", "")
    path.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe\x00junk,\x80,1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TraceError):
            load_trace(path)


# ---- a JSON-lines column the format reads must be on the first line too -----------------------

GENERIC_LINE = '{{"arrival_s": {t}, "prompt_tokens": 32, "output_tokens": 5{extra}}}\n'


@pytest.mark.parametrize("extra, column", [(', "priority": 7', "priority"), (', "num_samples": 2', "num_samples"),
                                           (', "prefix_keys": [1, 2], "prefix_block_tokens": 16', "prefix_block_tokens")])
def test_jsonl_column_first_seen_on_a_later_line_is_an_error(write_text, extra, column):
    text = GENERIC_LINE.format(t=0, extra="") + "\n" + GENERIC_LINE.format(t=1, extra=extra)
    expect_error(write_text("g.jsonl", text), "line 3", f"column '{column}' is not on line 1",
                 "on every line or on none")


def test_jsonl_late_hash_ids_in_a_later_chunk(write_text, monkeypatch):
    monkeypatch.setattr(load_mod, "CHUNK_LINES", 2)
    lines = [f'{{"timestamp": {t}, "input_length": 10, "output_length": 5}}\n' for t in range(4)]
    text = "".join(lines) + mooncake_line(9, 10, 5, [3])
    expect_error(write_text("m.jsonl", text), "line 5", "column 'hash_ids' is not on line 1")


def test_jsonl_unknown_column_on_a_later_line_is_still_ignored(write_text):
    text = GENERIC_LINE.format(t=0, extra="") + GENERIC_LINE.format(t=1, extra=', "note": "x"')
    assert len(load_trace(write_text("g.jsonl", text))) == 2


# ---- a CSV chunk's first row with too many fields (pandas would truncate it) ------------------


@pytest.mark.parametrize("row", ["2023-11-16 18:20:00.0,1,2,3", "2023-11-16 18:20:00.0,1,2,"])
def test_too_many_csv_fields_on_the_first_row(write_text, row):
    path = write_text("a.csv", AZURE_HEADER + row + "\n" + azure_rows(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no pandas ParserWarning either
        expect_error(path, "line 2", "expected 3 comma-separated fields", "found 4")


def test_too_many_csv_fields_on_the_first_row_of_a_later_chunk(write_text, monkeypatch):
    monkeypatch.setattr(load_mod, "CHUNK_LINES", 3)
    path = write_text("a.csv", AZURE_HEADER + azure_rows(3) + "2023-11-16 18:20:00.0,1,2,3\n" + azure_rows(2, 600))
    expect_error(path, "line 5", "expected 3 comma-separated fields")


# ---- token counts are bounded (coerce.MAX_TOKENS) and never wrap around -----------------------


def test_token_count_above_the_bound_is_an_error(write_text):
    from kvsim.trace.coerce import MAX_TOKENS

    ok = load_trace(write_text("ok.csv", AZURE_HEADER + f"2023-11-16 18:15:46.0,{MAX_TOKENS},44\n"))
    assert ok.prompt_tokens.tolist() == [MAX_TOKENS]
    path = write_text("a.csv", AZURE_HEADER + azure_rows(1) + "2023-11-16 18:20:00.0,9223372036854775807,44\n")
    expect_error(path, "line 3", "column 'ContextTokens' is too large (9223372036854775807)", str(MAX_TOKENS))
    path = write_text("m.jsonl", mooncake_line(0, 10, 5) + mooncake_line(1, 10, MAX_TOKENS + 1))
    expect_error(path, "line 2", "column 'output_length' is too large")


def test_integer_beyond_int64_is_too_large_not_fractional(write_text):
    path = write_text("a.csv", AZURE_HEADER + "2023-11-16 18:15:46.0,10,99999999999999999999999\n")
    expect_error(path, "line 2", "column 'GeneratedTokens' is too large")


def test_parquet_uint64_max_is_too_large_not_negative(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "g.parquet"
    col = pa.array([5, 2**64 - 1], pa.uint64())
    pq.write_table(pa.table({"arrival_s": [0.0, 1.0], "prompt_tokens": col, "output_tokens": [1, 1]}), path)
    msg = expect_error(path, "row 2", "'prompt_tokens' is too large", str(2**64 - 1))
    assert "negative" not in msg


# ---- not a text trace: lines are read with a bound, undecodable bytes are named ---------------


def test_dev_zero_is_refused_quickly_with_one_line():
    """Was: 3.7 GB read, then 'internal error: MemoryError', exit 1. In a subprocess capped at
    2 GiB of address space, so a regression fails here instead of exhausting the machine."""
    import resource
    import subprocess
    import sys
    from pathlib import Path

    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    proc = subprocess.run([sys.executable, "-m", "kvsim", "trace", "stats", "/dev/zero"], capture_output=True,
                          text=True, timeout=120, preexec_fn=cap)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()] and proc.stdout == ""
    assert proc.stderr.startswith("kvsim: error: /dev/zero: line 1: longer than 16 MiB without a line break: "
                                  "not a text trace"), proc.stderr


@pytest.mark.parametrize("name", ["g.csv", "g.jsonl", "g.csv.gz"])
def test_line_longer_than_the_bound_is_refused(write_text, monkeypatch, name):
    from kvsim.trace import fileio

    monkeypatch.setattr(fileio, "MAX_LINE_BYTES", 64)
    if "jsonl" in name:
        ok = '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 5}'
        long = '{"arrival_s": 1, "prompt_tokens": 5, "output_tokens": 5, "note": "' + "x" * 64 + '"}'
    else:
        ok, long = "arrival_s,prompt_tokens,output_tokens", "1," + "5" * 70 + ",5"
    assert len(ok) + 1 <= 64 + 1
    expect_error(write_text(name, ok + "\n" + long + "\n"), "line 2", "without a line break", "not a text trace")


def test_line_of_exactly_the_bound_is_read(write_text, monkeypatch):
    from kvsim.trace import fileio

    header = "arrival_s,prompt_tokens,output_tokens\n"
    monkeypatch.setattr(fileio, "MAX_LINE_BYTES", len(header) - 1)  # the newline is not counted
    assert len(load_trace(write_text("g.csv", header + "0,5,5\n"))) == 1


def test_jsonl_starting_with_a_non_utf8_byte_says_so(write_text):
    path = write_text("m.jsonl", "")
    path.write_bytes(b'\xff{"timestamp": 0, "input_length": 3, "output_length": 5}\n')
    msg = expect_error(path, "line 1", "not UTF-8 text", "JSON lines")
    assert "CSV header" not in msg


# ---- typed parquet date-times/durations are not numbers ---------------------------------------


@pytest.mark.parametrize("arrow_type, what", [("timestamp", "date-times"), ("duration", "durations")])
def test_generic_parquet_time_typed_arrival_is_refused(tmp_path, arrow_type, what):
    """Was read as raw microseconds taken for seconds (a 1 s gap became 1,000,000 s)."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    if arrow_type == "timestamp":
        col = pa.array([dt.datetime(2023, 11, 16, 18, 15, 46), dt.datetime(2023, 11, 16, 18, 15, 47)], pa.timestamp("us"))
    else:
        col = pa.array([0, 1_000_000], pa.duration("us"))
    path = tmp_path / "g.parquet"
    pq.write_table(pa.table({"arrival_s": col, "prompt_tokens": [5, 5], "output_tokens": [1, 1]}), path)
    expect_error(path, "row 1", f"column 'arrival_s' holds {what}", "seconds from the trace start", "TIMESTAMP")


def test_parquet_time_typed_length_is_refused(tmp_path):
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "g.parquet"
    col = pa.array([dt.datetime(2023, 11, 16)], pa.timestamp("us"))
    pq.write_table(pa.table({"arrival_s": [0.0], "prompt_tokens": col, "output_tokens": [1]}), path)
    expect_error(path, "row 1", "column 'prompt_tokens' holds date-times", "not numbers")


def test_azure_parquet_with_typed_timestamps_still_loads(tmp_path):
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "a.parquet"
    col = pa.array([dt.datetime(2023, 11, 16, 18, 15, 46), dt.datetime(2023, 11, 16, 18, 15, 47, 500000)], pa.timestamp("us"))
    pq.write_table(pa.table({"TIMESTAMP": col, "ContextTokens": [5, 5], "GeneratedTokens": [1, 1]}), path)
    assert load_trace(path).arrival_s.tolist() == [0.0, 1.5]


# ---- parquet: duplicate columns, null keys and uint64 keys are one-line errors naming the row ------

def _parquet(tmp_path, name, keys=None, **columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = {"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [32, 32, 32], "output_tokens": [1, 1, 1]}
    if keys is not None:
        data.update(prefix_block_tokens=[16, 16, 16], prefix_keys=keys)
    path = tmp_path / name
    pq.write_table(pa.table({**data, **columns}), path)
    return path


def test_parquet_duplicate_column_names(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "dup.parquet"
    pq.write_table(pa.table([[0.0], [10], [10], [5]],
                            names=["arrival_s", "prompt_tokens", "prompt_tokens", "output_tokens"]), path)
    expect_error(path, "schema: duplicate column name(s) 'prompt_tokens'")


def test_csv_duplicate_column_names(write_text):
    expect_error(write_text("dup.csv", "arrival_s,prompt_tokens,prompt_tokens,output_tokens\n0,1,1,1\n"),
                 "line 1: duplicate column name(s) 'prompt_tokens'")


def test_parquet_null_key_names_its_row(tmp_path):
    import pyarrow as pa

    keys = pa.array([[1, 2], [1, 2], [1, None]], pa.list_(pa.int64()))
    msg = expect_error(_parquet(tmp_path, "n.parquet", keys), "row 3", "null", "key 2 of 2")
    assert "list of int64" not in msg


def test_parquet_uint64_key_above_int64_is_refused(tmp_path):
    import pyarrow as pa

    keys = pa.array([[1, 2], [1, 2], [1, 2**64 - 1]], pa.list_(pa.uint64()))
    expect_error(_parquet(tmp_path, "u.parquet", keys), "row 3", "64-bit integers", str(2**64 - 1))
    ok = pa.array([[1, 2], [1, 2], [1, 2**63 - 1]], pa.list_(pa.uint64()))
    assert load_trace(_parquet(tmp_path, "ok.parquet", ok)).prefix_keys[2].tolist() == [1, 2**63 - 1]


def test_azure_timestamps_with_utc_offsets_are_converted_to_utc(write_text):
    """docs/traces.md: a stamp with an offset is converted to UTC; one without is taken as UTC."""
    text = AZURE_HEADER + ("2023-11-16 18:00:00.0+05:00,10,1\n"   # 13:00 UTC
                           "2023-11-16 13:00:01.0,10,1\n"          # 1 s later
                           "2023-11-16 13:00:03.0Z,10,1\n")
    assert load_trace(write_text("z.csv", text)).arrival_s.tolist() == [0.0, 1.0, 3.0]
