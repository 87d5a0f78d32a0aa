"""Self-contained HTML reports: ``report.html`` in a run, variants or sweep directory.

One file, no network: inline CSS, no JavaScript, every PNG embedded as a ``data:image/png;base64``
URI. Contents: the resolved scenario (YAML), the summary table(s), and every plot:

* every report opens with the headline table (:mod:`kvsim.report.headline`: fragmentation, HBM
  bandwidth utilisation, KV access latency, max concurrency; baseline vs each run, % change);
* single run: the summary table and the run's PNGs (memory breakdown, concurrency, latency CDF);
* variants directory: a comparison table (variants x metrics), the cross-variant PNGs, then one
  section per variant with its summary and PNGs;
* sweep directory: the sweep's points (index table), the ``compare/`` plots (made if missing) and,
  for sweeps of at most ``MAX_POINT_SECTIONS`` points, one section per point.

Plots a directory lacks (a run made with ``--no-plots``) are drawn into a temporary directory for
the report; the report never changes other files of the directory.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from kvsim.version import __version__
from kvsim.errors import ConfigError, KvsimError
from kvsim.report.priced_with import priced_with_lines
from kvsim.report.runs import read_run_dir, read_table
from kvsim.report.tables import fmt, read_resolved, resolved_runs, summary_metrics

MAX_POINT_SECTIONS = 16
RUN_PLOTS = {
    "memory_breakdown.png": "KV memory breakdown over time",
    "concurrency.png": "Running and waiting requests over time",
    "latency_cdf.png": "TTFT, TPOT and end-to-end latency CDFs",
}
VARIANT_PLOTS = {
    "fragmentation_breakdown.png": "KV memory breakdown by variant (time-weighted)",
    "concurrency_comparison.png": "Concurrency by variant",
    "latency_cdf.png": "Latency CDFs by variant",
}

CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:24px auto;max-width:1800px;
color:#212529;background:#fff;line-height:1.4;padding:0 16px}
h1{font-size:1.6em;border-bottom:2px solid #dee2e6;padding-bottom:6px}
h2{font-size:1.3em;margin-top:1.8em;border-bottom:1px solid #dee2e6;padding-bottom:4px}
h3{font-size:1.1em;margin-top:1.4em}
table{border-collapse:collapse;font-size:13px;margin:8px 0 16px 0}
th,td{border:1px solid #ced4da;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f1f3f5}
td.k,th.k{text-align:left}
tr:nth-child(even) td{background:#f8f9fa}
.failed td{background:#ffe3e3 !important}
.scroll{overflow-x:auto;max-width:100%}
table.headline th{white-space:normal;max-width:12em;vertical-align:bottom}
table.headline td.k{white-space:normal}
.chg{font-size:11px;color:#495057}
.chg.better{color:#2b8a3e}
.chg.worse{color:#c92a2a}
p,ul{max-width:1180px}
figure{margin:12px 0 24px 0}
figure img{max-width:100%;border:1px solid #e9ecef}
figcaption{font-size:13px;color:#495057}
pre{background:#f8f9fa;border:1px solid #e9ecef;padding:10px;font-size:12px;overflow-x:auto;max-height:480px}
details{margin:8px 0}
summary{cursor:pointer;font-weight:600}
.meta{color:#495057;font-size:13px}
.warn{color:#c92a2a}
"""


def _esc(v) -> str:
    return html.escape(str(v), quote=True)


