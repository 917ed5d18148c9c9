"""`authoring.new_gate` function by function, each one's whole output pinned: the module text
`render_gate` writes for each kind of lever and arm (every value it fills into the template), the
arms' wording, the spec each lever's options resolve to and every usage error word for word, the
default reference of a fused op, and where and when `write_gate` writes. In process, no model: fast."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from pytest_mlxgate.authoring import new_gate as ng
from pytest_mlxgate.authoring.new_gate import GateSpec, gate_spec, plain_version, render_gate, write_gate
from pytest_mlxgate.errors import MlxgateUsageError

PLAIN_RMS = "pytest_mlxgate.reference_ops:rms_norm"
FUSED_OPS = "layer_norm, rms_norm, rope, scaled_dot_product_attention"

KERNELS = '''
def plain_norm(x, weight, eps):
    """The reference a user brings."""


def fast_norm(x, weight, eps):
    """The kernel under test."""


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """`wholegate_kernels.py` in a folder of its own, importable from there only through `search`."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "wholegate_kernels.py").write_text(KERNELS)
    monkeypatch.chdir(tmp_path)
    yield folder
    sys.modules.pop("wholegate_kernels", None)


# -- render_gate ----------------------------------------------------------------------------------------


def _comment(*lines: str) -> str:
    return "\n".join(f"#: {line}" for line in lines)


PATCH_COMMENT = _comment(
    "The known-bad variant test_drift's limits must catch (test_known_bad fails until it is set, then passes only when",
    "test_drift fails on it): a function with mlx.core.fast.rms_norm's signature and the bug (e.g. mymod:broken). On a",
    "model no calibration file covers, the run first shows the limits fail it there, or the gate is an error.",
)
ENV_COMMENT = _comment(
    "The known-bad variant test_drift's limits must catch (test_known_bad fails until it is set, then passes only when",
    "test_drift fails on it): a value of MLX_K that selects a broken variant (e.g. BROKEN). On a model no calibration",
    "file covers, the run first shows the limits fail it there, or the gate is an error.",
)
SERVING = (
    "Serving path, what `mlx_lm.generate` runs: each prompt's prefix is prefilled through mlx_lm's KV\n"
    "cache, then its last `decode` tokens are fed one at a time."
)
PREFILL = "Prefill path: one teacher-forced forward per prompt, so every call sees the whole causal block."
PATCH_LEVER = (
    "Lever `{name}` patches `mlx.core.fast.rms_norm` (and every module-level copy bound by that name, as a\n"
    "model file's own import), restored after each arm:\n"
    "- reference arm: {ref};\n"
    "- candidate arm: {cand}."
)

