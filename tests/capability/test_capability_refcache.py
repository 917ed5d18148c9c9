"""The capability reference-arm cache: an unchanged gate runs only its candidate arm; any change to
what the reference outputs depend on is a miss, and a damaged entry (any byte flipped) is a miss
said once and rewritten, never a wrong answer and never an exception."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability import refcache, runner, user_tasks
from pytest_mlxgate.capability.base import ItemResult
from pytest_mlxgate.capability.refcache import CapabilityCache
from pytest_mlxgate.capability.user_tasks import jsonl_task
from pytest_mlxgate.common.keys import canonical_json
from pytest_mlxgate.common.refstore import EntryStore, seal, unseal
from pytest_mlxgate.levers.lever import Lever

BASE = {
    "model": "org/tiny@" + "0" * 40,
    "tokenizer": "t",
    "dtype": "float32",
    "machine": {"device": "cpu"},
    "lever": "ref-value",
}


@pytest.fixture
def setup(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import mlx_lm

    monkeypatch.setattr(user_tasks, "_REGISTRY", {})
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Item {i}:", "target": "x"}) + "\n" for i in range(3)))
    jsonl_task("cached", data, max_new_tokens=2)
    arms: list[str] = []
    real = runner.run_arm

    def counting(*args: Any, **kw: Any) -> Any:
        arms.append(args[5])  # which arm ran
        return real(*args, **kw)

    monkeypatch.setattr(runner, "run_arm", counting)
    model = mlx_lm.load(str(tiny_model_dir))
    return {"model": model, "arms": arms, "data": data, "cache": CapabilityCache(tmp_path / "cache")}


def _run(s: dict[str, Any], *, key: dict[str, Any] | None = None, lever: Lever | None = None, **kw: Any) -> Any:
    lever = lever or Lever(name="none", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="0")
    s["arms"].clear()
    opts: dict[str, Any] = {"n": None, "max_new_tokens": None, **kw}
    tier = opts.pop("tier", "full")
    return runner.run_capability(
        "cached",
        tier,
        reference=s["model"],
        candidate=s["model"],
        lever=lever,
        reference_cache=s["cache"],
        reference_key=key or BASE,
        **opts,
    )


def test_an_unchanged_gate_runs_only_its_candidate_arm(setup: dict[str, Any]) -> None:
    first = _run(setup)
    assert first.reference_source == "computed" and setup["arms"] == ["reference", "candidate"]
    again = _run(setup)
    assert again.reference_source == "cache" and setup["arms"] == ["candidate"]
    assert [r.to_json() for r in again.reference] == [r.to_json() for r in first.reference]
    assert again.rendered == first.rendered  # reports still show the exact inputs


@pytest.mark.parametrize(
    "change", ["model", "lever", "data", "n", "tier", "max_new_tokens", "code", "generation", "refresh"]
)
def test_each_key_input_is_a_miss(setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    _run(setup)
    kw: dict[str, Any] = {}
    key = dict(BASE)
    if change in ("model", "lever"):
        key[change] = "something else"
    elif change == "data":
        setup["data"].write_text(setup["data"].read_text().replace("Item 1:", "Item one:"))
    elif change == "n":
        kw["n"] = 2
    elif change == "tier":
        kw["tier"] = "smoke"  # the same 3 items (no smoke size): the tier alone is in the key
    elif change == "max_new_tokens":
        kw["max_new_tokens"] = 1
    elif change == "code":
        monkeypatch.setattr(refcache, "task_code_digest", lambda task: "another scorer")
    elif change == "generation":
        monkeypatch.setattr(refcache, "generation_code_digest", lambda: "another serving loop")
    else:
        kw["refresh_reference"] = True
    assert _run(setup, key=key, **kw).reference_source == "computed"
    assert setup["arms"] == ["reference", "candidate"]


def _kv(cand: dict[str, int]) -> Lever:
    return Lever(name="kv", kind="kv", target=None, ref="plain", cand=cand, path="serving")


def test_a_kv_lever_s_reference_is_cached_under_both_arms_plans(setup: dict[str, Any], tiny_kv_model_dir: Path) -> None:
    """The generation loop is chosen from both arms' KV plans (generate.generation_route), so the
    candidate's plan is part of the reference's key: the same plan hits, another one misses."""
    import mlx_lm

    setup["model"] = mlx_lm.load(str(tiny_kv_model_dir))  # head_dim 64: its cache quantizes in groups of 32
    eight = {"bits": 8, "group_size": 32, "start": 0}
    assert _run(setup, lever=_kv(eight)).reference_source == "computed"
    assert _run(setup, lever=_kv(eight)).reference_source == "cache" and setup["arms"] == ["candidate"]
    four = _run(setup, lever=_kv({**eight, "bits": 4}))
    assert four.reference_source == "computed" and setup["arms"] == ["reference", "candidate"]


def test_a_damaged_entry_is_a_miss_and_is_rewritten(setup: dict[str, Any]) -> None:
    from pytest_mlxgate.errors import MlxgateWarning

    _run(setup)
    (entry,) = setup["cache"].directory.glob("cap-*.json")
    entry.write_text('{"key": {"model": "another"}, "results": []}')  # no seal: not trusted, even as JSON
    with pytest.warns(MlxgateWarning, match=r"cap-.*\.json is damaged \(no checksum.*replacing the entry"):
        assert _run(setup).reference_source == "computed"
    entry.write_bytes(b"\x00 not json")
    setup["cache"] = CapabilityCache(setup["cache"].directory)  # the next run
    with pytest.warns(MlxgateWarning, match="no mlxgate entry header"):
        assert _run(setup).reference_source == "computed"
    assert _run(setup).reference_source == "cache"  # stored again after the miss


RESULTS = [
    ItemResult(f"item-{i}", f"{i:016x}", f"out {i} é", float(i % 2), ("wrong", "correct")[i % 2], {"n": i})
    for i in range(3)
]


def test_every_single_byte_flip_of_an_entry_is_a_miss_said_once(tmp_path: Path) -> None:
    """Exhaustive, as for the KL cache: the seal finds every flipped byte before JSON is parsed."""
    good = CapabilityCache(tmp_path / "good").store(BASE, RESULTS).read_bytes()
    lines: list[str] = []
    cache = CapabilityCache(tmp_path / "flip", report=lines.append)
    assert cache.load(BASE, 3) is None and not lines
    cache.store(BASE, RESULTS)
    assert [r.to_json() for r in cache.load(BASE, 3) or []] == [r.to_json() for r in RESULTS]
    path = cache.path_for(BASE)
    for i in range(len(good)):
        damaged = bytearray(good)
        damaged[i] ^= 0xFF
        path.write_bytes(bytes(damaged))
        lines.clear()
        cache.files = EntryStore(cache.directory, report=lines.append)  # a fresh run: says it again
        assert cache.load(BASE, 3) is None, i
        assert len(lines) == 1 and str(path) in lines[0] and "is damaged" in lines[0], (i, lines)


def test_a_broken_document_behind_a_valid_seal_never_raises(tmp_path: Path) -> None:
    """The parser layer alone: a payload that is not the document a store wrote (flipped bytes,
    other JSON) is a miss or some results, never an exception out of `load`."""
    cache = CapabilityCache(tmp_path, report=lambda line: None)
    path = cache.store(BASE, RESULTS)
    payload = unseal(path.read_bytes())
    docs = [bytes(payload[:i]) + bytes([payload[i] ^ 0x20]) + payload[i + 1 :] for i in range(len(payload))]
    docs += [
        b"[]",
        b"null",
        b'{"key": 1}',
        json.dumps({"key": json.loads(canonical_json(BASE)), "results": 7}).encode(),
        json.dumps({"key": json.loads(canonical_json(BASE)), "results": [{"item_id": 1}] * 3}).encode(),
        b"\xff\xfe",
    ]
    for doc in docs:
        path.write_bytes(seal(doc))
        got = cache.load(BASE, 3)  # must not raise
        assert got is None or len(got) == 3


def test_task_code_digest_covers_the_task_classes_bases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cloze task's scorer lives in `cloze.py`, its data in its own module: either changing is a miss."""
    import hashlib
    import sys

    from pytest_mlxgate.capability.tasks import arc_easy, mmlu, piqa

    def sha(path: str) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    assert refcache.task_code_digest(mmlu.TASK) == sha(mmlu.__file__)  # one file: exactly its bytes, as before
    assert refcache.task_code_digest(arc_easy.TASK) not in (
        sha(arc_easy.__file__),
        refcache.task_code_digest(piqa.TASK),
    )
    base = tmp_path / "mlxgate_digest_base.py"
    base.write_text("class Base:\n    def score(self): return 1\n")
    (tmp_path / "mlxgate_digest_task.py").write_text(
        "from mlxgate_digest_base import Base\nclass Task(Base):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import mlxgate_digest_task  # type: ignore[import-not-found]

        before = refcache.task_code_digest(mlxgate_digest_task.Task())
        base.write_text("class Base:\n    def score(self): return 0\n")  # the scorer changed, not the task's file
        assert refcache.task_code_digest(mlxgate_digest_task.Task()) != before
    finally:
        for name in ("mlxgate_digest_task", "mlxgate_digest_base"):
            sys.modules.pop(name, None)
