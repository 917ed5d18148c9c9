"""Run model-written Python where it cannot reach the network, the machine's files, or outlive its budget.

HumanEval executes whatever the model wrote. One bad (or adversarial) completion must not be able to
phone home, delete files, fork-bomb the host or hang the suite, so every program goes through
`run_python`, which refuses (`SandboxUnavailable`) unless real isolation exists or the user opted out.

Layers, outermost first (the result's `isolation` names the ones actually applied):

Linux (`unshare`, as root or via an unprivileged user namespace):
* new network namespace: only a loopback, left down; no route anywhere, not even to the host's 127.0.0.1;
* new PID namespace (plus IPC and UTS): a small launcher is PID 1 there; when it exits or is killed,
  the kernel kills every process in the namespace, so forks, daemons and `setsid` cannot survive;
* new mount namespace: the whole tree is re-marked read-only and nosuid (mount_setattr, Linux >= 5.12);
  the only writable place is a size-capped tmpfs mounted over the work dir (cwd, HOME, TMPDIR),
  which vanishes with the namespace;
* as root: the program runs as a fresh, otherwise unused uid/gid (no supplementary groups) with
  no capabilities and no_new_privs, so it cannot remount, cannot read root-only files (/root, 0600
  secrets), cannot signal other sandboxes, and RLIMIT_NPROC applies to it alone. The interpreter's
  prefix is bind-mounted into the sandbox so a Python under /root stays reachable. Unprivileged
  (user namespace): it keeps the caller's uid with every capability dropped.

macOS: `sandbox-exec` with a profile denying all network and every file write outside the work dir.

Everywhere: a separate `python -I -S` (no site-packages, no PYTHON* variables, no user site), a
minimal environment (PATH, HOME, TMPDIR, locale: no tokens or other secrets), rlimits (CPU seconds,
address space, processes, file size, open files, no core dumps), a new session, a wall-clock timeout
that kills the session (and on Linux the PID namespace), output read through a cap that kills the
program when exceeded, and the temp dir removed afterwards.

Not contained: reading world-readable files (it cannot send them anywhere but its own stdout, which
comes back truncated), CPU/memory pressure on the host within the limits, and kernel exploits.
Without isolation (`allow_unisolated=True`) only the rlimits, the temp cwd, the minimal environment
and the session kill apply: such a program has the caller's network and filesystem rights.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import MlxgateError
from . import sandbox_launcher

__all__ = [
    "Limits",
    "SandboxResult",
    "SandboxUnavailable",
    "isolation_available",
    "run_python",
]

Status = Literal["passed", "failed", "timeout", "killed", "error"]

_KEEP_HEAD = 1024  # bytes of each stream kept from its start ...
_KEEP_TAIL = 3072  # ... and from its end (tracebacks end there)
_SANDBOX_UID_BASE = 0x6D6C0000  # fresh uids for sandboxes run as root ("ml" prefix, far above real users)
_OPT_IN = "--mlx-allow-unsandboxed"
# util-linux unshare, when its child dies of SIGKILL (our timeout kill), tries to re-raise it and says so.
_UNSHARE_NOISE = "unshare: sigprocmask unblock failed: Invalid argument\n"


class SandboxUnavailable(MlxgateError):
    """No isolation for model-written code on this machine and the user did not opt out."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed program (rlimits apply to each of its processes)."""

    cpu_s: int = 10  # RLIMIT_CPU: SIGXCPU at this, SIGKILL a second later
    wall_s: float = 15.0  # wall clock from start to kill of the whole tree
    memory_mb: int = 1024  # RLIMIT_AS
    processes: int = 64  # RLIMIT_NPROC (per uid; not enforced for root, hence the PID namespace)
    file_mb: int = 16  # RLIMIT_FSIZE; the Linux work tmpfs holds 4x this
    open_files: int = 64  # RLIMIT_NOFILE
    output_kb: int = 1024  # stdout+stderr beyond this: the program is killed (status "killed")

    def __post_init__(self) -> None:
        for name in ("cpu_s", "wall_s", "memory_mb", "processes", "file_mb", "open_files", "output_kb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be positive, not {getattr(self, name)!r}")


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended. stdout/stderr keep about 4 KB each (head and tail)."""

    # passed: exit 0; failed: exit != 0; timeout: wall limit; killed: signal or output cap; error: sandbox setup
    status: Status
    returncode: int | None  # exit status, -signal, or None when mlxgate killed it (timeout, output cap) or setup failed
    stdout: str
    stderr: str
    seconds: float
    isolation: (
        str  # the layers applied, e.g. "netns+pidns+ipcns+utsns+ro-mounts+tmpfs-work+uid:1836843123+no-new-privs"
    )


# ------------------------------------------------------------------ the launcher (runs inside the sandbox)

# Stdlib only, run by path as `python -I -S sandbox_launcher.py CONFIG` (see that module for why it is
# a separate file). It finishes the isolation that needs code inside the namespaces (mounts), reports
# on a private pipe, forks the program with rlimits and dropped privileges, and stays behind as its
# reaper (PID 1 on Linux) to report how it ended. Absolute, as the wrapper runs in the temp dir.
_LAUNCHER = os.path.abspath(sandbox_launcher.__file__)


# ------------------------------------------------------------------ platform plans


@dataclass(frozen=True)
class _Plan:
    """How to wrap the launcher on this platform, and which layers that gives."""

    wrapper: tuple[str, ...]  # argv before `python -I -S LAUNCHER`; "{profile}" is replaced on macOS
    applied: tuple[str, ...]  # layers the wrapper itself provides
    mounts: bool = False  # Linux mount namespace: read-only tree, tmpfs work dir
    drop: Literal["uid", "caps", "none"] = "none"
    kind: str | None = None  # what isolation_available reports


def _linux_plans() -> list[_Plan]:
    """Candidate Linux plans, strongest first: unshare as root, else in an unprivileged user namespace."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    common = ("--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts")
    layers = ("netns", "pidns", "ipcns", "utsns")
    plans = []
    if os.geteuid() == 0:
        plans.append(_Plan((unshare, *common), layers, mounts=True, drop="uid", kind="netns"))
    plans.append(
        _Plan(
            (unshare, "--user", "--map-root-user", *common), ("userns", *layers), mounts=True, drop="caps", kind="netns"
        )
    )
    return plans


