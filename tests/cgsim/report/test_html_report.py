"""index.html (cgsim.report.html): self-contained, every finding rendered
with its picture and replay commands, the property table, coverage and the
per-worker timeline; loaded in a real headless Chromium."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cgsim.finding import Finding
from cgsim.properties import ALL_PROPERTIES
from cgsim.report.findings import write_finding
from cgsim.report.html import render_html
from cgsim.report.summary import build_summary, write_report

FINDINGS = Path(__file__).resolve().parents[3] / "docs" / "findings"
# Dispatch findings (pictures) and others (none), from real vLLM runs.
NAMES = ["dispatch-complete-ed6a3d919d", "dispatch-priority-29225784ff", "init-total-6bd79114c6",
         "pad-consistent-24c25280dc"]
T0 = 1_800_000_000.0


def _finding(name: str, worker: int, found: float, recorded: float) -> Finding:
    data = json.loads((FINDINGS / f"{name}.json").read_text())
    data["worker"] = worker
    f = Finding.from_json(data)
    return f.with_(worker=worker, extra={"found_at": T0 + found, "recorded_at": T0 + recorded})


def _summary(findings=None) -> dict:
    findings = findings if findings is not None else [
        _finding(n, i % 2, 2.0 + 3 * i, 4.0 + 3 * i) for i, n in enumerate(NAMES)]
    workers = [
        {"worker": 0, "gpu": None, "scenarios": 40, "restarts": 1, "end": "done",
         "spans": [{"incarnation": 0, "start_s": 0.1, "end_s": 9.0, "end": "died (SIGSEGV)"},
                   {"incarnation": 1, "start_s": 9.2, "end_s": 20.0, "end": "done"}]},
        {"worker": 1, "gpu": None, "scenarios": 35, "restarts": 0, "end": "done",
         "spans": [{"incarnation": 0, "start_s": 0.1, "end_s": 20.0, "end": "done"}]},
    ]
    stats = [{"scenarios": 75, "checks": {"DISPATCH-COMPLETE": 70, "INIT-TOTAL": 75}, "failures": {"DISPATCH-COMPLETE": 3},
              "coverage": {"modes": {"FULL": 30, "PIECEWISE": 45}, "batch_kinds": {"uniform-decode": 60}}}]
    return build_summary(run_id="run-1", settings={"target": "vllm", "backend": "mock", "ruleset": "vllm-0.32",
                                                    "budget_s": 18.0, "workers": 2, "seed": 0},
                         findings=findings, stats=stats, workers=workers, complete=True, elapsed_s=20.0,
                         started_unix=T0, started_at="2026-12-01T10:00:00+00:00")


class _Page(HTMLParser):
    """Elements with their attributes, and the text of the page."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str, **attrs) -> list[dict]:
        return [a for t, a in self.elements if t == tag and all(a.get(k) == v or (k == "class_" and v in a.get("class", "").split()) for k, v in attrs.items())]

    def with_class(self, tag: str, cls: str) -> list[dict]:
        return [a for t, a in self.elements if t == tag and cls in (a.get("class") or "").split()]


def need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is not installed in CI: .ci/run must install cgsim[plot]")
        pytest.skip(f"{module} is not installed (pip install 'cgsim[plot]')")


def _self_contained(page: _Page) -> None:
    for tag, attrs in page.elements:
        assert tag not in ("script", "link", "iframe", "object", "embed"), tag
        for key in ("src", "href", "data", "srcset", "action"):
            value = attrs.get(key)
            if value is not None:
                assert value.startswith(("data:", "#")), f"<{tag} {key}={value[:60]!r}> would fetch"
        assert "url(" not in (attrs.get("style") or "")


def test_write_report_writes_a_self_contained_index_html(tmp_path):
    need("matplotlib")
    summary = write_report(str(tmp_path), _summary())
    assert (tmp_path / "index.html").exists() and (tmp_path / "index.md").exists()
    pictures = sorted(p.name for p in (tmp_path / "pictures").iterdir())
    assert pictures == ["dispatch-complete-ed6a3d919d.png", "dispatch-priority-29225784ff.png"]
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert {f["id"]: f.get("picture") for f in on_disk["findings"]} == {
        "dispatch-complete-ed6a3d919d": "pictures/dispatch-complete-ed6a3d919d.png",
        "dispatch-priority-29225784ff": "pictures/dispatch-priority-29225784ff.png",
        "init-total-6bd79114c6": None, "pad-consistent-24c25280dc": None}
    assert summary == on_disk
    md = (tmp_path / "index.md").read_text()
    assert "](pictures/dispatch-complete-ed6a3d919d.png)" in md and "index.html" in md
    page = _Page((tmp_path / "index.html").read_text())
    _self_contained(page)
    sections = page.with_class("section", "finding")
    assert [s["id"] for s in sections] == [f"finding-{f['id']}" for f in summary["findings"]]
    images = page.with_class("img", "dispatch-map")
    assert len(images) == 2 and all(i["src"].startswith("data:image/png;base64,") for i in images)
    text = " ".join(page.text)
    for f in summary["findings"]:
        assert f["replay_command"] in text and f"python {f['repro_path']}" in text
    assert "4 findings" in text


def test_report_pictures_are_drawn_once_and_pruned(tmp_path):
    need("matplotlib")
    write_report(str(tmp_path), _summary())
    pic = tmp_path / "pictures" / "dispatch-complete-ed6a3d919d.png"
    stamp = pic.stat().st_mtime_ns
    write_report(str(tmp_path), _summary())
    assert pic.stat().st_mtime_ns == stamp  # not redrawn every few seconds
    write_report(str(tmp_path), _summary([_finding("dispatch-priority-29225784ff", 0, 1.0, 2.0)]))
    assert not pic.exists()  # its finding is gone (superseded)
    assert (tmp_path / "pictures" / "dispatch-priority-29225784ff.png").exists()


