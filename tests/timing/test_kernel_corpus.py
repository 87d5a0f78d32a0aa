"""The public kernel-measurement corpus: complete rows, a fixed split, bad rows refused in one line,
and the model's held-out error recomputed from the data (docs/kernel_model.md, "Measurement corpus")."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources

import numpy as np
import pytest

from kvsim.cli import main
from kvsim.errors import ConfigError
from kvsim.hw import GPUS
from kvsim.timing.kernel import KernelModel, builtin_backends, load_backend
from kvsim.timing.kernel_corpus import COLUMNS, layout_of, load_corpus, parse_rows, profile_for

CSV = resources.files("kvsim.timing") / "data" / "kernels" / "kernel_corpus.csv"


def test_corpus_is_complete_and_large_enough():
    pts = load_corpus()  # refuses any row with a missing field
    assert len(pts) >= 150
    assert len({p.source_url for p in pts}) >= 8
    on_presets = [p for p in pts if p.gpu_preset in GPUS]
    assert len(on_presets) >= 150
    assert {p.split for p in pts} == {"fit", "holdout"}
    # every number printed as text, but FlashInfer's launch-post figures, digitised with a stated reading error
    # (bench/digitise_flashinfer_blog.py); none of those is an hour's guess: each row names its error
    figure = [p for p in pts if p.reading != "text"]
    assert {p.reading for p in figure} == {"figure"}
    assert {p.source_id for p in figure} == {"flashinfer-blog-2024-batch-decode", "flashinfer-blog-2024-batch-gqa"}
    lines = CSV.read_text().splitlines()
    assert lines[0].split(",") == list(COLUMNS)
    assert len(lines) == len(pts) + 1


def test_split_holds_out_every_third_row_of_each_source_and_backend():
    from kvsim.timing.kernel_corpus import HELD_OUT_SOURCES, held_out_whole

    groups: dict = {}
    corpus = load_corpus()
    for p in corpus:
        groups.setdefault((p.source_id, p.backend), []).append(p)
    for (source, backend), rows in groups.items():
        rows.sort(key=lambda p: (p.batch, p.context, p.page_size, p.dtype))
        if held_out_whole(source):  # added after the fit: held out whole
            assert {p.split for p in rows} == {"holdout"}
        else:
            assert [p.split for p in rows] == ["holdout" if i % 3 == 2 else "fit" for i in range(len(rows))]
    assert HELD_OUT_SOURCES <= {p.source_id for p in corpus}


def test_a_row_with_a_missing_field_is_refused_naming_file_row_and_key(tmp_path, capsys):
    lines = CSV.read_text().splitlines()
    cells = lines[1].split(",")
    col = COLUMNS.index("source_id")
    cells[col] = ""
    bad = tmp_path / "corpus.csv"
    bad.write_text("\n".join([lines[0], ",".join(cells)]) + "\n")
    with pytest.raises(ConfigError, match=r"corpus.csv row 2: key 'source_id' is missing"):
        load_corpus(bad)
    assert main(["kernel", "--check", "--corpus", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "key 'source_id'" in err[0] and "corpus.csv" in err[0]


def test_malformed_fields_are_refused():
    header = ",".join(COLUMNS)
    good = CSV.read_text().splitlines()[1]
    with pytest.raises(ConfigError, match="key 'split' must be one of"):
        parse_rows([header, good.replace(",fit,", ",train,").replace(",holdout,", ",train,")], "x.csv")
    with pytest.raises(ConfigError, match="key 'attention' must be one of"):
        parse_rows([header, good.replace(",gqa,", ",mha,")], "x.csv")
    with pytest.raises(ConfigError, match="key 'time_us' is missing from the header"):
        parse_rows([header.replace("time_us", "time")], "x.csv")


def _heldout_errors(backend: str):
    """Relative time errors and (measured >= 40 %) utilisation errors of ``backend``'s held-out rows,
    computed here through the array path of the kernel model, not through kernel_corpus.error_table; an
    eagerly timed row's prediction is read through its source's host floor, as the row was measured."""
    from kvsim.timing.kernel_corpus import host_floors

    profiles = {b: load_backend(b) for b in builtin_backends()}
    corpus = load_corpus()
    floors = host_floors(corpus)
    rel, util = [], []
    for p in corpus:
        if p.split != "holdout" or p.backend != backend or p.gpu_preset not in GPUS:
            continue
        g, lay = GPUS[p.gpu_preset], layout_of(p)
        km = KernelModel.for_gpu(profile_for(p, profiles), lay, g)
        n = np.array([p.batch])
        t = float(km.time_s(n, n * p.context, n * -(-p.context // p.page_size))[0])
        if p.timing == "eager-wrapper":
            t = max(t, floors[p.source_id])
        rel.append(abs(t - p.time_s) / p.time_s)
        kv = p.layers * p.batch * p.context * lay.kv_bytes_per_token_layer
        measured = kv / p.time_s / g.hbm_bandwidth_bytes_per_s
        if measured >= 0.40:
            util.append(abs(kv / t / g.hbm_bandwidth_bytes_per_s - measured))
    return np.array(rel), np.array(util)


def _fit_errors(backend: str) -> np.ndarray:
    """Relative time errors of ``backend``'s fit rows (kernel_corpus.error_table's definition)."""
    from kvsim.timing.kernel_corpus import as_measured, host_floors, predict

    profiles = {b: load_backend(b) for b in builtin_backends()}
    corpus = load_corpus()
    floors = host_floors(corpus)
    return np.array([abs(as_measured(p, predict(p, profile_for(p, profiles))[0], floors) - p.time_s) / p.time_s
                     for p in corpus if p.split == "fit" and p.backend == backend and p.gpu_preset in GPUS])


@pytest.mark.parametrize("backend, rows, util_rows", [("flashattention-paged", 100, 90), ("flashinfer-paged", 152, 140),
                                                      ("vllm-paged-v2", 21, 10)])
def test_backends_with_20_heldout_rows_meet_the_issues_targets(backend, rows, util_rows):
    # issue 23: held-out error <= 15 % of kernel time for a backend with >= 20 held-out rows, and
    # within 5 points of utilisation at >= 40 % measured utilisation (mean over those rows; the rows
    # more than 5 points off are counted by `kvsim kernel --check` and discussed in
    # docs/kernel_model.md). FlashAttention: A100-80GB, A100-40GB and H100 rows; FlashInfer: A100-80GB and
    # H200 rows (the H100/H200 sources held out whole miss by far more: docs/kernel_model.md, "Whole sources
    # held out"; test_whole_sources_held_out_are_reported_per_gpu); PagedAttention v2: FlashInfer's launch post
    # (H100, A100 PCIe) and vLLM's threads (A100-40GB), half its rows under 40 % of peak (GQA re-reads).
    rel, util = _heldout_errors(backend)
    assert len(rel) == rows
    assert rel.mean() <= 0.15
    assert len(util) == util_rows and util.mean() <= 0.05


@pytest.mark.parametrize("backend, rows", [("vllm-paged-v1", 1), ("flashmla", 2)])
def test_small_backends_heldout_rows_generalise_like_their_fit_rows(backend, rows):
    # below the issue's 20-row floor (errors printed by `kvsim kernel --check`, stated in
    # docs/kernel_model.md); the check that remains: held-out rows are predicted about as well as the
    # rows the constants were fitted on (the fit does not merely memorise them): no held-out row
    # worse than the worst fit row, and their mean within 1.5x the fit rows' mean
    rel, _ = _heldout_errors(backend)
    fit = _fit_errors(backend)
    assert len(rel) == rows and len(fit) >= 2 * rows
    assert rel.max() <= fit.max() and rel.mean() <= 1.5 * fit.mean()


@pytest.mark.parametrize("family, start", [("vllm-paged-v1", {"query_head_reads": 0.25}),
                                           ("vllm-paged-v2", {"query_head_reads": 0.25})])
def test_fit_uses_fit_rows_only_and_reproduces_the_shipped_profiles(family, start):
    from kvsim.calibration import kernel_corpus_fit as F
    from kvsim.timing.kernel_corpus import evaluable

    profiles, corpus = F.family_inputs(family, load_corpus(), {})
    extra, _ = F.ALSO_READS.get(family, (None, None))
    if extra:  # read with the family's constants, partitioned as the other backend partitions
        assert profiles[extra].split_rule == "vllm-v2" and profiles[extra].launch_overhead_s == profiles[family].launch_overhead_s
    assert {p.backend for p in corpus} == set(profiles)
    fit_rows = [p for p in evaluable(corpus, profiles) if p.split == "fit"]
    base = {b: replace(p, **{**F.START_BASE[family], **start}) for b, p in profiles.items()}
    params, _ = F.fit_family(fit_rows, base, F.FITTED[family])
    for key, value in params.items():  # the shipped profile holds the fit, at 3 significant digits
        assert getattr(profiles[family], key) == pytest.approx(value, rel=5e-3, abs=1e-12), key
    # moving every held-out time leaves the fit unchanged: the fit never reads them
    moved = [p for p in evaluable([replace(p, time_s=p.time_s * (3.0 if p.split == "holdout" else 1.0))
                                   for p in corpus], profiles) if p.split == "fit"]
    assert F.fit_family(moved, base, F.FITTED[family])[0] == params


def test_vllm_paged_v2_takes_the_v1_page_cost_and_fits_its_own_rows():
    # v2's rows are all page 16 (FlashInfer's launch post, vLLM's threads): its per-page cost is v1's;
    # the 2023 kernel's profile (v1) is fitted on vLLM's threads alone, so the post's rows never reach it
    from kvsim.calibration import kernel_corpus_fit as F

    v1, v2 = load_backend("vllm-paged-v1"), load_backend("vllm-paged-v2")
    assert v2.page_overhead_s == v1.page_overhead_s and "page_overhead_s" not in F.FITTED["vllm-paged-v2"]
    assert F.BORROWERS["vllm-paged-v1"] == {"vllm-paged-v2": ("page_overhead_s",)}
    extra, sources = F.ALSO_READS["vllm-paged-v1"]
    assert extra == "vllm-paged-v2" and not any(s.startswith("flashinfer-blog") for s in sources)


def test_check_prints_every_backend_and_split(capsys):
    assert main(["kernel", "--check"]) == 0
    out = capsys.readouterr().out
    for backend in ("flashattention-paged", "vllm-paged-v1", "vllm-paged-v2", "flashinfer-paged", "flashmla"):
        assert backend in out
    assert "holdout" in out and "fit" in out and "not evaluated" in out
    verdicts = out.split("issue 23's held-out targets")[1].split("of these, the sources")[0].splitlines()[1:]
    assert len(verdicts) == len(builtin_backends())
    assert any(line.split()[0] == "contiguous" and "1 held-out rows" in line for line in verdicts)
    assert any(line.split()[0] == "vllm-paged-v1" and "target not claimed" in line for line in verdicts)
    assert any(line.split()[0] == "flashinfer-paged" and "(met)" in line for line in verdicts)
    whole = out.split("the sources held out whole")[1].splitlines()[1:]
    assert any(line.split()[:3] == ["flashattention-paged", "H100-SXM-80GB", "10"] and "42.7% mean" in line
               for line in whole)


def test_written_constants_read_back_as_numbers():
    # PyYAML reads 4e-08 as a string; the fit's writer must give every constant a float form
    import yaml

    from kvsim.calibration.kernel_corpus_fit import yaml_number

    for value in (4e-08, 1.07e-15, 3.12e-10, 0.992, 64.0, 4080.0, 1e-5, 0.0):
        assert yaml.safe_load(f"k: {yaml_number(value)}")["k"] == float(f"{value:.3g}")
    for backend in builtin_backends():  # the shipped files parse (a string value is refused)
        load_backend(backend)


def test_rounds_are_chosen_by_the_fit_rows_not_searched():
    from kvsim.calibration import kernel_corpus_fit as F

    # ctas_per_sm is a form constant each start holds (0 first), never a searched parameter
    assert all("ctas_per_sm" not in keys for keys in F.FITTED.values())
    for fam in ("flashattention-paged", "flashinfer-paged"):
        held = [st.get("ctas_per_sm", 0.0) for st in F.STARTS[fam]]
        assert held[0] == 0.0 and set(held) == {0.0, *F.ROUNDS}
    assert load_backend("flashinfer-paged").ctas_per_sm == 0.0  # what its fit rows chose (the tie rule)
    assert load_backend("flashattention-paged").ctas_per_sm == 0.0


def test_the_host_floor_is_the_eager_sources_and_stays_out_of_the_kernel_model():
    from kvsim.timing.kernel_corpus import TIMINGS, as_measured, host_floors, predict

    corpus = load_corpus()
    eager = {p.source_id for p in corpus if p.timing == "eager-wrapper"}
    # only Vidur's FlashInfer profile was timed around the eager wrapper call; FlashAttention's Vidur rows
    # scale with context from 9 us at batch 1 x 32 tokens (no flat floor above the kernel)
    assert eager == {"vidur-a100-llama3-8b-flashinfer"} and {p.timing for p in corpus} == set(TIMINGS)
    floors = host_floors(corpus)
    assert set(floors) == eager
    fi = [p for p in corpus if p.source_id in eager]
    small = sorted(p.time_s for p in fi if p.batch == 1 and p.split == "fit")
    assert small[0] <= floors["vidur-a100-llama3-8b-flashinfer"] <= small[-1]
    # held-out rows never set the floor
    moved = [replace(p, time_s=p.time_s * (3.0 if p.split == "holdout" else 1.0)) for p in corpus]
    assert host_floors(moved) == floors
    # the floor applies to the comparison with eager rows only, and the shipped kernel model runs below it:
    # a batch-1 launch of 800 tokens (8 KV heads of 128, one layer) predicts less than the floor it reads
    prof = load_backend("flashinfer-paged")
    p = next(p for p in fi if p.batch == 1 and p.context == 800)
    t = predict(p, prof)[0]
    assert t < floors[p.source_id] and as_measured(p, t, floors) == floors[p.source_id]
    kernel_row = next(p for p in corpus if p.timing == "kernel")
    assert as_measured(kernel_row, 1e-9, floors) == 1e-9


def test_a_bad_timing_value_is_refused():
    header = ",".join(COLUMNS)
    good = CSV.read_text().splitlines()[1]
    assert good.endswith(",kernel")
    with pytest.raises(ConfigError, match="key 'timing' must be one of"):
        parse_rows([header, good[: -len("kernel")] + "graph"], "x.csv")


def test_whole_sources_held_out_are_reported_per_gpu():
    # the figures docs/kernel_model.md, "Whole sources held out (twenty-fifth session)", quotes: the shipped
    # profiles against the sources added after the fit and never read by it
    from kvsim.timing.kernel_corpus import evaluable, held_out_whole, predict

    profiles = {b: load_backend(b) for b in builtin_backends()}
    corpus = load_corpus()
    err: dict = {}
    for p in evaluable(corpus, profiles):
        if held_out_whole(p.source_id):
            err.setdefault((p.source_id, p.backend), []).append(
                (p.time_s, predict(p, profile_for(p, profiles))[0] / p.time_s - 1))
    assert set(err) == {("onnxruntime-pr-21414-fa2", "flashattention-paged"),
                        ("tileops-nightly-2026-08-22", "flashinfer-paged"), ("tileops-pr-1930", "flashinfer-paged"),
                        ("tileops-pr-2084", "contiguous")}

    def mean_abs(key, rows):
        e = np.array([e for _, e in err[key]])
        assert len(e) == rows
        return np.abs(e).mean()

    assert mean_abs(("onnxruntime-pr-21414-fa2", "flashattention-paged"), 10) == pytest.approx(0.427, abs=5e-4)
    assert sorted(round(e, 3) for t, e in err[("onnxruntime-pr-21414-fa2", "flashattention-paged")]
                  if t >= 100e-6) == [0.036, 0.072]
    tile = ("tileops-nightly-2026-08-22", "flashinfer-paged")
    assert mean_abs(tile, 8) == pytest.approx(0.391, abs=5e-4)
    big = [e for t, e in err[tile] if t >= 100e-6]  # the group-4 launches of 200-500 us: predicted fast
    assert len(big) == 4 and max(big) < 0 and np.abs(big).mean() == pytest.approx(0.299, abs=5e-4)
    assert err[("tileops-pr-1930", "flashinfer-paged")][0][1] == pytest.approx(1.040, abs=5e-4)
    assert err[("tileops-pr-2084", "contiguous")][0][1] == pytest.approx(0.308, abs=5e-4)


def test_vllm_paged_v2_refit_on_the_launch_post_rows():
    # vLLM 0.2.6's PagedAttention v2 beside FlashInfer on an H100 and an A100 PCIe, split by the every-third
    # rule and fitted with vLLM's threads' v2 rows: the post's held-out rows per GPU (docs/kernel_model.md)
    from kvsim.timing.kernel_corpus import predict

    prof = load_backend("vllm-paged-v2")
    err: dict = {}
    for p in load_corpus():
        if p.backend == "vllm-paged-v2" and p.source_id.startswith("flashinfer-blog") and p.split == "holdout":
            err.setdefault(p.gpu_preset, []).append(abs(predict(p, profile_for(p, {p.backend: prof}))[0] / p.time_s - 1))
    assert {g: len(e) for g, e in err.items()} == {"H100-SXM-80GB": 11, "A100-PCIe-80GB": 9}
    assert np.mean(err["H100-SXM-80GB"]) == pytest.approx(0.083, abs=5e-4)
    assert np.mean(err["A100-PCIe-80GB"]) == pytest.approx(0.098, abs=5e-4)


def test_flashinfer_refit_on_the_launch_post_rows_keeps_the_a100_rows():
    # the post's H100 FlashInfer rows, split by the every-third rule, entered the flashinfer-paged fit: the
    # held-out H100 rows are within 15 % on the mean, and the A100 rows (Vidur's profile) are no worse than
    # before the refit (5.1 % held out)
    rel = {}
    profiles = {b: load_backend(b) for b in builtin_backends()}
    for p in load_corpus():
        if p.backend == "flashinfer-paged" and p.gpu_preset in ("H100-SXM-80GB", "A100-80GB") and p.split == "holdout":
            rel.setdefault(p.gpu_preset, []).append(p)
    from kvsim.timing.kernel_corpus import as_measured, host_floors, predict

    floors = host_floors(load_corpus())
    err = {g: np.array([abs(as_measured(p, predict(p, profiles[p.backend])[0], floors) / p.time_s - 1) for p in ps])
           for g, ps in rel.items()}
    assert len(err["H100-SXM-80GB"]) == 11 and err["H100-SXM-80GB"].mean() <= 0.15
    assert len(err["A100-80GB"]) == 123 and err["A100-80GB"].mean() <= 0.051


def test_the_digitised_rows_are_the_script_s_derivation_of_their_utilisation():
    # FlashInfer's launch post prints utilisation, not time: each digitised row's time is
    # (KV + query bytes) / (utilisation x the post's bandwidth), which bench/digitise_flashinfer_blog.py
    # writes; recomputed here from the row's own fields, and the script's rows parse as corpus rows
    from tests.helpers import load_bench
    from kvsim.timing.kernel_corpus import parse_rows

    script = load_bench("digitise_flashinfer_blog")
    rows = [p for p in load_corpus() if p.reading == "figure"]
    assert len(rows) == 134
    for p in rows:
        kv = p.batch * p.context * 2 * p.kv_heads * p.head_dim * 2
        q = p.batch * p.query_heads * p.head_dim * 2
        assert p.time_s == pytest.approx((kv + q) / (p.bandwidth_util * script.BW[p.gpu]), rel=2e-3)
    row = script._row("x", "Figure 6", "c", "H100 SXM 80GB", "flashinfer-paged", "v", 16, 1024, 32, 32, 75.9, 1.0, "n")
    import csv
    import io

    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=script.COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerow(row)
    (pt,) = parse_rows(out.getvalue().splitlines(), "x.csv")
    assert pt.reading == "figure" and pt.split == "holdout" and pt.time_s == pytest.approx(105.56e-6, rel=1e-3)
    assert script.main([]) == 2
    # the script splits its rows by the corpus' rule: the committed rows' splits, recomputed from them
    with CSV.open() as fh:
        recs = [r for r in csv.DictReader(fh) if r["reading"] == "figure"]
    committed = [r["split"] for r in recs]
    assert [r["split"] for r in script.assign_splits([dict(r, split="") for r in recs])] == committed
