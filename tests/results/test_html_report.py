"""The HTML report as a pure function of records (and history rows): every section of a KL, a capability
and a speed gate; text escaped; no resource from anywhere; bounded size; "not recorded" for old records;
the sparkline from the results DB; well-formed markup and SVG; the atomic write; the SVG writer."""

from __future__ import annotations

import copy
import os
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from report_records import (
    HOSTILE,
    capability_record,
    history_for,
    kl_record,
    run_info,
    speed_record,
)

from pytest_mlxgate.results.history import ResultsDB
from pytest_mlxgate.results.html_report import PLOTS, history_rows, html_report, write_html_report
from pytest_mlxgate.results.model import Record, parse_record
from pytest_mlxgate.results.svg import Figure, Scale, esc, log_ticks, message, nice_ticks, sparkline


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return [kl_record(), capability_record(), speed_record()]


@pytest.fixture(scope="module")
def page(records: list[Record]) -> str:
    return html_report(records, history=history_for(records), run=run_info())


def sections(page: str) -> dict[str, str]:
    """Each gate's section by its mode (the markup between its <section> and </section>)."""
    return {
        m.group(1): m.group(0)
        for m in re.finditer(
            r'<section class="gate[^"]*" id="g\d+" data-mode="(\w+)">'
            r".*?</section>",
            page,
            re.S,
        )
    }


def plots(section: str) -> list[str]:
    """The section's figures, in order, each holding at least one <svg>."""
    figures = re.findall(r'<figure class="plot" data-plot="([\w-]+)">(.*?)</figure>', section, re.S)
    assert all("<svg" in body for _, body in figures), [name for name, body in figures if "<svg" not in body]
    return [name for name, _ in figures]


def test_every_section_is_there_for_a_kl_a_capability_and_a_speed_gate(page: str) -> None:
    by_mode = sections(page)
    assert set(by_mode) == {"gate", "capability", "speed"}
    for section in by_mode.values():
        assert "<h3>Verdict</h3>" in section
        assert re.search(
            r"<th>metric</th><th>value</th><th>95% interval</th><th>limit</th><th>verdict</th>"
            r"<th>n</th>",
            section,
        )
        assert "<h3>History</h3>" in section
    kl, cap, speed = by_mode["gate"], by_mode["capability"], by_mode["speed"]
    assert plots(kl) == [*PLOTS["kl"], *PLOTS["history"]]
    for heading in (
        "KL distribution",
        "KL by position",
        "Top-1 flips and near ties",
        "Per-prompt mean KL",
        "Worst tokens in their context",
    ):
        assert f"<h3>{heading}</h3>" in kl
    assert plots(cap) == [*PLOTS["capability"], *PLOTS["history"]]
    assert "<h3>Capability per task</h3>" in cap and "<h3>Flipped items</h3>" in cap
    assert "gsm8k: 3 items flipped" in cap and "mmlu: no item changed" in cap
    assert plots(speed) == [*PLOTS["speed"], *PLOTS["history"]]
    assert "<h3>Speed and memory</h3>" in speed and "decode tok/s @256" in speed
    assert "1.0 MB → 524.3 kB<br><small>holds 786.4 kB → 393.2 kB</small>" in speed  # @256: allocated, held
    assert "not recorded" not in kl + cap + speed  # these records carry every plot's data


def test_the_verdict_table_has_value_interval_limit_verdict_and_n(page: str) -> None:
    kl = sections(page)["gate"]
    row = re.search(
        r"<tr><td>mean KL</td><td>([^<]+)</td><td>\[([^<]+)\]</td><td>≤ 2e-03</td>"
        r'<td><span class="badge v-(\w+)">[^<]+</span>[^<]*</td><td>6</td></tr>',
        kl,
    )
    assert row, kl[:3000]
    assert row.group(3) in ("pass", "fail", "inconclusive")


def test_record_text_is_escaped_never_markup(page: str) -> None:
    escaped = esc(HOSTILE)
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" == escaped
    assert escaped in sections(page)["gate"]  # the worst token's context, as text
    assert "<script" not in page.lower()  # no script at all: neither the report's nor a record's
    assert "<img" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page  # a capability prompt
    assert "<b>bold</b>" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page  # the marked token itself
    assert "tok" in page and "&lt;&amp;&gt;" in page  # token texts in the worst-token table


def test_nothing_is_loaded_from_anywhere(page: str) -> None:
    assert "http://" not in page and "https://" not in page
    parser = _Attributes()
    parser.feed(page)
    assert parser.tags.isdisjoint({"script", "link", "img", "iframe", "object", "embed", "image", "use", "base"})
    loading = {"src", "srcset", "xlink:href", "action", "formaction", "poster", "data", "background"}
    assert not [a for a in parser.attrs if a[0] in loading or a[0].startswith("on")]
    assert all(v.startswith("#") for name, v in parser.attrs if name == "href")  # in-page anchors only
    assert "url(" not in page and "@import" not in page
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page)
    assert csp and "default-src 'none'" in csp.group(1) and "script-src" not in csp.group(1)


