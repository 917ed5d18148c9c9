"""--mlx-html through pytester on the tiny model: a KV gate with speed writes one self-contained HTML file
at the end of the run (its records carrying the plots' data: the KL profile, the worst tokens' context),
the terminal says where, and a second run (mlx_html from the ini) draws each gate's history from the
results DB. Where chromium is installed the real report is also screenshotted into test-artifacts/."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("kv8", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0},
                          path="serving"),
    pytest.mark.mlx_kl(prompts=3, tokens=24, decode=4),
    pytest.mark.mlx_speed(contexts=(16, 40), decode=3, repetitions=3),
]


def test_drift(paired):
    assert_kl_below(paired, mean=10.0, top1=0.0)


def test_memory(paired):
    assert_smaller(paired, kv=0.3, at="all")
"""


@pytest.mark.slow  # two pytester gate sessions (~10 s each)
def test_mlx_html_writes_the_report_and_its_history(
    pytester: pytest.Pytester,
    tiny_kv_model_dir: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_kv=GATE)
    html, report, db = tmp_path / "out" / "gates.html", tmp_path / "gates.json", tmp_path / "results.sqlite"
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    args = (f"--mlx-candidate={tiny_kv_model_dir}", f"--mlx-db={db}", "-p", "no:randomly", "-p", "no:xdist")
    result = pytester.runpytest_subprocess(*args, f"--mlx-html={html}", f"--mlx-report={report}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"mlxgate: HTML report → {html}"])
    assert f"HTML report: `{html}`" in summary.read_text(encoding="utf-8")  # the job summary says where it is
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    records = {r["nodeid"].split("::")[1]: r for r in json.loads(report.read_text())["gates"]}
    assert "--mlx-html" not in records["test_drift"]["rerun"]  # re-running one gate must not overwrite the report
    profile = records["test_drift"]["kl_profile"]
    assert sum(profile["by_position"]["n"]) == records["test_drift"]["stats"]["n_tokens"] == 12  # 3 x 4 decoded
    assert profile["by_position"]["first"] == [20, 21, 22, 23]  # the serving path scores the decoded positions
    assert profile["prompts"]["total"] == 3
    contexts = profile["worst_context"]
    assert len(contexts) == len(records["test_drift"]["stats"]["worst"])
    assert all(c["before"] and c["token"] for c in contexts)

    page = html.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    # no resource from anywhere (a prompt's own text may name a URL: escaped, it is text, never a tag)
    assert not re.search(r"<[^>]*\b(src|href|srcset|data|action)\s*=\s*[\"']?\s*(https?:|//)", page, re.I)
    assert "<script" not in page and "url(" not in page
    for name in ("kl-histogram", "kl-by-position", "top1-flips", "kl-per-prompt", "speed-ratios", "memory", "history"):
        assert f'data-plot="{name}"><svg' in page or f'data-plot="{name}"><div' in page, name
    assert "test_kv::test_drift" in page and "test_kv::test_memory" in page
    assert page.count("no earlier runs of this gate") == 2  # the first run: nothing to draw a line through
    assert "not recorded" not in page  # a record of this version carries every plot's data

    # the ini twin, relative to the ini file; the second run draws a line through both
    pytester.makeini("[pytest]\nmlx_html = reports/again.html\n")
    again = pytester.runpytest_subprocess(*args)
    again.assert_outcomes(passed=2)
    second = (pytester.path / "reports" / "again.html").read_text(encoding="utf-8")
    assert "no earlier runs of this gate" not in second
    spots = re.findall(r'<circle class="spot v-pass"', second)
    assert len(spots) == 4  # two runs of each of the two gates

    from headless import Browser, find_chromium  # the real report, seen by a browser where one is installed

    chromium = find_chromium()
    if chromium is None:
        return
    with Browser(chromium) as browser:
        shown = browser.open(pytester.path / "reports" / "again.html")
        assert shown.errors == []
        png = shown.screenshot(tmp_path / "html-report-session.png")
    kept = request.config.rootpath / "test-artifacts" / png.name
    kept.parent.mkdir(exist_ok=True)
    shutil.copyfile(png, kept)
    with capsys.disabled():
        print(f"\nscreenshot of a real run's report: {kept}")
