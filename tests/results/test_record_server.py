"""A record's `server` part (`results.record_server`): read back as written, and its words say what a pass
through a server rests on, in every report."""

from __future__ import annotations

from typing import Any

from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.results.records import gate_record
from pytest_mlxgate.results.summary import summary_lines

PART: dict[str, Any] = {
    "url": "http://127.0.0.1:8081",
    "top_k": 11,
    "k": 11,
    "bound": "lower",
    "asked": 96,
    "unaskable": 2,
    "next_unlisted": 7,
    "chosen_disagreed": 40,
    "ref_tail": 0.153,
    "cand_tail": 0.149,
    "max_kl": 0.02,
    "served": ["/models/e4b"],
}


def test_the_part_reads_back_as_written_and_says_what_it_rests_on() -> None:
    record = parse_record({"nodeid": "g.py::t", "mode": "gate", "verdict": "pass", "server": PART})
    assert record.server is not None and record.to_json()["server"] == PART
    words = record.server.words
    assert words.startswith("candidate served at http://127.0.0.1:8081: KL a lower bound from its top-11")
    assert "mass left out: reference 0.153, candidate 0.149" in words
    assert "2 of 96 positions not askable" in words and "next token unlisted at 7" in words
    assert 'its "chosen" entries disagreed at 40 (not believed)' in words
    assert "changed nothing" not in words and "could not list" not in words


def test_a_server_that_differs_in_nothing_or_lists_no_model_says_so() -> None:
    same = parse_record({"nodeid": "g.py::t", "server": {**PART, "max_kl": 3e-7, "served": None}}).server
    assert same is not None
    assert "no difference from the reference arm at any position (max 3e-07)" in same.words
    assert "could not list the models it serves" in same.words
    assert parse_record({"nodeid": "g.py::t"}).server is None


def test_the_summary_shows_it_beside_the_verdict() -> None:
    record = gate_record(nodeid="g.py::t", mode="gate", verdict="pass", server=PART)
    text = " ".join(" ".join(summary_lines([record], width=100)).split())
    assert "candidate served at http://127.0.0.1:8081: KL a lower bound from its top-11" in text


def test_a_served_reference_is_named_first_and_its_listing_checked_apart() -> None:
    both = {**PART, "ref_url": "http://127.0.0.1:8082", "ref_served": ["/models/e4b"]}
    record = parse_record({"nodeid": "g.py::t", "server": both})
    assert record.server is not None and record.to_json()["server"] == both
    assert record.server.words.startswith(
        "reference served at http://127.0.0.1:8082; candidate served at http://127.0.0.1:8081: KL a lower bound "
        "from their top-11 (mass left out: reference 0.153, candidate 0.149)"
    )
    alone = {**PART, "url": None, "served": None, "cand_tail": None, "ref_url": "http://127.0.0.1:8082"}
    words = parse_record({"nodeid": "g.py::t", "server": alone}).server.words  # type: ignore[union-attr]
    assert words.startswith(
        "reference served at http://127.0.0.1:8082: KL a lower bound from its top-11 (mass left out: reference 0.153)"
    )
    assert "http://127.0.0.1:8082 could not list the models it serves" in words and "8081" not in words