def _img(path: Path, caption: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (f'<figure><img alt="{_esc(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(caption)} <code>({_esc(Path(path).name)})</code></figcaption></figure>")


def is_fraction(name: str) -> bool:
    """Metric names whose values are fractions (shown as percentages in reports)."""
    n = str(name).lower()
    return (n.endswith(("_frac", "frac_mean", "attainment", "utilisation", "utilization"))
            or "hit_ratio" in n or "_frac_" in n or n.startswith("kv_bandwidth_utilisation"))


def fmt_value(name: str, v) -> str:
    """A table cell: fractions (by metric ``name``) as percentages, other numbers as tables.fmt."""
    v = _py(v)
    if is_fraction(name) and isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
        pct = 100 * float(v)
        return f"{pct:.1f} %" if abs(pct) >= 1 or pct == 0 else f"{pct:.2g} %"
    return fmt(v)


def _table(df: pd.DataFrame, table_id: str | None = None, key_cols: int = 1, row_class=None,
           metric_rows: bool = False) -> str:
    """An HTML table. Fractions are shown as percentages: by column name, or (``metric_rows``: a
    table whose first column names the metric of each row) by that name."""
    tid = f' id="{_esc(table_id)}"' if table_id else ""
    cols = [str(c) for c in df.columns]
    head = "".join(f'<th class="{"k" if i < key_cols else ""}">{_esc(c)}</th>' for i, c in enumerate(cols))
    rows = []
    for _, r in df.iterrows():
        cls = f' class="{row_class(r)}"' if row_class and row_class(r) else ""
        vals = r.tolist()
        names = [str(vals[0])] * len(vals) if metric_rows else cols
        cells = "".join(f'<td class="{"k" if i < key_cols else ""}">'
                        f'{_esc(fmt(_py(v)) if i < key_cols else fmt_value(names[i], v))}</td>'
                        for i, v in enumerate(vals))
        rows.append(f"<tr{cls}>{cells}</tr>")
    return f'<div class="scroll"><table{tid}><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def _py(v):
    if v is pd.NA:
        return None
    return v.item() if hasattr(v, "item") else v


def _flat_summary_rows(summary: dict) -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []

    def walk(d, prefix=""):
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(v, key + ".")
            elif isinstance(v, list):
                rows.append((key, json.dumps(v)))
            else:
                rows.append((key, v))

    walk(summary)
    return rows


def _summary_table(summary: dict, table_id: str | None) -> str:
    df = pd.DataFrame(_flat_summary_rows(summary), columns=["metric", "value"])
    return _table(df, table_id, metric_rows=True)


def _page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{_esc(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _scenario_section(run_dir: Path) -> str:
    """The resolved scenario: the run's scenario.resolved.yaml, or (a variant subdirectory) this
    variant's entry of the parent's."""
    resolved_path = run_dir / "scenario.resolved.yaml"
    if resolved_path.exists():
        label, text = resolved_path.name, resolved_path.read_text(encoding="utf-8")
    else:
        from kvsim.report.tables import resolved_scenario

        scn = resolved_scenario(run_dir)
        if scn is None:
            return ""
        label = f"../scenario.resolved.yaml, runs.{run_dir.name}.scenario"
        text = yaml.safe_dump(scn, sort_keys=False, allow_unicode=True)
    return (f'<h2 id="scenario-yaml">Scenario (resolved)</h2><details><summary>{_esc(label)}'
            f"</summary><pre>{_esc(text)}</pre></details>")


def _run_plots(run_dir: Path, tmp: Path) -> list[str]:
    """Figures for one run; draws the missing ones into ``tmp``."""
    missing = [n for n in RUN_PLOTS if not (run_dir / n).exists()]
    src = {n: run_dir / n for n in RUN_PLOTS}
    if missing and (run_dir / "steps.parquet").exists():
        from kvsim.plots import plot_run_dir

        sub = tmp / run_dir.name
        sub.mkdir(parents=True, exist_ok=True)
        for f in ("summary.json", "steps.parquet", "requests.parquet"):
            (sub / f).symlink_to((run_dir / f).resolve())
        try:
            plot_run_dir(sub)
        except Exception as e:  # noqa: BLE001 -- e.g. a run dir written by an older kvsim
            return [_warn(f"could not draw the plots of {run_dir.name}: {type(e).__name__}: {e}")]
        for n in missing:
            src[n] = sub / n
    return [_img(p, cap) for n, cap in RUN_PLOTS.items() if (p := src[n]).exists()]


def _access_plots(summaries: dict[str, dict], tmp: Path, name: str) -> list[str]:
    """The access side (kvsim/report/access.py), drawn from the summaries into ``tmp``: step-time
    breakdown and bandwidth utilisation by run."""
    from kvsim.report.access import (bandwidth_values, plot_bandwidth_utilisation, plot_step_time_breakdown,
                                     step_time_shares)
    from kvsim.report.comparison_plots import PLOT_CAPTIONS

    sub = tmp / f"access-{name}"
    sub.mkdir(parents=True, exist_ok=True)
    out = []
    for fname, has, plot in (("step_time_breakdown.png", step_time_shares, plot_step_time_breakdown),
                             ("bandwidth_utilisation.png", bandwidth_values, plot_bandwidth_utilisation)):
        if any(has(s) for s in summaries.values()):
            try:
                out.append(_img(plot(summaries, sub / fname), PLOT_CAPTIONS[fname]))
            except Exception as e:  # noqa: BLE001 -- the rest of the report stands
                out.append(_warn(f"could not draw {fname}: {type(e).__name__}: {e}"))
    return out


def _warn(text: str) -> str:
    return f'<p class="warn">{_esc(text)}</p>'


def _header(title: str, path: Path, kind: str, shown_name: str | None = None) -> list[str]:
    return [f"<h1>{_esc(title)}</h1>",
            f'<p class="meta">kvsim {_esc(__version__)} report of the {_esc(kind)} directory '
            f"<code>{_esc(shown_name or path.name)}</code>. Metrics are defined in docs/metrics.md.</p>"]


MAX_HEADLINE_RUNS = 17  # baseline + 16 others; a larger sweep's full table is compare/headline.csv


def _headline_section(summaries: dict[str, dict], baseline: str | None = None) -> list[str]:
    """The headline table (kvsim/report/headline.py) that opens every report."""
    from kvsim.report.headline import headline, headline_html, pick_baseline

    if not summaries:
        return []
    labels = list(summaries)
    base = pick_baseline(labels, baseline)
    shown = [base] + [lab for lab in labels if lab != base][:MAX_HEADLINE_RUNS - 1]
    h = headline({lab: summaries[lab] for lab in shown}, base)
    out = ['<h2 id="headline-heading">Headline</h2>']
    if len(shown) < len(labels):
        out.append(f'<p class="meta">Showing the baseline and {len(shown) - 1} of {len(labels) - 1} other runs; '
                   "every run is in compare/headline.csv.</p>")
    out.append(headline_html(h))
    out.extend(priced_with_lines({lab: summaries[lab] for lab in shown}))
    return out


def _findings_section(summaries: dict[str, dict], baseline: str | None = None,
                      dirs: dict[str, Path] | None = None) -> list[str]:
    """"Key findings": computed sentences (kvsim/report/findings.py) that open every report; with the
    runs' directories (``dirs``, same labels), opened by what they do not share (trace, model, ...)."""
    from kvsim.report.findings import key_findings
    from kvsim.report.runs import load_run
    from kvsim.report.workload import workload_differences

    runs = [load_run(d, label, summaries[label]) for label, d in (dirs or {}).items()]
    items = key_findings(summaries, baseline, [d.split(":", 1)[0] for d in workload_differences(runs)])
    if not items:
        return []
    return ['<h2 id="findings">Key findings</h2>',
            "<ul>" + "".join(f"<li>{_esc(t)}</li>" for t in items) + "</ul>"]


def _trace_reports(run_dir: Path) -> dict[str, dict]:
    """{run name: trace report} from ``run_dir``'s scenario.resolved.yaml (empty without one)."""
    return {str(k): v.get("trace") or {} for k, v in resolved_runs(run_dir / "scenario.resolved.yaml").items()}


def _dropped_section(summaries: dict[str, dict], trace_reports: dict[str, dict]) -> list[str]:
    """"Requests not served": rejected/dropped/unfinished counts by reason per run, with the fix."""
    from kvsim.dropped import WARN_REJECTED_FRAC, Dropped

    rows, fixes, warn = [], [], []
    for name, s in summaries.items():
        d = Dropped.from_summary(s, trace_reports.get(name) or (next(iter(trace_reports.values()))
                                                                if len(trace_reports) == 1 else None))
        if not d.parts():
            continue
        rows.append({"run": name, "trace requests": d.trace_requests, "finished": d.finished,
                     "not served": f"{d.lost} ({100 * d.lost_frac:.1f}%)", "what happened": "; ".join(d.parts())})
        fixes += [f for f in d.fixes() if f not in fixes]
        if d.warning(name):
            warn.append(name)
    if not rows:
        return ['<h2 id="dropped">Requests not served</h2><p>Every request of the trace was served.</p>']
    out = ['<h2 id="dropped">Requests not served</h2>']
    if warn:
        out.append(_warn(f"More than {100 * WARN_REJECTED_FRAC:.0f}% of the trace was not served in: {', '.join(warn)}; "
                         "their metrics describe only the requests that were."))
    out.append(_table(pd.DataFrame(rows), "dropped"))
    out.append("<ul>" + "".join(f"<li>{_esc(f)}</li>" for f in fixes) + "</ul>")
    return out


def _single_run_body(run_dir: Path, tmp: Path, shown_name: str | None = None) -> tuple[str, list[str]]:
    summary = read_run_dir(run_dir)
    title = f"kvsim run: {summary.get('name', run_dir.name)}"
    body = _header(title, run_dir, "run", shown_name)
    body += _findings_section({str(summary.get("name", run_dir.name)): summary})
    body += _headline_section({str(summary.get("name", run_dir.name)): summary})
    body += _dropped_section({summary.get("name", run_dir.name): summary}, _trace_reports(run_dir))
    body += ['<h2 id="summary-heading">Summary</h2>', _summary_table(summary, "summary")]
    body += ['<h2 id="plots">Plots</h2>'] + _run_plots(run_dir, tmp)
    body += _access_plots({str(summary.get("name", run_dir.name)): summary}, tmp, "run")
    body.append(_scenario_section(run_dir))
    return title, body


def _variants_body(run_dir: Path, tmp: Path, shown_name: str | None = None) -> tuple[str, list[str]]:
    from kvsim.report.runs import scenario_baseline, unlisted_variants, variant_order, variants_without_summary

    subs = [run_dir / n for n in variant_order(run_dir)]  # scenario order, baseline first: everywhere
    summaries = {p.name: read_run_dir(p) for p in subs}
    scenario = next(iter(summaries.values())).get("scenario", run_dir.name)
    title = f"kvsim run: {scenario} ({len(subs)} variants)"
    body = _header(title, run_dir, "variants", shown_name)
    if left_out := variants_without_summary(run_dir):
        body.append(_warn(f"Left out {len(left_out)} variant(s) without a summary.json: {', '.join(left_out)}."))
    if ignored := unlisted_variants(run_dir):
        body.append(_warn(f"Ignored {len(ignored)} folder(s) that scenario.resolved.yaml does not list as variants: "
                          f"{', '.join(ignored)}."))
    baseline = scenario_baseline(run_dir)
    body += _findings_section(summaries, baseline, {p.name: p for p in subs})
    body += _headline_section(summaries, baseline)
    body += _dropped_section(summaries, _trace_reports(run_dir))
    table = pd.DataFrame({n: summary_metrics(s) for n, s in summaries.items()})
    table.insert(0, "metric", table.index)
    body += ['<h2 id="summary-heading">Summary by variant</h2>',
             _table(table.reset_index(drop=True), "summary", metric_rows=True)]
    missing = [n for n in VARIANT_PLOTS if not (run_dir / n).exists()]
    src = {n: run_dir / n for n in VARIANT_PLOTS}
    if missing:
        from kvsim.plots import plot_comparison_dir

        sub = tmp / "variants"
        sub.mkdir(parents=True, exist_ok=True)
        for p in subs:
            (sub / p.name).symlink_to(p.resolve())
        try:
            plot_comparison_dir(sub, [p.name for p in subs])
        except Exception as e:  # noqa: BLE001
            body.append(_warn(f"could not draw the comparison plots: {type(e).__name__}: {e}"))
        for n in missing:
            src[n] = sub / n
    body += ['<h2 id="plots">Plots</h2>'] + [_img(src[n], cap) for n, cap in VARIANT_PLOTS.items() if src[n].exists()]
    body += _access_plots(summaries, tmp, "variants")
    for p in subs:
        body += [f'<h2 id="variant-{_esc(p.name)}">Variant {_esc(p.name)}</h2>',
                 f"<details><summary>summary.json of {_esc(p.name)}</summary>{_summary_table(summaries[p.name], None)}"
                 "</details>"]
        body += _run_plots(p, tmp)
    body.append(_scenario_section(run_dir))
    return title, body


def _sweep_body(sweep_dir: Path, tmp: Path) -> tuple[str, list[str]]:
    from kvsim.report.comparison import compare
    from kvsim.report.comparison_plots import PLOT_CAPTIONS

    idx = read_table(sweep_dir / "index.parquet")
    doc = read_resolved(sweep_dir / "sweep.resolved.yaml") or {}
    name = doc.get("name", sweep_dir.name)
    title = f"kvsim sweep: {name}"
    body = _header(title, sweep_dir, "sweep")
    if doc.get("description"):
        body.append(f"<p>{_esc(doc['description'])}</p>")
    ok = int((idx["status"] == "ok").sum())
    body.append(f'<p class="meta">{len(idx)} points: {ok} ok, {len(idx) - ok} not ok. Source: '
                f"<code>{_esc(Path(str(doc.get('sweep_file', ''))).name)}</code></p>")
    from kvsim.report.tables import point_labels

    idx.insert(0, "label", point_labels([r.to_dict() for _, r in idx.iterrows()]))
    heads, dirs = {}, {}
    for _, r in idx.iterrows():
        f = sweep_dir / str(r["run_dir"]) / "summary.json"
        if r["status"] == "ok" and f.exists():
            heads[str(r["label"])] = read_run_dir(f.parent)
            dirs[str(r["label"])] = f.parent
    body += _findings_section(heads, dirs=dirs)
    body += _headline_section(heads)
    keys = [k for k in (doc.get("override_keys") or []) if k in idx.columns]
    cols = ["label"] + (["variant"] if "variant" in idx.columns else []) + keys + ["status"]
    metric_cols = ["throughput_requests_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "e2e_p50_s", "e2e_p99_s",
                   "normalized_latency_s_per_token", "concurrency_max", "concurrency_mean", "kv_token_states_frac",
                   "kv_internal_frag_frac", "kv_external_frag_frac", "preemptions", "requests_finished",
                   "requests_rejected"]
    cols += [c for c in metric_cols if c in idx.columns] + ["error", "point_id"]
    body += ['<h2 id="summary-heading">Points</h2>',
             '<p class="meta">label: the point\'s name without the hash that keeps its directory '
             "(points/&lt;point_id&gt;) unique.</p>",
             _table(idx[cols], "summary", key_cols=1 + len(keys) + ("variant" in idx.columns),
                    row_class=lambda r: "failed" if r["status"] != "ok" else "")]
    compare_dir = sweep_dir / "compare"
    plots = sorted(compare_dir.glob("*.png")) if compare_dir.is_dir() else []
    if not plots and ok:
        try:
            compare([sweep_dir], compare_dir)
        except Exception as e:  # noqa: BLE001
            body.append(_warn(f"could not draw the comparison plots: {type(e).__name__}: {e}"))
        plots = sorted(compare_dir.glob("*.png"))
    order = list(PLOT_CAPTIONS)
    plots.sort(key=lambda p: order.index(p.name) if p.name in order else len(order))
    body += ['<h2 id="plots">Comparison plots</h2>'] + [_img(p, PLOT_CAPTIONS.get(p.name, p.stem)) for p in plots]
    knees = compare_dir / "knees.csv"
    if knees.exists():
        body += ['<h3 id="knees">Knees</h3>', _table(pd.read_csv(knees), "knees")]
    if len(idx) <= MAX_POINT_SECTIONS:
        for _, r in idx.iterrows():
            pdir = sweep_dir / str(r["run_dir"])
            body.append(f'<h2 id="point-{_esc(r["point_id"])}">Point {_esc(r["label"])}</h2>')
            if r["status"] != "ok" or not (pdir / "summary.json").exists():
                body.append(f"<p>status {_esc(r['status'])}: {_esc(r['error'])}</p>")
                continue
            summary = heads[str(r["label"])]
            body.append(f"<details><summary>summary.json</summary>{_summary_table(summary, None)}</details>")
            body += _run_plots(pdir, tmp)
    if doc:
        body += ['<h2 id="scenario-yaml">Sweep (resolved)</h2><details><summary>sweep.resolved.yaml</summary>'
                 f"<pre>{_esc((sweep_dir / 'sweep.resolved.yaml').read_text(encoding='utf-8'))}</pre></details>"]
    return title, body


def report_kind(path: Path) -> str:
    path = Path(path)
    if (path / "index.parquet").exists() and (path / "points").is_dir():
        return "sweep"
    if (path / "summary.json").exists():
        return "run"
    if path.is_dir() and any((p / "summary.json").exists() for p in path.iterdir()):
        return "variants"
    raise KvsimError(f"{path}: not a kvsim run, variants or sweep directory (no summary.json, no index.parquet)")


def render_report(run_dir: str | Path, shown_name: str | None = None) -> str:
    """The report of ``run_dir`` as one HTML string (``shown_name``: the directory name to print,
    when ``run_dir`` is the temporary directory of a run about to be renamed)."""
    run_dir = Path(run_dir)
    kind = report_kind(run_dir)
    with tempfile.TemporaryDirectory(prefix="kvsim-report-") as t:
        tmp = Path(t)
        if kind == "sweep":
            title, body = _sweep_body(run_dir, tmp)
        elif kind == "run":
            title, body = _single_run_body(run_dir, tmp, shown_name)
        else:
            title, body = _variants_body(run_dir, tmp, shown_name)
        return _page(title, [b for b in body if b])


def write_run_report(run_dir: str | Path, out: str | Path | None = None, *, force: bool = False,
                     shown_name: str | None = None) -> Path:
    """Write ``report.html`` (or ``out``) for a run, variants or sweep directory; returns its path.

    An existing file is replaced only if it is a kvsim report (the marker of the kvsim directory
    holding it says so: kvsim.outdir.writer_of) or with ``force``."""
    from kvsim.outdir import check_out_file, write_file_atomic

    run_dir = Path(run_dir)
    path = Path(out) if out is not None else run_dir / "report.html"
    if out is not None:
        _check_out_folder(path)
    check_out_file(path, command="report", force=force)
    text = render_report(run_dir, shown_name)
    try:
        return write_file_atomic(path, lambda p: p.write_text(text, encoding="utf-8"), command="report", force=force)
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the report: {e.strerror or e}") from None


def _check_out_folder(path: Path) -> None:
    """``report --out FILE`` writes into an existing folder only (as ``trace convert`` does)."""
    folder = path.parent
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        raise ConfigError(f"--out {path}: the output folder {folder} {why}")
