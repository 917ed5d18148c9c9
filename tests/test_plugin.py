"""The plugin end to end through pytester: options and ini twins, names, header, xdist shipping.

The hub is replaced by `standin_hub` (same contract, no network): these tests are about the
wiring, the downloader has its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis  # noqa: F401  (see below)
import mlx.core  # noqa: F401  (see below)
import pytest

import standin_hub
from pytest_mlxgate.snapshots import ResolvedSnapshot

# In-process pytester runs drop the modules an inner run imported. mlx.core (a nanobind
# extension) aborts the process when imported a second time, and hypothesis's plugin would
# re-import (and assert-rewrite) hypothesis in every inner run. Importing both here keeps them.

STANDIN_SOURCE = Path(standin_hub.__file__).read_text()
PIN = standin_hub.COMMIT[:7]

SHOW_SNAPSHOT = """
def test_show(mlx_snapshot):
    print("SNAP", mlx_snapshot.to_json())
"""

Calls = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Calls:
    """Stand-in hub for in-process runs; returns a reader of its call log."""
    monkeypatch.setitem(sys.modules, "pytest_mlxgate.hub", standin_hub)
    log = tmp_path / "standin-calls.jsonl"
    monkeypatch.setenv("STANDIN_HUB_LOG", str(log))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "env-cache"))
    return lambda: [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def snapshot_printed(result: pytest.RunResult) -> ResolvedSnapshot:
    lines = [line for line in result.outlines if line.startswith("SNAP ")]
    assert len(lines) == 1, result.stdout.str()
    return ResolvedSnapshot.from_json(lines[0][len("SNAP ") :])


def uses_reference_blas_without_preload() -> bool:
    """Linux + MLX's CPU wheel: a run without LD_PRELOAD is on the bundled reference BLAS."""
    import mlx

    return sys.platform.startswith("linux") and (Path(mlx.__path__[0]).parent / "mlx_cpu.libs").is_dir()


# -- options, ini twins, precedence ---------------------------------------------------------------


def test_env_then_ini_then_command_line(pytester: pytest.Pytester, standin: Calls, tmp_path: Path) -> None:
    pytester.makepyfile(SHOW_SNAPSHOT)
    pytester.makepyprojecttoml("")
    assert pytester.runpytest("-s", "--mlx-candidate", "org/from-env").ret == 0
    env_call = standin()[-1]
    # nothing set here: None goes down and the hub reads HF_ENDPOINT / HF_HUB_OFFLINE / HF_HUB_CACHE
    assert (env_call["endpoint"], env_call["offline"], env_call["cache_dir"]) == (None, None, None)

    pytester.makepyprojecttoml(
        """
        [tool.pytest.ini_options]
        mlx_candidate = "org/from-ini"
        mlx_endpoint = "http://ini.invalid"
        mlx_cache_dir = "ini-cache"
        mlx_offline = false
        """
    )
    result = pytester.runpytest("-s")
    assert result.ret == 0
    ini_call = standin()[-1]
    assert snapshot_printed(result).repo_id == "org/from-ini"
    assert ini_call["endpoint"] == "http://ini.invalid"
    assert ini_call["cache_dir"] == str(pytester.path / "ini-cache")  # relative to the ini file
    assert ini_call["offline"] is False

    cli_cache = pytester.path / "cli-cache"
    standin_hub.snapshot_download("org/from-cli", cache_dir=cli_cache)  # so offline finds it
    result = pytester.runpytest(
        "-s", "--mlx-candidate", "org/from-cli", "--mlx-endpoint", "http://cli.invalid/",
        "--mlx-cache-dir", "cli-cache", "--mlx-offline",
    )
    assert result.ret == 0
    cli_call = standin()[-1]
    assert snapshot_printed(result).repo_id == "org/from-cli"
    assert cli_call["endpoint"] == "http://cli.invalid"
    assert cli_call["cache_dir"] == str(cli_cache)
    assert cli_call["offline"] is True


