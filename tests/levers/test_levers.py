"""Levers: marker and command-line parsing, and that applying one restores everything it touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.errors import LeverError, MlxgateUsageError
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.levers.parsing import lever_from_marker, lever_from_options
from pytest_mlxgate.levers.patching import resolve_object
from pytest_mlxgate.serving.kv_plan import PLAIN, KVSpec

SDPA = "mlx.core.fast.scaled_dot_product_attention"
REF_SDPA = "pytest_mlxgate.reference_ops:scaled_dot_product_attention"
VAR = "MLXGATE_TEST_LEVER_VAR"


def mark(*args: Any, **kwargs: Any) -> pytest.Mark:
    decorator: pytest.MarkDecorator = pytest.mark.mlx_lever(*args, **kwargs)
    return decorator.mark


class Boom(Exception):
    pass


# --- markers --------------------------------------------------------------------------------------


def test_env_marker() -> None:
    lever = lever_from_marker(mark("perf_kernel", env="MLX_BUN_PERF_KERNEL", ref="0", cand="1"))
    assert (lever.name, lever.kind, lever.target, lever.path) == (
        "perf_kernel",
        "env",
        "MLX_BUN_PERF_KERNEL",
        "prefill",
    )
    assert lever.value("reference") == "0" and lever.value("candidate") == "1"
    assert lever.describe() == "perf_kernel: 0 → 1 · path=prefill"


def test_env_marker_values_normalized() -> None:
    lever = lever_from_marker(mark("k", env="X", ref=None, cand=1, path="serving"))
    assert lever.ref is None and lever.cand == "1" and lever.path == "serving"
    assert lever.describe_value("reference") == "unset"
    assert lever_from_marker(mark("k", env="X", ref="unset", cand="1")).ref is None


def test_patch_marker() -> None:
    lever = lever_from_marker(mark("attention", patch=SDPA, ref=REF_SDPA, cand=None, path="prefill"))
    assert (lever.kind, lever.target, lever.ref, lever.cand) == ("patch", SDPA, REF_SDPA, None)
    assert lever.describe_value("reference") == REF_SDPA
    assert lever.describe_value("candidate") == "original"
    assert lever.describe() == "attention: reference_ops:scaled_dot_product_attention → original · path=prefill"


def test_kv_marker_defaults_to_serving() -> None:
    lever = lever_from_marker(mark("kv8", kv=True, ref="plain", cand={"bits": 8, "group_size": 64, "start": 0}))
    assert (lever.kind, lever.target, lever.path) == ("kv", None, "serving")
    assert lever.kv_plan("reference") is PLAIN
    assert lever.kv_plan("candidate").default == KVSpec(8, 64, 0)
    assert lever.describe() == "kv8: plain → 8-bit g64 from token 0 · path=serving"


def test_kv_marker_config_relative_to_base_dir(tmp_path: Path) -> None:
    (tmp_path / "kv_config.json").write_text(json.dumps({"layers": [4] * 10 + [8] * 20}))
    lever = lever_from_marker(mark("kv", kv=True, ref=None, cand="kv_config.json", path="serving"), base_dir=tmp_path)
    assert lever.cand == str(tmp_path / "kv_config.json")
    assert lever.describe_value("candidate") == "kv_config.json (30 layers: 4-bit ×10, 8-bit ×20)"


def test_model_marker() -> None:
    lever = lever_from_marker(mark("model"))
    assert (lever.kind, lever.target, lever.ref, lever.cand) == ("model", None, None, None)
    assert lever.describe() == "model: reference model → candidate model · path=prefill"
    assert lever.kv_plan("candidate") is PLAIN


@contextmanager
def record_factory(value: object) -> Iterator[None]:
    entered.append(value)
    try:
        yield
    finally:
        entered.append(("exit", value))


entered: list[object] = []


def test_context_marker_with_callable_and_name() -> None:
    entered.clear()
    lever = lever_from_marker(mark("myflag", context=record_factory, ref=0, cand=1))
    assert lever.kind == "context" and lever.factory is record_factory
    assert lever.target == f"{__name__}:record_factory"
    with lever.applied("candidate"):
        assert entered == [1]
    assert entered == [1, ("exit", 1)]

    by_name = lever_from_marker(mark("myflag", context=f"{__name__}:record_factory", ref="a", cand="b"))
    assert by_name.factory is None
    entered.clear()
    with pytest.raises(Boom), by_name.applied("reference"):
        raise Boom
    assert entered == ["a", ("exit", "a")]


def test_context_factory_must_return_context_manager() -> None:
    lever = Lever("f", "context", "x:y", ref=0, cand=1, factory=lambda v: v)
    with pytest.raises(LeverError, match="not a context manager"), lever.applied("reference"):
        pass


@pytest.mark.parametrize(
    ("args", "kwargs", "fragment"),
    [
        (("x",), {"env": "A", "patch": "a.b", "ref": 0, "cand": 1}, "exactly one of env=, patch=, kv=True, context="),
        (("x",), {"ref": 0, "cand": 1}, "got none of them"),
        (("x",), {"kv": True, "ref": None, "cand": 8, "path": "prefill"}, "never reads a KV cache back"),
        (("x",), {"env": "A", "ref": 0, "cand": 1, "flavour": "x"}, "unknown keyword flavour"),
        (("x",), {"env": "A", "ref": 0, "cand": 1, "path": "decode"}, "path='decode' is not one of"),
        (("x",), {"env": "A", "ref": 0}, "missing cand="),
        (("x",), {"kv": "yes", "ref": None, "cand": 8}, "write kv=True"),
        (("x",), {"kv": True, "ref": None, "cand": 7}, "bits=7"),
        (("x",), {"env": "A=B", "ref": 0, "cand": 1}, "not an environment variable name"),
        (("x",), {"env": "A", "ref": 0.5, "cand": 1}, "must be a string"),
        (("x",), {"patch": "nodots", "ref": None, "cand": None}, "not an attribute to patch"),
        (("x",), {"patch": "a.b", "ref": "not a name", "cand": None}, "not an object name"),
        (("x",), {"patch": "a.b", "ref": 3, "cand": None}, "must be a callable"),
        (("x",), {"context": 5, "ref": 0, "cand": 1}, "neither a callable"),
        (("model",), {"env": "A", "ref": 0, "cand": 1}, "two-model mode"),
        (("model",), {"ref": "a", "cand": "b"}, "takes no ref, cand"),
        ((), {"env": "A", "ref": 0, "cand": 1}, "lever's name as its one positional argument"),
        (("a", "b"), {"env": "A", "ref": 0, "cand": 1}, "one positional argument"),
        (("x",), {"env": "A", "ref": 0, "cand": 1, "snapshot_plan": "kv_config.json"}, "kv=True levers only"),
        (
            ("x",),
            {"kv": True, "ref": None, "cand": 8, "snapshot_plan": "../kv_config.json"},
            "file name of a kv_config",
        ),
        (("x",), {"kv": True, "ref": None, "cand": 8, "snapshot_plan": "kv_config.txt"}, "file name of a kv_config"),
        (("x",), {"kv": True, "ref": None, "cand": 8, "snapshot_plan": ".json"}, "file name of a kv_config"),
        (("x",), {"kv": True, "ref": None, "cand": 8, "snapshot_plan": 1}, "file name of a kv_config"),
    ],
)
def test_bad_markers(args: tuple[Any, ...], kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(LeverError) as info:
        lever_from_marker(mark(*args, **kwargs))
    message = str(info.value)
    assert message.startswith("marker mlx_lever(")
    assert fragment in message


def test_lever_error_is_a_usage_error() -> None:
    with pytest.raises(MlxgateUsageError):
        lever_from_marker(mark("x"))


def test_lever_itself_refuses_kv_on_prefill() -> None:
    with pytest.raises(LeverError, match="never reads"):
        Lever("kv", "kv", None, None, 8, path="prefill")
    with pytest.raises(LeverError, match="neither 'reference' nor 'candidate'"):
        Lever("e", "env", "A", "0", "1").value("baseline")  # type: ignore[arg-type]


# --- env ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arm", ["reference", "candidate"])
def test_env_absent_before_is_absent_after(monkeypatch: pytest.MonkeyPatch, arm: Any) -> None:
    monkeypatch.delenv(VAR, raising=False)
    lever = Lever("e", "env", VAR, ref=None, cand="1")
    with lever.applied(arm):
        assert os.environ.get(VAR) == (None if arm == "reference" else "1")
    assert VAR not in os.environ
    with pytest.raises(Boom), lever.applied(arm):
        raise Boom
    assert VAR not in os.environ


@pytest.mark.parametrize("arm", ["reference", "candidate"])
def test_env_present_before_is_restored(monkeypatch: pytest.MonkeyPatch, arm: Any) -> None:
    monkeypatch.setenv(VAR, "before")
    lever = Lever("e", "env", VAR, ref=None, cand="")
    with pytest.raises(Boom), lever.applied(arm):
        assert os.environ.get(VAR) == (None if arm == "reference" else "")
        raise Boom
    assert os.environ[VAR] == "before"


def test_env_restored_even_if_body_changes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, "before")
    with Lever("e", "env", VAR, ref="0", cand="1").applied("candidate"):
        os.environ[VAR] = "scribbled"
    assert os.environ[VAR] == "before"


# --- patch ---------------------------------------------------------------------------------------


def _original() -> str:
    return "original"


def _replacement() -> str:
    return "replacement"


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Three throwaway modules: `a` defines f; `b` imported it by name (and as g); `c` has its own f."""
    a, b, c = (types.ModuleType(f"mlxgate_throwaway_{n}") for n in "abc")

    def f() -> str:
        return "original"

    def other() -> str:
        return "c's own"

    a.f = f  # type: ignore[attr-defined]
    b.f = f  # type: ignore[attr-defined]  # from a import f
    b.g = f  # type: ignore[attr-defined]  # from a import f as g: another name, left alone
    c.f = other  # type: ignore[attr-defined]
    for m in (a, b, c):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    return types.SimpleNamespace(a=a, b=b, c=c, f=f, other=other)


