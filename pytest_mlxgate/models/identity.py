"""What identifies a loaded model for a cached reference arm: its snapshot, tokenizer and dtype.

Both reference caches (KL distributions, capability outputs) key on this, so a new commit, a
retokenized vocabulary or another dtype is a miss in both.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .loaded import LoadedModel

__all__ = ["model_fingerprint", "model_identity", "tokenizer_fingerprint"]

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def model_fingerprint(path: Path, commit: str, repo_id: str | None) -> str:
    """`repo@commit` for a verified snapshot; for a local directory, its files' names, sizes, mtimes."""
    if repo_id is not None and commit != "local":
        return f"{repo_id}@{commit}"
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        st = f.stat()
        digest.update(f"{f.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"local:{path}:{digest.hexdigest()[:32]}"


def tokenizer_fingerprint(path: Path) -> str:
    """sha256 over the tokenizer files' content (they decide the ids; cheap: a few MB at most)."""
    digest = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        f = path / name
        if f.is_file():
            digest.update(name.encode() + b"\0")
            with open(f, "rb") as fh:
                digest.update(hashlib.file_digest(fh, "sha256").digest())
    return digest.hexdigest()


def model_identity(model: LoadedModel) -> dict[str, str]:
    """{"model", "tokenizer", "dtype"}: the model part of a reference cache's key."""
    snap = model.snapshot
    return {
        "model": model_fingerprint(snap.dir, snap.commit, snap.repo_id),
        "tokenizer": tokenizer_fingerprint(snap.dir),
        "dtype": model.dtype,
    }
