"""A gate module's `mlx_server` marker: its arms served over HTTP, named by the module; a marker that cannot
name a server is an error record naming the module's marker and the fix, before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("flag", env="MLXGATE_UNUSED_FLAG", ref="0", cand="1"),
    pytest.mark.mlx_kl(prompts=2, tokens=16),
    pytest.mark.mlx_server(%s),
]


def test_drift(paired):
    assert_kl_below(paired, mean=1.0)
"""


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        ("cand=8081", "a server is its URL as a string"),
        ("'http://127.0.0.1:8081'", "takes ref=, cand= (a server's URL, or None: in process)"),
        ("cand='http://127.0.0.1:8081', port=1", "takes ref=, cand="),
        ("key_env='K'", "takes ref=, cand="),
        ("cand='http://u:pw@127.0.0.1:8081'", "password"),
        ("cand='ftp://127.0.0.1:8081'", "http"),
        ("cand='http://127.0.0.1:8081', top_k=40", "top_k=40: must be at most 11"),
    ],
)
def test_a_marker_that_names_no_server_is_an_error_naming_it(
    pytester: pytest.Pytester, tiny_model_dir: Path, marker: str, said: str
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_served=GATE % marker)
    report = pytester.path / "r.json"
    pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}", "--mlx-db=off", "--mlx-allow-untrained", f"--mlx-report={report}"
    )
    [record] = json.loads(report.read_text())["gates"]
    message = record["error"]["message"]
    assert record["verdict"] == "error" and "test_served.py's mlx_server marker" in message, message
    assert said in message, message


def test_the_command_line_server_stands_over_the_module_s(pytester: pytest.Pytester, tiny_model_dir: Path) -> None:
    """--mlx-cand-server replaces the module's candidate server (here one nothing listens on: the run's error
    names the command line's URL, not the module's)."""
    from mlx_server import free_port

    mine, theirs = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_served=GATE % f"cand={mine!r}")
    report = pytester.path / "r.json"
    pytester.runpytest_subprocess(
        f"--mlx-candidate={tiny_model_dir}",
        "--mlx-db=off",
        "--mlx-allow-untrained",
        "--mlx-prove=off",
        f"--mlx-report={report}",
        f"--mlx-cand-server={theirs}",
    )
    [record] = json.loads(report.read_text())["gates"]
    assert record["verdict"] == "error" and theirs in record["error"]["message"] and mine not in json.dumps(record)


def test_a_served_model_is_the_local_one_by_name_path_or_pinned_snapshot() -> None:
    """A server lists paths or ids: the local model's names and path count, and so does a hub snapshot folder
    of the same commit in another cache (the same files); another commit, a prefix or a bare commit do not."""
    from pytest_mlxgate.kl.served import names_the_model

    commit = "0f70a44e690d1c68c83c15e245c0edd74de65805"
    local = {f"/a/hub/models--o--m/snapshots/{commit}", "o/m", "smollm2-135m"}
    assert names_the_model("o/m", local, commit) and names_the_model(
        f"/a/hub/models--o--m/snapshots/{commit}", local, commit
    )
    assert names_the_model(f"/root/.cache/hub/models--o--m/snapshots/{commit}/", local, commit)
    assert not names_the_model(f"/b/snapshots/{'1' * 40}", local, commit)
    assert not names_the_model(f"/b/snapshots/{commit}x", local, commit) and not names_the_model(commit, local, commit)
    assert not names_the_model("/b/snapshots/local", local, "local")  # a local folder pins no commit
