"""Re-hash a cached snapshot, for users who suspect their cache."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .cache import RepoCache
from .environment import resolve_cache_dir
from .errors import HubOfflineError
from .hashing import algo_for_etag, hash_file
from .integrity import set_aside


@dataclass
class VerifyReport:
    """The outcome of re-hashing every file of one snapshot."""

    path: Path
    files_checked: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_snapshot(
    repo_id: str,
    *,
    revision: str = "main",
    repo_type: str = "model",
    cache_dir: str | os.PathLike[str] | None = None,
    repair: bool = False,
) -> VerifyReport:
    """Re-hash every blob a cached snapshot points to, against the hash that names it, stamps or not.

    Checks the manifest's file list when there is one (snapshots we wrote), so a missing file is
    reported too; a snapshot huggingface_hub wrote is checked file by file through its links.
    With `repair`, a corrupt blob is renamed aside (never deleted) so the next download fetches it again.
    A blob that matches gets a fresh verified stamp, so later uses need not hash it again.
    """
    cache = RepoCache(resolve_cache_dir(cache_dir), repo_id, repo_type)
    commit = cache.read_ref(revision)
    if commit is None or not cache.snapshot_dir(commit).is_dir():
        raise HubOfflineError(
            f"{repo_type} {repo_id}@{revision} is not in the cache {cache.cache_dir}; nothing to verify"
        )
    snap = cache.snapshot_dir(commit)
    report = VerifyReport(path=snap)
    manifest = cache.read_manifest(commit)
    expected = {f.path: f for f in manifest} if manifest is not None else {}
    seen: set[str] = set()
    for link in sorted(snap.rglob("*")):
        if link.is_dir() and not link.is_symlink():
            continue
        rel = link.relative_to(snap).as_posix()
        seen.add(rel)
        if not link.exists():
            report.problems.append(f"{rel}: its blob is missing")
            continue
        blob = Path(os.path.realpath(link))
        etag = blob.name
        want = expected.get(rel)
        if want is not None and want.etag != etag:
            report.problems.append(f"{rel}: links to blob {etag}, the manifest says {want.etag}")
            continue
        algo = algo_for_etag(etag)
        if algo is None:
            report.problems.append(f"{rel}: blob {etag} is not named by a hash; can't check it")
            continue
        # Every file, whatever its size or kind (LFS sha256, git sha1), is hashed: its stamp is no excuse here.
        if blob.parent == Path(os.path.realpath(cache.blobs)):
            check = cache.check_blob(etag, rehash=True)  # a match is stamped afresh, a mismatch unstamped
            actual, hashed, why = check.actual, check.hashed_bytes, check.why
        else:
            hashed, why = blob.stat().st_size, ""
            actual = hash_file(blob, algo)
        report.files_checked += 1
        report.bytes_checked += hashed
        if actual == etag:
            continue
        if actual is None:
            report.problems.append(f"{rel}: {why} ({blob})")
        else:
            report.problems.append(f"{rel}: content hashes to {actual}, not {etag} (corrupt blob {blob})")
        if repair and blob.exists():
            aside = set_aside(blob, cache.stamp_path(etag))
            report.problems[-1] += f"; moved aside to {aside.name}, the next download fetches it again"
    for rel in sorted(set(expected) - seen):
        report.problems.append(f"{rel}: missing from the snapshot")
    return report
