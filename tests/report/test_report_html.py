"""``report.html``: self-contained (embedded PNGs, no network), the summary table, every plot;
renders in headless Chromium when it is installed."""

from __future__ import annotations

import base64
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from report_helpers import REPO, kvsim_main

from kvsim.report import write_run_report
from kvsim.report.html import render_report


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if "id" in a:
            self.ids.add(a["id"])

    def all(self, tag):
        return [a for t, a in self.tags if t == tag]


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def assert_self_contained(page: Page, min_images: int) -> None:
    imgs = page.all("img")
    assert len(imgs) >= min_images
    for img in imgs:
        src = img["src"]
        assert src.startswith("data:image/png;base64,"), src[:60]
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
        assert img.get("alt")
    for tag, a in page.tags:
        for attr in ("src", "href"):
            v = (a.get(attr) or "").strip().lower()
            assert not v.startswith(("http:", "https:", "//")), (tag, v)
    assert not page.all("script") and not page.all("link") and not page.all("iframe")
    assert "summary" in page.ids  # the summary table
    assert page.all("table")


def test_single_run_report(variants_dir):
    run = variants_dir / "paged-16"
    path = write_run_report(run)
    assert path == run / "report.html"
    page = parse(path)
    assert_self_contained(page, min_images=3)  # memory breakdown, concurrency, latency CDFs
    text = path.read_text()
    assert "throughput_requests_per_s" in text and "Scenario (resolved)" in text and "allocator:" in text


def test_variants_report(variants_dir):
    path = write_run_report(variants_dir)
    page = parse(path)
    assert_self_contained(page, min_images=3 + 4 * 3)  # cross-variant plots + each variant's
    for v in ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"):
        assert f"variant-{v}" in page.ids


def test_sweep_report(rate_sweep):
    page = parse(rate_sweep / "report.html")  # written by run_sweep
    assert_self_contained(page, min_images=7)
    assert "knees" in page.ids
    rows = [a for t, a in page.tags if t == "tr"]
    assert len(rows) >= 7  # header + 6 points
    assert sum(1 for i in page.ids if i.startswith("point-")) == 6


def test_report_of_a_run_without_plots_draws_them_in_memory(tmp_path):
    from kvsim.api import run_to_dir
    from kvsim.config import load_scenario

    if not (REPO / "traces" / "azure_conv_2023.csv.gz").exists():
        pytest.skip("quickstart trace missing")
    out = run_to_dir(load_scenario(REPO / "scenarios" / "quickstart.yaml", ["trace.end_s=30", "variants={}"]),
                     tmp_path / "run", plots=False, progress=False)
    before = sorted(p.name for p in out.iterdir())
    assert not any(n.endswith(".png") for n in before)
    assert kvsim_main(["report", str(out)]) == 0
    after = sorted(p.name for p in out.iterdir())
    assert set(after) == set(before) | {"report.html"}  # nothing else written into the run dir
    assert_self_contained(parse(out / "report.html"), min_images=3)


def test_report_cli_out_and_errors(variants_dir, tmp_path, capsys):
    target = tmp_path / "r.html"
    assert kvsim_main(["report", str(variants_dir / "paged-16"), "--out", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert target.read_text() == render_report(variants_dir / "paged-16")  # deterministic
    assert kvsim_main(["report", str(tmp_path)]) == 2
    assert "not a kvsim run" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian package 'chromium')")
def test_report_renders_in_headless_chromium(rate_sweep, tmp_path):
    import matplotlib.image as mpimg

    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           f"--screenshot={shot}", "--window-size=1200,2000", (rate_sweep / "report.html").resolve().as_uri()]
    subprocess.run(cmd, check=False, capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000
    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (2000, 1200)
    # not blank: many distinct colours and real contrast (text, tables, embedded plots)
    assert float(np.std(img)) > 0.05
    assert len(np.unique((img.reshape(-1, 3) * 255).astype(np.uint8), axis=0)) > 50
