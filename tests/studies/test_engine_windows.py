"""bench/engine_windows.py: steady decode windows read from real vLLM engine log lines, priced with
kvsim's timing model, and the per-sequence overhead the vllm-v1 profile takes from them."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest

from helpers import load_bench

ROOT = Path(__file__).resolve().parents[2]


if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench import engine_windows as ew  # noqa: E402

vs = load_bench("validate_serving")


def _line(readme_line, time, prompt=0.0, gen=1000.0, running=20, waiting=0, pid=7, usage=10.0):
    return ew.LogLine(5, pid, f"09-04 {time}", readme_line, prompt, gen, running, waiting, usage, 24.83,
                      "qwen2-7b-a100x1-u50-i1024-o1024-n1")


def test_only_intervals_of_pure_decode_of_an_unchanged_batch_are_windows():
    lines = [
        _line(1, "01:00:00"), _line(2, "01:00:10"),                       # kept: (1, 2)
        _line(3, "01:00:20", prompt=5.0),                                 # a prompt started
        _line(4, "01:00:30", waiting=2), _line(5, "01:00:40"),            # waiting at its start
        _line(6, "01:00:50", running=19),                                 # a request ended
        _line(7, "01:01:20", running=19),                                 # 30 s after the previous line
        _line(8, "01:01:30", running=19), _line(9, "01:01:30", running=19),  # kept once (printed twice)
        _line(10, "01:01:40", running=19, pid=8),                         # another process: no predecessor
    ]
    got = [(a.readme_line, b.readme_line) for a, b in ew.steady_windows(lines)]
    assert got == [(1, 2), (7, 8)]


def test_mean_context_from_the_kv_usage_by_hand():
    ln = _line(1, "01:00:00", gen=2000.0, running=100, usage=50.0)
    # 50 % of 100,000 tokens over 100 requests = 500 held, less half a 16-token block, less half of the
    # 10 s x 2000 tok/s / 100 = 200 tokens each request decoded in the interval
    assert ew.mean_context(ln, 10.0, 100_000, 16) == pytest.approx(500 - 8 - 100)
    assert ew.mean_context(_line(1, "01:00:00", gen=1e6, running=1, usage=0.1), 10.0, 1000, 16) == 1.0


def test_committed_lines_are_the_readme_sections_of_the_corpus_cases():
    lines = ew.load_lines()
    cases = {r["case_id"] for r in vs.load_corpus()}
    assert len(lines) >= 150 and {ln.section for ln in lines} == set(range(2, 9))
    assert {ln.case_id for ln in lines} <= cases
    # each section is one deployment with the KV memory its heading prints (Test 5: 24.83 GiB)
    assert {ln.kv_cache_gib for ln in lines if ln.section == 5} == {24.83}
    assert len(ew.steady_windows(lines)) == 26


def test_a_window_is_priced_as_the_timing_model_prices_its_decode_step():
    from kvsim.timing.base import decode_shape

    lines = ew.load_lines()
    rows = ew.price(lines)
    r = next(x for x in rows if x["readme_line"] == 1962)  # Test 5, pid 2739: 195 running
    assert r["running"] == 195 and r["measured_ms"] == pytest.approx(195 / 5380.9 * 1e3)
    _, timing, geometry = ew._deployment(r["case_id"])
    want = timing.step_time(decode_shape(195, 195 * r["context"], 195 * math.ceil(r["context"] / 16))).duration_s
    assert r["kvsim_ms"] == want * 1e3
    assert {x["split"] for x in rows} == {"fit", "holdout"}


def test_a_tensor_parallel_window_leaves_the_rest_of_its_step_to_the_allreduces():
    from kvsim.timing.base import decode_shape

    rows = ew.price(ew.load_lines())
    r = next(x for x in rows if x["readme_line"] == 2072)  # Test 6: Qwen2.5-32B on 2 GPUs, 1 running
    scn, timing, _ = ew._deployment(r["case_id"])
    calls = scn.parallel_plan().allreduces_per_step
    step = timing.step_time(decode_shape(1, r["context"], math.ceil(r["context"] / 16)))
    comm = step.breakdown_s["parallel_comm_s"]
    assert calls == 128 and r["allreduce_bytes"] == 5120 * 2  # 2 a layer, hidden x 2 bytes per token
    assert r["kvsim_allreduce_s"] * calls == pytest.approx(comm, rel=1e-12)
    measured = r["measured_ms"] / 1e3
    assert r["implied_allreduce_s"] * calls + step.duration_s - comm == pytest.approx(measured, rel=1e-12)
    table = ew.allreduce_markdown(rows)
    assert table.count("\n") == 2 + sum(x["tensor"] > 1 for x in rows) and "| 2072 | 1 | 10 |" in table
    assert ew.allreduce_markdown([x for x in rows if x["tensor"] == 1]) == ""


def test_the_vllm_v1_per_sequence_overhead_is_what_the_fit_windows_give():
    from kvsim.config.profiles import profile_fills

    fitted = ew.fit_per_seq(ew.load_lines())
    profile = profile_fills("vllm-v1")["timing[analytical].overhead"].value["per_seq_s"]
    assert profile == pytest.approx(fitted, rel=5e-3)


def test_serving_fit_keeps_the_profiles_per_sequence_term():
    from kvsim.config.profiles import profile_fills

    per_seq = profile_fills("vllm-v1")["timing[analytical].overhead"].value["per_seq_s"]
    assert per_seq > 0
    got = vs.param_overrides({"per_prefill_seq_s": 0.004}, "vllm-v1")
    assert got == [f"timing.overhead={{per_seq_s: {per_seq!r}, per_prefill_seq_s: 0.004}}"]
    assert vs.param_overrides({"per_prefill_seq_s": 0.004}, "sglang") == ["timing.overhead={per_prefill_seq_s: 0.004}"]


def _write(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, ew.FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def test_bad_line_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "lines.csv"
    with ew.LINES.open() as f:
        rows = list(csv.DictReader(f))
    rows[3]["gen_tps"] = ""
    _write(bad, rows)
    assert ew.main(["--lines", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{bad}:5" in err and "gen_tps" in err
    rows[3]["gen_tps"] = "fast"
    _write(bad, rows)
    assert ew.main(["--lines", str(bad)]) == 2
    assert "numbers expected" in capsys.readouterr().err


def test_missing_doc_markers_leave_the_doc_alone(tmp_path):
    doc = tmp_path / "v.md"
    doc.write_text("no markers here\n")
    with pytest.raises(ew.WindowError, match="markers"):
        ew.update_docs("| table |\n", doc)
    assert doc.read_text() == "no markers here\n"
    doc.write_text(f"a\n{ew.DOC_START}\nold\n{ew.DOC_END}\nb\n")
    ew.update_docs("new\n", doc)
    assert doc.read_text() == f"a\n{ew.DOC_START}\nnew\n{ew.DOC_END}\nb\n"


def test_readme_parser_reads_a_logger_line_under_its_section():
    text = ("#### Test 5: 1 GPU pod hosts 7B model (Available KV cache memory: 24.83 GiB)\n"
            "(APIServer pid=2739) INFO 09-04 01:35:10 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 "
            "tokens/s, Avg generation throughput: 5380.9 tokens/s, Running: 195 reqs, Waiting: 0 reqs, GPU KV "
            "cache usage: 78.4%, Prefix cache hit rate: 33.3%\n")
    got = ew.lines_from_readme(text, {5: "case-x"})
    assert got == [{"section": 5, "pid": "2739", "log_time": "09-04 01:35:10", "readme_line": 2,
                    "prompt_tps": "0.0", "gen_tps": "5380.9", "running": "195", "waiting": "0",
                    "kv_usage_pct": "78.4", "hit_rate_pct": "33.3", "kv_cache_gib": "24.83", "case_id": "case-x",
                    "source_url": ew.README_URL}]
    assert ew.lines_from_readme(text, {4: "case-y"}) == []
