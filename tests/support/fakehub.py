"""A fake Hugging Face hub: a real HTTP/1.1 server on loopback, plus a CDN origin, with injectable faults.

Why: our downloader must be tested against real sockets (keep-alive, half-sent bodies, TCP resets,
redirects across origins), never against a mocked HTTP client. The same server is checked against the
real ``huggingface_hub`` client (see ``tests/hub/test_fakehub.py``), which proves it is faithful enough.

Two origins are started:

* the hub, ``endpoint`` = ``http://127.0.0.1:<port>``: the JSON API and ``resolve`` URLs;
* the CDN, ``cdn_endpoint`` = ``http://localhost:<port2>`` (different host *and* port, so clients see a
  different origin): serves LFS bytes at presigned-looking URLs and rejects an ``Authorization`` header.

Protocol served (``{t}`` is ``models`` or ``datasets``; resolve URLs of datasets start with ``/datasets``):

* ``GET /api/{t}/{org}/{name}[/revision/{rev}][?blobs=true]`` → ``{"id", "sha", "siblings": [...]}``
* ``GET /api/{t}/{org}/{name}/tree/{rev}[/{path}][?recursive=true][&cursor=...]`` → list of entries,
  paginated with ``Link: <absolute next url>; rel="next"`` (directories are listed too).
* ``GET|HEAD /[datasets/]{org}/{name}/resolve/{rev}/{path}`` → small files: 200/206 with the bytes;
  LFS files: 302 to ``{cdn_endpoint}/lfs/{sha256}?sig=...&expires=...``.

Errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``)
and a JSON body ``{"error": ...}``. No response is compressed (``Accept-Encoding`` is ignored) unless a
``content_encoding`` fault says so.

Faults (see :class:`Fault`) are queued per file with :meth:`FakeHub.inject` and consumed FIFO, one per
*content request*: a ``GET`` of the file's bytes on whichever origin serves them (the hub for small
files, the CDN for LFS files). ``redirect_loop`` is the exception: it is consumed by the hub's resolve
``GET`` for both kinds of file. ``HEAD`` requests never consume a fault. API faults
(:meth:`FakeHub.inject_api`) are consumed one per ``/api/`` request.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import secrets
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

__all__ = [
    "FOREVER",
    "FakeHub",
    "Fault",
    "Request",
    "content_encoding",
    "corrupt",
    "git_blob_oid",
    "ignore_range",
    "lfs_pointer",
    "range_416",
    "redirect_loop",
    "reset",
    "short_length",
    "status",
    "trickle",
    "truncate",
    "wrong_content_range",
]

#: ``times=FOREVER`` makes a fault apply to every matching request (it is never dequeued).
FOREVER: Final = -1
#: Body bytes are written in slices of this size (from a memoryview: no per-request copy of the file).
CHUNK: Final = 1 << 20
#: Files of at least this many bytes are LFS files unless ``add_repo(lfs=...)`` says otherwise.
LFS_THRESHOLD: Final = 1024
#: Query parameter marking a resolve URL that redirects to itself forever (see ``Fault.redirect_loop``).
LOOP_PARAM: Final = "_fakehub_loop"

FaultKind = Literal[
    "truncate",
    "reset",
    "status",
    "corrupt",
    "short_length",
    "ignore_range",
    "wrong_content_range",
    "trickle",
    "redirect_loop",
    "range_416",
    "content_encoding",
]
_API_KINDS: Final = frozenset({"status", "truncate", "reset", "corrupt", "short_length", "trickle"})
_HUB_SIDE_KINDS: Final = frozenset({"redirect_loop"})


def _check_times(times: int) -> int:
    if times != FOREVER and times < 1:
        raise ValueError(f"times must be >= 1 or FOREVER, got {times}")
    return times


@dataclass(frozen=True)
class Fault:
    """One injected misbehaviour, applied to ``times`` consecutive matching requests (``FOREVER``: all).

    Build them with the classmethods (or the module-level aliases of the same names):

    * ``truncate(at)``: full headers (true ``Content-Length``), then ``at`` body bytes, then a clean
      close (FIN). The client sees a premature EOF.
    * ``reset(at)``: same, but the socket is closed with ``SO_LINGER 0``: the client sees a TCP RST.
    * ``status(code, retry_after=None)``: answer ``code`` (503, 429, 500, 408...) with a JSON error body
      and, if given, the ``Retry-After`` header with that exact string. No file bytes are sent.
    * ``corrupt(offset)``: serve normally but flip (xor 0xFF) the byte at *file* offset ``offset`` if it
      falls inside the part of the file sent by this response.
    * ``short_length(n)``: ``Content-Length: n`` (less than the real length) and exactly ``n`` body bytes,
      connection kept alive: a complete-looking short response. A 206 keeps its ``Content-Range``
      claiming the full requested range (so the lie can be detected against it).
    * ``ignore_range()``: answer 200 with the whole file even when a ``Range`` was asked.
    * ``wrong_content_range(shift)``: answer 206 whose ``Content-Range`` and body both start ``shift``
      bytes away from the requested start (end shifted too; both clamped to the file). Also when no
      ``Range`` was asked (then the requested start is 0).
    * ``trickle(nbytes, every_s)``: send the body ``nbytes`` at a time, waiting ``every_s`` seconds
      between pieces; stops as soon as the client goes away or the hub is closed.
    * ``redirect_loop()``: the resolve ``GET`` answers 302 to a marked copy of its own URL, which
      answers 302 to itself forever (``GET`` and ``HEAD``), so any redirect-following client loops.
    * ``range_416()``: answer 416 (``Content-Range: bytes */<size>``) whatever was asked.
    * ``content_encoding(value)``: send ``Content-Encoding: <value>`` whatever the client accepts; for
      any value but ``identity`` or empty (either case) the body is the gzip of the file, as a server
      that compresses regardless would send it (Range is then not honoured: a 200).

    Every constructor takes ``times=N`` (default 1) or ``times=FOREVER``; ``fault.forever()`` is the
    same fault with ``times=FOREVER``. A ``FOREVER`` fault at the head of a queue hides those behind it.
    """

    kind: FaultKind
    at: int = 0
    code: int = 0
    retry_after: str | None = None
    offset: int = 0
    n: int = 0
    shift: int = 0
    nbytes: int = 0
    every_s: float = 0.0
    encoding: str = ""
    times: int = 1

    @classmethod
    def truncate(cls, at: int, *, times: int = 1) -> Fault:
        """Close cleanly after ``at`` body bytes (headers announce the full length)."""
        if at < 0:
            raise ValueError("at must be >= 0")
        return cls("truncate", at=at, times=_check_times(times))

    @classmethod
    def reset(cls, at: int, *, times: int = 1) -> Fault:
        """Send ``at`` body bytes then a TCP RST (SO_LINGER 0)."""
        if at < 0:
            raise ValueError("at must be >= 0")
        return cls("reset", at=at, times=_check_times(times))

    @classmethod
    def status(cls, code: int, retry_after: str | None = None, *, times: int = 1) -> Fault:
        """Answer with HTTP ``code`` (optionally with ``Retry-After: <retry_after>``)."""
        if not 100 <= code <= 599:
            raise ValueError(f"bad status code {code}")
        return cls("status", code=code, retry_after=retry_after, times=_check_times(times))

    @classmethod
    def corrupt(cls, offset: int, *, times: int = 1) -> Fault:
        """Flip the byte at file offset ``offset`` if this response carries it."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        return cls("corrupt", offset=offset, times=_check_times(times))

    @classmethod
    def short_length(cls, n: int, *, times: int = 1) -> Fault:
        """Announce and send only ``n`` body bytes, cleanly."""
        if n < 0:
            raise ValueError("n must be >= 0")
        return cls("short_length", n=n, times=_check_times(times))

    @classmethod
    def ignore_range(cls, *, times: int = 1) -> Fault:
        """Answer 200 with the whole file even if a Range was asked."""
        return cls("ignore_range", times=_check_times(times))

    @classmethod
    def wrong_content_range(cls, shift: int, *, times: int = 1) -> Fault:
        """Answer 206 starting ``shift`` bytes away from the requested start."""
        return cls("wrong_content_range", shift=shift, times=_check_times(times))

    @classmethod
    def trickle(cls, nbytes: int, every_s: float, *, times: int = 1) -> Fault:
        """Send ``nbytes`` at a time, sleeping ``every_s`` between pieces."""
        if nbytes < 1 or every_s < 0:
            raise ValueError("need nbytes >= 1 and every_s >= 0")
        return cls("trickle", nbytes=nbytes, every_s=every_s, times=_check_times(times))

    @classmethod
    def redirect_loop(cls, *, times: int = 1) -> Fault:
        """Make the resolve URL redirect into a self-redirect loop."""
        return cls("redirect_loop", times=_check_times(times))

    @classmethod
    def range_416(cls, *, times: int = 1) -> Fault:
        """Answer 416 Range Not Satisfiable."""
        return cls("range_416", times=_check_times(times))

    @classmethod
    def content_encoding(cls, value: str, *, times: int = 1) -> Fault:
        """Answer with ``Content-Encoding: <value>`` (and a gzip body unless it names identity)."""
        return cls("content_encoding", encoding=value, times=_check_times(times))

    def forever(self) -> Fault:
        """The same fault, applied to every matching request from now on."""
        return replace(self, times=FOREVER)


