"""materialize(): names to pinned snapshots, and the JSON that travels to xdist workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakehub import FakeHub
from hfenv import HfEnv
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.config.names import CandidateSpec
from pytest_mlxgate.models.materialize import ResolvedSnapshot, _commit_of, materialize

# hf_env (tests/conftest.py): no token, cache or offline setting from the environment, the calls say it
# all; HF_ENDPOINT refuses connections, so a call that lost its endpoint fails instead of going online.


def test_local_directory_is_its_own_snapshot(tmp_path: Path) -> None:
    spec = CandidateSpec(kind="local", name="./m", path=tmp_path)
    snap = materialize(spec)
    assert (snap.kind, snap.commit, snap.path, snap.repo_id, snap.source) == (
        "local",
        "local",
        str(tmp_path),
        None,
        "local",
    )
    assert snap.pinned == str(tmp_path)


def test_hub_snapshot_is_pinned_to_its_commit(hub: FakeHub, hf_env: HfEnv, tmp_path: Path) -> None:
    """The real downloader against the fake hub: the commit `main` pointed to is the pin."""
    files = {"config.json": b'{"model_type": "snapshots"}', "weights.bin": bytes(range(256)) * 8}  # 2 kB: LFS
    commit = hub.add_repo("snapshots/model", files)
    size = sum(len(b) for b in files.values())
    spec = CandidateSpec(kind="hub", name="alias", repo_id="snapshots/model")
    seen: list[tuple[int, int]] = []
    first = materialize(
        spec, cache_dir=tmp_path / "c", endpoint=hub.endpoint, offline=False, progress=lambda d, t: seen.append((d, t))
    )
    assert first.commit == commit and first.dir.name == commit
    assert first.dir == tmp_path / "c" / "models--snapshots--model" / "snapshots" / commit
    assert (first.source, first.fetched_bytes) == ("downloaded", size)
    assert (first.name, first.repo_id, first.kind) == ("alias", "snapshots/model", "hub")
    assert first.pinned == f"snapshots/model@{commit[:7]}"
    assert seen[-1] == (size, size)
    assert [r.path for r in hub.log if "/revision/" in r.path] == ["/api/models/snapshots/model/revision/main"]
    assert hub.bytes_served("snapshots/model") == size

    again = materialize(spec, cache_dir=tmp_path / "c", endpoint=hub.endpoint)
    assert (again.source, again.fetched_bytes, again.path) == ("cached", 0, first.path)
    offline = materialize(spec, cache_dir=tmp_path / "c", offline=True)
    assert (offline.source, offline.commit) == ("cached", commit)
    assert hub.bytes_served("snapshots/model") == size  # nothing fetched twice
    assert len([r for r in hub.log if "/revision/" in r.path]) == 2  # the offline call asked nothing


def test_dataset_repo_type_reaches_the_hub(hub: FakeHub, hf_env: HfEnv, tmp_path: Path) -> None:
    commit = hub.add_repo("snapshots/data", {"data.csv": b"a,b\n1,2\n"}, repo_type="dataset", branch="v1")
    spec = CandidateSpec(kind="hub", name="snapshots/data", repo_id="snapshots/data", revision="v1")
    snap = materialize(spec, cache_dir=tmp_path, endpoint=hub.endpoint, repo_type="dataset")
    assert (snap.repo_type, snap.commit) == ("dataset", commit)
    assert snap.path == str(tmp_path / "datasets--snapshots--data" / "snapshots" / commit)
    assert [r.path for r in hub.log if "/revision/" in r.path] == ["/api/datasets/snapshots/data/revision/v1"]


def test_a_snapshot_not_named_by_a_commit_is_refused(tmp_path: Path) -> None:
    """The pin is the snapshot folder's name; the real hub always names it by the commit, so the
    guard against a folder that is not one is checked directly."""
    with pytest.raises(ValueError, match="not named by a 40-hex commit"):
        _commit_of(tmp_path / "main")
    assert _commit_of(tmp_path / ("ab" * 20)) == "ab" * 20


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
