"""The sandbox against hostile programs: each is really run, and each must be contained and must end.

No mocks: every test starts real processes through `run_python` and then checks the host (the
filesystem, /proc, a listening socket) for anything that got out.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from pytest_mlxgate.capability import sandbox_launcher
from pytest_mlxgate.capability.sandbox import Limits, SandboxUnavailable, isolation_available, run_python

ISOLATED = isolation_available()[0] is not None
needs_isolation = pytest.mark.skipif(not ISOLATED, reason=f"no sandbox isolation here: {isolation_available()[1]}")
FAST = Limits(wall_s=6.0, cpu_s=3)


def _marked_processes(marker: str) -> list[int]:
    """Host processes whose name (/proc/PID/comm) is `marker`: what a program left behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == marker:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _name_self(marker: str) -> str:
    """Program lines that rename the process to `marker` (inherited by its forks), for the /proc scan."""
    return f"import ctypes\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\n"


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0, reason="the netns claim is for Linux as root"
)
def test_isolation_available_reports_netns_here() -> None:
    kind, layers = isolation_available()
    assert kind == "netns", layers
    for layer in ("netns", "pidns", "ro-mounts", "tmpfs-work", "no-new-privs"):
        assert layer in layers


@needs_isolation
def test_a_passing_and_a_failing_program() -> None:
    ok = run_python("print('hello', 6 * 7)", limits=FAST)
    assert (ok.status, ok.returncode, ok.stdout) == ("passed", 0, "hello 42\n")
    assert ok.isolation.startswith(("netns", "userns", "sandbox-exec"))
    bad = run_python("import sys\nprint('before')\nsys.exit(3)", limits=FAST)
    assert (bad.status, bad.returncode, bad.stdout) == ("failed", 3, "before\n")
    raised = run_python("raise ValueError('boom')", limits=FAST)
    assert raised.status == "failed" and raised.returncode == 1 and "ValueError: boom" in raised.stderr


@needs_isolation
def test_no_network_not_even_to_a_listener_on_the_hosts_loopback() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        code = textwrap.dedent(f"""
            import socket
            for address in [("1.1.1.1", 53), ("127.0.0.1", {port})]:
                try:
                    socket.create_connection(address, timeout=3).close()
                    print("CONNECTED", address)
                except OSError as e:
                    print("blocked", address, e.errno)
            try:
                socket.getaddrinfo("example.com", 80)
                print("RESOLVED")
            except OSError:
                print("no dns")
        """)
        result = run_python(code, limits=FAST)
        assert result.status == "passed", result.stderr
        assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
        assert result.stdout.count("blocked") == 2
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing ever reached the parent's listener
            listener.accept()
    finally:
        listener.close()


@needs_isolation
@pytest.mark.parametrize(
    "bomb",
    [
        "while True:\n    os.fork()\n",
        pytest.param(
            "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", marks=pytest.mark.slow
        ),
    ],
)  # slow: it runs to the wall limit
def test_fork_bomb_ends_within_the_wall_limit_and_leaves_nothing(bomb: str) -> None:
    marker = f"mxbomb{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    result = run_python(_name_self(marker) + "import os\n" + bomb, limits=Limits(wall_s=4.0, cpu_s=3))
    assert time.monotonic() - t0 < 4.0 + 6.0
    assert result.status in ("failed", "timeout", "killed")
    assert _marked_processes(marker) == []