# Module-level aliases, so tests can write ``inject(repo, path, truncate(100))``.
truncate = Fault.truncate
reset = Fault.reset
status = Fault.status
corrupt = Fault.corrupt
short_length = Fault.short_length
ignore_range = Fault.ignore_range
wrong_content_range = Fault.wrong_content_range
trickle = Fault.trickle
redirect_loop = Fault.redirect_loop
range_416 = Fault.range_416
content_encoding = Fault.content_encoding


FileKey = tuple[str, str, str]  # (repo_type, repo_id, path)


@dataclass
class Request:
    """One request as the server saw it. Appended to ``FakeHub.log`` when the request *arrives*.

    Why mutable: the entry is logged before any response byte leaves, so a client that got its answer
    always finds its request in the log; ``status``/``body_bytes``/``fault`` are filled in as the response
    is produced (``body_bytes`` is exact once the server has finished the response, and never less than
    what the client has received).
    """

    origin: Literal["hub", "cdn"]
    method: str
    path: str  # as sent, including the query string
    headers: dict[str, str]  # lower-case keys
    status: int = 0  # 0 until a status line was sent
    body_bytes: int = 0  # body bytes actually written to the socket (any body, not only file content)
    file: FileKey | None = None  # set when this request served (or was meant to serve) file content
    fault: str | None = None  # kind of the injected fault applied to this request
    conn_id: int = 0  # which TCP connection carried it (to check keep-alive / closes)