class _Attributes(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs += [(name, value or "") for name, value in attrs]

    handle_startendtag = handle_starttag


class _Balance(HTMLParser):
    VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source"}
    SVG_LEAVES = {"line", "rect", "circle", "polyline", "path"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: Any) -> None:
        assert tag in self.VOID | self.SVG_LEAVES, tag

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
        self.stack.pop()


def test_the_markup_is_balanced_and_every_svg_is_well_formed_xml(page: str) -> None:
    parser = _Balance()
    parser.feed(page)
    parser.close()
    assert parser.stack == []
    svgs = re.findall(r"<svg\b.*?</svg>", page, re.S)
    assert len(svgs) >= 9
    for svg in svgs:
        ET.fromstring(svg)  # no xmlns needed: HTML5 puts <svg> in the SVG namespace itself


def test_a_gate_with_many_prompts_keeps_a_small_record_and_a_bounded_page() -> None:
    import json

    big = kl_record(n_prompts=600, tokens=128)
    assert len(json.dumps(big.to_json()["kl_profile"])) < 25_000  # capped in the record...
    assert len(big.kl_profile.prompts.index) == 128
    one = len(html_report([big]).encode())
    assert one < 150_000, one
    # ...and by the renderer too, whatever a record holds (a hand-made or future one)
    huge = copy.deepcopy(big.to_json())
    n = 20_000
    huge["kl_profile"]["prompts"] = {
        "index": list(range(n)),
        "mean": [1e-3] * n,
        "ci": [[1e-4, 2e-3]] * n,
        "n_tokens": [64] * n,
        "total": n,
    }
    huge["kl_profile"]["by_position"] = {k: [1] * n for k in ("first", "last", "n", "flips", "near_tie_flips")} | {
        "median": [1e-3] * n,
        "p90": [2e-3] * n,
    }
    huge["stats"]["worst"] = huge["stats"]["worst"] * 2000
    size = len(html_report([parse_record(huge)]).encode())
    assert size < 400_000, size


def test_an_old_record_says_not_recorded_where_a_plot_lacks_its_data() -> None:
    old = kl_record(with_profile=False)
    cap = capability_record().to_json()
    for task in cap["tasks"].values():
        del task["flipped"]  # before flipped items carried their prompts
    page = html_report([old, parse_record(cap)])
    kl, capability = sections(page)["gate"], sections(page)["capability"]
    assert plots(kl) == [*PLOTS["kl"], *PLOTS["history"]]  # every plot still has its <svg>...
    for name in ("kl-histogram", "kl-by-position", "kl-per-prompt"):
        figure = re.search(rf'data-plot="{name}">(.*?)</figure>', kl, re.S)
        assert figure and "not recorded" in figure.group(1), name  # ...saying why it is empty
    assert "flips by position not recorded" in kl and "context not recorded" in kl
    assert "13 top-1 flips" in kl or "top-1 flips outside near ties" in kl  # the totals come from stats
    assert "gsm8k: 3 items flipped" in capability and "prompt not recorded" in capability  # from items
    assert "The answer is 2." in capability  # both outputs still shown


def test_history_draws_a_sparkline_of_the_gate_s_earlier_runs(records: list[Record]) -> None:
    page = html_report(records, history=history_for(records, runs=5), run=run_info())
    kl = sections(page)["gate"]
    hist = re.search(r'data-plot="history">(.*?)</figure>', kl, re.S)
    assert hist and '<svg class="plot spark"' in hist.group(1)
    spots = re.findall(r'<circle class="spot (v-\w+)"[^>]*><title>([^<]*)</title>', hist.group(1))
    assert len(spots) == 6  # five earlier runs and this one
    assert "this run" in spots[-1][1] and spots[0][0] == "v-fail"  # history_for: the first run failed
    assert "The last 6 runs" in hist.group(1)
    cap = sections(page)["capability"]
    assert "gsm8k candidate score" in cap and "mmlu candidate score" in cap
    # off, and a gate's first run
    off = sections(html_report(records[:1], history=None))["gate"]
    assert "the results DB is off" in off
    first = sections(html_report(records[:1], history={}, run=run_info()))["gate"]
    assert "no earlier runs of this gate" in first


def test_history_rows_come_from_the_results_db(tmp_path: Path, records: list[Record]) -> None:
    db = tmp_path / "results.sqlite"
    assert history_rows(db, ["x"]) == {}  # no DB file: nothing, and none created
    assert not db.exists()
    results = ResultsDB(db)
    for k in range(3):
        run = run_info()
        run = type(run)(**{**run.to_dict(), "run_id": f"{k:032x}"})
        results.append(run, records)
    rows = history_rows(db, [records[0].nodeid], last=2)
    assert list(rows) == [records[0].nodeid]
    assert [r["run_id"] for r in rows[records[0].nodeid]] == [f"{k:032x}" for k in (1, 2)]
    assert rows[records[0].nodeid][0]["mean_kl"] == pytest.approx(records[0].stats.mean)


def test_the_report_is_written_atomically_and_readable_by_everyone(tmp_path: Path, records: list[Record]) -> None:
    path = tmp_path / "out" / "report.html"
    write_html_report(path, records, run=run_info())
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]  # no temp file left