def test_patch_reaches_alias_copies_and_restores(modules: types.SimpleNamespace) -> None:
    lever = Lever("p", "patch", "mlxgate_throwaway_a.f", ref=None, cand=_replacement)
    with lever.applied("reference"):  # None: the original stays
        assert modules.a.f is modules.f
    with lever.applied("candidate"):
        assert modules.a.f is _replacement and modules.b.f is _replacement
        assert modules.b.g is modules.f and modules.c.f is modules.other
        assert modules.b.f() == "replacement"
    assert modules.a.f is modules.f and modules.b.f is modules.f and modules.b.g is modules.f


def test_patch_restored_when_body_raises(modules: types.SimpleNamespace) -> None:
    lever = Lever("p", "patch", "mlxgate_throwaway_a:f", ref=f"{__name__}:_replacement", cand=None)
    with pytest.raises(Boom), lever.applied("reference"):
        assert modules.a.f is _replacement and modules.b.f is _replacement
        raise Boom
    assert modules.a.f is modules.f and modules.b.f is modules.f


def test_patch_undoes_copies_bound_during_the_body(
    modules: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    late = types.ModuleType("mlxgate_throwaway_late")
    lever = Lever("p", "patch", "mlxgate_throwaway_a.f", ref=_replacement, cand=None)
    with lever.applied("reference"):
        late.f = modules.a.f  # type: ignore[attr-defined]  # imported while patched
        monkeypatch.setitem(sys.modules, late.__name__, late)
    assert late.f is modules.f
    assert sys.modules[__name__]._replacement is _replacement  # its home kept


def test_patch_value_not_callable(modules: types.SimpleNamespace) -> None:
    lever = Lever("p", "patch", "mlxgate_throwaway_a.f", ref="math:pi", cand=None)
    with pytest.raises(LeverError, match=r"callable but the patch value math:pi is float"), lever.applied("reference"):
        pass
    assert modules.a.f is modules.f


def test_patch_import_errors_name_the_module(modules: types.SimpleNamespace) -> None:
    target = Lever("p", "patch", "no_such_pkg_mlxgate.sub.attr", ref=_replacement, cand=None)
    with (
        pytest.raises(LeverError, match=r"module 'no_such_pkg_mlxgate' cannot be imported"),
        target.applied("reference"),
    ):
        pass
    value = Lever("p", "patch", "mlxgate_throwaway_a.f", ref="no_such_mod_mlxgate:thing", cand=None)
    with pytest.raises(LeverError, match=r"importing module 'no_such_mod_mlxgate' failed"), value.applied("reference"):
        pass
    attr = Lever("p", "patch", "os.path.no_such_attr_mlxgate", ref=_replacement, cand=None)
    with (
        pytest.raises(LeverError, match=r"os\.path has no attribute 'no_such_attr_mlxgate'"),
        attr.applied("reference"),
    ):
        pass
    assert modules.a.f is modules.f


def test_module_failing_on_import_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mlxgate_broken_mod.py").write_text("import mlxgate_missing_dependency\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(LeverError, match=r"importing module 'mlxgate_broken_mod' failed \(ModuleNotFoundError"):
        resolve_object("mlxgate_broken_mod.x", what="target")
    (tmp_path / "mlxgate_raising_mod.py").write_text("raise RuntimeError('half-written')\n")
    with pytest.raises(LeverError, match=r"'mlxgate_raising_mod' failed \(RuntimeError: half-written"):
        resolve_object("mlxgate_raising_mod:x", what="target")


def test_resolve_nanobind_submodule() -> None:
    import mlx.core as mx

    owner, attr, obj = resolve_object(SDPA, what="target")
    assert owner is mx.fast and attr == "scaled_dot_product_attention" and obj is mx.fast.scaled_dot_product_attention


def test_patch_mlx_lm_alias_copies() -> None:
    """mlx_lm model modules bind `scaled_dot_product_attention` from `.base` by name: all are patched."""
    import mlx.core as mx
    from mlx_lm.models import base, llama

    original = base.scaled_dot_product_attention
    assert llama.scaled_dot_product_attention is original
    seen = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return original(*args, **kwargs)

    lever = Lever("sdpa", "patch", "mlx_lm.models.base.scaled_dot_product_attention", ref=spy, cand=None)
    mx.random.seed(0)
    model = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=64,
            num_hidden_layers=3,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=256,
        )
    )
    with lever.applied("reference"):
        assert llama.scaled_dot_product_attention is spy
        mx.eval(model(mx.array([[1, 2, 3]])))
    assert seen == [1, 1, 1]
    assert base.scaled_dot_product_attention is original and llama.scaled_dot_product_attention is original