def _macos_profile(work: str) -> str:
    """The sandbox-exec (SBPL) profile: no network at all, no file writes outside `work` (a realpath)."""
    quoted = work.replace("\\", "\\\\").replace('"', '\\"')
    return "\n".join(
        [
            "(version 1)",
            "(allow default)",
            "(deny network*)",
            "(deny file-write*)",
            "(allow file-write*",
            f'    (subpath "{quoted}")',
            '    (literal "/dev/null")',
            '    (literal "/dev/zero"))',
            "",
        ]
    )


def _macos_plans() -> list[_Plan]:
    """sandbox-exec when present (deprecated by Apple but shipped and working through macOS 15)."""
    if sys.platform != "darwin" or not os.path.exists("/usr/bin/sandbox-exec"):
        return []
    return [_Plan(("/usr/bin/sandbox-exec", "-p", "{profile}"), ("sandbox-exec",), kind="sandbox-exec")]


_UNISOLATED = _Plan((), ("unisolated",))
_probe_lock = threading.Lock()
_probed: tuple[_Plan | None, str] | None = None


def _probe() -> tuple[_Plan | None, str]:
    """The first plan that really runs a program here (probed once per process), or why none does."""
    global _probed
    with _probe_lock:
        if _probed is None:
            candidates = _linux_plans() if sys.platform.startswith("linux") else _macos_plans()
            why = []
            for plan in candidates:
                result = _execute("print('sandbox-ok')", Limits(wall_s=20.0), plan)
                if result.status == "passed" and result.stdout.strip() == "sandbox-ok":
                    _probed = (plan, result.isolation)
                    break
                why.append(f"{' '.join(plan.wrapper[:3])} ...: {result.status}: {result.stderr.strip()[-300:]}")
            else:
                if not candidates:
                    why.append(
                        "no `unshare` on PATH (util-linux)"
                        if sys.platform.startswith("linux")
                        else f"no isolation tool for platform {sys.platform!r} (macOS: /usr/bin/sandbox-exec)"
                    )
                _probed = (None, "; ".join(why))
        return _probed


def isolation_available() -> tuple[str | None, str]:
    """("netns" or "sandbox-exec", the layers a probe program got), or (None, why nothing works here)."""
    plan, reason = _probe()
    return (plan.kind if plan else None), reason


# ------------------------------------------------------------------ running one program


class _Capped:
    """One output stream: the first and last few KB kept, the total counted."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = _KEEP_HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        del self.tail[:-_KEEP_TAIL]

    def text(self) -> str:
        kept = len(self.head) + len(self.tail)
        middle = f"\n[... {self.total - kept} bytes cut by mlxgate ...]\n" if self.total > kept else ""
        return bytes(self.head).decode(errors="replace") + middle + bytes(self.tail).decode(errors="replace")


def _interpreter() -> tuple[str, str]:
    """(the real interpreter binary, its installation prefix): a venv's python is a symlink to it."""
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