CASES = {
    "patch, the plain op as reference, serving": (
        GateSpec("fused_norm", "patch", "mlx.core.fast.rms_norm", PLAIN_RMS, None, "serving"),
        "gates/test_fused_norm.py",
        {
            "title": f"`fused_norm` (patch `mlx.core.fast.rms_norm`): the original vs `{PLAIN_RMS}`.",
            "lever": PATCH_LEVER.format(
                name="fused_norm",
                ref="`pytest_mlxgate.reference_ops:rms_norm`: the same maths in plain mlx ops, in float32",
                cand="the original `mlx.core.fast.rms_norm`, as it ships (the code under test)",
            ),
            "path": SERVING,
            "calibrate": "pytest gates/test_fused_norm.py --mlx-calibrate",
            "calibrate_literal": '"pytest gates/test_fused_norm.py --mlx-calibrate"',
            "plant": "pytest gates/test_fused_norm.py --mlx-lever fused_norm",
            "plant_values": f"--mlx-ref-value {PLAIN_RMS} --mlx-cand-value mymod:broken",
            "plant_note": "mymod:broken: a function with mlx.core.fast.rms_norm's signature and the bug",
            "stem": "test_fused_norm",
            "marker": (
                '        "fused_norm",\n'
                '        patch="mlx.core.fast.rms_norm",\n'
                f'        ref="{PLAIN_RMS}",\n'
                "        cand=None,\n"
                '        path="serving",'
            ),
            "known_bad_comment": PATCH_COMMENT,
        },
    ),
    "patch, the user's ref and cand, a folder with a space": (
        GateSpec("mine", "patch", "mlx.core.fast.rms_norm", "k:plain_norm", "k:fast_norm"),
        "my gates/test_mine.py",
        {
            "title": "`mine` (patch `mlx.core.fast.rms_norm`): `k:fast_norm` vs `k:plain_norm`.",
            "lever": PATCH_LEVER.format(
                name="mine",
                ref="`k:plain_norm` (TODO: why it is the trusted reference)",
                cand="`k:fast_norm`, the code under test",
            ),
            "path": PREFILL,
            "calibrate": "pytest 'my gates/test_mine.py' --mlx-calibrate",
            "calibrate_literal": "\"pytest 'my gates/test_mine.py' --mlx-calibrate\"",
            "plant": "pytest 'my gates/test_mine.py' --mlx-lever mine",
            "plant_values": "--mlx-ref-value k:plain_norm --mlx-cand-value mymod:broken",
            "plant_note": "mymod:broken: a function with mlx.core.fast.rms_norm's signature and the bug",
            "stem": "test_mine",
            "marker": (
                '        "mine",\n'
                '        patch="mlx.core.fast.rms_norm",\n'
                '        ref="k:plain_norm",\n'
                '        cand="k:fast_norm",\n'
                '        path="prefill",'
            ),
            "known_bad_comment": PATCH_COMMENT,
        },
    ),
    "patch, the original as reference": (
        GateSpec("own", "patch", "mlx.core.fast.rms_norm", None, PLAIN_RMS),
        "test_own.py",
        {
            "title": "`own` (patch `mlx.core.fast.rms_norm`): `pytest_mlxgate.reference_ops:rms_norm` vs the original.",
            "lever": PATCH_LEVER.format(
                name="own",
                ref="the original `mlx.core.fast.rms_norm`, as it ships",
                cand="`pytest_mlxgate.reference_ops:rms_norm`: the same maths in plain mlx ops, in float32",
            ),
            "path": PREFILL,
            "calibrate": "pytest test_own.py --mlx-calibrate",
            "calibrate_literal": '"pytest test_own.py --mlx-calibrate"',
            "plant": "pytest test_own.py --mlx-lever own",
            "plant_values": "--mlx-ref-value original --mlx-cand-value mymod:broken",
            "plant_note": "mymod:broken: a function with mlx.core.fast.rms_norm's signature and the bug",
            "stem": "test_own",
            "marker": (
                '        "own",\n'
                '        patch="mlx.core.fast.rms_norm",\n'
                "        ref=None,\n"
                f'        cand="{PLAIN_RMS}",\n'
                '        path="prefill",'
            ),
            "known_bad_comment": PATCH_COMMENT,
        },
    ),
    "env, unset as reference": (
        GateSpec("kern", "env", "MLX_K", "unset", "1", "serving"),
        "gates/test_kern.py",
        {
            "title": "`kern` (env `MLX_K`): '1' vs unset.",
            "lever": (
                "Lever `kern` sets the environment variable `MLX_K` for each arm (read at call time),\n"
                "restored afterwards:\n"
                "- reference arm: `MLX_K` unset;\n"
                "- candidate arm: `MLX_K='1'`, the code under test."
            ),
            "path": SERVING,
            "calibrate": "pytest gates/test_kern.py --mlx-calibrate",
            "calibrate_literal": '"pytest gates/test_kern.py --mlx-calibrate"',
            "plant": "pytest gates/test_kern.py --mlx-lever kern",
            "plant_values": "--mlx-ref-value unset --mlx-cand-value BROKEN",
            "plant_note": "BROKEN: a value of MLX_K that selects the broken variant",
            "stem": "test_kern",
            "marker": (
                '        "kern",\n'
                '        env="MLX_K",\n'
                '        ref="unset",\n'
                '        cand="1",\n'
                '        path="serving",'
            ),
            "known_bad_comment": ENV_COMMENT,
        },
    ),
    "env, values that need quoting and escaping": (
        GateSpec("q", "env", "MLX_K", 'a "b" \\c', "UNSET"),
        "gates/test_q.py",
        {
            "title": "`q` (env `MLX_K`): unset vs 'a \\\"b\\\" \\\\\\\\c'.",
            "lever": (
                "Lever `q` sets the environment variable `MLX_K` for each arm (read at call time),\n"
                "restored afterwards:\n"
                "- reference arm: `MLX_K='a \\\"b\\\" \\\\\\\\c'`;\n"
                "- candidate arm: `MLX_K` unset, the code under test."
            ),
            "path": PREFILL,
            "calibrate": "pytest gates/test_q.py --mlx-calibrate",
            "calibrate_literal": '"pytest gates/test_q.py --mlx-calibrate"',
            "plant": "pytest gates/test_q.py --mlx-lever q",
            "plant_values": "--mlx-ref-value 'a \\\"b\\\" \\\\c' --mlx-cand-value BROKEN",
            "plant_note": "BROKEN: a value of MLX_K that selects the broken variant",
            "stem": "test_q",
            "marker": (
                '        "q",\n'
                '        env="MLX_K",\n'
                "        ref='a \"b\" \\\\c',\n"
                '        cand="UNSET",\n'
                '        path="prefill",'
            ),
            "known_bad_comment": ENV_COMMENT,
        },
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_module_text_fills_every_value_of_the_template(case: str) -> None:
    spec, shown, fields = CASES[case]
    assert render_gate(spec, shown_path=shown) == ng._MODULE.substitute(fields)


@pytest.mark.parametrize("case", list(CASES))
def test_the_module_text_reads_back_as_the_lever_it_declares(case: str) -> None:
    spec, shown, _ = CASES[case]
    namespace: dict[str, Any] = {}
    exec(compile(render_gate(spec, shown_path=shown), shown, "exec"), namespace)
    lever = namespace["pytestmark"][0]
    assert lever.mark.args == (spec.name,)
    assert lever.mark.kwargs == {spec.kind: spec.target, "ref": spec.ref, "cand": spec.cand, "path": spec.path}
    assert namespace["KNOWN_BAD"] is None


def test_an_env_gate_with_no_reference_value_plants_against_unset() -> None:
    text = render_gate(GateSpec("e", "env", "V", None, "1"), shown_path="test_e.py")
    assert "- reference arm: `V` unset;\n" in text
    assert "  `pytest test_e.py --mlx-lever e\n  --mlx-ref-value unset --mlx-cand-value BROKEN`\n" in text
    assert "(env `V`): '1' vs unset." in text


def test_the_known_bad_comment_wraps_at_116_columns() -> None:
    """Its second line is 105 wide, and the next word would make it 117."""
    text = render_gate(GateSpec("k", "env", "MLX_KKK", "0", "1"), shown_path="test_k.py")
    assert (
        _comment(
            "The known-bad variant test_drift's limits must catch (test_known_bad fails until it is set, then passes "
            "only when",
            "test_drift fails on it): a value of MLX_KKK that selects a broken variant (e.g. BROKEN). On a model no",
            "calibration file covers, the run first shows the limits fail it there, or the gate is an error.",
        )
        + "\nKNOWN_BAD = None\n"
        in text
    )


# -- the arms' words ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "arm", "expected"),
    [
        (None, "reference", "the original `m.f`, as it ships"),
        (None, "candidate", "the original `m.f`, as it ships (the code under test)"),
        (PLAIN_RMS, "reference", f"`{PLAIN_RMS}`: the same maths in plain mlx ops, in float32"),
        (PLAIN_RMS, "candidate", f"`{PLAIN_RMS}`: the same maths in plain mlx ops, in float32"),
        (
            "pytest_mlxgate.reference_ops.rms_norm",
            "reference",
            "`pytest_mlxgate.reference_ops.rms_norm` (TODO: why it is the trusted reference)",
        ),
        ("k:fast", "candidate", "`k:fast`, the code under test"),
        ("k:plain", "reference", "`k:plain` (TODO: why it is the trusted reference)"),
    ],
)
def test_a_patch_arm_in_words(value: str | None, arm: str, expected: str) -> None:
    assert ng._patch_arm(value, "m.f", arm) == expected


@pytest.mark.parametrize(
    ("value", "arm", "short"),
    [
        (None, "`V` unset", "unset"),
        ("unset", "`V` unset", "unset"),
        ("UnSet", "`V` unset", "unset"),
        ("0", "`V='0'`", "'0'"),
        ("unset it", "`V='unset it'`", "'unset it'"),
        ("", "`V=''`", "''"),
    ],
)
def test_an_env_arm_in_words(value: str | None, arm: str, short: str) -> None:
    assert (ng._env_arm("V", value), ng._env_short(value)) == (arm, short)


@pytest.mark.parametrize(("value", "short"), [(None, "the original"), ("k:f", "`k:f`")])
def test_a_patch_value_in_short(value: str | None, short: str) -> None:
    assert ng._patch_short(value) == short


# -- plain_version --------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "rope", "scaled_dot_product_attention"])
def test_a_fused_op_with_a_plain_version_has_it_as_its_default_reference(op: str) -> None:
    assert plain_version(getattr(mx.fast, op)) == f"pytest_mlxgate.reference_ops:{op}"


@pytest.mark.parametrize("op", [mx.fast.metal_kernel, len, 3, None], ids=["fused, no plain", "builtin", "int", "None"])
def test_anything_else_has_none(op: object) -> None:
    assert plain_version(op) is None


def test_without_mlx_imported_nothing_is_a_fused_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "mlx.core")
    assert plain_version(mx.fast.rms_norm) is None


