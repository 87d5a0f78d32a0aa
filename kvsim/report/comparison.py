"""``kvsim compare``: comparison tables and plots over run directories or a sweep directory.

Inputs: single-run directories (``summary.json``), variants directories (subdirectories with
``summary.json``), or a sweep directory (``index.parquet`` + ``points/``; only ok points). Outputs
(``OUT``, default ``<input>/compare`` for one input):

* ``comparison.csv`` -- one row per run: label, source, the sweep's override columns (or the
  scenario keys that differ between runs), ``offered_rate_req_per_s``, every metric column of
  :mod:`kvsim.report.tables`;
* ``fragmentation_breakdown.png`` (always), ``concurrency_comparison.png`` (always),
  ``memory_over_time.png`` (always), ``latency_cdf.png`` (always);
* ``concurrency_vs_block_size.png`` -- when ``allocator.block_size`` takes 2+ values;
* ``throughput_vs_rate.png``, ``normalized_latency_vs_rate.png`` and ``knees.csv`` -- when a
  request-rate key (``trace.rate_scale``, ``trace.synthetic.arrival.rate_per_s``, any key ending in
  ``rate_scale`` / ``rate_per_s``) takes 2+ values;
* ``prefix_hit_ratio_vs_capacity.png`` -- when a summary has ``prefix_cache.hit_ratio_tokens``;
* ``step_time_breakdown.png``, ``bandwidth_utilisation.png`` -- when a summary has the step-time
  breakdown / a bandwidth utilisation (:mod:`kvsim.report.access`);
* ``latency_vs_block_size.png`` and ``bandwidth_vs_block_size.png`` -- when ``allocator.block_size``
  takes 2+ values (bandwidth: ``kv_access.hbm_bandwidth_utilisation``, any timing model with an
  attention kernel; calibrated timing's ``kv_bandwidth_utilisation`` where that is missing).
* ``knees.csv`` and the rate plots follow the series and knee rule of :mod:`kvsim.report.series`.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.errors import KvsimError
from kvsim.plots import plot_concurrency_comparison, plot_fragmentation_bars, plot_latency_cdfs
from kvsim.report.comparison_plots import (
    bandwidth_pct,
    plot_bandwidth_vs_block_size,
    plot_concurrency_vs_block_size,
    plot_latency_vs_block_size,
    plot_memory_over_time,
    plot_prefix_hit_vs_capacity,
    plot_vs_rate,
)
from kvsim.report.comparison_table import comparison_frame, table_text, vllm_frame, vllm_metrics
from kvsim.report.runs import baseline_choice, collect_runs, read_table
from kvsim.report.series import BLOCK_KEY, distinct_values, knees_frame, pick_runs, rate_key
from kvsim.report.tables import prefix_hit_value
from kvsim.results import write_text_atomic


def default_compare_dir(paths: list[str | Path]) -> Path:
    if len(paths) != 1:
        raise KvsimError("compare: give --out DIR when comparing more than one input")
    return Path(paths[0]) / "compare"


METRIC_NAMES = ("kvsim", "vllm")


def compare(paths: list[str | Path], out: str | Path | None = None, log=None, *, metric_names: str = "kvsim",
            baseline: str | None = None, show=None, force: bool = False) -> dict[str, Path]:
    """Write comparison tables and plots for ``paths`` into ``out``; returns {file name: path}.

    ``show`` (e.g. ``print``) receives the headline table first and, with ``metric_names="vllm"``,
    the vLLM-named view, as text. ``baseline`` names the headline's baseline run.

    ``out`` is a kvsim output directory (kvsim.outdir): written atomically, replacing only an
    earlier ``compare`` output (another kvsim command's only with ``force``), never a directory
    kvsim did not write, nor one holding an input."""
    from kvsim.outdir import atomic_out_dir

    if metric_names not in METRIC_NAMES:
        raise KvsimError(f"compare: --metric-names {metric_names!r}: valid choices are {', '.join(METRIC_NAMES)}")
    say = log or (lambda m: None)
    runs, meta = collect_runs(paths)
    base_label, why = baseline_choice(runs, baseline)
    final = Path(out) if out is not None else default_compare_dir(paths)
    with atomic_out_dir(final, "compare", force=force, protect=paths, log=say) as tmp:
        written = _write_comparison(runs, meta, tmp, say, metric_names=metric_names, base_label=base_label,
                                    show=show, why=why)
    return {name: final / name for name in written}


def _write_comparison(runs, meta, out: Path, say, *, metric_names: str, base_label, show,
                      why: str = "") -> dict[str, Path]:
    from kvsim.report.headline import headline, headline_frame, headline_text

    written: dict[str, Path] = {}

    from kvsim.report.findings import key_findings
    from kvsim.report.workload import differences_note, workload_differences

    head = headline({r.label: r.summary for r in runs}, base_label)
    write_text_atomic(out / "headline.csv", headline_frame(head).to_csv(index=False))
    written["headline.csv"] = out / "headline.csv"
    diffs = workload_differences(runs)
    if diffs:
        say(differences_note(diffs))
    if show is not None:
        findings = key_findings({r.label: r.summary for r in runs}, base_label, [d.split(":", 1)[0] for d in diffs])
        if findings:
            show("Key findings\n" + "\n".join(f"- {f}" for f in findings))
        reason = f" -- {why}; another: --baseline LABEL" if why else ""
        show(f"Headline (baseline: {head.baseline}{reason})\n{headline_text(head)}")
    table = comparison_frame(runs, meta)
    write_text_atomic(out / "comparison.csv", table.to_csv(index=False))
    written["comparison.csv"] = out / "comparison.csv"
    if metric_names == "vllm":
        vtable = vllm_frame(runs, meta)
        write_text_atomic(out / "comparison_vllm.csv", vtable.to_csv(index=False))
        written["comparison_vllm.csv"] = out / "comparison_vllm.csv"
        if show is not None:
            metric_cols = ["label"] + [c for c in vtable.columns if c in vllm_metrics(runs[0].summary)]
            show("Serving metrics (vLLM names, ms)\n" + table_text(vtable[metric_cols]))

    def attempt(name: str, fn) -> None:
        """Draw one output; a failure is reported and the other outputs are still written."""
        try:
            fn(out / name)
        except Exception as e:  # noqa: BLE001
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""  # (Arrow prints whole schemas)
            say(f"compare: could not write {name}: {type(e).__name__}: {first}")
            return
        written[name] = out / name

    summaries = {r.label: r.summary for r in runs}
    attempt("fragmentation_breakdown.png", lambda p: plot_fragmentation_bars(summaries, p))
    attempt("concurrency_comparison.png", lambda p: plot_concurrency_comparison(summaries, p))
    attempt("memory_over_time.png", lambda p: plot_memory_over_time(runs, p))

    def cdfs(p: Path) -> None:
        reqs = {r.label: read_table(r.path / "requests.parquet", columns=["status", "ttft_s", "tpot_s", "e2e_s"])
                for r in pick_runs(runs)}  # every run has its tables (read_run_dir checked them)
        plot_latency_cdfs(reqs, p, total_runs=len(runs))

    attempt("latency_cdf.png", cdfs)
    if len(distinct_values(runs, BLOCK_KEY)) > 1:
        attempt("concurrency_vs_block_size.png", lambda p: plot_concurrency_vs_block_size(runs, p))
    else:
        say("compare: block size does not vary: no concurrency_vs_block_size.png")
    key = rate_key(runs)
    if key is not None:
        attempt("throughput_vs_rate.png", lambda p: plot_vs_rate(
            runs, key, "throughput_requests_per_s", "throughput (requests/s)", "Throughput vs request rate", p))
        attempt("normalized_latency_vs_rate.png", lambda p: plot_vs_rate(
            runs, key, "normalized_latency_s_per_token", "normalized latency (s/token)",
            "Normalized latency vs request rate", p, log_y=True))
        attempt("knees.csv", lambda p: write_text_atomic(p, knees_frame(runs, key).to_csv(index=False)))
    else:
        say("compare: request rate does not vary: no throughput/latency-vs-rate plots")
    if any(prefix_hit_value(r.summary) is not None for r in runs):
        attempt("prefix_hit_ratio_vs_capacity.png", lambda p: plot_prefix_hit_vs_capacity(runs, p))
    from kvsim.report.access import plot_bandwidth_utilisation, plot_step_time_breakdown, step_time_shares

    if any(step_time_shares(s) is not None for s in summaries.values()):
        attempt("step_time_breakdown.png", lambda p: plot_step_time_breakdown(summaries, p))
    if any(bandwidth_pct(r) is not None for r in runs):
        attempt("bandwidth_utilisation.png", lambda p: plot_bandwidth_utilisation(summaries, p))
    if len(distinct_values(runs, BLOCK_KEY)) > 1:
        attempt("latency_vs_block_size.png", lambda p: plot_latency_vs_block_size(runs, p))
        if any(bandwidth_pct(r) is not None for r in runs):
            attempt("bandwidth_vs_block_size.png", lambda p: plot_bandwidth_vs_block_size(runs, p))
    if meta["failed"]:
        say(f"compare: left out {len(meta['failed'])} failed point(s): {', '.join(meta['failed'][:5])}")
    if meta.get("left_out"):
        say(f"compare: left out {len(meta['left_out'])} variant(s) without a summary.json: "
            f"{', '.join(meta['left_out'][:5])}")
    if meta.get("ignored"):
        say(f"kvsim: note: compare: ignored {len(meta['ignored'])} folder(s) that the run's scenario.resolved.yaml "
            f"does not list as variants: {', '.join(meta['ignored'])}")
    return written