def git_blob_oid(content: bytes) -> str:
    """Git's object id of a blob: sha1(b"blob <len>\\0" + content)."""
    h = hashlib.sha1(b"blob %d\0" % len(content))
    h.update(content)
    return h.hexdigest()


def lfs_pointer(sha256_hex: str, size: int) -> bytes:
    """The git-lfs pointer file text stored in git in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256_hex}\nsize {size}\n".encode()


@dataclass(frozen=True)
class _File:
    path: str
    content: bytes
    lfs: bool
    oid: str  # git oid of what git stores: the blob itself, or the LFS pointer
    sha256: str  # LFS only ("" otherwise)
    pointer_size: int  # LFS only (0 otherwise)
    listed_size: int  # the size the listing claims: len(content) unless add_repo(listed_sizes=...) says otherwise


@dataclass
class _Commit:
    sha: str
    files: dict[str, _File]
    created: float
    _tree: list[dict[str, Any]] | None = None

    def tree(self) -> list[dict[str, Any]]:
        """All entries (files and directories), sorted by path; computed once."""
        if self._tree is None:
            dirs: set[str] = set()
            for p in self.files:
                parts = p.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    dirs.add("/".join(parts[:i]))
            entries: list[dict[str, Any]] = []
            for d in dirs:
                oid = hashlib.sha1(f"tree {self.sha} {d}".encode()).hexdigest()
                entries.append({"type": "directory", "oid": oid, "size": 0, "path": d})
            for f in self.files.values():
                e: dict[str, Any] = {"type": "file", "oid": f.oid, "size": f.listed_size, "path": f.path}
                if f.lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.listed_size, "pointerSize": f.pointer_size}
                entries.append(e)
            entries.sort(key=lambda e: e["path"])
            self._tree = entries
        return self._tree


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, _Commit] = field(default_factory=dict)
    gated_token: str | None = None

    def lookup(self, rev: str) -> _Commit | None:
        """A branch name or a full commit sha of this repo."""
        sha = self.branches.get(rev, rev)
        return self.commits.get(sha)


@dataclass(frozen=True)
class _Signed:
    key: FileKey
    sha256: str


@dataclass
class _Queued:
    fault: Fault
    left: int  # applications left, or FOREVER


class _ClientGone(Exception):
    """The peer went away (or the hub is closing) while a body was being sent."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # FakeHub.close() joins handler threads itself, with a deadline
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], hub: FakeHub, origin: Literal["hub", "cdn"]) -> None:
        self.hub = hub
        self.origin: Literal["hub", "cdn"] = origin
        super().__init__(addr, _Handler)