@needs_isolation
def test_a_daemonised_child_does_not_outlive_the_program() -> None:
    marker = f"mxdaemon{uuid.uuid4().hex[:6]}"
    code = _name_self(marker) + textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        print("parent leaves")
    """)
    result = run_python(code, limits=FAST)
    assert (result.status, result.stdout) == ("passed", "parent leaves\n")
    assert _marked_processes(marker) == []


@needs_isolation
def test_writes_outside_the_work_dir_fail_and_inside_succeed(tmp_path: Path) -> None:
    escape = Path("/tmp") / f"mlxgate-escape-{uuid.uuid4().hex}"
    mine = tmp_path / "from-sandbox"
    code = textwrap.dedent(f"""
        import os
        for target in [{str(escape)!r}, {str(mine)!r}, os.path.expanduser("~/../escape-next-to-work")]:
            try:
                open(target, "w").write("x")
                print("WROTE", target)
            except OSError as e:
                print("denied", e.errno)
        open("inside.txt", "w").write("ok")
        print(open("inside.txt").read(), os.getcwd() == os.environ["HOME"] == os.environ["TMPDIR"])
    """)
    result = run_python(code, limits=FAST)
    assert result.status == "passed", result.stderr
    assert "WROTE" not in result.stdout
    assert result.stdout.count("denied") == 3 and "ok True" in result.stdout
    assert not escape.exists() and not mine.exists()


@needs_isolation
def test_the_temp_dir_is_removed_afterwards() -> None:
    result = run_python("import os\nprint(os.getcwd())\nopen('left.txt', 'w').write('x')", limits=FAST)
    work = Path(result.stdout.strip())
    assert result.status == "passed" and work.name == "work"
    assert not work.parent.exists()


@needs_isolation
def test_endless_allocation_is_stopped_by_the_memory_limit() -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n"
    result = run_python(code, limits=Limits(wall_s=10.0, memory_mb=256))
    assert result.status in ("failed", "killed"), result
    assert result.status == "killed" or "MemoryError" in result.stderr
    assert result.seconds < 10.0


@pytest.mark.slow  # runs into a resource limit
@needs_isolation
def test_sleeping_forever_times_out_at_the_wall_limit() -> None:
    result = run_python("import time\ntime.sleep(3600)", limits=Limits(wall_s=1.5))
    assert result.status == "timeout" and result.returncode is None
    assert 1.5 <= result.seconds < 5.0
    assert "wall-clock limit" in result.stderr


@pytest.mark.slow  # runs into a resource limit
@needs_isolation
def test_an_endless_cpu_loop_is_killed_by_the_cpu_limit() -> None:
    result = run_python("while True:\n    pass\n", limits=Limits(cpu_s=1, wall_s=15.0))
    assert result.status == "killed", result
    assert result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
    assert result.seconds < 15.0  # the CPU limit, not the wall clock, ended it (slow only on a loaded machine)


@needs_isolation
def test_printing_forever_is_capped_and_ends() -> None:
    result = run_python("while True:\n    print('spam' * 50)\n", limits=Limits(wall_s=10.0, output_kb=256))
    assert result.status == "killed" and result.returncode is None
    assert result.seconds < 5.0
    assert len(result.stdout) < 8192 and "bytes cut by mlxgate" in result.stdout
    assert "more than 256 KB of output" in result.stderr


@needs_isolation
def test_no_secrets_from_the_parent_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_parent_secret_value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws_parent_secret_value")
    result = run_python("import os\nprint(sorted(os.environ.items()))", limits=FAST)
    assert result.status == "passed"
    assert "secret_value" not in result.stdout and "HF_TOKEN" not in result.stdout
    assert "'HOME'" in result.stdout  # the minimal environment is there


@needs_isolation
def test_no_privileges_inside() -> None:
    code = textwrap.dedent("""
        import os
        status = open("/proc/self/status").read()
        print("CapEff", status.split("CapEff:")[1].split()[0])
        print("NoNewPrivs", status.split("NoNewPrivs:")[1].split()[0])
        try:
            os.setuid(0) if os.getuid() else os.chroot("/")
            print("PRIVILEGED")
        except OSError:
            print("unprivileged")
    """)
    result = run_python(code, limits=FAST)
    if not sys.platform.startswith("linux"):
        pytest.skip("capabilities are a Linux notion")
    assert result.status == "passed", result.stderr
    assert "CapEff 0000000000000000" in result.stdout and "NoNewPrivs 1" in result.stdout
    assert "unprivileged" in result.stdout


def test_no_isolation_raises_unless_the_user_opts_in() -> None:
    """Where no isolation exists (here: no `unshare` on PATH) run_python refuses, and says how to opt in."""
    if not sys.platform.startswith("linux"):
        pytest.skip("simulated by hiding unshare from PATH, which is Linux-specific")
    probe = textwrap.dedent("""
        from pytest_mlxgate.capability.sandbox import SandboxUnavailable, isolation_available, run_python
        print(isolation_available())
        try:
            run_python("print(1)")
        except SandboxUnavailable as e:
            print("REFUSED:", e)
        r = run_python("print('ran anyway')", allow_unisolated=True)
        print(r.status, r.isolation, r.stdout.strip())
    """)
    env = {"PATH": "/nonexistent", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert "(None, 'no `unshare` on PATH" in done.stdout
    assert "REFUSED:" in done.stdout and "--mlx-allow-unsandboxed" in done.stdout
    assert "passed unisolated" in done.stdout and "ran anyway" in done.stdout
    assert issubclass(SandboxUnavailable, Exception)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)


# ------------------------------------------------------------------ the launcher file on its own

LAUNCHER = Path(sandbox_launcher.__file__)


def test_the_launcher_imports_only_the_standard_library() -> None:
    """It runs under `python -I -S`, where site-packages (and so pytest_mlxgate itself) may be missing."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(LAUNCHER.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{LAUNCHER.name}:{node.lineno}: a relative import"
            imported.add((node.module or "").split(".")[0])
    assert {"ctypes", "os", "resource"} <= imported
    assert imported <= set(sys.stdlib_module_names), sorted(imported - set(sys.stdlib_module_names))


