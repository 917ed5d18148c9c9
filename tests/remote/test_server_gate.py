"""`--mlx-cand-server` and `--mlx-ref-server`: a KL gate whose arms are real mlx_lm.server processes (issue
56), run as a user runs it. The KV gate's shape and mean limit (2e-3) on the embedded model: an 8-bit KV
server passes, a 4-bit one fails (its lower bound beyond the limit: sound), with the reference in process or
served; a --kv-bits 4 server at mlx_lm's default start (it quantizes nothing here) passes only saying it
differs in nothing; every record says the KL is a lower bound from the servers' top-k, in the JSON, the
summary and JUnit; a speed test under a server is an error, never a pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlx_server import KV4, KV8, RunningServer, hub_env, mlx_server
from report_records import junit_gate_properties

pytestmark = pytest.mark.slow  # mlx_lm.server processes and pytester sessions on the embedded model

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0}),
    pytest.mark.mlx_kl(prompts=4, tokens=48, decode=8),
]


def test_drift(paired):
    assert_kl_below(paired, mean=2e-3)


def test_memory(paired):
    assert_smaller(paired, kv=0.5)
"""


def _session(
    pytester: pytest.Pytester, model: Path, url: str | None, tmp: Path, *more: str
) -> tuple[pytest.RunResult, dict]:
    report, xml = tmp / "r.json", tmp / "r.xml"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={model}",
        *([f"--mlx-cand-server={url}"] if url else []),
        "--mlx-db=off",
        f"--mlx-reference-cache={tmp / 'refcache'}",
        "--mlx-prove=off",
        f"--mlx-report={report}",
        f"--junit-xml={xml}",
        "-p",
        "no:randomly",
        *more,
    )
    records = {g["nodeid"].split("::")[-1]: g for g in json.loads(report.read_text())["gates"]}
    return result, {"records": records, "junit": junit_gate_properties(xml)}


#: `session(candidate server URL or None, *more pytest args)`: (the run, {"records": by test, "junit": ...}).
Session = Callable[..., tuple[pytest.RunResult, dict[str, Any]]]


@pytest.fixture
def kv_gate(pytester: pytest.Pytester, embedded: Path, tmp_path: Path) -> Session:
    """The KV gate module (`GATE`) in a pytester folder, run against a candidate server."""
    pytester.makepyfile(test_kv=GATE)
    pytester.makeini("[pytest]\n")
    return lambda url, *more: _session(pytester, embedded, url, tmp_path, *more)


@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        (KV8, "pass"),
        (KV4, "fail"),
        (("--kv-bits", "4"), "pass"),  # quantizes from token 5000: nothing here, and it says so
    ],
)
def test_the_kv_gate_through_a_server_reads_as_it_does_in_process(
    kv_gate: Session, served: Callable[..., RunningServer], args: tuple[str, ...], verdict: str
) -> None:
    server = served(*args)
    result, got = kv_gate(server.url)
    drift, memory = got["records"]["test_drift"], got["records"]["test_memory"]
    assert drift["verdict"] == verdict, drift.get("checks")
    part = drift["server"]
    assert part["url"] == server.url and part["bound"] == "lower" and part["k"] == 11
    assert drift["lever"]["cand"] == f"served at {server.url}"
    said = " ".join(result.stdout.str().split())
    assert f"candidate served at {server.url}: KL a lower bound from its top-11" in said
    assert got["junit"]["test_kv.py::test_drift"]["mlxgate.server.bound"] == "lower"
    unchanged = "changed nothing scored here" in said
    assert unchanged == (args == ("--kv-bits", "4")), said  # the vacuous server setting is named as such
    assert memory["verdict"] == "error" and "alone: the other arm runs in process" in memory["error"]["message"]


