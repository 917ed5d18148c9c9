"""The re-run command carries the run's options but never its credentials; a rejected endpoint's message
shows none either."""

from __future__ import annotations

import argparse

import pytest

from pytest_mlxgate.config.option_values import check_endpoint, endpoint_arg
from pytest_mlxgate.config.rerun import rerun_command
from pytest_mlxgate.errors import MlxgateUsageError


@pytest.mark.parametrize(
    "args",
    [
        ["--mlx-endpoint", "http://user:SECRET@127.0.0.1:9"],
        ["--mlx-endpoint=https://user:SECRET@hub.example.org/prefix"],
        ["-o", "mlx_endpoint=http://me:SECRET@proxy:3128"],
    ],
)
def test_the_rerun_command_keeps_the_endpoint_but_masks_its_credentials(
    pytester: pytest.Pytester, args: list[str]
) -> None:
    config = pytester.parseconfig("--mlx-kl-tokens=8", *args, "--mlx-report=r.json")
    command = rerun_command(config, "test_gate.py::test_drift")
    assert "SECRET" not in command, command
    assert "--mlx-kl-tokens=8" in command and "r.json" not in command  # still carries what it carried
    if args[0] != "-o":  # -o is pytest's, not carried; a --mlx-endpoint is, with the user to fill in
        assert "***@" in command, command


def test_the_rerun_command_pairs_flags_with_values_after_masking(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("--mlx-endpoint", "http://u:SECRET@127.0.0.1:9", "--mlx-kl-prompts", "3")
    assert (
        rerun_command(config, "t.py::g") == "pytest t.py::g --mlx-endpoint 'http://***@127.0.0.1:9' --mlx-kl-prompts 3"
    )


@pytest.mark.parametrize(
    "value", ["user:SECRET@host", "ftp://user:SECRET@host", "http://u:SECRET@host?x=1", "//u:SECRET@host"]
)
def test_a_rejected_endpoint_is_shown_without_its_credentials(value: str) -> None:
    with pytest.raises(MlxgateUsageError, match="is not a hub endpoint") as e:
        check_endpoint(value)
    assert "SECRET" not in str(e.value) and "***@host" in str(e.value)
    with pytest.raises(argparse.ArgumentTypeError) as a:
        endpoint_arg(value)
    assert "SECRET" not in str(a.value)


def test_an_endpoint_with_credentials_is_accepted_as_given() -> None:
    """The credentials are the user's to use: the value the downloader gets keeps them."""
    assert check_endpoint(" http://user:SECRET@127.0.0.1:9/ ") == "http://user:SECRET@127.0.0.1:9"