def test_only_a_callable_op_is_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake mlx.core whose `fast.rms_norm` is no function: `op` cannot be a fused op."""
    value = object()
    fake = types.ModuleType("mlx.core")
    fake.fast = types.SimpleNamespace(rms_norm=value)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlx.core", fake)
    assert plain_version(value) is None
    fake.fast = types.SimpleNamespace(rms_norm=len)  # type: ignore[attr-defined]
    assert plain_version(len) == PLAIN_RMS
    fake.fast = None  # type: ignore[attr-defined]
    assert plain_version(len) is None


# -- the spec and its usage errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "spec"),
    [
        (
            {"patch": "mlx.core.fast.rms_norm"},
            GateSpec("g", "patch", "mlx.core.fast.rms_norm", PLAIN_RMS, None),
        ),
        (
            {"patch": "mlx.core.fast:rope", "path": "serving"},
            GateSpec("g", "patch", "mlx.core.fast:rope", "pytest_mlxgate.reference_ops:rope", None, "serving"),
        ),
        (
            {
                "patch": "mlx.core.fast.rms_norm",
                "ref": "wholegate_kernels:plain_norm",
                "cand": "wholegate_kernels.fast_norm",
            },
            GateSpec(
                "g", "patch", "mlx.core.fast.rms_norm", "wholegate_kernels:plain_norm", "wholegate_kernels.fast_norm"
            ),
        ),
        (
            {"patch": "mlx.core.fast.rms_norm", "ref": "Original", "cand": PLAIN_RMS},
            GateSpec("g", "patch", "mlx.core.fast.rms_norm", None, PLAIN_RMS),
        ),
        (
            {"patch": "mlx.core.fast.rms_norm", "ref": "wholegate_kernels:plain_norm", "cand": "NONE"},
            GateSpec("g", "patch", "mlx.core.fast.rms_norm", "wholegate_kernels:plain_norm", None),
        ),
        (
            {"patch": "wholegate_kernels.NOT_A_FUNCTION", "ref": "original", "cand": "wholegate_kernels:fast_norm"},
            GateSpec("g", "patch", "wholegate_kernels.NOT_A_FUNCTION", None, "wholegate_kernels:fast_norm"),
        ),
        ({"env": "MLX_K", "ref": "unset", "cand": "1"}, GateSpec("g", "env", "MLX_K", "unset", "1")),
        (
            {"env": "_K9", "ref": "0", "cand": "unsetx", "path": "serving"},
            GateSpec("g", "env", "_K9", "0", "unsetx", "serving"),
        ),
    ],
    ids=repr,
)
def test_a_lever_s_options_resolve_to_its_spec(kernels: Path, options: dict[str, str], spec: GateSpec) -> None:
    assert gate_spec("g", search=kernels, **options) == spec  # type: ignore[arg-type]
    assert str(kernels) not in sys.path  # the folder is on sys.path only while the spec is resolved


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("fused-norm", "fused_norm"),
        ("X-ray", "X_ray"),
        ("8bit", "lever_8bit"),
        ("--", "my_lever"),
        ("a b!!c_", "a_b_c"),
        ("", "my_lever"),
    ],
)
def test_a_name_that_is_no_identifier_is_refused_with_one_that_is(name: str, fix: str) -> None:
    with pytest.raises(MlxgateUsageError) as raised:
        gate_spec(name, env="X", ref="0", cand="1")
    assert str(raised.value) == (
        f"NAME {name!r} is not a Python identifier (letters, digits and _, not starting with a digit): it names the "
        f"lever and the module test_NAME.py; use e.g. {fix!r}"
    )


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        (
            "g",
            {},
            "give exactly one of --patch module.attr (a function the lever swaps) or --env VAR (an environment "
            "variable it sets); got neither",
        ),
        (
            "g",
            {"patch": "m.f", "env": "X"},
            "give exactly one of --patch module.attr (a function the lever swaps) or --env VAR (an environment "
            "variable it sets); got both",
        ),
        (
            "g",
            {"env": "MLX_K=a=b", "ref": "0", "cand": "1"},
            "--env 'MLX_K=a=b' is not an environment variable name (letters, digits and _); give the name alone "
            "(--env MLX_K) and its values with --ref/--cand",
        ),
        (
            "g",
            {"env": "9K", "ref": "0", "cand": "1"},
            "--env '9K' is not an environment variable name (letters, digits and _)",
        ),
        (
            "g",
            {"env": "K"},
            "--env K needs --ref and --cand: the value each arm sets it to (e.g. --ref 0 --cand 1; 'unset' unsets it)",
        ),
        (
            "g",
            {"env": "K", "cand": "1"},
            "--env K needs --ref: the value each arm sets it to (e.g. --ref 0 --cand 1; 'unset' unsets it)",
        ),
        (
            "g",
            {"env": "K", "ref": "1"},
            "--env K needs --cand: the value each arm sets it to (e.g. --ref 0 --cand 1; 'unset' unsets it)",
        ),
        (
            "g",
            {"env": "K", "ref": "a\0b", "cand": "1"},
            "--ref 'a\\x00b': an environment variable's value cannot hold a NUL byte",
        ),
        (
            "g",
            {"env": "K", "ref": "1", "cand": "\0"},
            "--cand '\\x00': an environment variable's value cannot hold a NUL byte",
        ),
        (
            "g",
            {"env": "K", "ref": "Unset", "cand": "UNSET"},
            "--ref and --cand both set K to 'Unset': both arms would run the same code and the gate would measure "
            "nothing; give the candidate its own value",
        ),
        (
            "g",
            {"env": "K", "ref": "1", "cand": "1"},
            "--ref and --cand both set K to '1': both arms would run the same code and the gate would measure "
            "nothing; give the candidate its own value",
        ),
        (
            "g",
            {"patch": "wholegate_kernels.fast_norm"},
            "--patch wholegate_kernels.fast_norm: no default reference arm (pytest_mlxgate.reference_ops has "
            f"plain-ops versions of mlx.core.fast.{{{FUSED_OPS}}} only); give --ref package.module:function (what "
            "the reference arm runs in its place), or --ref original with --cand package.module:function to make "
            "the original the reference",
        ),
        (
            "g",
            {"patch": "mlx.core.fast.rms_norm", "ref": "none"},
            "--ref and --cand both run the original in place of mlx.core.fast.rms_norm: the gate would measure "
            "nothing; give the candidate (--cand, default: the original) something else to run",
        ),
        (
            "g",
            {
                "patch": "mlx.core.fast.rms_norm",
                "ref": "wholegate_kernels:fast_norm",
                "cand": "wholegate_kernels:fast_norm",
            },
            "--ref and --cand both run wholegate_kernels:fast_norm in place of mlx.core.fast.rms_norm: the gate "
            "would measure nothing; give the candidate (--cand, default: the original) something else to run",
        ),
        (
            "g",
            {"patch": "mlx.core.fast.rms_norm", "cand": "wholegate_kernels:NOT_A_FUNCTION"},
            "--cand wholegate_kernels:NOT_A_FUNCTION: mlx.core.fast.rms_norm is callable but "
            "wholegate_kernels:NOT_A_FUNCTION is int; name a function with the same signature as "
            "mlx.core.fast.rms_norm",
        ),
        (
            "g",
            {"patch": "mlx.core.fast.rms_norm", "ref": "wholegate_kernels:NOT_A_FUNCTION"},
            "--ref wholegate_kernels:NOT_A_FUNCTION: mlx.core.fast.rms_norm is callable but "
            "wholegate_kernels:NOT_A_FUNCTION is int; name a function with the same signature as "
            "mlx.core.fast.rms_norm",
        ),
    ],
)
def test_every_usage_error_word_for_word(kernels: Path, name: str, options: dict[str, str], message: str) -> None:
    with pytest.raises(MlxgateUsageError) as raised:
        gate_spec(name, search=kernels, **options)  # type: ignore[arg-type]
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        ({"patch": "mlx.core.fast.rms_nrom"}, "--patch 'mlx.core.fast.rms_nrom'"),
        ({"patch": "mlx.core.fast.rms_norm", "ref": "wholegate_kernels:nope"}, "--ref 'wholegate_kernels:nope'"),
        ({"patch": "mlx.core.fast.rms_norm", "cand": "wholegate_kernels:nope"}, "--cand 'wholegate_kernels:nope'"),
    ],
)
def test_a_patch_value_that_does_not_resolve_is_named_by_its_option(
    kernels: Path, options: dict[str, str], flag: str
) -> None:
    with pytest.raises(MlxgateUsageError) as raised:
        gate_spec("g", search=kernels, **options)  # type: ignore[arg-type]
    assert str(raised.value).startswith(f"{flag}: ")  # the rest is resolve_object's, tested with the levers


# -- write_gate -----------------------------------------------------------------------------------------

SPEC = GateSpec("kern", "env", "MLX_K", "unset", "1")


def test_the_gate_is_written_in_its_folder_made_if_missing_and_named_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_gate(SPEC, Path("a b") / "gates")
    assert path == Path("a b") / "gates" / "test_kern.py"
    assert path.read_text() == render_gate(SPEC, shown_path="a b/gates/test_kern.py")
    outside = tmp_path.parent / f"{tmp_path.name}_out"
    written = write_gate(SPEC, outside)  # outside the working directory: named as given
    assert written.read_text() == render_gate(SPEC, shown_path=str(outside / "test_kern.py"))


def test_an_existing_gate_or_a_file_for_a_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gates").mkdir()
    (tmp_path / "gates" / "test_kern.py").write_text("mine")
    with pytest.raises(MlxgateUsageError) as raised:
        write_gate(SPEC, Path("gates"))
    assert str(raised.value) == (
        "gates/test_kern.py already exists and mlxgate never overwrites a file; choose another NAME, or delete "
        "gates/test_kern.py first if you mean to start that gate over"
    )
    assert (tmp_path / "gates" / "test_kern.py").read_text() == "mine"
    (tmp_path / "flat").write_text("")
    with pytest.raises(MlxgateUsageError) as raised:
        write_gate(SPEC, Path("flat"))
    assert str(raised.value) == "--dir flat is a file, not a folder; give the folder the gate goes in"
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "test_kern.py").symlink_to(tmp_path / "nowhere")
    with pytest.raises(MlxgateUsageError, match="already exists"):
        write_gate(SPEC, Path("links"))


def test_a_gate_s_folder_that_exists_is_written_into(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gates").mkdir()
    assert write_gate(SPEC, Path("gates")).read_text() == render_gate(SPEC, shown_path="gates/test_kern.py")


def test_a_gate_made_meanwhile_is_refused_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process writes test_kern.py after the check and before the write: the "x" open refuses it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gates").mkdir()
    render = ng.render_gate

    def racing(spec: GateSpec, *, shown_path: str) -> str:
        (tmp_path / "gates" / "test_kern.py").write_text("theirs")
        return render(spec, shown_path=shown_path)

    monkeypatch.setattr(ng, "render_gate", racing)
    with pytest.raises(MlxgateUsageError, match=r"^gates/test_kern\.py already exists and mlxgate never overwrites"):
        write_gate(SPEC, Path("gates"))
    assert (tmp_path / "gates" / "test_kern.py").read_text() == "theirs"


def test_a_patch_value_is_found_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wholegate_cwd_kernels.py").write_text(KERNELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "wholegate_cwd_kernels", raising=False)
    assert str(tmp_path) not in sys.path
    try:
        spec = gate_spec("g", patch="mlx.core.fast.rms_norm", cand="wholegate_cwd_kernels:fast_norm")
    finally:
        sys.modules.pop("wholegate_cwd_kernels", None)
    assert spec == GateSpec("g", "patch", "mlx.core.fast.rms_norm", PLAIN_RMS, "wholegate_cwd_kernels:fast_norm")
    assert str(tmp_path) not in sys.path