def test_options_are_in_one_group_with_ini_twins(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    out = result.stdout.str()
    group = out[out.index("mlxgate: quality gates") :]
    for flag in ("--mlx-candidate", "--mlx-reference", "--mlx-cache-dir", "--mlx-offline", "--mlx-endpoint"):
        assert flag in group.split("\n\n")[0]
        assert f"  {flag[2:].replace('-', '_')} (" in out


# -- names ----------------------------------------------------------------------------------------


def test_unknown_alias_is_a_usage_error_naming_the_fix(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(SHOW_SNAPSHOT)
    result = pytester.runpytest("--mlx-candidate", "e5x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: 'e5x' is not a known candidate; known: e2b, e4b, smollm2-135m; add aliases under "
            "[[]tool.mlxgate.aliases[]] in *pyproject.toml, or pass a repo id org/name[[]@revision[]] "
            "or a local directory"
        ]
    )
    result = pytester.runpytest("--mlx-reference", "e5x")
    result.stderr.fnmatch_lines(["ERROR: 'e5x' is not a known reference; *"])


def test_malformed_names_and_values_fail_at_parse_time(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--mlx-candidate", "org/na..me")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*argument --mlx-candidate: 'org/na..me' is not a valid repo id: *"])
    result = pytester.runpytest("--mlx-endpoint", "ftp://hub")
    result.stderr.fnmatch_lines(["*argument --mlx-endpoint: 'ftp://hub' is not a hub endpoint*"])
    pytester.makefile(".bin", afile="")
    result = pytester.runpytest("--mlx-cache-dir", "afile.bin")
    result.stderr.fnmatch_lines(["*argument --mlx-cache-dir: 'afile.bin' exists and is not a directory"])


def test_malformed_ini_values_name_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nmlx_candidate = "org/-bad"\n')
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: mlx_candidate in *pyproject.toml: 'org/-bad' is not a valid repo id*"])


def test_local_directory_candidate_and_the_header(pytester: pytest.Pytester) -> None:
    model = pytester.mkdir("model")
    pytester.makepyfile(SHOW_SNAPSHOT)
    result = pytester.runpytest("-s", "--mlx-candidate", "./model")
    assert result.ret == 0
    snap = snapshot_printed(result)
    assert (snap.kind, snap.commit, snap.path, snap.name) == ("local", "local", str(model), "./model")
    result.stdout.fnmatch_lines(
        [
            "mlxgate: ./model (resolved on first use) · * · *",
            "*mlxgate: ./model → */model (local directory, not verified)",
        ]
    )
    result = pytester.runpytest("--mlx-candidate", "./absent")
    result.stderr.fnmatch_lines(["ERROR: local model directory './absent' (*) does not exist*"])


def test_aliases_from_pyproject(pytester: pytest.Pytester, standin: Calls) -> None:
    (pytester.path / "models" / "tiny").mkdir(parents=True)
    pytester.makepyprojecttoml(
        """
        [tool.mlxgate.aliases]
        tiny = "models/tiny"
        remote = "org/remote@v3"
        """
    )
    pytester.makepyfile(SHOW_SNAPSHOT)
    result = pytester.runpytest("-s", "--mlx-candidate", "tiny")
    assert snapshot_printed(result).path == str(pytester.path / "models" / "tiny")
    result = pytester.runpytest("-s", "--mlx-candidate", "remote")
    assert result.ret == 0
    assert [(c["repo_id"], c["revision"]) for c in standin()] == [("org/remote", "v3")]
    result.stdout.fnmatch_lines([f"*mlxgate: remote → org/remote@{PIN} (verified, downloaded *)"])
    result = pytester.runpytest("--mlx-candidate", "nope")
    result.stderr.fnmatch_lines(
        ["ERROR: 'nope' is not a known candidate; known: e2b, e4b, remote, smollm2-135m, tiny; *"]
    )


