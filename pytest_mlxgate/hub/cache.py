"""huggingface_hub's cache layout, written atomically.

<cache>/<models|datasets>--org--name/
    blobs/<etag>                      content, named by its hash (sha256 or git sha1)
    snapshots/<commit>/<path>         relative symlink to ../../blobs/<etag>
    refs/<revision>                   the commit a branch or tag pointed to
    .mlxgate/<commit>.json            our manifest: every file, size and etag (huggingface_hub ignores it)
    .mlxgate/verified/<etag>          the blob's verified stamp: its stat when its bytes last hashed to etag

Correctness never rests on a lock: a blob is published only verified, by os.replace. A snapshot is
complete only when every file links to its blob and each blob still holds the bytes that were verified
(its stamp vouches for an unchanged stat; anything else is hashed again: `integrity`).
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from ..common.atomic import atomic_write_bytes
from ..common.commits import COMMIT_RE
from .errors import HubUnsafePathError
from .hashing import Algo
from .integrity import BlobCheck, check_blob, set_aside

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class RepoFile:
    """One file of a snapshot: where it goes, how big it is and the hash that names its blob."""

    path: str
    size: int
    etag: str
    algo: Algo

    @property
    def is_lfs(self) -> bool:
        return self.algo == "sha256"


def repo_folder_name(repo_id: str, repo_type: str) -> str:
    return "--".join([f"{repo_type}s", *repo_id.split("/")])


def safe_relative_path(path: str) -> PurePosixPath:
    """Refuse a server-sent file name that could land outside the snapshot, before anything is written."""
    why = None
    if not path or "\x00" in path:
        why = "it is empty or holds a NUL byte"
    elif "\\" in path:
        why = "it holds a backslash"
    elif path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        why = "it is absolute"
    else:
        parts = path.split("/")
        if any(p in ("", ".", "..") for p in parts):
            why = "it has an empty, '.' or '..' component"
    if why:
        raise HubUnsafePathError(
            f"the server listed the file name {path!r}, which is unsafe ({why}): it could escape the "
            "snapshot directory, so nothing was written. Check the endpoint (HF_ENDPOINT) is a real hub."
        )
    return PurePosixPath(path)


class RepoCache:
    """One repo's folder in the cache, and the atomic operations on it."""

    def __init__(self, cache_dir: Path, repo_id: str, repo_type: str) -> None:
        self.cache_dir = cache_dir
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.root = cache_dir / repo_folder_name(repo_id, repo_type)
        self.blobs = self.root / "blobs"

    # paths ---------------------------------------------------------------------------
    def blob_path(self, etag: str) -> Path:
        return self.blobs / etag

    def snapshot_dir(self, commit: str) -> Path:
        return self.root / "snapshots" / commit

    def snapshot_file(self, commit: str, path: str) -> Path:
        rel = safe_relative_path(path)
        snap = self.snapshot_dir(commit)
        target = snap.joinpath(*rel.parts)
        # Belt and braces: an existing symlinked folder inside the snapshot must not lead out of it.
        if not _is_within(target.parent, snap):
            raise HubUnsafePathError(f"{path!r} resolves outside the snapshot {snap}; nothing was written")
        return target

    def lock_path(self, etag: str) -> Path:
        # The same place huggingface_hub locks, so its processes and ours exclude each other.
        return self.cache_dir / ".locks" / self.root.name / f"{etag}.lock"

    def manifest_path(self, commit: str) -> Path:
        return self.root / ".mlxgate" / f"{commit}.json"

    def stamp_path(self, etag: str) -> Path:
        return self.root / ".mlxgate" / "verified" / etag

    # blobs ---------------------------------------------------------------------------
    def check_blob(self, etag: str, size: int | None = None, *, rehash: bool = False) -> BlobCheck:
        """Whether blobs/<etag> holds the bytes named etag: its stamp vouches for it, else it is hashed."""
        return check_blob(self.blob_path(etag), self.stamp_path(etag), etag, size=size, rehash=rehash)

    def set_aside(self, etag: str) -> Path:
        """Move a damaged blob aside (kept, never deleted) so the next fetch writes it afresh."""
        return set_aside(self.blob_path(etag), self.stamp_path(etag))

    # refs ----------------------------------------------------------------------------
    def read_ref(self, revision: str) -> str | None:
        if COMMIT_RE.match(revision):
            return revision
        try:
            rel = safe_relative_path(revision)
        except HubUnsafePathError:
            return None
        try:
            commit = (self.root / "refs").joinpath(*rel.parts).read_text().strip()
        except OSError:
            return None
        return commit if COMMIT_RE.match(commit) else None

    def write_ref(self, revision: str, commit: str) -> None:
        if revision == commit:
            return
        rel = safe_relative_path(revision)
        ref = (self.root / "refs").joinpath(*rel.parts)
        ref.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(ref, commit.encode())

    # snapshots -----------------------------------------------------------------------
    def link(self, commit: str, file: RepoFile) -> None:
        """Point snapshots/<commit>/<path> at its blob with a relative symlink, atomically."""
        dest = self.snapshot_file(commit, file.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.blob_path(file.etag), dest.parent)
        try:
            if os.readlink(dest) == target:
                return
        except OSError:
            pass
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.tmp")
        os.symlink(target, tmp)
        os.replace(tmp, dest)

    def write_manifest(self, commit: str, files: list[RepoFile]) -> None:
        doc = {
            "version": MANIFEST_VERSION,
            "repo_id": self.repo_id,
            "repo_type": self.repo_type,
            "commit": commit,
            "files": [asdict(f) for f in sorted(files, key=lambda f: f.path)],
        }
        path = self.manifest_path(commit)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(doc, indent=1, sort_keys=True).encode())

    def read_manifest(self, commit: str) -> list[RepoFile] | None:
        try:
            doc = json.loads(self.manifest_path(commit).read_text())
            return [RepoFile(**entry) for entry in doc["files"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def complete_snapshot(self, commit: str) -> Path | None:
        """The snapshot's folder if our manifest lists it and every file is its verified blob, unchanged."""
        files = self.read_manifest(commit)
        if files is None or self.snapshot_problems(commit, files):
            return None
        return self.snapshot_dir(commit)

    def snapshot_problems(self, commit: str, files: list[RepoFile]) -> dict[str, BlobCheck]:
        """Each file (by path) that is not the verified blob its manifest entry names, and why."""
        problems = {}
        for f in files:
            check = self.file_check(commit, f)
            if not check.ok:
                problems[f.path] = check
        return problems

    def file_check(self, commit: str, file: RepoFile) -> BlobCheck:
        """What snapshots/<commit>/<path> reads: the blob named by its etag, holding the verified bytes?"""
        link = self.snapshot_file(commit, file.path)
        blob = self.blob_path(file.etag)
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            return BlobCheck(file.etag, "missing", why="it is missing from the snapshot")
        except OSError:  # not a link
            target = None
        # The relative target `link` writes (huggingface_hub writes the same); else compare where both lead.
        if target != os.path.relpath(blob, link.parent) and os.path.realpath(link) != os.path.realpath(blob):
            if not link.exists():
                return BlobCheck(file.etag, "missing", why="its link leads nowhere")
            # An editor or `sed -i` replaces the link with a file of its own; a link to another blob is no better.
            return BlobCheck(
                file.etag,
                "replaced",
                why=f"it is no longer a link to its verified blob {file.etag}: another file took its place",
            )
        return self.check_blob(file.etag, file.size)

    def missing_files(self, commit: str, files: list[RepoFile]) -> list[str]:
        """Files whose link or blob is absent or of the wrong size: what makes a snapshot incomplete."""
        missing = []
        for f in files:
            link = self.snapshot_file(commit, f.path)
            try:
                ok = link.stat().st_size == f.size  # follows the symlink to the blob
            except OSError:
                ok = False
            if not ok:
                missing.append(f.path)
        return missing


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True
