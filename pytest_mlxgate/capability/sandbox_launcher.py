"""The sandbox's launcher: the first code that runs inside the namespaces, before the program.

`sandbox._execute` runs this file by path, as `python -I -S sandbox_launcher.py CONFIG` under the
platform wrapper (`unshare ...` on Linux). It is a separate file, not part of `sandbox`, because it
runs in that other interpreter: `-I -S` drops site-packages and the script's directory from
sys.path, so `pytest_mlxgate` may not be importable there, and importing it would also pull the
package's dependencies into what should be a tiny, auditable step. Hence the rules for this file:
standard library only, nothing imported from `pytest_mlxgate` (tests/test_sandbox.py checks), and
no work at import time (the host imports it only to find its path).

What it does, in order: finish the isolation that needs code inside the namespaces (the work
tmpfs, the interpreter bind mount, the read-only remount), report "ready LAYERS PIDNS" on the
private pipe `report_fd`, fork the program with rlimits, dropped privileges (a fresh uid, or no
capabilities), no_new_privs, the work dir as cwd and a minimal environment, then stay behind as
its reaper (PID 1 on Linux) and report "exit N" or "signal N". A failure to set up or start is
reported as "error ..." and exits 125.

CONFIG is the JSON object built by `sandbox._layout` / `sandbox._execute`.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
from typing import Any

__all__ = ["can_forbid_new_privileges", "main"]

_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_SYS_MOUNT_SETATTR = 442
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 2, 4, 4096, 16384
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID = 1, 2
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_EXIT_SETUP = 125  # the launcher, not the program, failed


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("set", ctypes.c_uint64),
        ("clr", ctypes.c_uint64),
        ("prop", ctypes.c_uint64),
        ("userns", ctypes.c_uint64),
    ]


def can_forbid_new_privileges(platform: str = sys.platform) -> bool:
    """Linux has prctl(PR_SET_NO_NEW_PRIVS); macOS has no such call (sandbox-exec's profile confines
    the program there), so calling it would fail every start and report a layer that is not there."""
    return platform.startswith("linux")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, what + ": " + os.strerror(e))


def _enc(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


class _Launcher:
    """One launch: the config, the report pipe and libc."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.rep: int = cfg["report_fd"]
        os.set_inheritable(self.rep, False)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.syscall.restype = ctypes.c_long

    def say(self, line: str) -> None:
        os.write(self.rep, (line.replace("\n", " ") + "\n").encode())

    def mount(self, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None) -> None:
        _check(self.libc.mount(_enc(src), _enc(dst), _enc(fstype), ctypes.c_ulong(flags), _enc(data)), "mount " + dst)

    def mount_setattr(self, path: str, set_: int, clr: int, recursive: bool) -> None:
        attr = _MountAttr(set_, clr, 0, 0)
        rc = self.libc.syscall(
            ctypes.c_long(_SYS_MOUNT_SETATTR),
            ctypes.c_int(_AT_FDCWD),
            path.encode(),
            ctypes.c_uint(_AT_RECURSIVE if recursive else 0),
            ctypes.byref(attr),
            ctypes.c_size_t(32),
        )
        _check(0 if rc == 0 else -1, "mount_setattr " + path + " (needs Linux >= 5.12)")

    def drop_caps(self) -> None:
        for cap in range(64):
            self.libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last cap
        self.libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        hdr = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()
        _check(self.libc.capset(hdr, data), "capset")

    def setup(self) -> None:
        """Mounts (Linux), then the "ready" report; on any failure an "error" report and exit 125."""
        cfg = self.cfg
        applied = list(cfg["applied"])
        try:
            m = cfg["mounts"]
            if m:
                self.mount(
                    "tmpfs",
                    m["work"],
                    "tmpfs",
                    _MS_NOSUID | _MS_NODEV,
                    f"size={m['work_mb']:d}m,nr_inodes=8192,mode=0700,uid={cfg['uid']:d},gid={cfg['gid']:d}",
                )
                if m["bind"]:
                    self.mount(m["bind"][0], m["bind"][1], None, _MS_BIND | _MS_REC, None)
                self.mount_setattr("/", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, 0, True)  # whole tree
                self.mount_setattr(m["work"], 0, _MOUNT_ATTR_RDONLY, False)  # the work tmpfs alone writable again
                applied += ["ro-mounts", "tmpfs-work"]
            if cfg["drop"] == "uid":
                applied += [f"uid:{cfg['uid']:d}"]
            elif cfg["drop"] == "caps":
                applied += ["no-caps"]
            if can_forbid_new_privileges():
                applied += ["no-new-privs"]
            try:
                pidns = os.readlink("/proc/self/ns/pid")
            except OSError:
                pidns = "-"
            self.say("ready " + "+".join(applied) + " " + pidns)
        except Exception as e:
            self.say(f"error sandbox setup failed: {e}")
            sys.exit(_EXIT_SETUP)

    def start(self) -> int:
        """Fork; the child sets its limits and privileges and execs the program (never returns)."""
        cfg = self.cfg
        pid = os.fork()
        if pid == 0:
            try:
                for name, value in cfg["rlimits"]:
                    resource.setrlimit(getattr(resource, name), tuple(value))
                if cfg["drop"] == "uid":
                    os.setgroups([])
                    os.setgid(cfg["gid"])
                    os.setuid(cfg["uid"])
                elif cfg["drop"] == "caps":
                    self.drop_caps()
                if can_forbid_new_privileges():
                    _check(self.libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
                os.chdir(cfg["cwd"])
                os.execve(cfg["argv"][0], cfg["argv"], cfg["env"])
            except BaseException as e:
                self.say(f"error starting the program failed: {e}")
                os._exit(_EXIT_SETUP)
        return pid

    def reap(self, pid: int) -> None:
        """Wait for every child (PID 1 inherits orphans); report how the program itself ended."""
        while True:
            try:
                done, status = os.wait()
            except ChildProcessError:
                break
            if done == pid:
                self.say(
                    f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
                )
                break


def main(argv: list[str]) -> None:
    """Launch the program described by the JSON config `argv[0]`."""
    launcher = _Launcher(json.loads(argv[0]))
    launcher.setup()
    launcher.reap(launcher.start())


if __name__ == "__main__":
    main(sys.argv[1:])