def test_an_empty_run_still_makes_a_page() -> None:
    page = html_report([])
    assert "No gate records" in page and page.rstrip().endswith("</html>")


# -- the SVG writer ------------------------------------------------------------------------------


def test_scales_map_and_clamp_linear_and_log() -> None:
    lin = Scale(0, 10, 100, 200)
    assert (lin(0), lin(5), lin(10), lin(-3), lin(99)) == (100, 150, 200, 100, 200)
    log = Scale(1e-4, 1e-2, 0, 100, log=True)
    assert log(1e-3) == pytest.approx(50) and log(0.0) == 0 and log(1.0) == 100
    with pytest.raises(ValueError):
        Scale(0, 1, 0, 1, log=True)
    assert nice_ticks(0, 1, 5) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert log_ticks(1e-8, 1e2, 6) == [1e-8, 1e-6, 1e-4, 1e-2, 1.0, 1e2]


def test_figures_escape_every_text_and_write_no_namespace_url() -> None:
    fig = Figure(x=(0, 1), y=(1e-3, 1), ylog=True, label='a "<label>"')
    fig.axes(xlabel="<x>", ylabel="y&", xticks=[(0.5, "<tick>")])
    fig.bars([(0, 0.5, 0.1, "<bar>")]).line([(0, 0.01), (1, None)]).points([(0.5, 0.1, None, 0.2, "<pt>")])
    fig.hline(0.5, label="<h>").vline(0.2, label="<v>").legend([("a", "<l>")]).text(1, 1, "<t>")
    svg = fig.svg()
    ET.fromstring(svg)
    assert "<x>" not in svg and "&lt;x&gt;" in svg and "&lt;tick&gt;" in svg and "&lt;pt&gt;" in svg
    assert "http" not in svg
    assert 'class="err open"' in svg  # the unbounded lower end: dashed to the edge
    ET.fromstring(message("<nothing>"))
    ET.fromstring(sparkline([1.0, None, 3.0], tips=["<a>", "", "<c>"], classes=["v-pass", "", "v-fail"], reference=2.0))
    assert "no values" in sparkline([None, None])
    assert esc("a\x00b\x1bc") == "abc"  # control characters XML cannot hold are dropped


def test_an_attributed_gate_shows_each_scope_the_output_error_curve_and_the_types_by_position() -> None:
    from report_records import attribution_data

    record = parse_record({**kl_record().to_json(), "attribution": attribution_data()})
    page = html_report([record], run=run_info())
    kl = sections(page)["gate"]
    assert plots(kl) == [*PLOTS["kl"], *PLOTS["attribution"], "kl-by-position", *PLOTS["history"]]
    assert "<h3>Where the drift comes from</h3>" in kl
    assert "drift from: layer 2 0.018 [0.009, 0.027], 90% of the whole" in kl
    assert "output error enters at layer 2 (x83.3 the layer before&#x27;s)" in kl
    assert "<h4>KL by position, the lever on sliding layers only</h4>" in kl
    assert HOSTILE not in page  # scope names and notes are record text: escaped
    parser = _Balance()
    parser.feed(page)
    parser.close()
    assert parser.stack == []
    for svg in re.findall(r"<svg\b.*?</svg>", kl, re.S):
        ET.fromstring(svg)


def test_the_summary_names_the_top_contributors_of_an_attributed_gate() -> None:
    from report_records import attribution_data

    from pytest_mlxgate.results.summary import summary_lines

    record = kl_record()
    plain = "\n".join(summary_lines([record]))
    record = parse_record({**record.to_json(), "attribution": attribution_data()})
    text = "\n".join(summary_lines([record], width=200))
    assert "drift from" not in plain
    assert "drift from: layer 2 0.018 [0.009, 0.027], 90% of the whole; layer 0 1.00e-04" in text