class _Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests to the hub or CDN logic (HTTP/1.1 keep-alive)."""

    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"
    timeout = 30  # bounds a blocked send/recv; close() interrupts it sooner
    server: _Server

    # -- connection lifecycle -------------------------------------------------------------------
    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes: without NODELAY, Nagle + delayed ACK add ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.hub: FakeHub = self.server.hub
        self.conn_id = self.hub._register(self.connection)
        self.entry: Request | None = None

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.hub._unregister(self.connection)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Silence the stdlib's per-request stderr logging."""

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except OSError:  # peer reset / hub closing: just drop the connection
            self.close_connection = True

    # -- entry points ---------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch(head=True)

    def _not_allowed(self) -> None:
        self.close_connection = True  # a request body may follow; don't try to resync
        self._dispatch(head=False, allowed=False)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _dispatch(self, *, head: bool, allowed: bool = True) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.entry = self.hub._log_request(
            Request(
                origin=self.server.origin, method=self.command, path=self.path, headers=headers, conn_id=self.conn_id
            )
        )
        try:
            if not allowed:
                self._json(405, {"error": f"method {self.command} not allowed"})
            elif self.server.origin == "hub":
                self._hub(head)
            else:
                self._cdn(head)
        except _ClientGone:
            self.close_connection = True
        except OSError:
            self.close_connection = True
        finally:
            self.entry = None
            self.hub._request_done()

    # -- low-level writing ----------------------------------------------------------------------
    def send_response(self, code: int, message: str | None = None) -> None:
        if self.entry is not None:  # None for the stdlib's own errors (malformed request line...)
            self.entry.status = code
        super().send_response(code, message)

    def _send(self, data: memoryview | bytes, key: FileKey | None) -> None:
        """Write ``data`` with ``send`` (not ``sendall``) so every byte is counted exactly.

        Counts are added before each ``send`` and the unsent remainder subtracted after, so a counter is
        never below what the client has already received.
        """
        view = memoryview(data)
        sock = self.connection
        while view.nbytes:
            want = view.nbytes
            self._count(want, key)
            sent = 0
            try:
                sent = sock.send(view)
            except OSError as e:
                raise _ClientGone from e
            finally:
                if sent != want:
                    self._count(sent - want, key)
            view = view[sent:]

    def _count(self, n: int, key: FileKey | None) -> None:
        assert self.entry is not None
        self.hub._add_bytes(self.entry, n, key)

    def _client_gone(self) -> bool:
        """True when the peer has closed its side (EOF pending) or the socket is dead."""
        sock: socket.socket = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            return sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _head(self, code: int, headers: Iterable[tuple[str, str]]) -> None:
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()

    def _json(self, code: int, obj: Any, headers: Iterable[tuple[str, str]] = (), *, head: bool = False) -> None:
        body = json.dumps(obj).encode()
        hdrs = [("Content-Type", "application/json; charset=utf-8"), ("Content-Length", str(len(body))), *headers]
        self._head(code, hdrs)
        if not head:
            self._send(body, None)

    def _error(
        self,
        code: int,
        error_code: str | None,
        message: str,
        headers: Iterable[tuple[str, str]] = (),
        *,
        head: bool = False,
    ) -> None:
        hdrs = list(headers)
        if error_code is not None:
            hdrs += [("X-Error-Code", error_code), ("X-Error-Message", message)]
        self._json(code, {"error": message}, hdrs, head=head)

    def _status_fault(self, fault: Fault, *, head: bool) -> None:
        hdrs = [("Retry-After", fault.retry_after)] if fault.retry_after is not None else []
        self._json(fault.code, {"error": f"fakehub: injected HTTP {fault.code}"}, hdrs, head=head)

    # -- body serving with faults -----------------------------------------------------------------
    def _serve(
        self,
        content: bytes,
        *,
        base: list[tuple[str, str]],
        fault: Fault | None,
        head: bool,
        key: FileKey | None,
        ranges: bool,
        content_type: str = "application/octet-stream",
    ) -> None:
        """Send ``content`` (honouring Range when ``ranges``), applying ``fault``."""
        kind = fault.kind if fault is not None else None
        if fault is not None and kind == "status":
            self._status_fault(fault, head=head)
            return
        compressed = fault is not None and kind == "content_encoding" and fault.encoding.lower() not in ("", "identity")
        if compressed:
            content = gzip.compress(content, mtime=0)
        size = len(content)
        rng: tuple[int, int] | None | Literal["unsat"] = (
            _parse_range(self.headers.get("Range"), size) if ranges and not compressed else None
        )
        if kind == "range_416":
            rng = "unsat"
        elif kind == "ignore_range":
            rng = None
        elif fault is not None and kind == "wrong_content_range" and size > 0:
            a, b = rng if isinstance(rng, tuple) else (0, size - 1)
            a2 = min(max(a + fault.shift, 0), size - 1)
            rng = (a2, min(max(b + fault.shift, a2), size - 1))
        if rng == "unsat":
            self._head(416, [*base, ("Content-Range", f"bytes */{size}"), ("Content-Length", "0")])
            return
        if isinstance(rng, tuple):
            code, start, end = 206, rng[0], rng[1] + 1
        else:
            code, start, end = 200, 0, size
        length = end - start
        announced = length
        if fault is not None and kind == "short_length":
            announced = min(fault.n, length)
        hdrs = [*base, ("Content-Type", content_type), ("Content-Length", str(announced))]
        if fault is not None and kind == "content_encoding":
            hdrs.append(("Content-Encoding", fault.encoding))
        if ranges:
            hdrs.append(("Accept-Ranges", "bytes"))
        if code == 206:
            hdrs.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
        self._head(code, hdrs)
        if head:
            return

        limit = announced
        if fault is not None and kind in ("truncate", "reset"):
            limit = min(fault.at, length)
        step = fault.nbytes if fault is not None and kind == "trickle" else CHUNK
        flip = fault.offset if fault is not None and kind == "corrupt" else -1
        mv = memoryview(content)
        off, stop = start, start + limit
        while off < stop:
            nxt = min(off + step, stop)
            if off <= flip < nxt:
                self._send(mv[off:flip], key)
                self._send(bytes([content[flip] ^ 0xFF]), key)
                self._send(mv[flip + 1 : nxt], key)
            else:
                self._send(mv[off:nxt], key)
            off = nxt
            if fault is not None and kind == "trickle" and off < stop:
                if self.hub._closing.wait(fault.every_s) or self._client_gone():
                    raise _ClientGone
        if kind == "truncate":
            self.close_connection = True  # finish() then sends FIN: a premature clean EOF
        elif kind == "reset":
            self.close_connection = True
            sock = self.connection
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()  # drop the makefile() reference so close() below is the real close
                sock.close()  # linger 0 => RST instead of FIN
            except OSError:
                pass

    # -- hub origin -----------------------------------------------------------------------------
    def _hub(self, head: bool) -> None:
        parts = urlsplit(self.path)
        segs = parts.path.split("/")[1:]
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if segs and segs[0] == "api":
            self._api(segs[1:], query, parts.path, head)
            return
        repo_type = "model"
        if segs and segs[0] == "datasets":
            repo_type, segs = "dataset", segs[1:]
        if len(segs) >= 5 and segs[2] == "resolve":
            repo_id = f"{unquote(segs[0])}/{unquote(segs[1])}"
            self._resolve(repo_type, repo_id, unquote(segs[3]), unquote("/".join(segs[4:])), query, parts.path, head)
            return
        self._error(404, None, f"fakehub: no route for {parts.path}", head=head)

    def _repo_or_error(self, repo_type: str, repo_id: str, head: bool) -> _Repo | None:
        """The repo, after the gate check; None when an error response was sent instead."""
        repo = self.hub._repo(repo_type, repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found: {repo_type} {repo_id}", head=head)
            return None
        if repo.gated_token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                msg = f"Access to {repo_type} {repo_id} is restricted. You must be authenticated to access it."
                self._error(401, "GatedRepo", msg, head=head)
                return None
            if auth != f"Bearer {repo.gated_token}":
                msg = f"Access to {repo_type} {repo_id} is restricted and you are not in the authorized list."
                self._error(403, "GatedRepo", msg, head=head)
                return None
        return repo

    def _api(self, segs: list[str], query: dict[str, str], route: str, head: bool) -> None:
        fault = self.hub._take_api_fault()
        if fault is not None:
            assert self.entry is not None
            self.entry.fault = fault.kind
        if fault is not None and fault.kind == "status":
            self._status_fault(fault, head=head)
            return
        if len(segs) < 3 or segs[0] not in ("models", "datasets"):
            self._error(404, None, f"fakehub: no API route for {route}", head=head)
            return
        repo_type = segs[0][:-1]
        repo_id = f"{unquote(segs[1])}/{unquote(segs[2])}"
        rest = segs[3:]
        if rest and (rest[0] not in ("revision", "tree") or len(rest) < 2):
            self._error(404, None, f"fakehub: no API route for {route}", head=head)
            return
        repo = self._repo_or_error(repo_type, repo_id, head)
        if repo is None:
            return
        if not rest or rest[0] == "revision":  # repo info at a revision (default branch when absent)
            rev = unquote("/".join(rest[1:])) if rest else "main"
            commit = repo.lookup(rev)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
                return
            info = self.hub._info_json(repo, commit, blobs=_truthy(query.get("blobs")))
            self._serve(
                json.dumps(info).encode(),
                base=[],
                fault=fault,
                head=head,
                key=None,
                ranges=False,
                content_type="application/json; charset=utf-8",
            )
            return
        rev = unquote(rest[1])
        commit = repo.lookup(rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
            return
        sub = unquote("/".join(rest[2:])).strip("/")
        entries = _tree_listing(commit, sub, recursive=_truthy(query.get("recursive")))
        if entries is None:
            self._error(404, "EntryNotFound", f"{sub} does not exist on {rev}", head=head)
            return
        try:
            offset = _decode_cursor(query.get("cursor"))
        except ValueError:
            self._error(400, None, "fakehub: bad cursor", head=head)
            return
        page_size = self.hub.tree_page_size
        page = entries[offset : offset + page_size]
        link: list[tuple[str, str]] = []
        if offset + page_size < len(entries):
            q = {k: v for k, v in query.items() if k != "cursor"}
            q["cursor"] = _encode_cursor(offset + page_size)
            link = [("Link", f'<{self.hub.endpoint}{route}?{urlencode(q)}>; rel="next"')]
        self._serve(
            json.dumps(page).encode(),
            base=link,
            fault=fault,
            head=head,
            key=None,
            ranges=False,
            content_type="application/json; charset=utf-8",
        )

    def _resolve(
        self, repo_type: str, repo_id: str, rev: str, path: str, query: dict[str, str], route: str, head: bool
    ) -> None:
        repo = self._repo_or_error(repo_type, repo_id, head)
        if repo is None:
            return
        commit = repo.lookup(rev)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
            return
        f = commit.files.get(path)
        if f is None:
            self._error(
                404, "EntryNotFound", f"{path} does not exist on {rev}", [("X-Repo-Commit", commit.sha)], head=head
            )
            return
        key: FileKey = (repo_type, repo_id, path)
        assert self.entry is not None
        self.entry.file = key
        if LOOP_PARAM in query:  # inside a redirect loop: 302 to exactly this URL, forever
            self.entry.fault = "redirect_loop"
            self._redirect(f"{self.hub.endpoint}{self.path}", [("X-Repo-Commit", commit.sha)], head)
            return
        fault = None if head else self.hub._take_fault(key, hub_side=True, lfs=f.lfs)
        if fault is not None:
            self.entry.fault = fault.kind
        if fault is not None and fault.kind == "redirect_loop":
            self._redirect(f"{self.hub.endpoint}{route}?{LOOP_PARAM}=1", [("X-Repo-Commit", commit.sha)], head)
            return
        base = [("X-Repo-Commit", commit.sha), ("ETag", f'"{f.oid}"')]
        if f.lfs:
            location = self.hub._sign(key, f.sha256)
            base += [("X-Linked-Etag", f'"{f.sha256}"'), ("X-Linked-Size", str(len(f.content)))]
            self._redirect(location, base, head)
            return
        self._serve(f.content, base=base, fault=fault, head=head, key=key, ranges=True)

    def _redirect(self, location: str, headers: list[tuple[str, str]], head: bool) -> None:
        body = f"Found. Redirecting to {location}".encode()
        hdrs = [
            *headers,
            ("Location", location),
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
        ]
        self._head(302, hdrs)
        if not head:
            self._send(body, None)

    # -- CDN origin -----------------------------------------------------------------------------
    def _cdn(self, head: bool) -> None:
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if "authorization" in (k.lower() for k in self.headers.keys()):
            body = (
                b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidArgument</Code><Message>Only one '
                b"auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string "
                b"parameter or the Authorization header should be specified (fakehub CDN: presigned URLs must "
                b"not carry an Authorization header)</Message></Error>"
            )
            self._head(400, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            if not head:
                self._send(body, None)
            return
        segs = parts.path.split("/")[1:]
        signed = self.hub._signed(query.get("sig", ""))
        if len(segs) != 2 or segs[0] != "lfs" or signed is None or signed.sha256 != segs[1]:
            body = b"<Error><Code>AccessDenied</Code><Message>fakehub CDN: bad or missing signature</Message></Error>"
            self._head(403, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
            if not head:
                self._send(body, None)
            return
        content = self.hub._content(signed)
        assert self.entry is not None
        self.entry.file = signed.key
        fault = None if head else self.hub._take_fault(signed.key, hub_side=False, lfs=True)
        if fault is not None:
            self.entry.fault = fault.kind
        name = signed.key[2].rsplit("/", 1)[-1]
        base = [
            ("ETag", f'"{signed.sha256}"'),
            ("Content-Disposition", f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"),
            ("Cache-Control", "public, max-age=604800, immutable"),
        ]
        self._serve(content, base=base, fault=fault, head=head, key=signed.key, ranges=True)


def _truthy(v: str | None) -> bool:
    return v is not None and v.lower() in ("1", "true", "yes")


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"fakehub:{offset}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        prefix, _, num = raw.partition(":")
        if prefix != "fakehub":
            raise ValueError(cursor)
        return int(num)
    except Exception as e:
        raise ValueError(cursor) from e


def _tree_listing(commit: _Commit, sub: str, *, recursive: bool) -> list[dict[str, Any]] | None:
    """Entries under directory ``sub`` ("" = root); None if ``sub`` is not a directory."""
    entries = commit.tree()
    if sub and not any(e["type"] == "directory" and e["path"] == sub for e in entries):
        return None
    prefix = f"{sub}/" if sub else ""
    out = []
    for e in entries:
        p = e["path"]
        if not p.startswith(prefix) or p == sub:
            continue
        if not recursive and "/" in p[len(prefix) :]:
            continue
        out.append(e)
    return out


def _parse_range(value: str | None, size: int) -> tuple[int, int] | None | Literal["unsat"]:
    """``(first, last)`` inclusive, ``None`` to serve the whole file (no/invalid/multi range), or "unsat"."""
    if value is None:
        return None
    value = value.strip()
    if not value.startswith("bytes=") or "," in value:
        return None
    spec = value[len("bytes=") :].strip()
    first_s, sep, last_s = spec.partition("-")
    if not sep:
        return None
    try:
        if first_s == "":  # suffix range: the last N bytes
            n = int(last_s)
            if n <= 0:
                return None if size == 0 else "unsat"
            return None if size == 0 else (max(size - n, 0), size - 1)
        first = int(first_s)
        last = int(last_s) if last_s else None
    except ValueError:
        return None
    if first < 0 or (last is not None and last < first) or size == 0:
        return None  # invalid: RFC 9110 says ignore the Range header
    if first >= size:
        return "unsat"
    return (first, size - 1 if last is None else min(last, size - 1))


class FakeHub:
    """A fake Hugging Face hub (two loopback origins) with per-file fault queues. See the module doc."""

    def __init__(self, *, tree_page_size: int = 1000) -> None:
        if tree_page_size < 1:
            raise ValueError("tree_page_size must be >= 1")
        self.tree_page_size = tree_page_size
        self.endpoint = ""
        self.cdn_endpoint = ""
        self.log: list[Request] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._closing = threading.Event()
        self._repos: dict[tuple[str, str], _Repo] = {}
        self._blobs: dict[str, bytes] = {}  # sha256 -> content (what the CDN stores)
        self._sigs: dict[str, _Signed] = {}
        self._faults: dict[FileKey, deque[_Queued]] = {}
        self._api_faults: deque[_Queued] = deque()
        self._served: dict[FileKey, int] = {}
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conn_ids = 0
        self._commit_counter = 0
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> FakeHub:
        """Bind both origins on ephemeral loopback ports and start serving."""
        if self._servers:
            raise RuntimeError("FakeHub already started")
        self._closing.clear()
        hub = _Server(("127.0.0.1", 0), self, "hub")
        cdn = _Server(("127.0.0.1", 0), self, "cdn")
        self._servers = [hub, cdn]
        self.endpoint = f"http://127.0.0.1:{hub.server_address[1]}"
        # "localhost" resolves to 127.0.0.1 too, but is a different host string: a different origin.
        self.cdn_endpoint = f"http://localhost:{cdn.server_address[1]}"
        for srv in self._servers:
            t = threading.Thread(
                target=srv.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fakehub-{srv.origin}", daemon=True
            )
            t.start()
            self._threads.append(t)
        return self

    def close(self) -> None:
        """Stop both origins promptly, even mid-trickle: listening sockets and live connections are shut."""
        self._closing.set()
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        with self._lock:
            conns = list(self._conns.items())
        for sock, _ in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        for t in [*self._threads, *(t for _, t in conns)]:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self._servers = []
        self._threads = []

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- content --------------------------------------------------------------------------------
    def add_repo(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        repo_type: str = "model",
        branch: str = "main",
        lfs: Callable[[str, bytes], bool] | set[str] | None = None,
        gated_token: str | None = None,
        hostile_paths: bool = False,
        listed_sizes: dict[str, int] | None = None,
    ) -> str:
        """Commit ``files`` (the whole tree) to ``branch`` of ``repo_id``; returns the 40-hex commit sha.

        Calling again for the same repo makes a new commit: the branch moves, older commits stay
        resolvable by sha. ``lfs``: predicate or set of paths; default: files >= 1024 bytes are LFS.
        ``gated_token``: if given, every API/resolve request must carry ``Authorization: Bearer <it>``;
        ``None`` keeps the repo's previous gating. ``hostile_paths``: list paths as given, even
        ``../x`` or ``/abs`` — a malicious hub, for testing that clients refuse them. ``listed_sizes``:
        sizes the listings (tree and ``?blobs=true``) claim instead of the real ones, so a check made from
        the listing alone (free disk space) can be tested with a size no test could serve (10**15 bytes).
        """
        if repo_type not in ("model", "dataset"):
            raise ValueError(f"repo_type must be 'model' or 'dataset', got {repo_type!r}")
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"repo_id must be 'org/name', got {repo_id!r}")
        listed = listed_sizes or {}
        unknown = set(listed) - set(files)
        if unknown:
            raise ValueError(f"listed_sizes names files that are not in files: {sorted(unknown)}")
        built: dict[str, _File] = {}
        for path, content in files.items():
            if not hostile_paths and (
                not path
                or path.startswith("/")
                or path.endswith("/")
                or any(s in ("", ".", "..") for s in path.split("/"))
            ):
                raise ValueError(f"bad file path {path!r}")
            content = bytes(content)
            if lfs is None:
                is_lfs = len(content) >= LFS_THRESHOLD
            elif isinstance(lfs, (set, frozenset)):
                is_lfs = path in lfs
            else:
                is_lfs = bool(lfs(path, content))
            if is_lfs:
                sha = hashlib.sha256(content).hexdigest()
                pointer = lfs_pointer(sha, len(content))
                built[path] = _File(
                    path, content, True, git_blob_oid(pointer), sha, len(pointer), listed.get(path, len(content))
                )
            else:
                built[path] = _File(path, content, False, git_blob_oid(content), "", 0, listed.get(path, len(content)))
        with self._lock:
            key = (repo_type, repo_id)
            repo = self._repos.setdefault(key, _Repo(repo_type, repo_id))
            if gated_token is not None:
                repo.gated_token = gated_token
            self._commit_counter += 1
            h = hashlib.sha1(f"commit {repo_type}/{repo_id} {branch} {self._commit_counter}\n".encode())
            for p in sorted(built):
                h.update(f"{built[p].oid} {p}\n".encode())
            sha = h.hexdigest()
            repo.commits[sha] = _Commit(sha, built, time.time())
            repo.branches[branch] = sha
            for f in built.values():
                if f.lfs:
                    self._blobs[f.sha256] = f.content
        return sha

    # -- faults ---------------------------------------------------------------------------------
    def inject(self, repo_id: str, path: str, *faults: Fault, repo_type: str = "model") -> None:
        """Queue ``faults`` for ``path`` of ``repo_id`` (any commit), consumed FIFO by content GETs."""
        with self._lock:
            q = self._faults.setdefault((repo_type, repo_id, path), deque())
            q.extend(_Queued(f, f.times) for f in faults)

    def inject_api(self, *faults: Fault) -> None:
        """Queue faults for ``/api/`` requests (revision, tree), one per request, any repo."""
        bad = [f.kind for f in faults if f.kind not in _API_KINDS]
        if bad:
            raise ValueError(f"faults {bad} make no sense on API requests; use one of {sorted(_API_KINDS)}")
        with self._lock:
            self._api_faults.extend(_Queued(f, f.times) for f in faults)

    @staticmethod
    def _pop(q: deque[_Queued]) -> Fault:
        item = q[0]
        if item.left != FOREVER:
            item.left -= 1
            if item.left == 0:
                q.popleft()
        return item.fault

    def _take_fault(self, key: FileKey, *, hub_side: bool, lfs: bool) -> Fault | None:
        """Consume the head fault if this request is where it applies (see module doc)."""
        with self._lock:
            q = self._faults.get(key)
            if not q:
                return None
            is_hub_kind = q[0].fault.kind in _HUB_SIDE_KINDS
            if lfs and hub_side != is_hub_kind:
                return None
            return self._pop(q)

    def _take_api_fault(self) -> Fault | None:
        with self._lock:
            return self._pop(self._api_faults) if self._api_faults else None

    def pending_faults(self, repo_id: str | None = None, path: str | None = None) -> int:
        """How many fault applications are still queued (a FOREVER fault counts as 1)."""
        with self._lock:
            return sum(
                (1 if item.left == FOREVER else item.left)
                for (_, rid, p), q in self._faults.items()
                if (repo_id is None or rid == repo_id) and (path is None or p == path)
                for item in q
            )

    def clear_faults(self) -> None:
        """Drop every queued fault (file and API)."""
        with self._lock:
            self._faults.clear()
            self._api_faults.clear()

    # -- observation ----------------------------------------------------------------------------
    def bytes_served(self, repo_id: str | None = None, path: str | None = None) -> int:
        """File-content bytes actually written to sockets, by both origins (optionally filtered)."""
        with self._lock:
            return sum(
                n
                for (_, rid, p), n in self._served.items()
                if (repo_id is None or rid == repo_id) and (path is None or p == path)
            )

    def reset_log(self) -> None:
        """Forget the request log and the bytes_served counters (faults and repos are kept)."""
        with self._lock:
            self.log.clear()
            self._served.clear()

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is being served (e.g. after a client hung up mid-trickle)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def file_url(self, repo_id: str, path: str, *, revision: str = "main", repo_type: str = "model") -> str:
        """The hub resolve URL of a file (quoted the way huggingface_hub quotes it)."""
        prefix = "/datasets" if repo_type == "dataset" else ""
        return f"{self.endpoint}{prefix}/{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"

    # -- internals used by the handler ----------------------------------------------------------
    def _repo(self, repo_type: str, repo_id: str) -> _Repo | None:
        with self._lock:
            return self._repos.get((repo_type, repo_id))

    def _info_json(self, repo: _Repo, commit: _Commit, *, blobs: bool) -> dict[str, Any]:
        siblings: list[dict[str, Any]] = []
        for p in sorted(commit.files):
            f = commit.files[p]
            s: dict[str, Any] = {"rfilename": p}
            if blobs:
                s["size"] = f.listed_size
                s["blobId"] = f.oid
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": f.listed_size, "pointerSize": f.pointer_size}
            siblings.append(s)
        modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(commit.created))
        return {
            "_id": hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}".encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.sha,
            "lastModified": modified,
            "private": False,
            "gated": "manual" if repo.gated_token is not None else False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }

    def _sign(self, key: FileKey, sha256: str) -> str:
        sig = secrets.token_urlsafe(24)
        with self._lock:
            self._sigs[sig] = _Signed(key, sha256)
        expires = int(time.time()) + 3600
        return f"{self.cdn_endpoint}/lfs/{sha256}?sig={sig}&expires={expires}"

    def _signed(self, sig: str) -> _Signed | None:
        with self._lock:
            return self._sigs.get(sig)

    def _content(self, signed: _Signed) -> bytes:
        with self._lock:
            return self._blobs[signed.sha256]

    def _register(self, sock: socket.socket) -> int:
        with self._lock:
            self._conns[sock] = threading.current_thread()
            self._conn_ids += 1
            conn_id = self._conn_ids
        if self._closing.is_set():  # accepted while close() was running: don't let it linger
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return conn_id

    def _unregister(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.pop(sock, None)

    def _log_request(self, entry: Request) -> Request:
        with self._lock:
            self.log.append(entry)
            self._inflight += 1
        return entry

    def _request_done(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def _add_bytes(self, entry: Request, n: int, key: FileKey | None) -> None:
        with self._lock:
            entry.body_bytes += n
            if key is not None:
                self._served[key] = self._served.get(key, 0) + n