def _launch(tmp_path: Path, **cfg: object) -> tuple[int, list[str]]:
    """Run the launcher by path, as the sandbox does but with no wrapper and no mounts: (its exit status,
    its report lines)."""
    report_r, report_w = os.pipe()
    config = {
        "applied": ["test"],
        "mounts": None,
        "drop": "none",
        "uid": os.getuid(),
        "gid": os.getgid(),
        "cwd": str(tmp_path),
        "env": {"PATH": "/usr/bin:/bin"},
        "rlimits": [["RLIMIT_CORE", [0, 0]]],
        "report_fd": report_w,
        **cfg,
    }
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(config)],
            pass_fds=(report_w,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            cwd=tmp_path,
        )
    finally:
        os.close(report_w)
    with os.fdopen(report_r, "rb") as report:
        return done.returncode, report.read().decode().splitlines()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher's prctl calls are Linux's")
def test_the_launcher_reports_ready_then_how_the_program_ended(tmp_path: Path) -> None:
    py = os.path.realpath(sys.executable)
    rc, lines = _launch(tmp_path, argv=[py, "-I", "-S", "-c", "import os, sys; sys.exit(3 if os.getcwd() else 0)"])
    assert rc == 0 and len(lines) == 2, lines
    assert lines[0].split()[:2] == ["ready", "test+no-new-privs"] and lines[1] == "exit 3"
    rc, lines = _launch(
        tmp_path, argv=[py, "-I", "-S", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    )
    assert rc == 0 and lines[1:] == [f"signal {int(signal.SIGKILL)}"], lines


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher's prctl calls are Linux's")
def test_the_launcher_reports_its_own_failures_with_status_125(tmp_path: Path) -> None:
    rc, lines = _launch(tmp_path, argv=[str(tmp_path / "no-such-interpreter")])
    assert rc == 0 and lines[0].startswith("ready ") and lines[1].startswith("error starting the program failed: ")
    assert lines[2:] == ["exit 125"], lines
    # A config missing a mount setting fails before any mount is attempted.
    rc, lines = _launch(tmp_path, mounts={"work": str(tmp_path / "absent"), "bind": None}, argv=["/bin/true"])
    assert rc == 125 and lines == ["error sandbox setup failed: 'work_mb'"], lines


def test_no_new_privileges_is_a_linux_layer_only() -> None:
    """macOS has no prctl: calling it there failed every start (and reported a layer that was not there)."""
    assert sandbox_launcher.can_forbid_new_privileges("linux")
    assert not sandbox_launcher.can_forbid_new_privileges("darwin")
    assert sandbox_launcher.can_forbid_new_privileges() == sys.platform.startswith("linux")