@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        (KV8, "pass"),
        (KV4, "fail"),
    ],
)
def test_both_arms_served_read_as_the_kv_gate_does_in_process(
    kv_gate: Session, served: Callable[..., RunningServer], args: tuple[str, ...], verdict: str
) -> None:
    """A plain server as the reference, a KV-quantizing one as the candidate: the gate's verdict as in process,
    each side's server named, the KL a lower bound from their top-11. Twice the module's positions: a bound
    from two servers' top-k leaves more out than one (at 4 x 8, 4-bit's fail reads inconclusive)."""
    ref, cand = served(), served(*args)
    result, got = kv_gate(cand.url, f"--mlx-ref-server={ref.url}", "-k", "drift", "--mlx-kl-decode=16")
    drift = got["records"]["test_drift"]
    assert drift["verdict"] == verdict, drift.get("checks") or drift.get("error")
    part = drift["server"]
    assert (part["url"], part["ref_url"], part["bound"], part["k"]) == (cand.url, ref.url, "lower", 11)
    assert drift["lever"]["ref"] == f"served at {ref.url}" and drift["lever"]["cand"] == f"served at {cand.url}"
    said = " ".join(result.stdout.str().split())
    assert f"reference served at {ref.url}; candidate served at {cand.url}: KL a lower bound from their top-11" in said