def test_a_mlxgate_table_alone_puts_mlxgate_in_use(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    assert "mlxgate:" not in pytester.runpytest().stdout.str()
    pytester.makepyprojecttoml("[tool.mlxgate]\n")
    pytester.runpytest().stdout.fnmatch_lines(["mlxgate: smollm2-135m (resolved on first use) · * · *"])


# -- fixtures -------------------------------------------------------------------------------------


def test_hub_errors_fail_the_tests_cleanly_and_resolve_once(pytester: pytest.Pytester, standin: Calls) -> None:
    pytester.makepyfile(
        """
        def test_a(mlx_snapshot): pass
        def test_b(mlx_snapshot): pass
        """
    )
    result = pytester.runpytest("--mlx-candidate", "missing/model")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        ["*mlxgate: cannot get the candidate 'missing/model': missing/model does not exist on the hub (404)*"]
    )
    out = result.stdout.str()
    assert "standin_hub.py" not in out and "exception" not in out  # no (chained) traceback
    assert len(standin()) == 1


def test_a_failed_resolution_is_not_retried(pytester: pytest.Pytester, standin: Calls) -> None:
    """Later callers (fixtures of later issues) get the first failure, not a second download."""
    from pytest_mlxgate.errors import ModelUnavailableError
    from pytest_mlxgate.plugin import SESSION_KEY

    state = pytester.parseconfigure("--mlx-candidate", "missing/model").stash[SESSION_KEY]
    for _ in range(2):
        with pytest.raises(ModelUnavailableError, match="does not exist on the hub"):
            state.snapshot("candidate")
    assert len(standin()) == 1


def test_reference_snapshot_skips_without_a_reference(pytester: pytest.Pytester) -> None:
    pytester.mkdir("ref")
    pytester.makepyfile(
        """
        def test_ref(mlx_reference_snapshot):
            print("REF", mlx_reference_snapshot.path)
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no reference model: pass --mlx-reference NAME*"])
    result = pytester.runpytest("-s", "--mlx-reference", "./ref")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["mlxgate reference: ./ref (resolved on first use)", f"REF {pytester.path / 'ref'}"]
    )


def test_mlx_model_loads_once_per_process(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[str] = []

    class FakeMlxLm:
        @staticmethod
        def load(path: str) -> tuple[str, str]:
            loads.append(path)
            return ("model", "tokenizer")

    monkeypatch.setitem(sys.modules, "mlx_lm", FakeMlxLm)
    pytester.mkdir("m")
    pytester.makepyfile(
        """
        def test_a(mlx_model): assert mlx_model == ("model", "tokenizer")
        def test_b(mlx_model): assert mlx_model == ("model", "tokenizer")
        """
    )
    pytester.runpytest("--mlx-candidate", "./m").assert_outcomes(passed=2)
    assert loads == [str(pytester.path / "m")]


# -- loading, xdist -------------------------------------------------------------------------------


def test_importing_the_plugin_imports_no_mlx_and_no_httpx(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import sys
        import pytest_mlxgate, pytest_mlxgate.plugin
        pytest_mlxgate.CandidateSpec, pytest_mlxgate.MlxgateWarning
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("mlx", "mlx_lm", "httpx"))
        print(heavy)
        """
    )
    # cwd elsewhere: the installed package, as pytest's entry point loads it
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr


