"""A speed measurement's JSON (`SpeedResult.to_json()`, a record's `speed`) in words, as a reader meets it:
parsed by the read model (`results.record_speed`), then worded by `results.speed_text`. The tests give JSON,
the form a record carries, so its tolerant parse is tested with its words."""

from __future__ import annotations

from typing import Any

from pytest_mlxgate.results import speed_text
from pytest_mlxgate.results.record_speed import parse_context, parse_speed


def context_text(ctx: Any) -> str:
    return speed_text.context_text(parse_context(ctx))


def speed_lines(speed: Any) -> list[str]:
    return speed_text.speed_lines(parse_speed(speed))


def ratio_text(estimate: Any) -> str:
    return speed_text.ratio_text(parse_context({"decode": estimate}).decode)


def load_warning(seen: Any) -> str | None:
    return speed_text.load_warning(parse_speed({"load_seen": seen}).load_seen)