def test_patch_of_scalar_does_not_hunt_for_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = types.ModuleType("mlxgate_throwaway_sa"), types.ModuleType("mlxgate_throwaway_sb")
    a.FLAG = True  # type: ignore[attr-defined]
    b.FLAG = True  # type: ignore[attr-defined]  # same object (True is a singleton), unrelated meaning
    for m in (a, b):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    with Lever("flag", "patch", "mlxgate_throwaway_sa.FLAG", ref="builtins:len", cand=None).applied("reference"):
        assert a.FLAG is len and b.FLAG is True
    assert a.FLAG is True


# --- command-line override ----------------------------------------------------------------------


def test_options_replace_declared_values() -> None:
    declared = lever_from_marker(mark("perf_kernel", env="MLX_BUN_PERF_KERNEL", ref="0", cand="1", path="serving"))
    lever = lever_from_options("perf_kernel", "unset", "2", declared)
    assert (lever.name, lever.kind, lever.target, lever.path) == (
        "perf_kernel",
        "env",
        "MLX_BUN_PERF_KERNEL",
        "serving",
    )
    assert (lever.ref, lever.cand) == (None, "2")


def test_options_replace_declared_patch_and_kv() -> None:
    patch = lever_from_marker(mark("attention", patch=SDPA, ref=REF_SDPA, cand=None))
    lever = lever_from_options(
        "attention", "original", "pytest_mlxgate.reference_ops.scaled_dot_product_attention", patch
    )
    assert (lever.ref, lever.cand) == (None, "pytest_mlxgate.reference_ops.scaled_dot_product_attention")
    assert lever_from_options("attention", "none", REF_SDPA, patch).ref is None
    with pytest.raises(LeverError, match="not an object name"):
        lever_from_options("attention", "nope", REF_SDPA, patch)
    kv = lever_from_marker(mark("kv8", kv=True, ref="plain", cand=8))
    changed = lever_from_options("kv8", "plain", "q4", kv)
    assert changed.kv_plan("candidate").default == KVSpec(4) and changed.path == "serving"
    with pytest.raises(LeverError, match="bits=9"):
        lever_from_options("kv8", "plain", "q9", kv)


