"""A plan search keeps what it measured beside the reference (`explain/plan_cache.py`): a second search on
the same model, gate and machine reads the selection's reference and every plan, runs none of them, and
answers the same; a different machine is a miss; damage is a miss, measured again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=6, tokens=24, decode=8),
]


def test_drift(paired):
    assert_kl_below(paired, mean=%g, top1=0.5)
"""


def _search(model_dir: Path, gate_file: Path, cache_dir: Path, machine: dict[str, str], said: list[str]) -> Any:
    import mlx_lm

    from pytest_mlxgate.explain.plan_cache import SearchCache
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_kv import search_kv_plan
    from pytest_mlxgate.kl.refcache import ReferenceCache
    from pytest_mlxgate.models.loaded import LoadedModel
    from pytest_mlxgate.models.materialize import ResolvedSnapshot

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    snap = ResolvedSnapshot(name="t", kind="local", repo_id=None, commit="local", path=str(model_dir), source="local")
    cache = SearchCache(ReferenceCache(cache_dir), LoadedModel(model, tokenizer, snap), machine)
    gate = read_gate(gate_file)
    return search_kv_plan(
        model, tokenizer, gate, bits=(2, 4, 8), groups=(64,), selection=2, say=said.append, cache=cache
    )


def _forbid_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_mlxgate.explain import plan_kv, plan_rows

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("measured again: the cache was not read")

    monkeypatch.setattr(plan_kv, "run_reference", refuse)
    monkeypatch.setattr(plan_rows.SelectionRuns, "measure", refuse)
    monkeypatch.setattr(plan_rows.SelectionRuns, "measure_many", refuse)


def test_a_second_search_reads_every_measurement_and_answers_the_same(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(GATE % 0.02)
    machine = {"device": "cpu", "blas": "test"}
    first_said: list[str] = []
    first = _search(tiny_kv_model_dir, gate, tmp_path / "cache", machine, first_said)
    assert first_said[0].startswith("plan kv: reference arm on 2 selection sequences")
    # measured here (a round whose plan is one already measured, e.g. a uniform one, reads it even now)
    assert not any("read, not run" in s for s in first_said if "uniform" in s or "alone" in s)
    assert list((tmp_path / "cache" / "plans").glob("*.json"))  # the plans' entry, beside the reference
    with monkeypatch.context() as m:
        _forbid_measuring(m)
        said: list[str] = []
        again = _search(tiny_kv_model_dir, gate, tmp_path / "cache", machine, said)
    assert said[0] == "plan kv: the reference arm on 2 selection sequences read from the reference cache"
    measured = [s for s in said if s != said[0]]
    assert measured and all("read, not run" in s for s in measured), measured
    assert again.layers == first.layers and again.rounds == first.rounds
    assert again.uniform == first.uniform and again.sensitivity == first.sensitivity

    # other limits: the same sensitivities, their verdicts drawn afresh (its rounds are other plans)
    gate.write_text(GATE % 1e-12)
    strict_said: list[str] = []
    strict = _search(tiny_kv_model_dir, gate, tmp_path / "cache", machine, strict_said)
    assert all("read, not run" in s for s in strict_said if "uniform" in s or "alone" in s)
    assert [u["mean"] for u in strict.uniform] == [u["mean"] for u in first.uniform]
    assert any(u["passes"] for u in first.uniform) and not any(u["passes"] for u in strict.uniform)
    gate.write_text(GATE % 0.02)

    # another machine (another BLAS: other float rounding) is another key: everything is measured again
    other: list[str] = []
    _search(tiny_kv_model_dir, gate, tmp_path / "cache", {**machine, "blas": "other"}, other)
    assert other[0].startswith("plan kv: reference arm on") and not any(
        "uniform" in s and "read, not run" in s for s in other
    )

    # a damaged entry is a miss, measured again and written whole
    for entry in (tmp_path / "cache" / "plans").glob("*.json"):
        data = bytearray(entry.read_bytes())
        data[-3] ^= 0xFF
        entry.write_bytes(bytes(data))
    from pytest_mlxgate.errors import MlxgateWarning

    healed: list[str] = []
    with pytest.warns(MlxgateWarning, match=r"plans/.*\.json is damaged \(checksum mismatch\)"):
        _search(tiny_kv_model_dir, gate, tmp_path / "cache", machine, healed)
    assert any("layers alone" in s and "read, not run" not in s for s in healed)
    with monkeypatch.context() as m:
        _forbid_measuring(m)
        _search(tiny_kv_model_dir, gate, tmp_path / "cache", machine, [])  # whole again


def test_a_second_weights_search_reads_its_references_and_every_plan(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights search keeps its three reference arms (selection, the gate's held-out prompts, the long
    selection) and every plan it measured on them: run again, it runs no forward and answers the same."""
    import mlx_lm
    from plan_gates import weights_gate_spec

    from pytest_mlxgate.explain import plan_weights
    from pytest_mlxgate.explain.plan_cache import SearchCache
    from pytest_mlxgate.explain.plan_weights_compare import search_weights_plan
    from pytest_mlxgate.kl.refcache import ReferenceCache
    from pytest_mlxgate.models.loaded import LoadedModel
    from pytest_mlxgate.models.materialize import ResolvedSnapshot

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    snap = ResolvedSnapshot(
        name="t", kind="local", repo_id=None, commit="local", path=str(tiny_kv_model_dir), source="local"
    )
    cache = SearchCache(ReferenceCache(tmp_path / "cache"), LoadedModel(model, tokenizer, snap), {"blas": "test"})
    gate = weights_gate_spec(tmp_path)
    asked: dict[str, Any] = dict(bits=(4, 8), groups=(64,), selection=3, long=24, compare=True, cache=cache)
    first_said: list[str] = []
    first = search_weights_plan(model, tokenizer, gate, say=first_said.append, **asked)
    # all measured here: the three reference arms and the plans (a comparison that lands on a plan the search
    # measured reads it, even now)
    assert sum(s.startswith("plan weights: reference arm on") for s in first_said) == 3
    assert not any("read from the reference cache" in s for s in first_said)
    assert sum("read, not run" not in s for s in first_said) > 10

    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("measured again: the cache was not read")

    said: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(plan_weights, "run_reference", refuse)
        m.setattr(plan_weights, "run_candidate", refuse)
        again = search_weights_plan(model, tokenizer, gate, say=said.append, **asked)
    assert sum("read from the reference cache" in s for s in said) == 3  # selection, held out, long
    # (mlx_lm's dynamic_quant estimates its own sensitivities again: its code, not a plan measured here)
    measured = [s for s in said if not s.startswith("plan weights: mlx_lm dynamic_quant")]
    assert all("read" in s for s in measured), [s for s in measured if "read" not in s]
    assert again.to_json()["quantization"] == first.to_json()["quantization"]
    assert again.rounds == first.rounds and again.sensitivity == first.sensitivity
    assert [c["held_out"] for c in again.comparisons] == [c["held_out"] for c in first.comparisons]
