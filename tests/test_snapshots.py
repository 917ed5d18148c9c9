"""materialize(): names to pinned snapshots, and the JSON that travels to xdist workers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import standin_hub
from pytest_mlxgate.names import CandidateSpec
from pytest_mlxgate.snapshots import ResolvedSnapshot, materialize


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The stand-in hub in place of the real one; returns its call log."""
    monkeypatch.setitem(sys.modules, "pytest_mlxgate.hub", standin_hub)
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("STANDIN_HUB_LOG", str(log))
    return log


def test_local_directory_is_its_own_snapshot(tmp_path: Path) -> None:
    spec = CandidateSpec(kind="local", name="./m", path=tmp_path)
    snap = materialize(spec)
    assert (snap.kind, snap.commit, snap.path, snap.repo_id, snap.source) == (
        "local", "local", str(tmp_path), None, "local",
    )
    assert snap.pinned == str(tmp_path)


def test_hub_snapshot_is_pinned_to_its_commit(standin: Path, tmp_path: Path) -> None:
    spec = CandidateSpec(kind="hub", name="alias", repo_id="org/model")
    seen: list[tuple[int, int]] = []
    first = materialize(spec, cache_dir=tmp_path / "c", endpoint="http://x", offline=False,
                        progress=lambda d, t: seen.append((d, t)))
    assert first.commit == standin_hub.COMMIT and first.dir.name == standin_hub.COMMIT
    assert (first.source, first.fetched_bytes) == ("downloaded", len(standin_hub.PAYLOAD))
    assert first.pinned == f"org/model@{standin_hub.COMMIT[:7]}"
    assert seen[-1] == (len(standin_hub.PAYLOAD), len(standin_hub.PAYLOAD))
    again = materialize(spec, cache_dir=tmp_path / "c")
    assert again.source == "cached" and again.path == first.path
    calls = [json.loads(line) for line in standin.read_text().splitlines()]
    assert calls[0]["revision"] == "main" and calls[0]["endpoint"] == "http://x"


def test_dataset_repo_type_reaches_the_hub(standin: Path, tmp_path: Path) -> None:
    spec = CandidateSpec(kind="hub", name="org/data", repo_id="org/data", revision="v1")
    snap = materialize(spec, cache_dir=tmp_path, repo_type="dataset")
    assert snap.repo_type == "dataset" and "datasets--org--data" in snap.path
    assert json.loads(standin.read_text())["revision"] == "v1"


def test_a_snapshot_not_named_by_a_commit_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pytest_mlxgate.hub", standin_hub)
    monkeypatch.setattr(standin_hub, "snapshot_download", lambda *a, **k: tmp_path / "main")
    with pytest.raises(ValueError, match="not named by a 40-hex commit"):
        materialize(CandidateSpec(kind="hub", name="o/m", repo_id="o/m"))


@given(
    st.builds(
        ResolvedSnapshot,
        name=st.text(),
        kind=st.sampled_from(["embedded", "hub", "local"]),
        repo_id=st.none() | st.text(),
        commit=st.text(),
        path=st.text(),
        repo_type=st.sampled_from(["model", "dataset"]),
        source=st.sampled_from(["cached", "downloaded", "built", "local"]),
        fetched_bytes=st.integers(min_value=0, max_value=2**53),
        seconds=st.floats(min_value=0, max_value=1e6),
    )
)
def test_json_round_trip(snap: ResolvedSnapshot) -> None:
    assert ResolvedSnapshot.from_json(snap.to_json()) == snap


def test_from_json_ignores_fields_from_a_newer_controller() -> None:
    data = json.loads(ResolvedSnapshot("n", "local", None, "local", "/p").to_json())
    data["added_later"] = 1
    assert ResolvedSnapshot.from_json(json.dumps(data)).path == "/p"