def test_options_context_value_is_passed_as_string() -> None:
    entered.clear()
    declared = lever_from_marker(mark("myflag", context=record_factory, ref=0, cand=1))
    with lever_from_options("myflag", "0", "7", declared).applied("candidate"):
        assert entered == ["7"]


@pytest.mark.parametrize("name", ["MLX_BUN_PERF_KERNEL", "env:MLX_BUN_PERF_KERNEL"])
def test_options_new_env_lever(name: str) -> None:
    lever = lever_from_options(name, "0", "1", None)  # the ancestor's --self VAR --ref-value 0 --cand-value 1
    assert (lever.kind, lever.target, lever.ref, lever.cand, lever.path) == (
        "env",
        "MLX_BUN_PERF_KERNEL",
        "0",
        "1",
        "prefill",
    )


def test_options_new_lever_beside_a_declared_one() -> None:
    declared = lever_from_marker(mark("attention", patch=SDPA, ref=REF_SDPA, cand=None, path="serving"))
    lever = lever_from_options(
        "patch:mlx.core.fast.rms_norm", "pytest_mlxgate.reference_ops:rms_norm", "original", declared
    )
    assert (lever.kind, lever.target, lever.cand, lever.path) == ("patch", "mlx.core.fast.rms_norm", None, "serving")
    kv = lever_from_options("kv", "plain", "bits=8,group_size=32", declared)
    assert kv.kind == "kv" and kv.path == "serving" and kv.kv_plan("candidate").default == KVSpec(8, 32)
    model = lever_from_options("model", None, None, declared)
    assert model.kind == "model"
    ctx = lever_from_options(f"context:{__name__}:record_factory", "a", "b", None)
    assert ctx.kind == "context" and ctx.target == f"{__name__}:record_factory"


