"""Secret redaction: a secret placed anywhere `redact` promises to find it never survives, text without
one comes back unchanged, redacting twice is redacting once; argv keeps its shape; RunInfo stores no secret."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pytest_mlxgate.common.redact import MASK, redact, redact_argv, redact_data

# A secret is upper case and digits, 6+ long: the text around it (lower case, no digits) and the templates
# below can never spell it, so "the secret is not in the output" means exactly "it was redacted".
secrets = st.text(string.ascii_uppercase + string.digits, min_size=6, max_size=40)
# A password may hold what a URL parser allows there, '@' and ':' included (urlsplit splits at the last '@'):
# each of its parts must go, not just the whole.
separators = st.sampled_from(["", "@", ":", "%40", "!", "$", ";", ",", "@@"])
words = st.text(string.ascii_lowercase + " .,:()[]'\"-", max_size=30)
schemes = st.sampled_from(["http", "https", "ws", "git+https", "s3"])
hosts = st.sampled_from(["127.0.0.1:8080", "localhost", "hub.example.org", "proxy.internal:3128", "[::1]:9"])
paths = st.sampled_from(["", "/", "/api/models/org/name", "/org/name/resolve/main/model.safetensors"])
secret_params = st.sampled_from(
    [
        "token",
        "access_token",
        "key",
        "api_key",
        "apikey",
        "password",
        "secret",
        "sig",
        "signature",
        "X-Amz-Signature",
        "X-Amz-Credential",
        "hf_token",
        "client-secret",
    ]
)
benign_params = st.sampled_from(
    [
        "revision",
        "recursive",
        "cursor",
        "expires",
        "blobs",
        "tokens",
        "monkey",
        "keyboard",
        "passage",
        "signed",
        "authors",
    ]
)


@st.composite
def secret_in_context(draw: st.DrawFn) -> tuple[str, list[str]]:
    """(text, secrets): the secret somewhere `redact` must find it, in words on both sides."""
    kind = draw(st.sampled_from(["userinfo", "username", "param", "hf", "bearer", "authorization", "headers"]))
    if kind in ("userinfo", "username"):
        head, sep, tail = draw(secrets), draw(separators), draw(secrets)
        cred = f"user:{head}{sep}{tail}" if kind == "userinfo" else f"{head}{sep}{tail}"
        core = f"{draw(schemes)}://{cred}@{draw(hosts)}{draw(paths)}"
        return f"{draw(words)} {core} {draw(words)}", [head, tail]
    elif kind == "param":
        secret = draw(secrets)
        before = draw(st.lists(benign_params, max_size=2))
        query = "&".join([*(f"{p}=main" for p in before), f"{draw(secret_params)}={secret}", "expires=9"])
        core = f"{draw(schemes)}://{draw(hosts)}{draw(paths)}?{query}"
    elif kind == "hf":
        secret = draw(st.text(string.ascii_uppercase + string.digits, min_size=20, max_size=40))
        core = f"hf_{secret}"
    elif kind == "bearer":
        secret = draw(secrets)
        core = f"Bearer {secret}"
    elif kind == "authorization":
        secret = draw(secrets)
        core = f"Authorization: {draw(st.sampled_from(['Bearer ', 'Basic ', 'token ', '']))}{secret}"
    else:
        secret = draw(secrets)
        core = f"{{'accept': 'application/json', 'authorization': 'Bearer {secret}'}}"
    return f"{draw(words)} {core} {draw(words)}", [secret]


@given(secret_in_context())
def test_a_secret_never_survives(case: tuple[str, list[str]]) -> None:
    text, secret = case
    out = redact(text)
    assert not [s for s in secret if s in out], (text, out)
    assert MASK in out


@given(secret_in_context(), secret_in_context())
def test_two_secrets_in_one_text_both_go(a: tuple[str, list[str]], b: tuple[str, list[str]]) -> None:
    out = redact(f"{a[0]} then {b[0]}")
    assert not [s for s in a[1] + b[1] if s in out], out


@st.composite
def benign_text(draw: st.DrawFn) -> str:
    """Messages, URLs and arguments that hold no secret: hosts, paths, harmless query parameters."""
    pieces = draw(
        st.lists(
            st.one_of(
                st.text(string.ascii_letters + string.digits + " .,:;/-()[]#?&'\"", max_size=40),
                st.builds(
                    lambda s, h, p, q: f"{s}://{h}{p}?{q}=main&recursive=true", schemes, hosts, paths, benign_params
                ),
                st.sampled_from(
                    [
                        "--mlx-kl-tokens=256",
                        "--mlx-report=/tmp/r.json",
                        "--mlx-endpoint=https://huggingface.co",
                        "test_gate.py::test_drift[a=b]",
                        "git@github.com:org/repo.git",
                        "user@example.org",
                        "http://host/path@v2",
                        "3 tokens=12",
                        "hf_short",
                        "the token was rejected",
                        "no token was sent",
                        "mailto:a@b.org",
                        "--mlx-cand-value=8bit",
                        "keyboard=qwerty",
                    ]
                ),
            ),
            max_size=6,
        )
    )
    text = " ".join(pieces)
    assume("bearer" not in text.lower() and "authorization" not in text.lower())
    return text


@given(benign_text())
def test_text_without_secrets_is_unchanged(text: str) -> None:
    assert redact(text) == text


# Fragments that make the patterns meet, overlap and abut: idempotence must hold on any mix of them.
fragments = st.sampled_from(
    [
        "http://",
        "https://",
        "@",
        ":",
        "/",
        "?",
        "&",
        "#",
        " ",
        "=",
        "token",
        "key",
        "sig",
        "_",
        "-",
        ".",
        "hf_",
        "A1B2C3D4E5F6G7H8I9J0K",
        "Bearer ",
        "Authorization: ",
        "'",
        '"',
        "***",
        "u",
        "p",
        "host",
        ";",
        ",",
        "Basic ",
    ]
)


@given(st.one_of(st.text(), st.lists(fragments, max_size=25).map("".join), secret_in_context().map(lambda c: c[0])))
def test_redact_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


@pytest.mark.parametrize(
    "text, expected",
    [
        ("--mlx-endpoint=http://user:SECRET@127.0.0.1:5/x", "--mlx-endpoint=http://***@127.0.0.1:5/x"),
        ("https://u:p@ss@host/x?a=1", "https://***@host/x?a=1"),  # a password holding '@'
        ("http://user:SEC%40RET@h", "http://***@h"),  # percent-encoded
        ("http://localhost:1/lfs/ab?sig=XYZ&expires=5", "http://localhost:1/lfs/ab?sig=***&expires=5"),
        (
            "X-Amz-Signature=abc&X-Amz-Credential=def&Key-Pair-Id=7",
            "X-Amz-Signature=***&X-Amz-Credential=***&Key-Pair-Id=7",
        ),
        ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz", "HF_TOKEN=***"),
        ("got hf_abcdefghijklmnopqrstuvwxyz12 here", "got hf_*** here"),
        ("Authorization: Bearer abc.def", "Authorization: Bearer ***"),
        ("{'authorization': 'Basic dXNlcjpTRUNSRVQ='}", "{'authorization': 'Basic ***'}"),
        ("--api-key=abc", "--api-key=***"),
        ("--mlx-kl-tokens=256", "--mlx-kl-tokens=256"),  # 'tokens' is not 'token'
        ("git@github.com:org/x", "git@github.com:org/x"),  # no scheme://: not a URL's userinfo
    ],
)
def test_examples(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_argv_masks_flag_value_pairs_and_keeps_one_argument_for_each() -> None:
    argv = [
        "--mlx-endpoint",
        "http://user:SECRET@h:1",
        "--token",
        "SECRET2",
        "--mlx-kl-tokens",
        "3",
        "--hf-token",
        "SECRET3",
        "--mlx-endpoint=https://me:SECRET4@h",
        "--password",
        "--mlx-aa",
        "-k",
        "x",
    ]
    out = redact_argv(argv)
    assert out == [
        "--mlx-endpoint",
        "http://***@h:1",
        "--token",
        MASK,
        "--mlx-kl-tokens",
        "3",
        "--hf-token",
        MASK,
        "--mlx-endpoint=https://***@h",
        "--password",
        "--mlx-aa",
        "-k",
        "x",
    ]
    assert redact_argv(out) == out


@given(
    st.lists(
        st.one_of(
            fragments,
            st.sampled_from(["--token", "--api-key", "--mlx-endpoint", "-k"]),
            secret_in_context().map(lambda c: c[0]),
        ),
        max_size=8,
    )
)
def test_argv_shape_and_idempotence(argv: list[str]) -> None:
    out = redact_argv(argv)
    assert len(out) == len(argv)
    assert redact_argv(out) == out


def test_data_redacts_strings_and_secret_named_keys_at_any_depth() -> None:
    data = {
        "gate": {"report": "/tmp/r.json", "db": None, "kl_tokens": "256", "api_token": "plain"},
        "urls": ["http://u:SECRET@h/x", 3, None],
        "token": "",
        "n": 1.5,
    }
    assert redact_data(data) == {
        "gate": {"report": "/tmp/r.json", "db": None, "kl_tokens": "256", "api_token": MASK},
        "urls": ["http://***@h/x", 3, None],
        "token": "",
        "n": 1.5,
    }


def test_run_info_stores_neither_argv_nor_config_secrets(tmp_path: Path) -> None:
    """The one constructor of a run's record masks both: JSON report, history and merge get it safe."""
    from pytest_mlxgate.results.records import RunInfo

    run = RunInfo.new(
        tmp_path,
        argv=["--mlx-endpoint", "http://user:SECRET@127.0.0.1:9", "--token", "SECRET2", "-x"],
        config={"candidate": "org/m", "gate": {"cand_value": "hf_SECRET3abcdefghijklmnopqrst"}},
        machine={"device": "cpu"},
    )
    text = repr(run.to_dict())
    assert "SECRET" not in text, text
    assert run.argv == ["--mlx-endpoint", "http://***@127.0.0.1:9", "--token", MASK, "-x"]
    assert run.config == {"candidate": "org/m", "gate": {"cand_value": "hf_***"}}