def _rlimits(limits: Limits) -> list[tuple[str, tuple[int, int]]]:
    """The child's rlimits (soft, hard); CPU gets a 1 s grace between SIGXCPU and SIGKILL."""
    mb = 1024 * 1024
    return [
        ("RLIMIT_CPU", (limits.cpu_s, limits.cpu_s + 1)),
        ("RLIMIT_AS", (limits.memory_mb * mb, limits.memory_mb * mb)),
        ("RLIMIT_NPROC", (limits.processes, limits.processes)),
        ("RLIMIT_FSIZE", (limits.file_mb * mb, limits.file_mb * mb)),
        ("RLIMIT_NOFILE", (limits.open_files, limits.open_files)),
        ("RLIMIT_CORE", (0, 0)),
    ]


def _layout(root: Path, code: str, plan: _Plan) -> dict[str, Any]:
    """Files and directories of one run under `root` (program, work dir, interpreter view); the launcher config."""
    work = root / "work"
    work.mkdir()
    program = root / "main.py"
    program.write_text(code, encoding="utf-8")
    program.chmod(0o644)
    root.chmod(0o755)
    exe, prefix = _interpreter()
    uid = gid = 0 if plan.drop == "caps" else os.getuid()  # "caps": inside a user namespace, mapped to root
    bind = None
    if plan.drop == "uid":
        uid = gid = _SANDBOX_UID_BASE + secrets.randbelow(0x10000)
        os.chown(work, uid, gid)
        if exe.startswith(prefix + os.sep):  # an interpreter under /root: reachable through a bind mount
            (root / "py").mkdir(mode=0o755)
            bind = [prefix, str(root / "py")]
            exe = str(root / "py" / os.path.relpath(exe, prefix))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    if bind:
        env["LD_LIBRARY_PATH"] = str(root / "py" / "lib")  # libpython's RUNPATH points under /root
    argv = [exe, "-I", "-S", "-B", "-X", "utf8", str(program)]
    return {
        "applied": list(plan.applied),
        "drop": plan.drop,
        "uid": uid,
        "gid": gid,
        "cwd": str(work),
        "env": env,
        "argv": argv,
        "mounts": {"work": str(work), "bind": bind} if plan.mounts else None,
    }


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; empty elsewhere or once it is gone)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _sweep_pidns(pidns: str | None) -> None:
    """SIGKILL whatever is still in the sandbox's PID namespace (visible to root; never our own namespace)."""
    if not pidns or pidns == os.readlink("/proc/self/ns/pid"):
        return
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "pid") == pidns:
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass


def _kill_tree(proc: subprocess.Popen[bytes], pidns: str | None) -> None:
    """Kill the program and everything it started, and return once they are gone.

    On Linux the launcher under `unshare` is PID 1 of the sandbox: killing it makes the kernel kill the
    whole namespace, and `unshare` exits only after that teardown, so waiting for it means nothing is
    left. The session kill and the namespace sweep catch whatever that missed (and everything of an
    unisolated run, which has only its session).
    """
    for child in _children(proc.pid):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass
    if proc.returncode is None or pidns is None:  # an exited unshare leaves an empty namespace
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _sweep_pidns(pidns)