def test_options_without_name() -> None:
    declared = lever_from_marker(mark("model"))
    assert lever_from_options(None, None, None, declared) is declared
    with pytest.raises(LeverError, match="without --mlx-lever"):
        lever_from_options(None, "0", None, declared)
    with pytest.raises(LeverError, match="no lever: declare one"):
        lever_from_options("", None, None, None)


@pytest.mark.parametrize(
    ("name", "ref", "cand", "fragment"),
    [
        ("MY_VAR", "0", None, "missing --mlx-cand-value; pass --mlx-ref-value and --mlx-cand-value"),
        ("MY_VAR", None, None, "missing --mlx-ref-value and --mlx-cand-value"),
        ("model", "a", "b", "takes no values"),
        ("not-a-name", "0", "1", "cannot tell what 'not-a-name' switches"),
        ("patch:nodots", "a.b", "original", "not an attribute to patch"),
        ("env:", "0", "1", "not an environment variable name"),
    ],
)
def test_options_errors(name: str, ref: str | None, cand: str | None, fragment: str) -> None:
    with pytest.raises(LeverError) as info:
        lever_from_options(name, ref, cand, None)
    assert fragment in str(info.value) and f"--mlx-lever {name}" in str(info.value)


# --- keys and JSON --------------------------------------------------------------------------------


def test_key_follows_kv_config_content_not_path(tmp_path: Path) -> None:
    config = tmp_path / "kv_config.json"
    config.write_text(json.dumps({"default": 4}))
    lever = lever_from_marker(mark("kv", kv=True, ref=None, cand=str(config)))
    first = lever.key("candidate")
    assert lever.key("candidate") == first
    assert lever.key("reference") != first
    copy = tmp_path / "elsewhere.json"
    copy.write_bytes(config.read_bytes())
    assert lever_from_marker(mark("other", kv=True, ref=None, cand=str(copy))).key("candidate") == first
    config.write_text(json.dumps({"default": 8}))
    assert lever.key("candidate") != first


def test_key_canonical_forms() -> None:
    eight = {lever_from_marker(mark("kv", kv=True, ref=None, cand=v)).key("candidate") for v in (8, "q8", {"bits": 8})}
    assert len(eight) == 1
    env = Lever("e", "env", "A", "0", "1")
    assert env.key("reference") != env.key("candidate")
    assert env.key("reference") != Lever("e", "env", "B", "0", "1").key("reference")
    assert env.key("reference") != Lever("e", "env", "A", "0", "1", path="serving").key("reference")
    assert Lever("renamed", "env", "A", "0", "1").key("reference") == env.key("reference")
    patch = Lever("p", "patch", SDPA, ref=_replacement, cand=None)
    assert json.loads(patch.key("reference"))["value"] == {"callable": f"{__name__}:_replacement"}
    assert json.loads(patch.key("candidate")) == {"kind": "as-loaded", "path": "prefill"}