def test_without_matplotlib_the_report_says_how_to_get_pictures(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    summary = write_report(str(tmp_path), _summary())
    assert not (tmp_path / "pictures").exists()
    assert any("cgsim[plot]" in n for n in summary["notes"])
    page = _Page((tmp_path / "index.html").read_text())
    assert len(page.with_class("section", "finding")) == 4 and not page.with_class("img", "dispatch-map")
    assert "cgsim[plot]" in " ".join(page.text)


def test_fuzz_report_draws_the_pictures_and_drops_the_note_once_matplotlib_is_there(tmp_path, monkeypatch):
    """A run reported without matplotlib says so; ``fuzz report`` after it
    was installed draws the maps and says it no more."""
    need("matplotlib")
    from cgsim.report import plots
    from fuzz.campaign.rebuild import rebuild_report

    def missing(*a, **k):
        raise plots.MissingMatplotlib()

    with monkeypatch.context() as m:
        m.setattr(plots, "finding_picture", missing)
        first = write_report(str(tmp_path), dict(_summary(), finished_at="2026-12-01T10:00:20+00:00"))
    assert any("no pictures" in n for n in first["notes"])
    (tmp_path / "findings").mkdir()
    for f in _summary()["findings"]:
        write_finding(str(tmp_path / "findings"), Finding.from_json(dict(f, schema="cgsim.finding")))
    rebuilt = rebuild_report(str(tmp_path), quiet=True).summary
    assert not any("no pictures" in n for n in rebuilt["notes"]), rebuilt["notes"]
    assert sorted(p.name for p in (tmp_path / "pictures").iterdir()) == [
        "dispatch-complete-ed6a3d919d.png", "dispatch-priority-29225784ff.png"]
    assert "no pictures" not in (tmp_path / "index.md").read_text()


def test_property_table_coverage_and_timeline():
    summary = _summary()
    page = _Page(render_html(summary))
    _self_contained(page)
    text = " ".join(page.text)
    rows = [a for t, a in page.elements if t == "tr"]
    assert len(rows) >= len(ALL_PROPERTIES)
    assert len(page.with_class("tr", "failed")) == sum(1 for v in summary["properties"].values() if v["failures"])
    for words in ("FULL", "PIECEWISE", "uniform-decode", "worker 0", "worker 1", "budget"):
        assert words in text, words
    assert len(page.with_class("rect", "span")) == 3  # worker 0 died and was restarted
    markers = page.with_class("path", "finding-marker")
    assert len(markers) == len(NAMES)
    times = {f["id"]: f for f in summary["timeline"]["findings"]}
    assert times["init-total-6bd79114c6"]["found_s"] == pytest.approx(8.0)
    assert times["init-total-6bd79114c6"]["recorded_s"] == pytest.approx(10.0)


def test_timeline_without_times_and_no_findings():
    summary = build_summary(run_id="r", settings={"target": "reference"}, findings=[], complete=False,
                            interrupted="SIGINT")
    page = _Page(render_html(summary))
    text = " ".join(page.text)
    assert "no findings" in text and "PARTIAL: SIGINT" in text and "None: every property held" in text
    old = Finding.from_json(json.loads((FINDINGS / "init-total-6bd79114c6.json").read_text()))
    summary = build_summary(run_id="r", settings={}, findings=[old], started_unix=T0)
    assert summary["timeline"]["findings"][0]["found_s"] is None  # written without times
    _Page(render_html(summary))


def test_html_escapes_what_it_shows():
    f = _finding("init-total-6bd79114c6", 0, 1.0, 1.0).with_(message="<script>alert(1)</script> & \"x\"")
    text = render_html(_summary([f]))
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt; &amp;" in text


# -- a real browser ------------------------------------------------------------------------------
def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("Chromium is not installed in CI: .ci/run installs the Debian package chromium")
    pytest.skip("Chromium is not installed (apt-get install chromium) for the browser check")


def _browser(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_chromium_renders_the_findings(tmp_path):
    need("matplotlib")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = write_report(str(run_dir), _summary())
    url = (run_dir / "index.html").as_uri()
    dom = _browser(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = _Page(dom.stdout)
    _self_contained(page)
    sections = page.with_class("section", "finding")
    assert [s["id"] for s in sections] == [f"finding-{f['id']}" for f in summary["findings"]]
    assert len(page.with_class("img", "dispatch-map")) == 2
    assert page.all("table", id="properties") and page.all("svg", id="timeline")
    text = " ".join(page.text)
    assert "DISPATCH-COMPLETE" in text and "python -m fuzz replay findings/dispatch-complete-ed6a3d919d.json" in text

    # The pictures were decoded and painted: the waste colour scale's darkest
    # purple exists only inside them.
    shot = tmp_path / "shot.png"
    res = _browser(tmp_path, "--window-size=1300,2400", "--hide-scrollbars", f"--screenshot={shot}", url)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(io.BytesIO(shot.read_bytes()), format="png")[..., :3]
    purple = np.array([0x3f, 0x00, 0x7d]) / 255  # Purples at 1.0: the top of the waste scale
    assert (np.abs(img - purple).max(axis=-1) < 0.05).sum() > 50
    badge = np.array([0xc6, 0x28, 0x28]) / 255  # the headline's findings badge
    assert (np.abs(img - badge).max(axis=-1) < 0.02).sum() > 200
