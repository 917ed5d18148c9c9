"""A headless chromium driven over the Chrome DevTools Protocol through a pipe: standard library only.

`--remote-debugging-pipe` makes chromium read protocol messages from fd 3 and write them to fd 4, each
JSON text ending in NUL (what Puppeteer's pipe transport uses), so no websocket client and no port are
needed. `Browser.open(path)` loads a page and collects what the console and the browser log said
(console.error/warning, uncaught exceptions, CSP violations, failed loads); `evaluate` runs JavaScript
in it; `screenshot` writes a PNG of the whole page.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Browser", "ChromiumError", "Page", "find_chromium"]

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_chromium() -> str | None:
    """`MLXGATE_CHROMIUM`, else the first chromium (or Chrome) on PATH."""
    given = os.environ.get("MLXGATE_CHROMIUM")
    if given:
        return given if Path(given).is_file() else shutil.which(given)
    return next((found for name in _NAMES if (found := shutil.which(name))), None)


class ChromiumError(RuntimeError):
    pass


def _above_9(fd: int) -> int:
    """The same pipe end as a close-on-exec fd numbered 10 or more (the original closed)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


@dataclass
class Page:
    """One tab: its session id and what its console and log said since it was opened."""

    browser: Browser
    session: str
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions, and log entries of level error or warning."""
        out = []
        for m in self.messages:
            method, params = m["method"], m.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                out.append(
                    "console."
                    + params["type"]
                    + ": "
                    + " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                )
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                entry = params["entry"]
                out.append(f"log {entry.get('source')}.{entry.get('level')}: {entry.get('text')}")
        return out

    def evaluate(self, expression: str) -> Any:
        result = self.browser.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session,
        )
        if "exceptionDetails" in result:
            raise ChromiumError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path, *, width: int = 1200) -> Path:
        """The whole page as a PNG (the viewport set to the page's full height)."""

        def viewport(height: int) -> None:
            self.browser.call(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=self.session,
            )

        viewport(800)  # the width first: the page's height depends on it
        viewport(min(16000, int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))))
        data = self.browser.call(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=self.session
        )["data"]
        path.write_bytes(base64.b64decode(data))
        return path


class Browser:
    """A headless chromium process and its protocol pipe; a context manager that closes it."""

    def __init__(self, executable: str, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="mlxgate-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        to_chrome_r, from_chrome_w = _above_9(to_chrome_r), _above_9(from_chrome_w)  # so 3 and 4 cannot clash
        args = [
            executable,
            "--headless=new",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--metrics-recording-only",
            "--mute-audio",
            f"--user-data-dir={self._profile}",
            "about:blank",
        ]

        def child_fds() -> None:  # the protocol's fds: 3 reads commands, 4 writes replies and events
            os.dup2(to_chrome_r, 3)  # dup2's copies are inheritable; every other fd here is close-on-exec
            os.dup2(from_chrome_w, 4)

        self._log = open(Path(self._profile) / "stderr.log", "w+b")  # a file: a full pipe would block chromium
        # Not the tests' LD_PRELOAD (OpenBLAS for MLX): chromium's zygote children die with it preloaded.
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            preexec_fn=child_fds,
            close_fds=False,
            env=env,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                try:
                    self.call("Browser.close", {}, timeout=10)
                except (ChromiumError, OSError):
                    pass
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
        finally:
            for fd in (self._to_chrome, self._from_chrome):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._log.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    # -- the protocol ----------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        import select

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChromiumError("no answer from chromium in time")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                self._log.seek(0)
                err = self._log.read().decode(errors="replace")
                raise ChromiumError(f"chromium closed its pipe (exit {self._proc.poll()}): {err[-2000:]}")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send one command and wait for its answer; events meanwhile are kept for `Page.messages`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ChromiumError(f"{method}: {reply['error']}")
                return reply.get("result", {})  # type: ignore[no-any-return]
            if "method" in reply:
                self._events.append(reply)

    def _wait_for(self, method: str, session: str, deadline: float) -> None:
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == session:
                    del self._events[i]
                    return
            self._events.append(self._read_message(deadline))

    def open(self, path: Path, *, settle: float = 0.3) -> Page:
        """A new tab showing `path`, after its load event (and `settle` seconds for late messages)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=session)
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        self._wait_for("Page.loadEventFired", session, time.monotonic() + self.timeout)
        self.call(
            "Runtime.evaluate",
            {"expression": f"new Promise(r => setTimeout(r, {int(settle * 1000)}))", "awaitPromise": True},
            session=session,
        )
        page = Page(self, session)
        kept: list[dict[str, Any]] = []
        for event in self._events:
            (page.messages if event.get("sessionId") == session else kept).append(event)
        self._events = kept
        return page