def _execute(code: str, limits: Limits, plan: _Plan) -> SandboxResult:
    """One program through `plan`: lay out the temp dir, start, drain with caps, kill, clean up."""
    root = Path(tempfile.mkdtemp(prefix="mlxgate-sandbox-"))
    try:
        cfg = _layout(root, code, plan)
        if cfg["mounts"]:
            cfg["mounts"]["work_mb"] = limits.file_mb * 4
        cfg["rlimits"] = _rlimits(limits)
        profile = _macos_profile(os.path.realpath(root / "work"))
        wrapper = [profile if a == "{profile}" else a for a in plan.wrapper]
        report_r, report_w = os.pipe()
        cfg["report_fd"] = report_w
        launcher = [_interpreter()[0], "-I", "-S", _LAUNCHER, json.dumps(cfg)]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                wrapper + launcher,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(report_w,),
                start_new_session=True,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                cwd=root,
            )
        except OSError as e:
            os.close(report_r)
            return SandboxResult(
                "error",
                None,
                "",
                f"mlxgate sandbox: could not start {wrapper[:1] or launcher[:1]}: {e}",
                0.0,
                "+".join(plan.applied),
            )
        finally:
            os.close(report_w)
        out, err, report, ended = _drain(proc, report_r, start + limits.wall_s, limits.output_kb * 1024)
        return _verdict(report, ended, proc.returncode, out, err, time.monotonic() - start, plan, limits)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _reported_pidns(report: bytes | bytearray) -> str | None:
    """The PID namespace the launcher reported being PID 1 of ("ready LAYERS pid:[N]"), if it has yet."""
    for line in report.decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ready" and parts[2].startswith("pid:["):
            return parts[2]
    return None


def _drain(
    proc: subprocess.Popen[bytes], report_r: int, deadline: float, cap: int
) -> tuple[_Capped, _Capped, str, str]:
    """Read stdout, stderr and the launcher's report until all close; kill at the deadline or the cap.

    Whatever happens, the session and the PID namespace are swept before returning, so nothing the
    program started outlives the call. Returns (stdout, stderr, report, "exited"|"timeout"|"output").
    """
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Capped(), _Capped()
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    report = bytearray()
    ended = "exited"
    sel = selectors.DefaultSelector()
    for fd in (*streams, report_r):
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    open_fds = {*streams, report_r}
    grace_until: float | None = None  # after a kill: drain what is left, briefly
    while open_fds:
        now = time.monotonic()
        if grace_until is None and now >= deadline:
            ended = "timeout"
        if grace_until is None and ended != "exited":
            _kill_tree(proc, _reported_pidns(report))
            grace_until = now + 2.0
        if grace_until is not None and now >= grace_until:
            break
        limit = (grace_until if grace_until is not None else deadline) - now
        for key, _ in sel.select(timeout=max(0.0, min(limit, 0.5))):
            fd = int(key.fd)
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(fd)
                open_fds.discard(fd)
            elif fd == report_r:
                report += chunk[: max(0, 4096 - len(report))]
            else:
                streams[fd].add(chunk)
                if grace_until is None and out.total + err.total > cap:
                    ended = "output"
    sel.close()
    os.close(report_r)
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()) if ended == "exited" else 2.0)
    except subprocess.TimeoutExpired:
        ended = "timeout" if ended == "exited" else ended
        _kill_tree(proc, _reported_pidns(report))
    proc.wait()
    if _reported_pidns(report) is None:  # no PID namespace (macOS, unisolated): its session may hold stragglers
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    _sweep_pidns(_reported_pidns(report))  # isolated: empty already (unshare outlives its namespace)
    proc.stdout.close()
    proc.stderr.close()
    return out, err, report.decode(errors="replace"), ended


def _verdict(
    report: str,
    ended: str,
    wrapper_rc: int | None,
    out: _Capped,
    err: _Capped,
    seconds: float,
    plan: _Plan,
    limits: Limits,
) -> SandboxResult:
    """Map the launcher's report and how the run ended onto a SandboxResult."""
    lines = report.splitlines()
    ready = next((line.split()[1] for line in lines if line.startswith("ready ") and len(line.split()) > 1), None)
    isolation = ready or "+".join(plan.applied)
    stdout, stderr = out.text(), err.text().replace(_UNSHARE_NOISE, "")
    errors = [line[6:] for line in lines if line.startswith("error ")]
    if errors or ready is None:
        why = errors[0] if errors else f"the sandbox launcher ended (status {wrapper_rc}) before reporting"
        return SandboxResult("error", None, stdout, f"mlxgate sandbox: {why}\n{stderr}", seconds, isolation)
    if ended == "timeout":
        return SandboxResult(
            "timeout",
            None,
            stdout,
            stderr + f"\nmlxgate sandbox: killed after the {limits.wall_s:g} s wall-clock limit",
            seconds,
            isolation,
        )
    if ended == "output":
        return SandboxResult(
            "killed",
            None,
            stdout,
            stderr + f"\nmlxgate sandbox: killed for writing more than {limits.output_kb} KB of output",
            seconds,
            isolation,
        )
    final = next((line for line in reversed(lines) if line.startswith(("exit ", "signal "))), None)
    if final is None:
        return SandboxResult(
            "error",
            wrapper_rc,
            stdout,
            stderr + "\nmlxgate sandbox: the launcher did not report how the program ended",
            seconds,
            isolation,
        )
    number = int(final.split()[1])
    if final.startswith("signal "):
        return SandboxResult("killed", -number, stdout, stderr, seconds, isolation)
    return SandboxResult("passed" if number == 0 else "failed", number, stdout, stderr, seconds, isolation)


def run_python(code: str, *, limits: Limits = Limits(), allow_unisolated: bool = False) -> SandboxResult:
    """Run `code` as a fresh `python -I -S` program inside the best isolation this machine has.

    Raises SandboxUnavailable when there is none and `allow_unisolated` is False.
    """
    plan, reason = _probe()
    if plan is None:
        if not allow_unisolated:
            raise SandboxUnavailable(
                f"model-written code cannot be run in isolation here: {reason}. Without isolation it would run "
                "with this machine's network and files. Fix: run where `unshare --net` works (as root, or with "
                "unprivileged user namespaces enabled: sysctl user.max_user_namespaces > 0, "
                "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu), or on macOS with /usr/bin/sandbox-exec; "
                f"or accept running it with only rlimits and a temp dir via {_OPT_IN} (only for models you trust)."
            )
        plan = _UNISOLATED
    return _execute(code, limits, plan)
