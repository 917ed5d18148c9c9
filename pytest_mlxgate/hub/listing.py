"""What a snapshot holds: revision → commit, then the recursive tree listing, page by page."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from ..common.commits import COMMIT_RE, GIT_SHA1_RE
from .cache import RepoFile, safe_relative_path
from .errors import HubProtocolError
from .transport import HubClient, origin, redact

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NEXT_LINK = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


def api_base(endpoint: str, repo_id: str, repo_type: str) -> str:
    return f"{endpoint}/api/{repo_type}s/{repo_id}"


def resolve_url(endpoint: str, repo_id: str, repo_type: str, commit: str, path: str) -> str:
    prefix = "" if repo_type == "model" else f"{repo_type}s/"
    return f"{endpoint}/{prefix}{repo_id}/resolve/{commit}/{quote(path)}"


def resolve_commit(client: HubClient, repo_id: str, repo_type: str, revision: str) -> str:
    """The commit sha a branch, tag or sha points to now."""
    url = f"{api_base(client.endpoint, repo_id, repo_type)}/revision/{quote(revision, safe='')}"
    doc, _ = client.get_json(url, f"looking up {repo_type} {repo_id}@{revision}")
    sha = doc.get("sha") if isinstance(doc, dict) else None
    if not isinstance(sha, str) or not COMMIT_RE.match(sha):
        raise HubProtocolError(f"{redact(url)} gave no commit sha for {repo_id}@{revision} (got {sha!r})")
    return sha


def list_files(client: HubClient, repo_id: str, repo_type: str, commit: str) -> list[RepoFile]:
    """Every file at `commit`, following the tree API's Link pagination (same origin only)."""
    url: str | None = f"{api_base(client.endpoint, repo_id, repo_type)}/tree/{commit}?recursive=true"
    files: dict[str, RepoFile] = {}
    pages = 0
    while url:
        pages += 1
        if pages > 100_000:
            raise HubProtocolError(f"the tree listing of {repo_id} never ends (over 100000 pages)")
        doc, response = client.get_json(url, f"listing {repo_type} {repo_id}@{commit[:7]}")
        if not isinstance(doc, list):
            raise HubProtocolError(f"the tree listing of {repo_id} is not a JSON list")
        for entry in doc:
            file = parse_tree_entry(entry, repo_id)
            if file is None:
                continue
            if file.path in files:
                raise HubProtocolError(f"the tree listing of {repo_id} names {file.path!r} twice")
            files[file.path] = file
        url = next_page(response.headers.get("link"), url, client.endpoint)
    return sorted(files.values(), key=lambda f: f.path)


def next_page(link: str | None, current: str, endpoint: str) -> str | None:
    if not link:
        return None
    match = _NEXT_LINK.search(link)
    if not match:
        return None
    nxt = match.group(1)
    if origin(nxt) != origin(endpoint):
        # The token goes with API requests: a listing must not send us elsewhere.
        raise HubProtocolError(f"the tree listing's next page points to another origin ({redact(nxt)})")
    if nxt == current:
        raise HubProtocolError(f"the tree listing's next page is the page itself ({redact(nxt)})")
    return nxt


def parse_tree_entry(entry: Any, repo_id: str) -> RepoFile | None:
    """A file entry → RepoFile (None for folders). The content hash of an LFS file is lfs.oid
    (sha256); its plain `oid` is the sha1 of the pointer file, not of the content."""
    if not isinstance(entry, dict) or entry.get("type") != "file":
        if isinstance(entry, dict) and entry.get("type") in ("directory", "dir"):
            return None
        raise HubProtocolError(f"the tree listing of {repo_id} holds an entry that is not a file: {entry!r:.200}")
    path = entry.get("path")
    if not isinstance(path, str):
        raise HubProtocolError(f"the tree listing of {repo_id} holds a file without a path")
    safe_relative_path(path)
    lfs = entry.get("lfs")
    if isinstance(lfs, dict):
        etag, size, algo = lfs.get("oid") or lfs.get("sha256"), lfs.get("size", entry.get("size")), "sha256"
        pattern = _HEX64
    else:
        etag, size, algo = entry.get("oid"), entry.get("size"), "git-sha1"
        pattern = GIT_SHA1_RE
    if not isinstance(etag, str) or not pattern.match(etag) or not isinstance(size, int) or size < 0:
        raise HubProtocolError(
            f"the tree listing of {repo_id} gives {path!r} an unusable hash or size ({etag!r}, {size!r})"
        )
    return RepoFile(path=path, size=size, etag=etag, algo=algo)  # type: ignore[arg-type]
