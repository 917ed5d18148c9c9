"""The plugin end to end through pytester: options and ini twins, names, header, xdist shipping.

Hub names go through the real downloader to the fake hub on loopback (`tests/support/fakehub.py`, the
`hub` fixture): what the plugin passed down is read off the hub's request log (which server was
asked, for which revision, how often), `bytes_served` (what was downloaded) and the cache folder
the snapshot landed in. Each test uses repo ids of its own, since the fake hub lives for the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hypothesis  # noqa: F401  (see below)
import mlx.core  # noqa: F401  (see below)
import pytest
from fakehub import FakeHub, Request
from hfenv import HfEnv

from pytest_mlxgate.models.materialize import ResolvedSnapshot

# In-process pytester runs drop the modules an inner run imported. mlx.core (a nanobind
# extension) aborts the process when imported a second time, and hypothesis's plugin would
# re-import (and assert-rewrite) hypothesis in every inner run. Importing both here keeps them.

TOKEN = "hf_plugin_test_token_0123456789"

SHOW_SNAPSHOT = """
def test_show(mlx_snapshot):
    print("SNAP", mlx_snapshot.to_json())
"""


@pytest.fixture
def hf_env(hf_env: HfEnv, hub: FakeHub) -> Path:
    """The shared isolated HF_* environment (tests/conftest.py) on the fake hub: HF_ENDPOINT is the hub,
    HF_HUB_CACHE a fresh folder (returned), no token, not offline. Inner runs, in-process or not, inherit it."""
    return hf_env.on_hub(hub)


def requests_for(hub: FakeHub, repo_id: str) -> list[Request]:
    """Every request the hub (or its CDN) got for `repo_id`: API, resolve and content."""
    return [r for r in list(hub.log) if (r.file is not None and r.file[1] == repo_id) or f"/{repo_id}/" in r.path]


def resolutions(hub: FakeHub, repo_id: str, repo_type: str = "model") -> list[str]:
    """The revisions asked for `repo_id` (`/api/<type>s/<repo>/revision/<rev>`): one per resolution."""
    prefix = f"/api/{repo_type}s/{repo_id}/revision/"
    return [r.path[len(prefix) :] for r in list(hub.log) if r.origin == "hub" and r.path.startswith(prefix)]


def snapshot_dir(cache: Path, repo_id: str, commit: str) -> Path:
    return cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit


def snapshot_printed(result: pytest.RunResult) -> ResolvedSnapshot:
    lines = [line for line in result.outlines if line.startswith("SNAP ")]
    assert len(lines) == 1, result.stdout.str()
    return ResolvedSnapshot.from_json(lines[0][len("SNAP ") :])


def uses_reference_blas_without_preload() -> bool:
    """Linux + MLX's CPU wheel: a run without LD_PRELOAD is on the bundled reference BLAS."""
    import mlx

    return sys.platform.startswith("linux") and (Path(mlx.__path__[0]).parent / "mlx_cpu.libs").is_dir()


# -- options, ini twins, precedence ---------------------------------------------------------------


