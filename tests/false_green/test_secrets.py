"""False green, secrets: a run whose endpoint carries credentials (`http://user:SECRET@host`) uses them
against the hub and stores them nowhere: not on the terminal, not in the JSON report (argv, re-run
commands), the HTML, the JUnit XML or the sqlite history; a failed download says so without them."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

import pytest
from fakehub import FOREVER, FakeHub, Fault
from gate_sources import PERTURB
from hfenv import HfEnv

# One gate over its limit (its failure message prints the re-run command), one within it.
GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="perturb:rms_norm"),
    pytest.mark.mlx_kl(prompts=3, tokens=24),
]


def test_over_its_limit(paired):
    assert_kl_below(paired, mean=1e-9)


def test_within_its_limit(paired):
    assert_kl_below(paired, mean=1.0, top1=0.2)
"""

REPO = "secrets/tiny"
SECRET = "SECRET"
PASSWORD = f"{SECRET}-9f3Kq"  # "SECRET" alone is a word of the tiny model's vocabulary (its tokenizer.json)
HF_TOKEN = "hf_" + "Tk9" * 10  # a token-shaped value in the environment: it must not surface either


def _with_credentials(endpoint: str) -> str:
    return endpoint.replace("http://", f"http://user:{PASSWORD}@", 1)


@pytest.fixture
def gates(pytester: pytest.Pytester, hub: FakeHub, hf_env: HfEnv, tiny_model_dir: Path) -> pytest.Pytester:
    """The tiny model as a hub repo (its weights on the CDN), the gate module, an isolated HF_* env."""
    hub.add_repo(REPO, {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()})
    hf_env.on_hub(hub)  # the cache a fresh folder; HF_ENDPOINT the hub without credentials: the option wins
    hf_env.monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    pytester.makepyfile(perturb=PERTURB, test_gate=GATE)
    pytester.syspathinsert()
    pytester.makeini("[pytest]\n")
    return pytester


def _stored(paths: list[Path]) -> dict[str, bytes]:
    """Each output file's bytes, and a sqlite file's journal/WAL siblings too (written rows live there)."""
    out = {}
    for path in paths:
        assert path.is_file(), f"{path.name} was not written"
        for p in path.parent.glob(path.name + "*"):
            out[p.name] = p.read_bytes()
    return out


@pytest.mark.slow  # a pytester gate session on the tiny model, downloaded from the fake hub
def test_credentials_in_the_endpoint_are_used_and_stored_nowhere(
    gates: pytest.Pytester, hub: FakeHub, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    report, html, junit, db = out / "report.json", out / "report.html", out / "junit.xml", out / "results.sqlite"
    endpoint = _with_credentials(hub.endpoint)
    result = gates.runpytest_subprocess(
        f"--mlx-candidate={REPO}",
        "--mlx-endpoint",
        endpoint,
        f"--mlx-report={report}",
        f"--mlx-html={html}",
        f"--junit-xml={junit}",
        f"--mlx-db={db}",
        "-p",
        "no:randomly",
        "-rA",
        "-v",
    )
    text = result.stdout.str() + result.stderr.str()
    # Not a false green: the gate over its limit fails, its report names the re-run command, masked.
    result.assert_outcomes(failed=1, passed=1)
    assert "re-run: pytest test_gate.py::test_over_its_limit" in text and "'http://***@127.0.0.1:" in text, text[-3000:]

    # The credentials were used (Basic auth on the hub's origin), and never sent to the CDN.
    basic = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert any(r.origin == "cdn" for r in hub.log), "the weights did not come from the CDN"
    assert [r.path for r in hub.log if r.origin == "hub" and r.headers.get("authorization") != basic] == []
    assert [r.path for r in hub.log if r.origin == "cdn" and "authorization" in r.headers] == []

    # What is stored still says what ran: argv holds the endpoint, masked; every record its re-run command.
    data = json.loads(report.read_text())
    assert hub.endpoint.replace("http://", "http://***@") in data["run"]["argv"], data["run"]["argv"]
    reruns = [g.get("rerun", "") for g in data["gates"]]
    assert len(reruns) == 2 and all("--mlx-endpoint 'http://***@127.0.0.1:" in r for r in reruns), reruns
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT count(*) FROM quality_runs").fetchone()[0] == 2
    assert ".rerun" in junit.read_text() and "re-run:" in html.read_text()  # both show the re-run commands...
    assert "http://***@127.0.0.1:" in junit.read_text() and "http://***@127.0.0.1:" in html.read_text()  # masked

    for where, blob in {"terminal": text.encode(), **_stored([report, html, junit, db])}.items():
        assert SECRET.encode() not in blob, f"{where} holds the endpoint's password"
        assert base64.b64encode(f"user:{PASSWORD}".encode()) not in blob, f"{where} holds the Basic credentials"
        assert HF_TOKEN.encode() not in blob, f"{where} holds the HF token"
    # Nor anything else the run left on disk: the hub cache, pytest's cache, the reference cache.
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and PASSWORD.encode() in p.read_bytes()]
    assert leaked == [], leaked


@pytest.mark.slow  # a pytester session whose download fails
def test_a_download_that_fails_says_so_without_the_credentials(
    gates: pytest.Pytester, hub: FakeHub, tmp_path: Path
) -> None:
    """The hub keeps failing (503, no wait asked): the retries run out and the gates error, with the URL
    that failed in the message, its userinfo masked; the JUnit XML carries the same message."""
    hub.inject_api(Fault.status(503, retry_after="0", times=FOREVER))
    junit = tmp_path / "junit.xml"
    result = gates.runpytest_subprocess(
        f"--mlx-candidate={REPO}",
        f"--mlx-endpoint={_with_credentials(hub.endpoint)}",
        f"--junit-xml={junit}",
        "--mlx-db=off",
        "-p",
        "no:randomly",
        "-rA",
    )
    text = result.stdout.str() + result.stderr.str()
    result.assert_outcomes(errors=2)
    assert result.ret != 0
    assert "Traceback" not in text, text[-3000:]
    result.stdout.fnmatch_lines(
        [f"*cannot get the candidate '{REPO}'*gave up after*http://***@127.0.0.1:*answered 503*"]
    )
    for where, blob in {"terminal": text.encode(), "junit": junit.read_bytes()}.items():
        assert SECRET.encode() not in blob, f"{where} holds the endpoint's password"
    assert "http://***@127.0.0.1:" in junit.read_text()
