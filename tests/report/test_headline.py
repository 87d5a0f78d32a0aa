"""The headline table (fragmentation, HBM bandwidth utilisation, KV access latency, max concurrency:
baseline vs each variant with the % change), on summaries built by hand, in `kvsim compare` and in
report.html; and `kvsim compare --metric-names vllm`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pandas as pd
import pytest
import yaml

from kvsim.report.headline import HEADLINE, headline, headline_frame, headline_html, headline_text
from report_helpers import kvsim_main


def summary(frag=None, bw=None, lat=None, conc=None, **extra) -> dict:
    s: dict = {"concurrency": {}, "kv": {}}
    if frag is not None:
        s["kv"]["fragmentation_frac"] = frag
    if bw is not None or lat is not None:
        s["kv_access"] = {}
        if bw is not None:
            s["kv_access"]["hbm_bandwidth_utilisation"] = bw
        if lat is not None:
            s["kv_access"]["kv_load_latency_ns"] = lat
    if conc is not None:
        s["concurrency"]["max"] = conc
    s.update(extra)
    return s


def test_values_and_changes_by_hand():
    h = headline({"contiguous": summary(0.6, 0.5, 200.0, 10),
                  "paged-16": summary(0.04, 0.55, 250.0, 35)})
    assert h.baseline == "contiguous" and h.others == ("paged-16",)
    ch = h.changes["paged-16"]
    labels = [m.label for m in HEADLINE]
    assert ch[labels[0]] == pytest.approx((0.04 - 0.6) / 0.6 * 100)  # -93.3 %
    assert ch[labels[1]] == pytest.approx(10.0)
    assert ch[labels[2]] == pytest.approx(25.0)
    assert ch[labels[3]] == pytest.approx(250.0)
    text = headline_text(h)
    assert "60.0 %" in text and "4.0 %" in text and "-93.3 %" in text and "+250.0 %" in text
    df = headline_frame(h)
    assert list(df["metric"]) == labels
    assert df["baseline:contiguous"].iloc[0] == pytest.approx(60.0)
    assert df["paged-16 change_pct"].iloc[3] == pytest.approx(250.0)


def test_missing_keys_show_na_and_designated_baseline():
    old = summary(conc=12)  # an older kvsim: no fragmentation_frac, no kv_access section
    new = summary(0.1, 0.4, 90.0, 24)
    h = headline({"old": old, "new": new}, baseline="new")
    assert h.baseline == "new" and h.others == ("old",)
    labels = [m.label for m in HEADLINE]
    assert h.values["old"][labels[0]] is None and h.changes["old"][labels[0]] is None
    assert h.changes["old"][labels[3]] == pytest.approx(-50.0)
    rows = headline_text(h).splitlines()
    assert len(rows) == 1 + len(HEADLINE)
    assert rows[1].count("n/a") == 2 and rows[2].count("n/a") == 2 and "n/a" not in rows[4]
    # a zero baseline has no relative change
    z = headline({"a": summary(0.0, conc=0), "b": summary(0.2, conc=3)})
    assert z.changes["b"][labels[0]] is None and z.changes["b"][labels[3]] is None


def test_html_is_escaped_and_complete():
    h = headline({"<base>": summary(0.5, conc=2), "v&1": summary(0.25, conc=4)})
    out = headline_html(h)
    assert "<base>" not in out and "&lt;base&gt;" in out and "v&amp;1" in out
    assert out.count("<tr>") == 1 + len(HEADLINE) and "-50.0 %" in out and "+100.0 %" in out


def _run_dir(path, name, s, scenario=None):
    """A run directory as kvsim writes one: the summary ``s`` (with the keys every kvsim summary
    has: 0 where ``s`` lacks them) and both tables (empty)."""
    path.mkdir(parents=True)
    s = {**s, "concurrency": {"max": 0, "mean": 0.0, **s.get("concurrency", {})},
         "kv": {**{f"{p}_frac": 0.0 for p in ("token_states", "reservation", "internal_frag", "external_frag",
                                             "free")}, **s.get("kv", {})}}
    (path / "summary.json").write_text(json.dumps({"name": name, **s}))
    pd.DataFrame({c: pd.Series(dtype=t) for c, t in (("status", str), ("arrival_s", float), ("ttft_s", float),
                                                     ("tpot_s", float), ("e2e_s", float))}).to_parquet(
        path / "requests.parquet")
    pd.DataFrame({c: pd.Series(dtype=float) for c in ("start_s", "duration_s", "free_bytes",
                                                      "external_frag_bytes")}).to_parquet(path / "steps.parquet")
    return path


def _variants_dir(tmp_path, baseline=None):
    out = tmp_path / "study"
    serving = {"completed": 10, "total_input_tokens": 1000, "total_output_tokens": 500,
               "request_throughput": 2.0, "input_throughput": 200.0, "output_throughput": 100.0,
               "total_token_throughput": 300.0, "percentiles": [50.0, 99.0],
               **{f"{m}_ms": {"mean": 10.0, "median": 9.0, "std": 1.0, "p50": 9.0, "p99": 20.0, "max": 30.0}
                  for m in ("ttft", "tpot", "itl", "e2el")}}
    _run_dir(out / "contiguous", "contiguous", summary(0.5, 0.3, 400.0, 8, serving=serving,
                                                      slo={"goodput_requests_per_s": 1.5}))
    _run_dir(out / "a-paged", "a-paged", summary(0.05, 0.45, 300.0, 30, serving=serving))
    runs = {"contiguous": {"scenario": {"name": "study", "baseline": baseline}}, "a-paged": {"scenario": {}}}
    (out / "scenario.resolved.yaml").write_text(yaml.safe_dump({"name": "study", "runs": runs}, sort_keys=False))
    return out


def test_compare_prints_headline_first_and_writes_csv(tmp_path, capsys):
    src = _variants_dir(tmp_path)
    assert kvsim_main(["compare", str(src), "--out", str(tmp_path / "cmp"), "-q",
                       "--baseline", "contiguous"]) == 0
    out = capsys.readouterr().out
    # key findings first, then the headline table
    assert out.startswith("Key findings\n")
    assert "- Most requests at once: 30 with a-paged (baseline contiguous: 8, +275.0 %)." in out
    assert out.index("Headline (baseline: contiguous -- --baseline contiguous") < out.index("/cmp/")
    assert "-90.0 %" in out  # fragmentation 50 % -> 5 %
    df = pd.read_csv(tmp_path / "cmp" / "headline.csv")
    assert "baseline:contiguous" in df.columns and df["a-paged change_pct"].iloc[3] == pytest.approx(275.0)
    assert not (tmp_path / "cmp" / "comparison_vllm.csv").exists()
    assert kvsim_main(["compare", str(src), "--out", str(tmp_path / "cmp4"), "--baseline", "nope"]) == 2
    assert "names no run" in capsys.readouterr().err


def test_baseline_resolution(tmp_path):
    from kvsim.report.runs import baseline_of, collect_runs

    runs, _ = collect_runs([_variants_dir(tmp_path / "a")])
    assert [r.label for r in runs] == ["contiguous", "a-paged"]  # the scenario's order, not the names'
    assert baseline_of(runs) == "contiguous"  # no baseline: key: the first run
    assert baseline_of(runs, "a-paged") == "a-paged"
    runs, _ = collect_runs([_variants_dir(tmp_path / "b", baseline="a-paged")])
    assert baseline_of(runs) == "a-paged"  # the scenario's baseline: key...
    assert [r.label for r in runs] == ["a-paged", "contiguous"]  # ...which every table and plot shows first


def test_compare_metric_names_vllm(tmp_path, capsys):
    src = _variants_dir(tmp_path)
    assert kvsim_main(["compare", str(src), "--out", str(tmp_path / "cmp"), "-q", "--metric-names", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "Serving metrics (vLLM names, ms)" in out and "p99_itl_ms" in out
    df = pd.read_csv(tmp_path / "cmp" / "comparison_vllm.csv")
    for col in ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
                "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "mean_itl_ms",
                "median_e2el_ms", "total_input_tokens"):
        assert col in df.columns, col
    row = df.set_index("label").loc["contiguous"]
    assert row["p99_itl_ms"] == 20.0 and row["request_goodput"] == 1.5
    assert pd.isna(df.set_index("label").loc["a-paged", "request_goodput"])  # no slo: no goodput
    with pytest.raises(SystemExit) as e:  # argparse: usage line naming the valid choices
        kvsim_main(["compare", str(src), "--out", str(tmp_path / "x"), "--metric-names", "tgi"])
    assert e.value.code == 2 and "choose from 'kvsim', 'vllm'" in capsys.readouterr().err


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.ids.append(dict(attrs).get("id") or "")


def test_report_opens_with_headline(tmp_path):
    from kvsim.report.html import render_report

    src = _variants_dir(tmp_path, baseline="contiguous")
    page = render_report(src)
    p = _Tables()
    p.feed(page)
    assert p.ids[0] == "headline"
    head = page[page.index('id="headline"'):page.index("</table>", page.index('id="headline"'))]
    assert "contiguous (baseline)" in head and "-90.0 %" in head
    single = render_report(src / "a-paged")
    p = _Tables()
    p.feed(single)
    assert p.ids[0] == "headline" and "a-paged (baseline)" in single


def test_latency_and_throughput_rows():
    lat = {"ttft_s": {"p50": 0.2, "p99": 3.0}, "tpot_s": {"p50": 0.03}, "throughput_requests_per_s": 2.0,
           "throughput_output_tokens_per_s": 400.0, "normalized_latency_s_per_token": 0.5}
    fast = {"ttft_s": {"p50": 0.1, "p99": 1.5}, "tpot_s": {"p50": 0.036}, "throughput_requests_per_s": 2.5,
            "throughput_output_tokens_per_s": 500.0, "normalized_latency_s_per_token": 0.25}
    h = headline({"base": summary(**lat), "fast": summary(**fast)})
    ch = {m.summary_key if hasattr(m, "summary_key") else ".".join(m.path): h.changes["fast"][m.label]
          for m in HEADLINE}
    assert ch["ttft_s.p50"] == pytest.approx(-50.0) and ch["ttft_s.p99"] == pytest.approx(-50.0)
    assert ch["tpot_s.p50"] == pytest.approx(20.0) and ch["throughput_requests_per_s"] == pytest.approx(25.0)
    assert ch["normalized_latency_s_per_token"] == pytest.approx(-50.0)
    text = headline_text(h)
    assert "200 ms" in text and "1.5 s" in text and "36 ms" in text
    out = headline_html(h)
    # TTFT fell: better (green); TPOT rose: worse (red)
    ttft_row = out[out.index("Median time to first token"):].split("</tr>")[0]
    tpot_row = out[out.index("Median time per output token"):].split("</tr>")[0]
    assert 'class="chg better">-50.0 %' in ttft_row and 'class="chg worse">+20.0 %' in tpot_row


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAYOUT_PROBE = """<script>
const t = document.getElementById('headline'), s = t.parentElement;
document.body.setAttribute('data-probe', [s.scrollWidth, s.clientWidth].join(','));
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian package 'chromium')")
@pytest.mark.parametrize("width", [1280, 1920])
def test_headline_fits_the_window_in_chromium(tmp_path, width):
    """The whole headline table of a four-variant report shows without a horizontal scroll (a real
    browser lays it out; a script appended to a copy of the page measures it)."""
    from kvsim.report.html import render_report

    out = tmp_path / "study"
    full = {"ttft_s": {"p50": 161.83, "p99": 286.0}, "tpot_s": {"p50": 0.0301}, "throughput_requests_per_s": 0.7771,
            "throughput_output_tokens_per_s": 219.1, "normalized_latency_s_per_token": 1.278}
    names = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"]
    for i, n in enumerate(names):
        _run_dir(out / n, n, summary(0.427 - 0.1 * i, 0.76, 503.6, 7 + 4 * i, **full))
    runs = {n: {"scenario": {"name": "study"}} for n in names}
    (out / "scenario.resolved.yaml").write_text(yaml.safe_dump({"name": "study", "runs": runs}, sort_keys=False))
    page = tmp_path / "probe.html"
    page.write_text(render_report(out).replace("</body>", LAYOUT_PROBE + "</body>"))
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'p'}",
           f"--window-size={width},1000", "--dump-dom", page.resolve().as_uri()]
    dom = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'data-probe="(\d+),(\d+)"', dom)
    assert m, dom[:500]
    scroll_w, client_w = int(m.group(1)), int(m.group(2))
    assert 0 < scroll_w <= client_w, (scroll_w, client_w)


def test_compare_says_which_run_is_the_baseline_and_why(tmp_path, capsys):
    a = _variants_dir(tmp_path / "a")  # no baseline: key
    b = _variants_dir(tmp_path / "b", baseline="a-paged")
    assert kvsim_main(["compare", str(a), str(b), "--out", str(tmp_path / "c1"), "-q"]) == 0
    out = capsys.readouterr().out
    assert f"Headline (baseline: b/study/a-paged -- the scenario's baseline: a-paged key ({b}); another: --baseline LABEL)" \
        in out
    assert kvsim_main(["compare", str(a), str(b), "--out", str(tmp_path / "c2"), "-q", "--baseline", "a/study/contiguous"]) == 0
    assert "Headline (baseline: a/study/contiguous -- --baseline a/study/contiguous; another: --baseline LABEL)" \
        in capsys.readouterr().out
    assert kvsim_main(["compare", str(a), "--out", str(tmp_path / "c3"), "-q"]) == 0
    assert "Headline (baseline: contiguous -- the first run (no --baseline, no baseline: key)" in capsys.readouterr().out