def test_env_then_ini_then_command_line(
    pytester: pytest.Pytester, hub: FakeHub, hf_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF_* < ini < command line, for the endpoint, the cache and offline. Each layer's choice shows
    where it acts: which server the requests reach, where the snapshot lands, whether any is sent."""
    test_file = pytester.makepyfile(SHOW_SNAPSHOT)
    pytester.makepyprojecttoml("")

    # Nothing set here: None goes down and the hub reads HF_ENDPOINT / HF_HUB_CACHE / HF_HUB_OFFLINE.
    env_commit = hub.add_repo("layers/from-env", {"config.json": b'{"layer": "env"}'})
    result = pytester.runpytest("-s", "--mlx-candidate", "layers/from-env")
    assert result.ret == 0
    assert snapshot_printed(result).path == str(snapshot_dir(hf_env, "layers/from-env", env_commit))
    assert resolutions(hub, "layers/from-env") == ["main"]
    hub.add_repo("layers/from-env", {"config.json": b'{"layer": "env", "v": 2}'})  # main moves on
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = pytester.runpytest("-s", "--mlx-candidate", "layers/from-env")
    assert result.ret == 0
    assert snapshot_printed(result).commit == env_commit  # the cached one: the hub was not asked
    assert resolutions(hub, "layers/from-env") == ["main"]

    # From here on the runs start in a subfolder: ini paths are relative to the ini file,
    # command-line paths to where pytest was started.
    monkeypatch.chdir(pytester.mkdir("sub"))
    with FakeHub() as ini_hub:
        ini_commit = ini_hub.add_repo("layers/from-ini", {"config.json": b'{"layer": "ini"}'})
        pytester.makepyprojecttoml(
            f"""
            [tool.pytest.ini_options]
            mlx_candidate = "layers/from-ini"
            mlx_endpoint = "{ini_hub.endpoint}"
            mlx_cache_dir = "ini-cache"
            mlx_offline = false
            """
        )
        result = pytester.runpytest("-s", str(test_file))
        assert result.ret == 0, result.stdout.str()
        snap = snapshot_printed(result)
        assert (snap.repo_id, snap.commit) == ("layers/from-ini", ini_commit)
        # ini over HF_HUB_CACHE, relative to the ini file (not to the subfolder the run started in)
        assert snap.path == str(snapshot_dir(pytester.path / "ini-cache", "layers/from-ini", ini_commit))
        # ini endpoint over HF_ENDPOINT; mlx_offline = false over HF_HUB_OFFLINE=1 (it went online)
        assert resolutions(ini_hub, "layers/from-ini") == ["main"]
        assert requests_for(hub, "layers/from-ini") == []
        ini_hub.reset_log()

        cli_commit = hub.add_repo("layers/from-cli", {"config.json": b'{"layer": "cli"}'})
        cli_args = (
            "-s",
            str(test_file),
            "--mlx-candidate",
            "layers/from-cli",
            "--mlx-endpoint",
            f"{hub.endpoint}/",
            "--mlx-cache-dir",
            "cli-cache",
        )
        result = pytester.runpytest(*cli_args)
        assert result.ret == 0, result.stdout.str()
        snap = snapshot_printed(result)
        assert (snap.repo_id, snap.commit) == ("layers/from-cli", cli_commit)
        assert snap.path == str(snapshot_dir(pytester.path / "sub" / "cli-cache", "layers/from-cli", cli_commit))
        assert resolutions(hub, "layers/from-cli") == ["main"]  # the trailing '/' was dropped: no '//api'
        assert ini_hub.log == []  # the ini's endpoint was not asked anything

        # --mlx-offline over mlx_offline = false: the cached snapshot, though main has moved on
        hub.add_repo("layers/from-cli", {"config.json": b'{"layer": "cli", "v": 2}'})
        result = pytester.runpytest(*cli_args, "--mlx-offline")
        assert result.ret == 0, result.stdout.str()
        assert snapshot_printed(result).commit == cli_commit
        assert resolutions(hub, "layers/from-cli") == ["main"]
        assert ini_hub.log == []


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
            "ERROR: 'e5x' is not a known candidate; known: e2b, e4b, gemma3-270m, smollm2-135m; add aliases under "
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


def test_aliases_from_pyproject(pytester: pytest.Pytester, hub: FakeHub, hf_env: Path) -> None:
    hub.add_repo("aliases/remote", {"config.json": b'{"branch": "main"}'})
    v3 = hub.add_repo("aliases/remote", {"config.json": b'{"branch": "v3"}'}, branch="v3")
    (pytester.path / "models" / "tiny").mkdir(parents=True)
    pytester.makepyprojecttoml(
        """
        [tool.mlxgate.aliases]
        tiny = "models/tiny"
        remote = "aliases/remote@v3"
        """
    )
    pytester.makepyfile(SHOW_SNAPSHOT)
    result = pytester.runpytest("-s", "--mlx-candidate", "tiny")
    assert snapshot_printed(result).path == str(pytester.path / "models" / "tiny")
    assert requests_for(hub, "aliases/remote") == []
    result = pytester.runpytest("-s", "--mlx-candidate", "remote")
    assert result.ret == 0
    assert resolutions(hub, "aliases/remote") == ["v3"]
    snap = snapshot_printed(result)
    assert (snap.repo_id, snap.commit, snap.name) == ("aliases/remote", v3, "remote")
    assert (snap.dir / "config.json").read_bytes() == b'{"branch": "v3"}'
    result.stdout.fnmatch_lines([f"*mlxgate: remote → aliases/remote@{v3[:7]} (verified, downloaded 16 B in * s)"])
    result = pytester.runpytest("--mlx-candidate", "nope")
    result.stderr.fnmatch_lines(
        ["ERROR: 'nope' is not a known candidate; known: e2b, e4b, gemma3-270m, remote, smollm2-135m, tiny; *"]
    )


def test_a_mlxgate_table_alone_puts_mlxgate_in_use(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    assert "mlxgate:" not in pytester.runpytest().stdout.str()
    pytester.makepyprojecttoml("[tool.mlxgate]\n")
    pytester.runpytest().stdout.fnmatch_lines(["mlxgate: smollm2-135m (resolved on first use) · * · *"])


# -- fixtures -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing", "gated"])
def test_hub_errors_fail_the_tests_cleanly_and_resolve_once(
    pytester: pytest.Pytester, hub: FakeHub, hf_env: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A 404 and a gated repo's 401: every test that needs the model errors with the hub's own
    message (what, why, the fix) and no traceback, after a single request to the hub."""
    repo = f"errors/{case}"
    if case == "gated":
        hub.add_repo(repo, {"config.json": b"{}"}, gated_token=TOKEN)
    pytester.makepyfile(
        """
        def test_a(mlx_snapshot): pass
        def test_b(mlx_snapshot): pass
        """
    )
    result = pytester.runpytest("--mlx-candidate", repo, "--mlx-endpoint", hub.endpoint)
    result.assert_outcomes(errors=2)
    url = f"{hub.endpoint}/api/models/{repo}/revision/main"
    why = {
        "missing": f"{url} answered 404 (RepoNotFound). Check the repo id, the revision and whether it is a model "
        "or a dataset repo; *",
        "gated": f"{url} answered 401 (GatedRepo; no token was sent). To fix: if the repo is gated, "
        f"accept its terms on {hub.endpoint}; make sure your token has access: set HF_TOKEN *",
    }[case]
    result.stdout.fnmatch_lines([f"*mlxgate: cannot get the candidate '{repo}': looking up model {repo}@main: {why}"])
    out = result.stdout.str()
    assert "Traceback" not in out and "exception" not in out  # no (chained) traceback
    assert "pytest_mlxgate/hub" not in out and "httpx" not in out
    assert len(requests_for(hub, repo)) == 1  # resolved once for both tests, no retry
    if case == "gated":  # and the fix works: the token from the environment reaches the hub
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        result = pytester.runpytest("--mlx-candidate", repo, "--mlx-endpoint", hub.endpoint)
        result.assert_outcomes(passed=2)
        assert TOKEN not in result.stdout.str() + result.stderr.str()


def test_a_failed_resolution_is_not_retried(pytester: pytest.Pytester, hub: FakeHub, hf_env: Path) -> None:
    """Later callers (fixtures of later issues) get the first failure, not a second download."""
    from pytest_mlxgate.errors import ModelUnavailableError
    from pytest_mlxgate.plugin import SESSION_KEY

    config = pytester.parseconfigure("--mlx-candidate", "errors/not-retried", "--mlx-endpoint", hub.endpoint)
    state = config.stash[SESSION_KEY]
    for _ in range(2):
        with pytest.raises(ModelUnavailableError, match=r"errors/not-retried.* answered 404 \(RepoNotFound\)"):
            state.snapshot("candidate")
    assert resolutions(hub, "errors/not-retried") == ["main"]
    hub.add_repo("errors/not-retried", {"config.json": b"{}"})  # even once it exists, this run remembers
    with pytest.raises(ModelUnavailableError, match="answered 404"):
        state.snapshot("candidate")
    assert resolutions(hub, "errors/not-retried") == ["main"]


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
    result.stdout.fnmatch_lines(["mlxgate reference: ./ref (resolved on first use)", f"REF {pytester.path / 'ref'}"])


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


@pytest.mark.slow  # a pytester session in a subprocess
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


@pytest.mark.slow  # a pytester session under -n 2 in a subprocess
def test_xdist_controller_resolves_once_and_ships_the_pin(
    pytester: pytest.Pytester, hub: FakeHub, hf_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Under -n 2 the controller resolves and downloads once, then ships the commit-pinned
    snapshot: one revision lookup, every file fetched once and by commit, never by branch."""
    files = {"config.json": b'{"model_type": "xdist"}', "weights.bin": bytes(range(256)) * 8}  # 2 kB: LFS, via the CDN
    commit = hub.add_repo("xdist/model", files)
    seen = tmp_path / "seen"
    seen.mkdir()
    monkeypatch.setenv("SEEN_DIR", str(seen))
    monkeypatch.delenv("LD_PRELOAD", raising=False)  # so the reference-BLAS warning shows
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(var, raising=False)  # when this suite itself runs under xdist
    pytester.makepyfile(
        test_w="""
        import os, pathlib
        def test_snapshot(mlx_snapshot):
            out = pathlib.Path(os.environ["SEEN_DIR"]) / os.environ["PYTEST_XDIST_WORKER"]
            out.write_text(mlx_snapshot.to_json())
        """
    )
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "--dist",
        "each",
        "--mlx-candidate",
        "xdist/model",
        "--mlx-endpoint",
        hub.endpoint,
        "--mlx-cache-dir",
        "cache",
    )
    result.assert_outcomes(passed=2)
    # One resolution for three processes: the controller's (its header below reports the download;
    # a worker that resolved would add a lookup of its own).
    assert resolutions(hub, "xdist/model") == ["main"]
    assert hub.bytes_served("xdist/model") == sum(len(b) for b in files.values())  # downloaded once
    fetched = [r for r in requests_for(hub, "xdist/model") if r.file is not None and r.method == "GET"]
    assert sorted(r.file[2] for r in fetched if r.origin == "hub") == ["config.json", "weights.bin"]
    assert all(f"/resolve/{commit}/" in r.path for r in fetched if r.origin == "hub")  # pinned, not "main"
    assert all(f"/tree/{commit}" in r.path for r in requests_for(hub, "xdist/model") if "/tree/" in r.path)
    shipped = {p.name: ResolvedSnapshot.from_json(p.read_text()) for p in seen.iterdir()}
    assert sorted(shipped) == ["gw0", "gw1"]
    assert {s.commit for s in shipped.values()} == {commit}
    assert {s.path for s in shipped.values()} == {str(snapshot_dir(pytester.path / "cache", "xdist/model", commit))}
    out = result.stdout.str()
    result.stdout.fnmatch_lines([f"mlxgate: xdist/model@{commit[:7]} (verified, downloaded 2.1 kB in * s) · * · *"])
    expected_warnings = 1 if uses_reference_blas_without_preload() else 0
    assert out.count("MlxgateWarning: MLX runs on the reference BLAS") == expected_warnings


def test_xdist_resolution_error_is_a_usage_error(pytester: pytest.Pytester, hub: FakeHub, hf_env: Path) -> None:
    pytester.makepyfile(SHOW_SNAPSHOT)
    result = pytester.runpytest_subprocess(
        "-n", "2", "--mlx-candidate", "xdist/missing", "--mlx-endpoint", hub.endpoint
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: mlxgate: cannot get the candidate 'xdist/missing': looking up model xdist/missing@main: "
            f"{hub.endpoint}/api/models/xdist/missing/revision/main answered 404 (RepoNotFound). Check the repo id*"
        ]
    )
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert resolutions(hub, "xdist/missing") == ["main"]  # the controller's, before any worker started


def test_a_worker_uses_the_shipped_snapshot_and_refuses_a_missing_one(
    pytester: pytest.Pytester, hub: FakeHub, hf_env: Path
) -> None:
    from pytest_mlxgate.config.settings import read_settings
    from pytest_mlxgate.errors import ModelUnavailableError
    from pytest_mlxgate.session.state import MlxgateSession

    commit = hub.add_repo("worker/model", {"config.json": b"{}"})  # there to be had: a worker must still not ask
    here = pytester.mkdir("snap")
    for path, works in ((here, True), (pytester.path / "elsewhere", False)):
        config = pytester.parseconfig("--mlx-candidate", "worker/model", "--mlx-endpoint", hub.endpoint)
        shipped = ResolvedSnapshot("worker/model", "hub", "worker/model", commit, str(path))
        config.workerinput = {"mlxgate_snapshot": shipped.to_json()}  # type: ignore[attr-defined]
        state = MlxgateSession(config, read_settings(config))
        if works:
            assert state.snapshot() == shipped
        else:
            with pytest.raises(ModelUnavailableError, match="not on this worker's machine"):
                state.snapshot()
    assert requests_for(hub, "worker/model") == []  # workers never resolve


@pytest.mark.skipif(os.name != "posix", reason="paths")
def test_worker_payload_is_plain_data(pytester: pytest.Pytester) -> None:
    """execnet can only ship plain data: snapshots as JSON strings, the progress relay's folder and mode."""
    from pytest_mlxgate.plugin import SESSION_KEY

    pytester.mkdir("m")
    config = pytester.parseconfigure("--mlx-candidate", "./m")
    state = config.stash[SESSION_KEY]
    state.snapshot("candidate")
    payload = state.worker_payload()
    assert list(payload) == ["mlxgate_snapshot", "mlxgate_progress_dir", "mlxgate_live_progress"]
    assert ResolvedSnapshot.from_json(payload["mlxgate_snapshot"]).path == str(pytester.path / "m")
    assert Path(payload["mlxgate_progress_dir"]).is_dir() and payload["mlxgate_live_progress"] is False
    assert state.worker_payload()["mlxgate_progress_dir"] == payload["mlxgate_progress_dir"]  # one relay per run
    state.pytest_sessionfinish(None)  # type: ignore[arg-type]
    assert not Path(payload["mlxgate_progress_dir"]).exists()
