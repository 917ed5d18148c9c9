"""A lever that tests nothing is refused, and a lever's cache key follows its code.

Units of the plumbing the false-green corpus (tests/false_green/test_vacuous_gates.py) runs end to
end: the KV plan's quantized layers within a sequence length, the patch call counter, a bare
`--mlx-lever NAME`'s targets, and `Lever.key` over edited source.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.errors import LeverError, VacuousLeverError
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.levers.naming import source_digest
from pytest_mlxgate.levers.parsing import check_override_targets, override_applies
from pytest_mlxgate.serving.kv_plan import PLAIN, parse_kv_value, require_kv_difference


@pytest.fixture(scope="module")
def tiny_llama(tiny_kv_model_dir: Path) -> Any:
    import mlx_lm

    return mlx_lm.load(str(tiny_kv_model_dir))[0]


@pytest.mark.parametrize(
    ("start", "tokens", "quantizes"),
    [
        (0, 24, True),
        (23, 24, True),
        (24, 24, False),
        (5000, 24, False),
        (5000, 6000, True),
    ],
)
def test_a_layer_quantizes_within_a_length_exactly_when_its_start_is_before_the_last_fed_token(
    tiny_llama: Any, start: int, tokens: int, quantizes: bool
) -> None:
    plan = parse_kv_value({"bits": 4, "start": start})
    layers = plan.quantized_within(tiny_llama, tokens)
    assert bool(layers) is quantizes
    if quantizes:
        assert sorted(layers) == list(range(len(tiny_llama.layers)))  # a uniform plan: every cached layer


def test_a_kv_lever_is_refused_when_both_plans_serve_the_same_caches(tiny_llama: Any) -> None:
    late = parse_kv_value({"bits": 2, "start": 5000})
    with pytest.raises(VacuousLeverError, match=r"starts at token 5000, beyond the 24 tokens"):
        require_kv_difference("kv", PLAIN, late, tiny_llama, 24, where="the serving path")
    with pytest.raises(VacuousLeverError, match="neither plan quantizes"):
        require_kv_difference("kv", PLAIN, PLAIN, tiny_llama, 24, where="the serving path")
    same = parse_kv_value({"bits": 8})
    with pytest.raises(VacuousLeverError, match="both plans quantize the same layers"):
        require_kv_difference(
            "kv", same, parse_kv_value("bits=8,group_size=64,start=0"), tiny_llama, 24, where="the serving path"
        )
    require_kv_difference(
        "kv", PLAIN, parse_kv_value({"bits": 8, "start": 23}), tiny_llama, 24, where="the serving path"
    )  # quantizes before the last position: tested, no error


def test_a_vacuous_lever_error_is_a_lever_error_with_its_fix() -> None:
    assert issubclass(VacuousLeverError, LeverError)


def _double(x: int) -> int:
    return 2 * x


def test_the_call_counter_counts_calls_of_the_patched_site_in_either_arm(monkeypatch: pytest.MonkeyPatch) -> None:
    site = type(sys)("mlxgate_counted_site")
    site.fn = _double  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlxgate_counted_site", site)
    lever = Lever(name="fn", kind="patch", target="mlxgate_counted_site:fn", ref=None, cand=lambda x: 3 * x)
    calls: list[str] = []
    for arm in ("reference", "candidate"):
        with lever.applied(arm, on_call=lambda arm=arm: calls.append(arm)):  # type: ignore[misc]
            results = [site.fn(i) for i in range(3)]  # type: ignore[attr-defined]
        assert results == ([0, 2, 4] if arm == "reference" else [0, 3, 6])  # each arm's own function ran
    assert calls == ["reference"] * 3 + ["candidate"] * 3
    assert site.fn is _double  # type: ignore[attr-defined]  # restored: no wrapper left behind
    with lever.applied("candidate"):  # no counter: no wrapper (timed trials)
        assert site.fn is not _double and site.fn(1) == 3  # type: ignore[attr-defined]


def test_a_patch_never_called_is_refused_and_one_called_is_not() -> None:
    lever = Lever(name="norm", kind="patch", target="mlx.core.fast.layer_norm", ref=None, cand=None)
    with pytest.raises(VacuousLeverError, match="never called during the candidate arm's prefill path"):
        lever.require_exercised("candidate", 0, during="prefill path")
    lever.require_exercised("candidate", 1, during="prefill path")
    Lever(name="flag", kind="env", target="FLAG", ref="0", cand="1").require_exercised(
        "candidate", 0, during="prefill path"
    )  # an env lever has no site to count: not refused


@pytest.mark.parametrize(
    ("name", "declared", "applies"),
    [
        ("attention", "attention", True),
        ("attention", "kv_cache", False),
        ("attention", None, True),
        ("env:attention", "kv_cache", True),
        ("patch:a.b", "kv_cache", True),
        ("kv", "attention", True),
        ("model", "kv_cache", True),
    ],
)
def test_a_bare_override_addresses_only_its_own_module(name: str, declared: str | None, applies: bool) -> None:
    assert override_applies(name, declared) is applies


def test_a_bare_override_that_addresses_no_module_is_refused() -> None:
    with pytest.raises(LeverError, match=r"no collected gate module declares a lever named 'attention'"):
        check_override_targets("attention", {"gates/test_kv.py": "kv_cache", "gates/test_w.py": "weights"})
    check_override_targets("attention", {"gates/test_kv.py": "kv_cache", "gates/test_a.py": "attention"})
    check_override_targets("FLAG", {"gates/test_x.py": None})  # a module without a lever: an env lever
    check_override_targets("env:attention", {"gates/test_kv.py": "kv_cache"})  # explicit: asked for


def _write_module(root: Path, name: str, body: str) -> Any:
    path = root / f"{name}.py"
    path.write_text(body)
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)  # a later mtime, as an editor's save makes
    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    return importlib.import_module(name)


def test_the_key_follows_the_source_of_every_callable_the_lever_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    v1 = "def ref(x):\n    return x\n\nclass Factory:\n    def __call__(self, value):\n        return open(__file__)\n"
    mod = _write_module(tmp_path, "mlxgate_keyed_ref", v1)
    patch = Lever(name="fn", kind="patch", target="os.path:join", ref="mlxgate_keyed_ref:ref", cand=None)
    context = Lever(name="ctx", kind="context", target=None, ref=0, cand=1, factory=mod.Factory())
    before = (patch.key("reference"), context.key("reference"), patch.key("candidate"))
    assert '"code"' in before[0] and "mlxgate_keyed_ref:ref" in before[0]
    assert "mlxgate_keyed_ref:Factory" in before[1]  # a callable instance is named by its class, not its address
    assert (
        Lever(name="ctx", kind="context", target=None, ref=0, cand=1, factory=mod.Factory()).key("reference")
        == before[1]
    )  # another instance: the same key

    mod = _write_module(tmp_path, "mlxgate_keyed_ref", v1.replace("return x", "return x * 2"))  # same names
    patch = Lever(name="fn", kind="patch", target="os.path:join", ref="mlxgate_keyed_ref:ref", cand=None)
    context = Lever(name="ctx", kind="context", target=None, ref=0, cand=1, factory=mod.Factory())
    assert patch.key("reference") != before[0]
    assert context.key("reference") != before[1]
    assert patch.key("candidate") == before[2]  # the candidate keeps os.path.join: its code did not change


def test_source_digests_name_the_defining_file_and_skip_compiled_code() -> None:
    import hashlib
    import json as json_module

    expected = hashlib.sha256(Path(json_module.__file__).read_bytes()).hexdigest()
    assert source_digest(json_module.dumps) == expected
    assert source_digest(functools.partial(json_module.dumps, indent=2)) == expected  # a partial: its function
    assert source_digest(len) is None  # a builtin: versions are keyed elsewhere


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_kv_lever_on_a_capability_task_it_cannot_change_is_refused(tmp_path: Path, tiny_kv_model_dir: Path) -> None:
    import mlx_lm

    from pytest_mlxgate.capability.runner import run_arm
    from pytest_mlxgate.capability.user_tasks import jsonl_task

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))
    choice = jsonl_task(
        "vacuous_choice",
        _jsonl(tmp_path / "c.jsonl", [{"prompt": "p", "choices": [" a", " b"], "target": " a"}]),
        scoring="choice",
    )
    gen = jsonl_task(
        "vacuous_gen", _jsonl(tmp_path / "g.jsonl", [{"prompt": "Say red:", "target": "red"}]), max_new_tokens=4
    )
    eight = Lever(name="kv8", kind="kv", target=None, ref="plain", cand={"bits": 8}, path="serving")
    with pytest.raises(VacuousLeverError, match="scored by its choices' log-probabilities"):
        run_arm(choice, choice.load("smoke"), model, tokenizer, eight, "candidate")
    late = Lever(name="kv8", kind="kv", target=None, ref="plain", cand={"bits": 8, "start": 5000}, path="serving")
    with pytest.raises(VacuousLeverError, match="capability task vacuous_gen's generation"):
        run_arm(gen, gen.load("smoke"), model, tokenizer, late, "candidate")
    results, _ = run_arm(gen, gen.load("smoke"), model, tokenizer, eight, "candidate")  # tested: runs
    assert len(results) == 1