def test_a_served_reference_judges_the_module_s_lever_in_process(
    pytester: pytest.Pytester, embedded: Path, served: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """The reference a plain server the module names (`mlx_server(ref=URL)`), the candidate the module's own
    8-bit KV lever in process: it passes as it does with both arms in process; the reference is never cached
    (it is the server's, asked now)."""
    pytester.makeini("[pytest]\n")
    ref = served()
    declared = f"    pytest.mark.mlx_server(ref={ref.url!r}),\n]"
    pytester.makepyfile(test_kv=GATE.replace("\n]", "\n" + declared, 1))
    result, got = _session(pytester, embedded, None, tmp_path, "-k", "drift")
    drift = got["records"]["test_drift"]
    assert drift["verdict"] == "pass", drift.get("checks") or drift.get("error")
    assert drift["server"]["ref_url"] == ref.url and drift["server"]["url"] is None
    assert drift["lever"]["ref"] == f"served at {ref.url}" and "8-bit" in drift["lever"]["cand"]
    said = " ".join(result.stdout.str().split())
    assert f"reference served at {ref.url}: KL a lower bound from its top-11 (mass left out: reference" in said
    assert not list((tmp_path / "refcache").glob("**/*.npz"))


def test_a_server_of_another_model_is_an_error_naming_both(
    pytester: pytest.Pytester, embedded: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytester.makepyfile(test_kv=GATE)
    pytester.makeini("[pytest]\n")
    with mlx_server(tiny_model_dir, tmp_path, env=hub_env(tmp_path)) as server:
        _, got = _session(pytester, embedded, server.url, tmp_path, "-k", "drift")
    drift = got["records"]["test_drift"]
    assert drift["verdict"] == "error"
    assert f"serves {tiny_model_dir}, not the candidate" in drift["error"]["message"]


def test_the_key_reaches_no_record_report_log_or_database(
    pytester: pytest.Pytester,
    embedded: Path,
    served: Callable[..., RunningServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server behind a key (mlx_lm.server ignores it; the bearer header is sent all the same): the key's
    value is in none of what the run writes, the history DB included."""
    import sqlite3

    key, ref_key = "sk-mlxgate-test-7f3a9c", "sk-mlxgate-ref-91b2e4"
    monkeypatch.setenv("MY_SERVER_KEY", key)
    monkeypatch.setenv("MY_REF_KEY", ref_key)  # the reference served too, behind a key of its own
    pytester.makepyfile(test_kv=GATE)
    pytester.makeini("[pytest]\n")
    db, html = tmp_path / "history.sqlite", tmp_path / "r.html"
    server = served(*KV8)
    report, xml = tmp_path / "r.json", tmp_path / "r.xml"
    result = pytester.runpytest_subprocess(
        f"--mlx-candidate={embedded}",
        f"--mlx-cand-server={server.url}",
        "--mlx-server-key-env=MY_SERVER_KEY",
        f"--mlx-ref-server={server.url}",
        "--mlx-ref-server-key-env=MY_REF_KEY",
        f"--mlx-db={db}",
        f"--mlx-html={html}",
        f"--mlx-reference-cache={tmp_path / 'refcache'}",
        "--mlx-prove=off",
        f"--mlx-report={report}",
        f"--junit-xml={xml}",
        "-k",
        "drift",
    )
    assert json.loads(report.read_text())["gates"][0]["verdict"] == "pass"
    written = [report.read_text(), xml.read_text(), html.read_text(), result.stdout.str(), result.stderr.str()]
    with sqlite3.connect(db) as conn:
        written += [repr(row) for table in ("quality_runs",) for row in conn.execute(f"SELECT * FROM {table}")]
    written.append(server.log.read_text(errors="replace"))  # the server's own log too
    assert all(key not in text and ref_key not in text for text in written)
    assert "MY_SERVER_KEY" in report.read_text()  # the variable's name is said; its value nowhere


def test_a_server_speaking_the_protocol_is_scored_exactly(
    pytester: pytest.Pytester, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The protocol's reference server (`python -m pytest_mlxgate.remote.reference_server`) as the candidate:
    whole distributions, so the record's KL is exact (no top-k bound), and a plain server matches the
    reference arm at every position and says so."""
    pytester.makepyfile(test_kv=GATE)
    pytester.makeini("[pytest]\n")
    with mlx_server(tiny_model_dir, tmp_path, "--mlxgate-reference") as server:
        result, got = _session(pytester, tiny_model_dir, server.url, tmp_path, "-k", "drift", "--mlx-allow-untrained")
    drift = got["records"]["test_drift"]
    assert drift["verdict"] == "pass" and drift["server"]["bound"] == "exact", drift
    assert drift["server"]["served"] == [str(tiny_model_dir)] and drift["server"]["unaskable"] == 0
    said = " ".join(result.stdout.str().split())
    assert "whole distributions by the mlxgate protocol (KL exact)" in said
    assert "no difference from the reference arm at any position" in said


SPEED_GATE = """
import pytest
from pytest_mlxgate import assert_faster, assert_kl_below, assert_smaller

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0}),
    pytest.mark.mlx_kl(prompts=2, tokens=32, decode=8),
    pytest.mark.mlx_speed(contexts=(48,), decode=8, repetitions=3),
]


def test_speed(paired):
    assert_faster(paired, decode=0.2)


def test_memory(paired):
    assert_smaller(paired, kv=0.5)
"""


def test_speed_between_two_servers_is_streamed_paired_and_never_reads_memory_it_cannot_see(
    pytester: pytest.Pytester, embedded: Path, served: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Both arms served: time to first token and decode tokens/s from streamed completions, paired (ABBA) at
    the module's context and again with 4 requests at once; a KV-bytes goal cannot be seen through HTTP and
    never reads pass. One server alone against an arm in process is an error naming both flags."""
    pytester.makepyfile(test_kv=SPEED_GATE)
    pytester.makeini("[pytest]\n")
    ref, cand = served(), served(*KV8)
    result, got = _session(pytester, embedded, cand.url, tmp_path, f"--mlx-ref-server={ref.url}", "--mlx-speed=on")
    _, alone = _session(pytester, embedded, cand.url, tmp_path / "alone", "-k", "speed", "--mlx-speed=on")
    speed = got["records"]["test_speed"]
    assert speed["verdict"] in ("pass", "fail", "inconclusive"), speed.get("error")
    part = speed["speed"]
    assert part["served"]["reference"] == ref.url and part["served"]["candidate"] == cand.url
    at = part["contexts"]["48"]
    assert at["decode"]["n"] >= 3 and at["reference"]["decode_tps"] > 0 and at["candidate"]["prefill_tps"] > 0
    assert len(at["reference"]["trials"]) == len(at["candidate"]["trials"]) == at["decode"]["n"]
    concurrent = part["served"]["concurrent"]
    assert concurrent["requests"] == 4 and concurrent["context"] == 48 and concurrent["decode"]["n"] >= 3
    assert got["records"]["test_memory"]["verdict"] != "pass", got["records"]["test_memory"].get("checks")
    error = alone["records"]["test_speed"]
    assert error["verdict"] == "error" and "--mlx-cand-server" in error["error"]["message"]
    assert "--mlx-ref-server too" in error["error"]["message"]


TASK_GATE = """
import pytest
from pytest_mlxgate import assert_capability_at_least, jsonl_task

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0}),
    pytest.mark.mlx_kl(prompts=2, tokens=32, decode=8),
]
jsonl_task("capitals", "capitals.jsonl", max_new_tokens=6, scoring="regex")


def test_capitals(paired):
    assert_capability_at_least(paired, "capitals", max_drop=0.5)
"""
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo"), ("Spain", "Madrid"), ("Egypt", "Cairo")]


def test_a_generation_task_through_servers_answers_as_the_model_in_process(
    pytester: pytest.Pytester, embedded: Path, served: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A JSONL generation task, greedy through a plain server: the candidate served answers every item as the
    reference in process does (the same prompt tokens, checked at each item), so no drop; with both arms
    served, the same. Each run's reference is its own: a served one is never cached."""
    pytester.makeini("[pytest]\n")
    (pytester.path / "capitals.jsonl").write_text(
        "".join(json.dumps({"prompt": f"The capital of {c} is", "target": t}) + "\n" for c, t in CAPITALS)
    )
    pytester.makepyfile(test_tasks=TASK_GATE)
    plain = served()
    _, one = _session(pytester, embedded, plain.url, tmp_path / "one")
    _, both = _session(pytester, embedded, plain.url, tmp_path / "both", f"--mlx-ref-server={plain.url}")
    for got in (one, both):
        record = got["records"]["test_capitals"]
        assert record["verdict"] in ("pass", "inconclusive"), record.get("error") or record.get("checks")
        task = record["tasks"]["capitals"]
        assert task["n"] == len(CAPITALS) and task["ref_score"] == task["cand_score"] and not task["flipped"]["total"]
        assert record["lever"]["cand"] == f"served at {plain.url}"
    assert (
        "ref" not in one["records"]["test_capitals"]["lever"]
        or one["records"]["test_capitals"]["lever"]["ref"] == "plain"
    )
    assert both["records"]["test_capitals"]["lever"]["ref"] == f"served at {plain.url}"


def test_the_docs_gate_module_gates_a_real_server(
    pytester: pytest.Pytester,
    embedded: Path,
    served: Callable[..., RunningServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/server-arm.md's gate module, as written, with its URL pointed at a real --kv-bits 8 server: its
    candidate is the server's, behind the key the module names (sizes lowered to the test's)."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "server-arm.md").read_text()
    [source] = [b for b in re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M) if "mlx_server(" in b]
    monkeypatch.setenv("MY_SERVER_KEY", "sk-docs-example")
    pytester.makeini("[pytest]\n")
    server = served(*KV8)
    pytester.makepyfile(test_served=source.replace("http://127.0.0.1:8081", server.url))
    result, got = _session(
        pytester, embedded, None, tmp_path, "--mlx-kl-prompts=4", "--mlx-kl-tokens=48", "--mlx-kl-decode=8"
    )
    drift = got["records"]["test_drift"]
    checks = {c["key"]: c["verdict"] for c in drift.get("checks", [])}
    # the mean shown under its limit; top-1 at 90% needs the module's own 16 prompts (a test's 4: inconclusive)
    assert checks.get("mean") == "pass" and drift["verdict"] in ("pass", "inconclusive"), drift.get("error")
    assert drift["lever"]["cand"] == f"served at {server.url}" and drift["server"]["url"] == server.url
    # its words for a position whose next token the server did not list ("p 0.4 → ?"), never a traceback
    assert "Traceback" not in result.stdout.str() and "TypeError" not in result.stdout.str()
