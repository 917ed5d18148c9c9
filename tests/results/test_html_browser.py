"""The HTML report in a real headless browser (Debian's chromium, driven over the DevTools protocol by
`tests/support/headless.py`): it renders without a console error or a blocked load, every plot's <svg>
is in the rendered DOM with a size, record text stays text, and a screenshot is kept as an artifact
(under the test's tmp dir and in test-artifacts/ at the repo root, gitignored; its path printed)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from headless import Browser, find_chromium
from report_records import HOSTILE, capability_record, history_for, kl_record, run_info, speed_record

from pytest_mlxgate.results.html_report import PLOTS, write_html_report

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium on PATH (nor MLXGATE_CHROMIUM): the HTML report's headless-browser check "
    "needs one; on Debian `apt-get install chromium` (./dev test installs it)",
)

_LAYOUT = """
Array.from(document.querySelectorAll('section.gate')).map(s => ({
  mode: s.dataset.mode,
  plots: Array.from(s.querySelectorAll('figure[data-plot]')).map(f => {
    const svgs = Array.from(f.querySelectorAll('svg'));
    return {name: f.dataset.plot, svgs: svgs.length, namespace: svgs.length ? svgs[0].namespaceURI : null,
            drawn: svgs.every(v => { const r = v.getBoundingClientRect(); return r.width > 50 && r.height > 20; })};
  }),
}))
"""


def keep_artifact(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], png: Path) -> Path:
    """Copy a screenshot into test-artifacts/ at the repo root (gitignored) and say where both are: on the
    terminal past output capture, and as the test's `screenshot` property (JUnit XML, xdist included)."""
    target = request.config.rootpath / "test-artifacts"
    target.mkdir(exist_ok=True)
    kept = target / png.name
    shutil.copyfile(png, kept)
    request.node.user_properties.append(("screenshot", str(kept)))
    with capsys.disabled():
        print(f"\nscreenshot: {png}\nscreenshot kept: {kept}")
    return kept


def test_the_report_renders_in_headless_chromium(
    tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    records: list[Any] = [
        kl_record(),
        capability_record(),
        speed_record(),
        kl_record(with_profile=False, nodeid="gates/test_old.py::test_drift"),
    ]
    report = tmp_path / "report.html"
    write_html_report(report, records, history=history_for(records), run=run_info())
    assert CHROMIUM is not None
    with Browser(CHROMIUM) as browser:
        page = browser.open(report)
        assert page.errors == []  # no console error, no exception, no load the CSP blocked or that failed
        layout = page.evaluate(_LAYOUT)
        expected = {
            "gate": [*PLOTS["kl"], *PLOTS["history"]],
            "capability": [*PLOTS["capability"], *PLOTS["history"]],
            "speed": [*PLOTS["speed"], *PLOTS["history"]],
        }
        assert sorted(s["mode"] for s in layout) == ["capability", "gate", "gate", "speed"]
        for section in layout:
            assert [p["name"] for p in section["plots"]] == expected[section["mode"]], section
            for plot in section["plots"]:
                assert plot["svgs"] >= 1 and plot["drawn"], (section["mode"], plot)
                assert plot["namespace"] == "http://www.w3.org/2000/svg"  # parsed as SVG, not unknown HTML
        assert page.evaluate("document.scripts.length") == 0
        contexts = page.evaluate("Array.from(document.querySelectorAll('span.ctx')).map(e => e.textContent)")
        assert contexts and all(HOSTILE in text for text in contexts)  # the record's markup shown as text
        png = page.screenshot(tmp_path / "html-report.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    keep_artifact(request, capsys, png)


def test_the_check_sees_console_errors_and_blocked_loads(tmp_path: Path) -> None:
    """The page above passes because it is clean, not because the driver hears nothing."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
        "<script>console.error('planted')</script><img src=\"https://example.invalid/x.png\">"
        "</body></html>"
    )
    assert CHROMIUM is not None
    with Browser(CHROMIUM) as browser:
        errors = browser.open(bad).errors
    assert any("planted" in e for e in errors), errors
    assert any("Content Security Policy" in e or "example.invalid" in e for e in errors), errors
