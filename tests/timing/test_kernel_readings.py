"""``kvsim kernel --check --readings FILE``: a user's own kernel readings beside the model, row by row, every
row held out; bad files refused in one line (docs/kernel_model.md, "Your own readings")."""

from __future__ import annotations

import json

import pytest

from kvsim.cli import main
from kvsim.timing.kernel import builtin_backends, load_backend
from kvsim.timing.kernel_corpus import load_corpus, predict, profile_for

HEADER = "gpu_preset,backend,batch,context,query_heads,kv_heads,head_dim,dtype,page_size,time_us"


def _corpus_rows(source_id: str) -> list:
    return [p for p in load_corpus() if p.source_id == source_id]


def _as_readings(points) -> str:
    lines = [HEADER + ",layers"]
    for p in points:
        lines.append(f"{p.gpu_preset},{p.backend},{p.batch},{p.context},{p.query_heads},{p.kv_heads},{p.head_dim},"
                     f"{p.dtype},{p.page_size},{p.time_s * 1e6!r},{p.layers}")
    return "\n".join(lines) + "\n"


def test_readings_are_each_compared_with_the_model_as_the_corpus_rows_are(tmp_path, capsys):
    pts = _corpus_rows("onnxruntime-pr-21414-fa2")  # the H100 source held out whole
    f = tmp_path / "mine.csv"
    f.write_text(_as_readings(pts))
    assert main(["kernel", "--check", "--readings", str(f), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    profiles = {b: load_backend(b) for b in builtin_backends()}
    assert len(rows) == len(pts) == 10
    for r, p in zip(rows, pts):
        t, u_pred, u_meas = predict(p, profile_for(p, profiles))
        assert r["predicted_s"] == pytest.approx(t, rel=1e-12) and r["measured_s"] == pytest.approx(p.time_s)
        assert r["error"] == pytest.approx(t / p.time_s - 1, rel=1e-9)
        assert r["predicted_utilisation"] == pytest.approx(u_pred) and r["measured_utilisation"] == pytest.approx(u_meas)
    # the text form prints every row and the table of the held-out rows with the targets
    assert main(["kernel", "--check", "--readings", str(f)]) == 0
    out = capsys.readouterr().out
    assert "10 rows" in out and out.count("H100-SXM-80GB") >= 11
    assert "10 held-out rows (< 20): target not claimed" in out


@pytest.mark.parametrize("text, key", [
    (HEADER.replace(",time_us", "") + "\nH100-SXM-80GB,flashinfer-paged,8,1024,32,8,128,fp16,16\n", "time_us"),
    (HEADER + "\nH300,flashinfer-paged,8,1024,32,8,128,fp16,16,50\n", "gpu_preset"),
    (HEADER + "\nH100-SXM-80GB,flashdecoding,8,1024,32,8,128,fp16,16,50\n", "backend"),
    (HEADER + "\nH100-SXM-80GB,flashinfer-paged,8,1024,32,8,128,fp16,16,-1\n", "time_us"),
    (HEADER + "\nH100-SXM-80GB,flashinfer-paged,8,,32,8,128,fp16,16,50\n", "context"),
    (HEADER + "\nH100-SXM-80GB,flashinfer-paged,8,1024,32,8,128,fp13,16,50\n", "dtype"),
    (HEADER + "\nH100-SXM-80GB,flashinfer-paged,8,1024,32,7,128,fp16,16,50\n", "kv_heads"),  # 32 % 7: no GQA
    (HEADER + ",attention\nH100-SXM-80GB,flashmla,8,1024,128,32,576,fp16,64,50,mla\n", "kv_heads"),  # MLA: 1 latent
])
def test_a_bad_reading_is_refused_in_one_line_naming_the_file_and_key(tmp_path, capsys, text, key):
    f = tmp_path / "mine.csv"
    f.write_text(text)
    assert main(["kernel", "--check", "--readings", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mine.csv" in err[0] and f"'{key}'" in err[0]


def test_a_reading_may_name_a_backend_by_its_old_name(tmp_path, capsys):
    f = tmp_path / "mine.csv"
    rows = [HEADER, "A100-80GB,{},32,1024,40,40,128,fp16,16,600"]
    f.write_text("\n".join([rows[0], rows[1].format("vllm-2023-paged"), rows[1].format("vllm-paged-v1")]) + "\n")
    assert main(["kernel", "--check", "--readings", str(f), "--json"]) == 0
    old, new = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert old["backend"] == new["backend"] == "vllm-paged-v1" and old["predicted_s"] == new["predicted_s"]


def test_readings_need_check_and_rows(tmp_path, capsys):
    f = tmp_path / "mine.csv"
    f.write_text("")
    assert main(["kernel", "--check", "--readings", str(f)]) == 2
    assert "the kernel readings file is empty" in capsys.readouterr().err
    f.write_text(HEADER + "\n")
    assert main(["kernel", "--check", "--readings", str(f)]) == 2
    assert "no readings" in capsys.readouterr().err
    assert main(["kernel", "--readings", str(f)]) == 2
    assert "--readings needs --check" in capsys.readouterr().err
    assert main(["kernel", "--check", "--readings", str(tmp_path / "absent.csv")]) == 2


@pytest.mark.parametrize("args", [["kernel", "--check", "--readings"], ["kernel", "--check", "--corpus"],
                                  ["memory", "--check", "--corpus"]])
def test_a_file_that_is_not_text_is_refused_in_one_line(tmp_path, capsys, args):
    f = tmp_path / "binary.csv"
    f.write_bytes(b"\xff\xfe\x00bad")
    assert main([*args, str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "binary.csv" in err[0] and "not UTF-8 text" in err[0]


@pytest.mark.parametrize("batch, context, words", [
    (100_000_000, 16, ["row 3", "'batch'", "1..1,048,576 (as --batch)", "got 100,000,000"]),
    (8, 16_777_217, ["row 3", "'context'", "1..16,777,216 (as --context)", "got 16,777,217"]),
])
def test_a_reading_past_the_launch_bounds_is_refused(tmp_path, capsys, batch, context, words):
    """QA (thirty-first session): one row of batch 10^8 took 12 GB and minutes; a row is bounded as --batch
    and --context are (the shipped corpus is within them: it loads)."""
    f = tmp_path / "big.csv"
    f.write_text(f"{HEADER}\nH100-SXM-80GB,flashattention-paged,8,16,32,8,128,fp16,16,10\n"
                 f"H100-SXM-80GB,flashattention-paged,{batch},{context},32,8,128,fp16,16,1000\n")
    assert main(["kernel", "--check", "--readings", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "big.csv" in err[0] and all(w in err[0] for w in words), err
    assert load_corpus()


def test_a_readings_file_with_a_bom_is_read(tmp_path, capsys):
    """QA (thirty-first session): a UTF-8 BOM (a spreadsheet's CSV export) read as "key 'gpu_preset' is missing
    from the header"; the user's files are read as utf-8-sig (kvsim.errors.read_user_text)."""
    from kvsim.errors import read_user_text

    f = tmp_path / "bom.csv"
    f.write_text(f"{HEADER}\nH100-SXM-80GB,flashattention-paged,64,512,32,32,128,fp16,256,194.181\n",
                 encoding="utf-8-sig")
    assert main(["kernel", "--check", "--readings", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["backend"] == "flashattention-paged"
    assert read_user_text(f, "x").startswith("gpu_preset,")


def test_a_reading_of_an_attention_kind_its_backend_does_not_read_is_refused(tmp_path, capsys):
    """QA (thirty-first session): flashmla rows with attention gqa were accepted. The backend's profile says
    which kinds it reads (attention_kinds, as for a run's model); flashattention-paged reads both."""
    f = tmp_path / "mine.csv"
    f.write_text(f"{HEADER},attention\nH100-SXM-80GB,flashmla,64,4096,128,1,576,bf16,64,300,mla\n"
                 "H100-SXM-80GB,flashmla,64,4096,32,8,128,bf16,64,300,gqa\n")
    assert main(["kernel", "--check", "--readings", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in ("mine.csv row 3", "'attention'", "one of mla", "'flashmla'",
                                                         "got 'gqa'")), err
    f.write_text(f"{HEADER},attention\nH100-SXM-80GB,flashattention-paged,64,4096,128,1,576,bf16,16,300,mla\n")
    assert main(["kernel", "--check", "--readings", str(f), "--json"]) == 0