def test_a_run_that_does_not_use_mlxgate_is_untouched(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys
        def test_nothing_heavy_loaded():
            heavy = [m for m in sys.modules if m.split(".")[0] in ("mlx", "mlx_lm", "httpx")]
            assert heavy == []
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:xdist")
    result.assert_outcomes(passed=1)
    assert "mlxgate:" not in result.stdout.str()  # no header line


def test_runs_without_xdist(pytester: pytest.Pytester) -> None:
    pytester.mkdir("m")
    pytester.makepyfile(SHOW_SNAPSHOT)
    result = pytester.runpytest("-p", "no:xdist", "-s", "--mlx-candidate", "./m")
    assert result.ret == 0
    assert snapshot_printed(result).kind == "local"


def test_xdist_controller_resolves_once_and_ships_the_pin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log, seen = tmp_path / "calls.jsonl", tmp_path / "seen"
    seen.mkdir()
    monkeypatch.setenv("STANDIN_HUB_LOG", str(log))
    monkeypatch.setenv("SEEN_DIR", str(seen))
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # so the reference-BLAS warning shows
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(var, raising=False)  # when this suite itself runs under xdist
    pytester.makepyfile(standin_hub=STANDIN_SOURCE)
    pytester.makeconftest("import standin_hub\nstandin_hub.install()\n")
    pytester.makepyfile(
        test_w="""
        import os, pathlib
        def test_snapshot(mlx_snapshot):
            out = pathlib.Path(os.environ["SEEN_DIR"]) / os.environ["PYTEST_XDIST_WORKER"]
            out.write_text(mlx_snapshot.to_json())
        """
    )
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "each", "--mlx-candidate", "org/model", "--mlx-cache-dir", "cache"
    )
    result.assert_outcomes(passed=2)
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(c["worker"], c["repo_id"], c["revision"]) for c in calls] == [("controller", "org/model", "main")]
    shipped = {p.name: ResolvedSnapshot.from_json(p.read_text()) for p in seen.iterdir()}
    assert sorted(shipped) == ["gw0", "gw1"]
    assert {s.commit for s in shipped.values()} == {standin_hub.COMMIT}
    assert {s.path for s in shipped.values()} == {
        str(pytester.path / "cache" / "models--org--model" / "snapshots" / standin_hub.COMMIT)
    }
    out = result.stdout.str()
    result.stdout.fnmatch_lines([f"mlxgate: org/model@{PIN} (verified, downloaded * in * s) · * · *"])
    expected_warnings = 1 if uses_reference_blas_without_preload() else 0
    assert out.count("MlxgateWarning: MLX runs on the reference BLAS") == expected_warnings


def test_xdist_resolution_error_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STANDIN_HUB_LOG", raising=False)
    pytester.makepyfile(standin_hub=STANDIN_SOURCE)
    pytester.makeconftest("import standin_hub\nstandin_hub.install()\n")
    pytester.makepyfile(SHOW_SNAPSHOT)
    result = pytester.runpytest_subprocess("-n", "2", "--mlx-candidate", "missing/model")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: mlxgate: cannot get the candidate 'missing/model': missing/model does not exist on the hub (404)*"]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_worker_uses_the_shipped_snapshot_and_refuses_a_missing_one(
    pytester: pytest.Pytester, standin: Calls
) -> None:
    from pytest_mlxgate.errors import ModelUnavailableError
    from pytest_mlxgate.session import MlxgateSession
    from pytest_mlxgate.settings import read_settings

    here = pytester.mkdir("snap")
    for path, works in ((here, True), (pytester.path / "elsewhere", False)):
        config = pytester.parseconfig("--mlx-candidate", "org/model")
        shipped = ResolvedSnapshot("org/model", "hub", "org/model", standin_hub.COMMIT, str(path))
        config.workerinput = {"mlxgate_snapshot": shipped.to_json()}  # type: ignore[attr-defined]
        state = MlxgateSession(config, read_settings(config))
        if works:
            assert state.snapshot() == shipped
        else:
            with pytest.raises(ModelUnavailableError, match="not on this worker's machine"):
                state.snapshot()
    assert standin() == []  # workers never resolve


@pytest.mark.skipif(os.name != "posix", reason="paths")
def test_worker_payload_is_plain_json_strings(pytester: pytest.Pytester) -> None:
    """execnet can only ship plain data: the payload must be str -> str."""
    from pytest_mlxgate.plugin import SESSION_KEY

    pytester.mkdir("m")
    config = pytester.parseconfigure("--mlx-candidate", "./m")
    state = config.stash[SESSION_KEY]
    state.snapshot("candidate")
    payload = state.worker_payload()
    assert list(payload) == ["mlxgate_snapshot"]
    assert ResolvedSnapshot.from_json(payload["mlxgate_snapshot"]).path == str(pytester.path / "m")
