"""Workers' progress lines reach the controller: real files, a real thread, partial lines held back."""

from __future__ import annotations

import time

from pytest_mlxgate.session.relay import ProgressRelay, worker_progress


def test_lines_from_each_worker_arrive_tagged_and_in_order() -> None:
    seen: list[str] = []
    relay = ProgressRelay(seen.append, interval=0.05)
    gw0, gw1 = worker_progress(str(relay.directory), "gw0"), worker_progress(str(relay.directory), "gw1")
    gw0("scoring capability mmlu (smoke) reference arm: 4 / 40 items")
    gw1("scoring capability hashhop (smoke) candidate arm: 1 / 8 items")
    gw0("scored capability mmlu (smoke) reference arm: 40 items in 12.0 s\nwith a second line folded in")
    deadline = time.monotonic() + 5
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [line for line in seen if line.startswith("[gw0]")] == [
        "[gw0] scoring capability mmlu (smoke) reference arm: 4 / 40 items",
        "[gw0] scored capability mmlu (smoke) reference arm: 40 items in 12.0 s with a second line folded in",
    ]
    assert "[gw1] scoring capability hashhop (smoke) candidate arm: 1 / 8 items" in seen
    directory = relay.directory
    relay.close()
    assert not directory.exists() and len(seen) == 3


def test_a_line_still_being_written_waits_for_its_end_and_close_drains_the_rest() -> None:
    seen: list[str] = []
    relay = ProgressRelay(seen.append, interval=3600)  # no background look: drain by hand
    path = relay.directory / "gw3.log"
    path.write_text("first line\nhalf a li")
    relay.drain()
    assert seen == ["[gw3] first line"]
    with open(path, "a") as handle:
        handle.write("ne\n")
    worker_progress(str(relay.directory), "gw3")("last")
    relay.close()
    assert seen == ["[gw3] first line", "[gw3] half a line", "[gw3] last"]
    worker_progress(str(relay.directory), "gw3")("after close: the folder is gone, and nothing breaks")