def test_arms_that_switch_nothing_share_one_key_whatever_lever_names_them() -> None:
    """A KV lever's plain plan, a patch left to the original and a weights lever's weights as loaded all run
    the model as loaded: one key per path, so a run computes (and caches) that reference arm once for all of them.
    What changes anything keeps a key of its own."""
    as_loaded = [
        Lever("kv8", "kv", None, ref=None, cand={"bits": 8}, path="serving"),
        Lever("kv4", "kv", None, ref="plain", cand={"bits": 4}, path="serving"),
        Lever("sdpa", "patch", SDPA, ref=None, cand=_replacement, path="serving"),
        Lever("w4", "weights", None, ref=None, cand={"bits": 4}, path="serving"),
    ]
    assert all(lever.as_loaded("reference") for lever in as_loaded)
    assert len({lever.key("reference") for lever in as_loaded}) == 1
    assert len({lever.key("candidate") for lever in as_loaded}) == len(as_loaded)  # each candidate its own
    assert not any(lever.as_loaded("candidate") for lever in as_loaded)
    changes = [
        Lever("e", "env", "A", ref=None, cand="1", path="serving"),  # unsetting a variable the process has: a change
        Lever("c", "context", "x.y", ref=None, cand=1, path="serving", factory=record_factory),
        Lever("m", "model", None, ref=None, cand=None, path="serving"),
        Lever("kv", "kv", None, ref={"bits": 8}, cand=None, path="serving"),
    ]
    assert not any(lever.as_loaded("reference") for lever in changes)
    assert as_loaded[0].key("reference") not in {lever.key("reference") for lever in changes}
    # the path is part of what is computed
    assert Lever("p", "patch", SDPA, ref=None, cand=_replacement).key("reference") != as_loaded[2].key("reference")


def test_key_tells_lambdas_apart() -> None:
    one = Lever("p", "patch", SDPA, ref=lambda q: q + 1, cand=None)
    two = Lever("p", "patch", SDPA, ref=lambda q: q + 2, cand=None)
    assert one.key("reference") != two.key("reference")
    assert "<lambda>#" in one.describe_value("reference")


def test_to_json_is_json_serializable(tmp_path: Path) -> None:
    config = tmp_path / "kv_config.json"
    config.write_text(json.dumps({"layers": {"0": 4}}))
    levers = [
        lever_from_marker(mark("attention", patch=SDPA, ref=REF_SDPA, cand=None)),
        lever_from_marker(mark("kv", kv=True, ref=None, cand=str(config))),
        lever_from_marker(mark("kv8", kv=True, ref="plain", cand={"bits": 8})),
        lever_from_marker(mark("model")),
        lever_from_marker(mark("myflag", context=record_factory, ref=0, cand={"a": [1]})),
        Lever("p", "patch", SDPA, ref=_replacement, cand=None),
    ]
    for lever in levers:
        data = lever.to_json()
        assert set(data) == {"name", "kind", "target", "ref", "cand", "path"}
        assert all(v is None or isinstance(v, str) for v in data.values())
        assert json.loads(json.dumps(data)) == data
    assert levers[0].to_json() == {
        "name": "attention",
        "kind": "patch",
        "target": SDPA,
        "ref": REF_SDPA,
        "cand": "original",
        "path": "prefill",
    }
    assert levers[4].to_json()["cand"] == "{'a': [1]}"


def test_importing_levers_imports_no_mlx() -> None:
    """levers.py is imported while pytest collects: it (and kvcache, reference_ops) must stay light."""
    code = (
        "import sys, pytest_mlxgate.levers.lever, pytest_mlxgate.serving.kv_plan, pytest_mlxgate.levers.reference_ops\n"
        "print(sorted(m for m in sys.modules if m == 'mlx' or m.startswith(('mlx.', 'mlx_lm'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
