"""Model names: aliases, repo ids, local directories, and the errors users see."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pytest_mlxgate.config.names import (
    BUILTIN_ALIASES,
    DEFAULT_CANDIDATE,
    Aliases,
    CandidateSpec,
    check_name_syntax,
    find_pyproject,
    load_aliases,
    parse_name,
    validate_repo_id,
    validate_revision,
)
from pytest_mlxgate.errors import MlxgateUsageError, ModelNameError


@pytest.fixture
def aliases(tmp_path: Path) -> Aliases:
    return load_aliases(tmp_path / "pyproject.toml")


def parse(text: str, aliases: Aliases, base: Path) -> CandidateSpec:
    return parse_name(text, aliases=aliases, base_dir=base)


def test_builtin_aliases(aliases: Aliases, tmp_path: Path) -> None:
    assert parse("e4b", aliases, tmp_path) == CandidateSpec(
        kind="hub", name="e4b", repo_id="mlx-community/gemma-4-e4b-it-4bit"
    )
    assert parse("e2b", aliases, tmp_path).repo_id == "mlx-community/gemma-4-e2b-it-4bit"
    assert parse(DEFAULT_CANDIDATE, aliases, tmp_path).kind == "embedded"


def test_default_alias_is_the_embedded_models_own() -> None:
    from pytest_mlxgate.models.embedded import EMBEDDED_ALIAS

    assert BUILTIN_ALIASES[EMBEDDED_ALIAS] is None
    assert DEFAULT_CANDIDATE == EMBEDDED_ALIAS


def test_repo_id_with_and_without_revision(aliases: Aliases, tmp_path: Path) -> None:
    assert parse("org/model", aliases, tmp_path) == CandidateSpec(kind="hub", name="org/model", repo_id="org/model")
    spec = parse("org/model@refs/pr/3", aliases, tmp_path)
    assert (spec.repo_id, spec.revision, spec.name) == ("org/model", "refs/pr/3", "org/model@refs/pr/3")


def test_alias_with_revision_overrides_the_alias_revision(aliases: Aliases, tmp_path: Path) -> None:
    spec = parse("e4b@" + "a" * 40, aliases, tmp_path)
    assert (spec.repo_id, spec.revision) == ("mlx-community/gemma-4-e4b-it-4bit", "a" * 40)
    with pytest.raises(ModelNameError, match="no revisions"):
        parse("smollm2-135m@v1", aliases, tmp_path)


def test_unknown_alias_lists_known_ones_and_where_to_add(aliases: Aliases, tmp_path: Path) -> None:
    with pytest.raises(ModelNameError) as info:
        parse("e5x", aliases, tmp_path)
    message = str(info.value)
    assert message.startswith("'e5x' is not a known candidate; known: e2b, e4b, gemma3-270m, smollm2-135m; ")
    assert "[tool.mlxgate.aliases]" in message and str(tmp_path / "pyproject.toml") in message
    assert "org/name[@revision]" in message and "local directory" in message


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("org/na..me", "'--' and '..'"),
        ("org/na--me", "'--' and '..'"),
        ("org/-name", "starts or ends"),
        ("org/name.", "starts or ends"),
        ("org/name.git", ".git"),
        ("org/na me", "not allowed"),
        ("a/b/c", "exactly one '/'"),
        ("org/" + "x" * 97, "longer than 96"),
        ("org/", "exactly one '/'"),
    ],
)
def test_malformed_repo_ids(text: str, reason: str) -> None:
    with pytest.raises(ModelNameError, match="is not a valid repo id") as info:
        check_name_syntax(text)
    assert reason in str(info.value)


@pytest.mark.parametrize("rev", ["", "-x", "a..b", "a b", "x.lock", "a:b", "/main"])
def test_malformed_revisions(rev: str) -> None:
    with pytest.raises(ModelNameError, match="not a valid revision"):
        validate_revision(rev)
    with pytest.raises(ModelNameError):
        check_name_syntax(f"org/model@{rev}")


def test_not_an_alias_shape() -> None:
    with pytest.raises(ModelNameError, match="neither an alias"):
        check_name_syntax("e4b!")
    with pytest.raises(ModelNameError, match="must not be empty"):
        check_name_syntax("  ")


@given(
    st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=100),
    st.text(alphabet=string.ascii_letters + string.digits + "-_.", min_size=1, max_size=100),
)
@example("a", "b.git")
@example("-a", "b")
@example("a_", "_b")
@example("a", "x" * 96)
@example("a", "x" * 97)
def test_repo_id_rules_match_huggingface_hub(org: str, name: str) -> None:
    """Differential: for ASCII org/name we accept exactly what huggingface_hub accepts."""
    from huggingface_hub.utils import HFValidationError
    from huggingface_hub.utils import validate_repo_id as hf_validate

    repo_id = f"{org}/{name}"
    try:
        hf_validate(repo_id)
        theirs = True
    except HFValidationError:
        theirs = False
    try:
        validate_repo_id(repo_id)
        ours = True
    except ModelNameError:
        ours = False
    assert ours == theirs, repo_id


def test_local_directories(aliases: Aliases, tmp_path: Path) -> None:
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "e4b").mkdir()
    explicit = parse("./models/tiny", aliases, tmp_path)
    assert (explicit.kind, explicit.path) == ("local", (tmp_path / "models" / "tiny").resolve())
    # an existing relative directory is local even though it looks like a repo id
    assert parse("models/tiny", aliases, tmp_path).kind == "local"
    # an alias beats a same-named directory; ./e4b means the directory
    assert parse("e4b", aliases, tmp_path).kind == "hub"
    assert parse("./e4b", aliases, tmp_path).kind == "local"
    assert parse(str(tmp_path / "e4b"), aliases, tmp_path).path == (tmp_path / "e4b").resolve()
    with pytest.raises(ModelNameError, match="does not exist"):
        parse("./nope", aliases, tmp_path)


def test_home_relative_directory(aliases: Aliases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    assert parse("~/m", aliases, Path("/")).path == (tmp_path / "m").resolve()


def test_user_aliases_from_pyproject(tmp_path: Path) -> None:
    (tmp_path / "weights" / "mine").mkdir(parents=True)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        "[tool.mlxgate.aliases]\n"
        'mine = "weights/mine"\n'
        'pinned = "org/model@v2"\n'
        'e4b = "mlx-community/gemma-4-e4b-it-4bit@' + "b" * 40 + '"\n'
        'gone = "./not-there"\n'
    )
    aliases = load_aliases(pyproject)
    assert aliases.known() == ["e2b", "e4b", "gemma3-270m", "gone", "mine", "pinned", "smollm2-135m"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # a path in an alias is relative to the pyproject, not to where the user stands
    assert parse("mine", aliases, elsewhere).path == (tmp_path / "weights" / "mine").resolve()
    assert parse("pinned", aliases, elsewhere).revision == "v2"
    assert parse("e4b", aliases, elsewhere).revision == "b" * 40  # users may pin built-ins
    with pytest.raises(ModelNameError, match="alias 'gone' points at .* not a directory"):
        parse("gone", aliases, elsewhere)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('bad = "org/na..me"', r"\[tool.mlxgate.aliases\] bad in .*not a valid repo id"),
        ("num = 3", "must be a string"),
        ('"has/slash" = "org/model"', "an alias name uses"),
        ("aliases = 3", "must be a table"),
    ],
)
def test_bad_user_aliases(tmp_path: Path, body: str, match: str) -> None:
    pyproject = tmp_path / "pyproject.toml"
    header = "[tool.mlxgate]\n" if body.startswith("aliases") else "[tool.mlxgate.aliases]\n"
    pyproject.write_text(header + body + "\n")
    with pytest.raises(MlxgateUsageError, match=match):
        load_aliases(pyproject)


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text("[tool.mlxgate\n")
    with pytest.raises(MlxgateUsageError, match="cannot read .*pyproject.toml"):
        load_aliases(pyproject)


def test_find_pyproject_prefers_the_one_with_a_mlxgate_table(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    assert find_pyproject(inner) == inner / "pyproject.toml"  # none: where to create one
    (tmp_path / "a" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert find_pyproject(inner) == tmp_path / "a" / "pyproject.toml"
    (tmp_path / "pyproject.toml").write_text("[tool.mlxgate.aliases]\nm = 'org/m'\n")
    assert find_pyproject(inner) == tmp_path / "pyproject.toml"


def test_with_revision() -> None:
    hub = CandidateSpec(kind="hub", name="org/m", repo_id="org/m")
    assert hub.with_revision("v1").revision == "v1"
    assert hub.with_revision(None) is hub
    with pytest.raises(ModelNameError, match="contradicts"):
        hub.with_revision("v1").with_revision("v2")
    with pytest.raises(ModelNameError, match="local directory and has no revisions"):
        CandidateSpec(kind="local", name="./m", path=Path("/m")).with_revision("v1")
