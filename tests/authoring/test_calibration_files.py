"""Calibration as data: every gate's limits checked against its `gates/calibration/<module>.json` (fast,
no model: it reads the files), the check failing a planted bad limit, a stale file saying so and naming
the command that refreshes it, the file written deterministically and atomically and never replaced by
a measurement that is not the gate's; and, on the tiny model, `--mlx-calibrate` writing the file and
`--mlx-aa` checking a test's limits against it."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.authoring.calibration_check import known_bad_verdict, module_findings
from pytest_mlxgate.authoring.calibration_file import (
    FORMAT,
    GateSource,
    Limit,
    calibration_model,
    calibration_path,
    read_calibration,
    render,
    write_calibration,
)
from pytest_mlxgate.authoring.serving_code import serving_code, source_digest
from pytest_mlxgate.errors import StaleCalibrationWarning
from pytest_mlxgate.verdicts.calibration import (
    CHECK_ROOM,
    FLOOR_FACTOR,
    QUALITY_BOUNDS,
    check_kl_limit,
    least_kl_limit,
    suggest_limits,
)

REPO = Path(__file__).resolve().parents[2]
GATES = REPO / "gates"
WITH_LIMITS = [p for p in sorted(GATES.glob("test_*.py")) if GateSource.read(p).limits]
#: (gate, model) for every per-model calibration file there is, and every model a gate names limits for.
PER_MODEL = sorted(
    {
        (module, folder.name)
        for folder in (GATES / "calibration").iterdir()
        if folder.is_dir()
        for module in WITH_LIMITS
        if (folder / f"{module.stem}.json").exists()
    }
    | {(module, str(lim.model)) for module in WITH_LIMITS for lim in GateSource.read(module).limits if lim.model}
)


def _skipped_here(module: Path) -> str | None:
    """The reason the module's own `skipif` marks give on this machine (None: it runs here)."""
    sys.path.insert(0, str(module.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"_calibration_check_{module.stem}", module)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
    finally:
        sys.path.remove(str(module.parent))
    marks = getattr(loaded, "pytestmark", [])
    for mark in marks if isinstance(marks, list) else [marks]:
        mark = getattr(mark, "mark", mark)
        if mark.name == "skipif" and mark.args and mark.args[0]:
            return str(mark.kwargs.get("reason", "skipif"))
    return None


def test_the_project_s_gates_with_limits_are_the_ones_expected() -> None:
    """The parametrization below is not vacuous: it covers every gate module with a limit."""
    assert {p.name for p in WITH_LIMITS} >= {
        "test_attention.py",
        "test_kv_cache.py",
        "test_weights.py",
        "test_custom_kernel.py",
    }
    assert "test_snapshot.py" not in {p.name for p in WITH_LIMITS}


@pytest.mark.parametrize("module", WITH_LIMITS, ids=lambda p: p.name)
def test_every_gate_with_kl_limits_declares_a_known_bad(module: Path) -> None:
    """What proves a gate's limits on a model no calibration covers (authoring/proof.py): without one,
    its verdicts there read "limits unproven" and --mlx-require-proof fails them."""
    gate = GateSource.read(module)
    if gate.limits_of(kl=True):
        assert gate.declares_known_bad, f"gates/{module.name} has KL limits and no KNOWN_BAD"


@pytest.mark.parametrize("module", WITH_LIMITS, ids=lambda p: p.name)
def test_every_gate_s_limits_keep_the_rule_against_its_calibration_file(module: Path) -> None:
    shown = f"gates/{module.name}"
    findings = module_findings(module, shown_as=shown)
    if findings.missing:
        reason = _skipped_here(module)
        if reason is None:
            pytest.fail(
                f"{shown} has limits but no calibration file ({findings.file}): run {findings.refresh} "
                "and commit the file it writes"
            )
        pytest.skip(
            f"{shown}: no calibration file, and it does not run here ({reason}); calibrate it where it "
            f"runs: {findings.refresh}"
        )
    if findings.stale:
        warnings.warn(StaleCalibrationWarning(findings.stale_text()), stacklevel=1)
    assert not findings.problems, findings.problem_text()


@pytest.mark.parametrize(("module", "model"), PER_MODEL, ids=lambda x: x.name if isinstance(x, Path) else x)
def test_every_model_s_limits_keep_the_rule_against_that_model_s_calibration_file(module: Path, model: str) -> None:
    """A gate's limits on another built-in model (its own `models=` entries, the gate's elsewhere) against
    `calibration/<model>/<module>.json`: a model the gate names limits for must have its file. Where the
    file shows the lever breaks that model (beyond the quality bounds: no limit can pass it), the gate
    names none for it and must fail the lever there, as its known-bad variant: a true finding, kept red."""
    shown = f"gates/{module.name}"
    findings = module_findings(module, shown_as=shown, model=model)
    assert not findings.missing, f"{shown} names limits for {model} but has no {findings.file}: run {findings.refresh}"
    if findings.stale:
        warnings.warn(StaleCalibrationWarning(findings.stale_text()), stacklevel=1)
    doc = read_calibration(findings.file)
    assert doc is not None
    gate = GateSource.read(module)
    if (doc.get("suggested") or {}).get("breaks"):
        assert not any(lim.model == model for lim in gate.limits), f"{shown}: limits for {model}, whose lever breaks it"
        verdict, why = known_bad_verdict(doc["drift"], gate.limits_of(kl=True, model=model))
        assert verdict == "fail", f"{shown} on {model}: the lever breaks the model but the limits give {verdict}: {why}"
        return
    assert not findings.problems, findings.problem_text()


@pytest.mark.parametrize("module", WITH_LIMITS, ids=lambda p: p.name)
def test_no_gate_docstring_repeats_a_figure_its_calibration_file_holds(module: Path) -> None:
    """The numbers live in the file: the docstring keeps the why. Figures as the terminal prints them
    (4.2e-4, 98.6%, x0.281) of the lever, the A/A floor and the known-bad variant must not reappear."""
    doc = read_calibration(calibration_path(module))
    if doc is None:
        pytest.skip(f"{module.name}: no calibration file here")
    docstring = (module.read_text().split('"""')[1:2] or [""])[0]
    held: set[str] = set()
    tables = [doc["drift"]["metrics"], ((doc.get("known_bad") or {}).get("drift") or {}).get("metrics") or {}]
    for table in tables:
        for key in ("mean", "p99", "top1"):
            for end in ("value", "lower", "upper"):
                x = (table.get(key) or {}).get(end)
                if isinstance(x, float) and x > 0:
                    held.add(f"{100 * x:.1f}%" if key == "top1" else _sci(x))
    for key in ("mean", "p99"):
        x = doc["aa_floor"].get(key)
        if isinstance(x, float) and x > 0:
            held.add(_sci(x))
    held = {f for f in held if not f.isdigit()}  # a bare "8" is the 8 of "8-bit", not a measured figure
    found = sorted(f for f in held if re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", docstring))
    assert not found, f"{module.name}'s docstring repeats figures its calibration file holds: {found}"


def _sci(x: float) -> str:
    if 1e-2 <= abs(x) < 1e3:
        return f"{x:.2g}"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


# -- the check fails what it should -------------------------------------------------------------------


@pytest.fixture
def kv_gate(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of gates/test_kv_cache.py and its calibration file, to plant limits in; the copy stamped
    with this code's serving digest (as if measured on it), so that only what a test plants is stale."""
    gates = tmp_path / "gates"
    (gates / "calibration").mkdir(parents=True)
    module = gates / "test_kv_cache.py"
    shutil.copy(GATES / "test_kv_cache.py", module)
    doc = json.loads((GATES / "calibration" / "test_kv_cache.json").read_text())
    doc["serving_code"] = serving_code()
    (gates / "calibration" / "test_kv_cache.json").write_text(json.dumps(doc))
    return module, doc


def _plant(module: Path, call: str) -> None:
    source = module.read_text()
    planted, n = re.subn(r"assert_kl_below\(paired, [^)]*\)", call, source)
    assert n == 1
    module.write_text(planted)


def test_the_copied_gate_keeps_the_rule_before_anything_is_planted(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, _ = kv_gate
    findings = module_findings(module)
    assert (findings.problems, findings.stale, findings.missing) == ([], [], False)


def test_a_limit_with_too_little_room_above_the_lever_fails(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, doc = kv_gate
    upper = doc["drift"]["metrics"]["mean"]["upper"]
    _plant(module, f"assert_kl_below(paired, mean={upper * 1.5:.3g})")  # the lever clears it, by x1.5 only
    problems = module_findings(module).problems
    assert len(problems) == 1 and re.match(r"mean=\S+ leaves the lever's 95% bound \S+ only x1\.5 of room", problems[0])
    assert f"less than x{CHECK_ROOM:g}" in problems[0]
    assert "the tightest limit the check accepts here: mean=" in problems[0]


def test_a_limit_the_lever_does_not_clear_fails(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, doc = kv_gate
    lower = doc["drift"]["metrics"]["top1"]["lower"]
    _plant(module, f"assert_kl_below(paired, top1={min(0.999, lower + 0.01):.3f})")
    (problem, *_rest) = module_findings(module).problems
    assert "is beyond it, so the gate does not pass the lever it was calibrated on" in problem


def test_a_limit_too_close_to_the_a_a_floor_fails(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, doc = kv_gate
    floor = doc["aa_floor"]["p99"]
    # a lever as exact as the floor: only the floor rule is left (its interval a real one, lower <= value <= upper)
    doc["drift"]["metrics"]["p99"].update(lower=floor / 2, value=floor * 0.75, upper=floor)
    calibration_path(module).write_text(json.dumps(doc))
    _plant(module, f"assert_kl_below(paired, p99={floor * 5:.3g})")
    problems = module_findings(module).problems
    assert any(f"less than x{FLOOR_FACTOR:g}: the gate's verdict may be decided by noise" in p for p in problems)


def test_limits_that_pass_the_known_bad_variant_fail(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, doc = kv_gate
    bad_lower = doc["known_bad"]["drift"]["metrics"]["mean"]["lower"]
    limit = min(QUALITY_BOUNDS["mean"], bad_lower * 2)  # loose enough for the known-bad, within the quality bound
    _plant(module, f"assert_kl_below(paired, mean={limit:.3g})")
    problems = module_findings(module).problems
    assert any(
        p.startswith("KNOWN_BAD = {'bits': 4") and "is not shown to fail the gate's KL limits" in p for p in problems
    ), problems


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            {"declared": False},
            ["KNOWN_BAD: the calibration was measured before the gate declared it and holds no measurement of it"],
        ),
        ({"declared": True, "value": 2}, ["KNOWN_BAD = 2: the calibration holds no measurement of it"]),
        ({"declared": True, "value": 2, "non_finite": True, "message": "NaN logits"}, []),  # the gate goes red on them
    ],
)
def test_a_known_bad_the_file_holds_no_drift_of_is_named_as_such(
    kv_gate: tuple[Path, dict[str, Any]], entry: dict[str, Any], expected: list[str]
) -> None:
    module, doc = kv_gate
    doc["known_bad"] = entry
    calibration_path(module).write_text(json.dumps(doc))
    assert module_findings(module).problems == expected


@pytest.fixture
def rope_gate(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of gates/test_fused_norms_rope.py (its KNOWN_BAD a whole lever), known_bad_ops.py and its
    calibration file, stamped with this code's serving digest."""
    gates = tmp_path / "gates"
    (gates / "calibration").mkdir(parents=True)
    module = gates / "test_fused_norms_rope.py"
    shutil.copy(GATES / "test_fused_norms_rope.py", module)
    shutil.copy(GATES / "known_bad_ops.py", gates / "known_bad_ops.py")
    doc = json.loads((GATES / "calibration" / "test_fused_norms_rope.json").read_text())
    doc["serving_code"] = serving_code()
    (gates / "calibration" / "test_fused_norms_rope.json").write_text(json.dumps(doc))
    return module, doc


def test_limits_that_pass_a_whole_lever_known_bad_fail_naming_what_it_switches(
    rope_gate: tuple[Path, dict[str, Any]],
) -> None:
    module, doc = rope_gate
    assert module_findings(module).problems == []
    gate = GateSource.read(module)
    assert gate.declares_known_bad and gate.known_bad is None  # declared, as a marker: not a literal
    assert "known_bad_ops.py" in gate.digest["parts"]  # the broken kernel's file, named in cand=
    bad_upper = doc["known_bad"]["drift"]["metrics"]["mean"]["upper"]
    _plant(module, f"assert_kl_below(paired, mean={bad_upper * 2:.3g})")  # within the quality bounds, still
    problems = module_findings(module).problems
    assert any(
        p.startswith(
            "KNOWN_BAD = mlx_lever 'rope_base_off' (patch mlx.core.fast.rope: original → known_bad_ops:rope_base_off, "
            "path=serving) is not shown to fail the gate's KL limits (pass: mean ["
        )
        for p in problems
    ), problems


def test_a_whole_lever_known_bad_s_kernel_edited_makes_the_calibration_stale(
    rope_gate: tuple[Path, dict[str, Any]],
) -> None:
    module, _ = rope_gate
    ops = module.parent / "known_bad_ops.py"
    ops.write_text(ops.read_text().replace("base = base * 1.1", "base = base * 1.2"))
    assert [s for s in module_findings(module).stale if "(known_bad_ops.py)" in s]


def test_a_limit_beyond_the_quality_bounds_fails(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, _ = kv_gate
    _plant(module, "assert_kl_below(paired, mean=2.5)")
    assert any("beyond the quality bound" in p for p in module_findings(module).problems)


def test_a_bytes_goal_the_lever_does_not_meet_fails(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, doc = kv_gate
    source = module.read_text()
    planted, n = re.subn(r"assert_(faster|smaller)\(paired, kv=[0-9.]+", r"assert_\1(paired, kv=0.2", source)
    assert n == 1
    module.write_text(planted)
    problems = module_findings(module).problems
    contexts = doc["speed"]["contexts"]
    assert contexts  # at="all": every context the calibration measured is held to the goal
    for tokens, figures in contexts.items():
        measured = f"x{figures['kv']['ratio']:.3g}"
        assert any(p.startswith(f"kv=0.2 @{tokens} tokens: the lever measures {measured}") for p in problems), problems


def test_a_check_of_one_test_reads_only_that_test_s_limits(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, _ = kv_gate
    _plant(module, "assert_kl_below(paired, mean=2.5)")
    assert module_findings(module, test="test_memory").problems == []
    assert module_findings(module, test="test_drift").problems


def test_a_model_s_own_limits_are_checked_against_that_model_s_file_only(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    """`models={"gemma3-270m": {...}}` limits are read from the source per model; the embedded model's
    check reads the gate's own limits and its file, gemma3-270m's its limits (the gate's where it names
    none) against `calibration/gemma3-270m/<module>.json`, and a model without a file of its own has
    none (never the embedded model's)."""
    module, doc = kv_gate
    upper = doc["drift"]["metrics"]["mean"]["upper"]
    tight = f"{upper * 1.5:.3g}"
    _plant(
        module,
        'assert_kl_below(paired, mean=2e-3, p99=3e-2, top1=0.9, models={"gemma3-270m": {"mean": ' + tight + "}})",
    )
    gate = GateSource.read(module)
    own = gate.limits_of("test_drift", kl=True)
    assert {(lim.key, lim.value) for lim in own} == {("mean", 2e-3), ("p99", 3e-2), ("top1", 0.9)}
    on_gemma = {(lim.key, lim.value, lim.model) for lim in gate.limits_of("test_drift", kl=True, model="gemma3-270m")}
    assert on_gemma == {("mean", float(tight), "gemma3-270m"), ("p99", 3e-2, None), ("top1", 0.9, None)}
    assert module_findings(module).problems == []  # the embedded model's limits, its file: as before
    missing = module_findings(module, model="gemma3-270m")
    assert missing.missing and missing.file == module.parent / "calibration" / "gemma3-270m" / "test_kv_cache.json"
    assert "--mlx-candidate gemma3-270m" in missing.refresh
    gemma = calibration_path(module, "gemma3-270m")
    gemma.parent.mkdir()
    # the same figures, as gemma3-270m's: the too-tight gemma3 mean is found, on that file only
    gemma.write_text(json.dumps({**doc, "model": {"name": "gemma3-270m", "commit": "0" * 40}}))
    problems = module_findings(module, model="gemma3-270m").problems
    assert len(problems) == 1 and "only x1.5 of room" in problems[0], problems


def test_a_calibration_belongs_to_the_model_it_measured() -> None:
    from pytest_mlxgate.authoring.calibration_file import calibration_model
    from pytest_mlxgate.config.names import BUILT_MODELS

    assert calibration_model("smollm2-135m", BUILT_MODELS["smollm2-135m"]) is None  # the embedded: the gate's own
    assert calibration_model("gemma3-270m", BUILT_MODELS["gemma3-270m"]) == "gemma3-270m"
    assert calibration_model("x", BUILT_MODELS["gemma3-270m"]) == "gemma3-270m"  # known by its repo
    assert calibration_model("mlx-community/gemma-4-e4b-it-4bit", "mlx-community/gemma-4-e4b-it-4bit") == (
        "mlx-community--gemma-4-e4b-it-4bit"
    )
    assert calibration_model("/some/dir", None) is None


#: A part of a repo id as the hub takes it: word characters at both ends, no "--" or ".." inside.
_HUB_PART = st.from_regex(r"\w([\w.-]{0,18}\w)?", fullmatch=True).filter(
    lambda part: part.isascii() and "--" not in part and ".." not in part
)


@given(org=_HUB_PART, name=_HUB_PART)
def test_a_calibration_s_folder_names_the_candidate_that_measures_it(org: str, name: str) -> None:
    """The command that refreshes a model's calibration names the model as --mlx-candidate takes it:
    the repo id its folder stands for, or the built-in's alias (never the folder name itself)."""
    from pytest_mlxgate.authoring.calibration_file import calibration_candidate, calibration_model
    from pytest_mlxgate.config.names import BUILT_MODELS

    repo = f"{org}/{name}"
    folder = calibration_model(repo, repo)
    assert folder is not None and "/" not in folder
    if repo in BUILT_MODELS.values():
        return
    assert calibration_candidate(folder) == repo
    assert calibration_candidate("gemma3-270m") == "gemma3-270m"


# -- stale ----------------------------------------------------------------------------------------------


def test_a_calibration_measured_on_other_serving_code_is_stale_and_names_the_command(
    kv_gate: tuple[Path, dict[str, Any]],
) -> None:
    module, doc = kv_gate
    doc["serving_code"]["files"]["kl/arms.py"] = "0" * 64
    calibration_path(module).write_text(json.dumps(doc))
    findings = module_findings(module, shown_as="gates/test_kv_cache.py")
    assert len(findings.stale) == 1
    assert "the serving code changed since it was measured (kl/arms.py;" in findings.stale[0]
    assert findings.stale_text().endswith("refresh it: pytest gates/test_kv_cache.py --mlx-calibrate")
    assert findings.problems == []  # the limits are still checked, against the figures it holds


def test_a_calibration_of_another_lever_or_sizes_is_stale(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, _ = kv_gate
    module.write_text(module.read_text().replace("mlx_kl(prompts=16,", "mlx_kl(prompts=32,"))
    assert [s for s in module_findings(module).stale if "the gate's own declarations changed since (pytestmark)" in s]
    module.write_text(
        module.read_text()
        .replace("mlx_kl(prompts=32,", "mlx_kl(prompts=16,")
        .replace('KNOWN_BAD = {"bits": 4,', 'KNOWN_BAD = {"bits": 3,')
    )
    assert [s for s in module_findings(module).stale if "(KNOWN_BAD)" in s]


def test_a_limit_change_docstring_or_formatting_does_not_make_a_calibration_stale(
    kv_gate: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    module, _ = kv_gate
    module.write_text(
        module.read_text()
        .replace('"""Gate:', '"""Gate (reworded):', 1)
        .replace("top1=0.", "top1 = 0.")
        .replace("\nKNOWN_BAD", "\n# a comment\nKNOWN_BAD")
    )
    assert module_findings(module).stale == []
    source = tmp_path / "arms.py"
    source.write_text('"""Doc."""\nimport math\n\ndef f(x):\n    return math.exp(x) + 1\n')
    before = source_digest(source)
    # reworded, reformatted, typed, the import moved into the function: the same computation
    source.write_text(
        '"""Another doc."""\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import os\n\n\n'
        'def f( x: float ) -> float:  # same code\n    """Its doc."""\n    import math\n\n'
        "    return (math.exp(x) + 1)\n"
    )
    assert source_digest(source) == before
    source.write_text('"""Doc."""\nimport math\n\ndef f(x):\n    return math.exp(x) + 2\n')
    assert source_digest(source) != before
    # FILE::NAME: one definition of a file whose rest (records, plumbing) does not make the numbers
    source.write_text("def floors(x):\n    return x * 2\n\ndef record(x):\n    return {'x': x}\n")
    floors = source_digest(source, "floors")
    source.write_text("def floors(x):\n    return x * 2\n\ndef record(x, y):\n    return {'x': x, 'y': y}\n")
    assert source_digest(source, "floors") == floors != source_digest(source, "record")
    source.write_text("def floors(x):\n    return x * 3\n")
    assert source_digest(source, "floors") != floors and source_digest(source, "record") == "absent"


def test_the_serving_code_digest_names_files_that_exist() -> None:
    files = serving_code()["files"]
    assert "kl/arms.py" in files and "serving/batch.py" in files
    assert "absent" not in files.values(), [n for n, d in files.items() if d == "absent"]


# -- the file ---------------------------------------------------------------------------------------------


def _doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "suggested": {"z": 1, "a": 2},
        "calibration_format": FORMAT,
        "module": "gates/test_x.py",
        "drift": {"metrics": {"mean": {"value": 1e-3, "lower": 5e-4, "upper": float("nan")}}},
        "aa_floor": {"mean": 1e-8},
    }
    doc["drift"]["metrics"]["mean"]["upper"] = 2e-3
    doc.update(over)
    return doc


def test_the_file_is_written_in_one_order_every_time(tmp_path: Path) -> None:
    path = tmp_path / "calibration" / "test_x.json"
    write_calibration(path, _doc())
    first = path.read_bytes()
    write_calibration(path, dict(reversed(list(_doc().items()))))
    assert path.read_bytes() == first
    assert list(json.loads(first)) == ["calibration_format", "module", "aa_floor", "drift", "suggested"]
    assert list(json.loads(first)["suggested"]) == ["a", "z"]  # nested: sorted
    assert [p.name for p in path.parent.iterdir()] == ["test_x.json"]  # no temp file left behind
    assert b"NaN" not in render(_doc(extra={"x": float("nan")}))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"drift": {"metrics": {"mean": {"value": 1e-3, "lower": None, "upper": None}}}}, "no 95% interval"),
        ({"aa_floor": {}}, "no A/A floor"),
    ],
)
def test_a_measurement_with_nothing_to_check_against_never_replaces_a_file(
    tmp_path: Path, change: dict[str, Any], words: str
) -> None:
    path = tmp_path / "calibration" / "test_x.json"
    write_calibration(path, _doc())
    good = path.read_bytes()
    with pytest.raises(ValueError, match=words):
        write_calibration(path, _doc(**change))
    assert path.read_bytes() == good


def test_a_file_that_is_not_a_calibration_says_which_and_how_to_rewrite_it(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"x\.json: not JSON .*calibrate again to rewrite it"):
        read_calibration(path)
    path.write_text("[]")
    with pytest.raises(ValueError, match="not a calibration file"):
        read_calibration(path)
    assert read_calibration(tmp_path / "absent.json") is None


# -- the rule, one source ---------------------------------------------------------------------------------

kl_bound = st.floats(min_value=1e-10, max_value=1.0, allow_nan=False)
floor_value = st.floats(min_value=0.0, max_value=1e-3, allow_nan=False)


@given(mean=kl_bound, p99=kl_bound, miss=st.floats(min_value=1e-4, max_value=0.3), floor=floor_value)
def test_every_suggested_limit_keeps_the_check_unless_its_note_says_the_floor_is_too_close(
    mean: float, p99: float, miss: float, floor: float
) -> None:
    kl = {
        "mean": mean / 2,
        "mean_ci": [mean / 4, mean],
        "p99": p99 / 2,
        "quantile_ci": {"p99": [p99 / 4, p99]},
        "top1": 1 - miss / 2,
        "top1_ci": [1 - miss, 1.0],
    }
    floors = {"mean": floor, "p99": floor * 3, "top1": 1 - floor}
    s = suggest_limits(kl, floors, None)
    bounds = {"mean": mean, "p99": p99, "top1": 1 - miss}
    for key, limit in s["kl_limits"].items():
        problems = check_kl_limit(key, limit, lever_bound=bounds[key], floor=floors[key])
        floor_noted = any(n.startswith(f"{key} KL: capped") and "above the A/A floor" in n for n in s["notes"])
        assert problems == [] or (floor_noted and all("A/A floor" in p for p in problems)), (key, limit, problems)


@given(
    key=st.sampled_from(["mean", "p99", "p90", "top1"]),
    bound=st.floats(min_value=1e-9, max_value=0.3),
    floor=floor_value,
)
def test_the_tightest_accepted_limit_is_accepted_and_a_tighter_one_is_not(key: str, bound: float, floor: float) -> None:
    lever_bound, floor_at = (1 - bound, 1 - floor) if key == "top1" else (bound, floor)
    least = least_kl_limit(key, lever_bound, floor_at)
    if least is None:
        return
    assert check_kl_limit(key, least, lever_bound=lever_bound, floor=floor_at) == []
    if least == QUALITY_BOUNDS.get(key):
        return  # at the quality bound: no tighter round step was accepted, by construction
    tighter = 1 - (1 - least) * 0.59 if key == "top1" else least * 0.59  # below the previous round step
    assert check_kl_limit(key, tighter, lever_bound=lever_bound, floor=floor_at)


def test_a_known_bad_variant_is_caught_only_when_its_interval_is_beyond_a_limit() -> None:
    drift = {
        "metrics": {
            "mean": {"value": 0.1, "lower": 0.05, "upper": 0.2},
            "top1": {"value": 0.8, "lower": 0.7, "upper": 0.9},
        }
    }
    assert known_bad_verdict(drift, [Limit("t", "assert_kl_below", "mean", 0.01)])[0] == "fail"
    assert known_bad_verdict(drift, [Limit("t", "assert_kl_below", "mean", 0.1)])[0] == "inconclusive"
    assert known_bad_verdict(drift, [Limit("t", "assert_kl_below", "mean", 0.5)])[0] == "pass"
    assert known_bad_verdict(drift, [Limit("t", "assert_kl_below", "top1", 0.95)])[0] == "fail"
    assert (
        known_bad_verdict(
            drift, [Limit("t", "assert_kl_below", "top1", 0.5), Limit("t", "assert_kl_below", "mean", 0.01)]
        )[0]
        == "fail"
    )
    assert known_bad_verdict(drift, [Limit("t", "assert_kl_below", "top1", 0.5)])[0] == "pass"
    assert math.isclose(QUALITY_BOUNDS["top1"], 0.3)


# -- on the tiny model: --mlx-calibrate writes the file, --mlx-aa reads it --------------------------------

TINY_GATE = """
import pytest
from pytest_mlxgate import assert_faster, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv4", kv=True, ref="plain", cand={{"bits": 4, "group_size": 64}}, path="serving"),
    pytest.mark.mlx_kl(prompts=4, tokens=24, decode=6),
    pytest.mark.mlx_speed(contexts=(16,), decode=2, repetitions=3),
]

KNOWN_BAD = {known_bad}


def test_drift(paired):
    {drift}
"""


def test_in_process_calibrate_writes_the_document_with_every_part(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path
) -> None:
    """The slow test's first session, in process (mutation testing sees the calibration run): the file
    holds the module, the model and machine, the lever's drift and A/A floor, the known-bad's drift, the
    speed figures and the suggested limits, measured under this serving code."""
    pytester.makeini("[pytest]\n")
    (pytester.path / "test_kv.py").write_text(TINY_GATE.format(known_bad="2", drift="pytest.fail('no limits yet')"))
    result = pytester.runpytest_inprocess(
        f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "-p", "no:xdist", "--mlx-allow-untrained",
        "--mlx-db=off", "--mlx-calibrate",
    )  # fmt: skip
    result.assert_outcomes(skipped=1)
    # the terminal's block ends with the known-bad's measurement (the record carries it) and the file written
    result.stdout.fnmatch_lines(
        ["*known-bad KNOWN_BAD = 2: mean KL *: the gate has no KL limits yet (the suggested ones must fail it*"]
    )
    doc = json.loads((pytester.path / "calibration" / "test_kv.json").read_text())
    assert doc["calibration_format"] == 1 and doc["module"] == "test_kv.py"
    assert doc["command"] == "pytest test_kv.py --mlx-calibrate"
    assert doc["model"]["commit"] and doc["model"]["name"] == str(tiny_kv_model_dir)
    assert doc["machine"]["device"] == "cpu" and doc["serving_code"] == serving_code()
    import mlx.core as mx
    import mlx_lm

    assert (doc["versions"]["mlx"], doc["versions"]["mlx_lm"]) == (mx.__version__, mlx_lm.__version__)
    assert doc["machine"]["mlx"] == mx.__version__  # the machine facts hold the versions too
    assert doc["lever"]["kind"] == "kv" and doc["shape"]["tokens"] == 24 and doc["shape"]["decode"] == 6
    drift = doc["drift"]
    assert drift["n_prompts"] == 4 and drift["n_tokens"] == 4 * 6  # the decoded positions of each prompt
    assert drift["metrics"]["mean"]["lower"] <= drift["metrics"]["mean"]["value"] <= drift["metrics"]["mean"]["upper"]
    assert doc["aa_floor"]["chunk"] and doc["aa_floor"]["mean"] >= 0
    bad = doc["known_bad"]
    assert bad["value"] == 2 and bad["drift"]["metrics"]["mean"]["lower"] > drift["metrics"]["mean"]["upper"]
    assert bad["verdict_when_measured"] == {"verdict": "no limits", "limits": []}  # the gate asserted none yet
    speed = doc["speed"]["contexts"]["16"]
    assert 0 < speed["kv"]["ratio"] < 1 and set(speed) >= {"kv", "decode", "prefill"}
    assert set(speed["decode"]) == {"ratio", "lower", "upper", "reference_tps", "candidate_tps"}
    assert set(speed["peak"]) == {"ratio", "lower", "upper"}  # a ratio of memory: no tokens/s beside it
    assert doc["suggested"]["kl_limits"]["mean"] > drift["metrics"]["mean"]["upper"]
    assert any(line.startswith("assert_kl_below(paired, mean=") for line in doc["suggested"]["code"])
    assert {"accepted", "breaks", "kl_limits", "code"} <= set(doc["suggested"])


NAN_GATE = """
import mlx.core as mx
import pytest
from pytest_mlxgate import assert_kl_below

_rms = mx.fast.rms_norm


def scaled(x, weight, eps):
    return _rms(x, weight * 1.01, eps)


def nan_norm(x, weight, eps):
    return x * mx.array(float("nan"))


pytestmark = [
    pytest.mark.mlx_lever("norm", patch="mlx.core.fast.rms_norm", ref=None, cand="test_norm:scaled"),
    pytest.mark.mlx_kl(prompts=3, tokens=24),
]

KNOWN_BAD = "test_norm:nan_norm"


def test_drift(paired):
    assert_kl_below(paired, mean={mean})
"""


def test_in_process_a_hub_model_s_calibration_is_its_own_and_aa_reads_it(
    pytester: pytest.Pytester, tiny_model_dir: Path, hub: Any, hf_env: Any
) -> None:
    """A model from the hub is calibrated into its own folder (its repo id, so no other model's file is
    replaced); a known-bad whose logits are NaN is kept as such with its message; --mlx-aa then reads
    that model's file and fails a limit the file shows wrong; the verdict names the model as pinned."""
    repo = "mlxgate-test/tiny-llama"
    hub.add_repo(repo, {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()})
    hf_env.on_hub(hub)
    pytester.makeini("[pytest]\n")
    pytester.syspathinsert()
    gate = pytester.path / "test_norm.py"
    gate.write_text(NAN_GATE.format(mean="1e-3"))
    common = ("--mlx-allow-untrained", "--mlx-db=off", "-p", "no:randomly", "-p", "no:xdist")
    pytester.runpytest_inprocess(f"--mlx-candidate={repo}", *common, "--mlx-calibrate").assert_outcomes(skipped=1)
    assert not (pytester.path / "calibration" / "test_norm.json").exists()  # the embedded model's file: not this one
    doc = json.loads((pytester.path / "calibration" / "mlxgate-test--tiny-llama" / "test_norm.json").read_text())
    assert doc["model"]["repo"] == repo and doc["model"]["commit"]
    bad = doc["known_bad"]
    assert bad["non_finite"] is True and "drift" not in bad
    assert bad["value"] == "test_norm:nan_norm" and "produced NaN logits" in bad["message"]

    gate.write_text(NAN_GATE.format(mean="1e9"))  # beyond the quality bound: the file shows it wrong
    report = pytester.path / "r.json"
    aa = pytester.runpytest_inprocess(f"--mlx-candidate={repo}", *common, "--mlx-aa", f"--mlx-report={report}")
    aa.assert_outcomes(errors=1)
    aa.stdout.fnmatch_lines(["*mean=1e+09 is beyond the quality bound*"])
    assert f"pytest test_norm.py --mlx-calibrate --mlx-candidate {repo}" in aa.stdout.str()  # the repo, not its folder
    gate.write_text(NAN_GATE.format(mean="1e-3"))
    pytester.runpytest_inprocess(f"--mlx-candidate={repo}", *common, f"--mlx-report={report}")
    (record,) = json.loads(report.read_text())["gates"]
    pinned = record["limits_from"]["model"]  # repo@commit, the commit as pinned (short)
    assert pinned.startswith(f"{repo}@") and doc["model"]["commit"].startswith(pinned.split("@")[1])
    assert record["limits_from"]["file"] == "calibration/mlxgate-test--tiny-llama/test_norm.json"


@pytest.mark.slow  # pytester sessions on the tiny model
def test_calibrate_writes_the_file_and_aa_checks_the_limits_against_it(
    pytester: pytest.Pytester, tiny_kv_model_dir: Path
) -> None:
    pytester.makeini("[pytest]\n")
    common = [f"--mlx-candidate={tiny_kv_model_dir}", "-p", "no:randomly", "--mlx-allow-untrained", "--mlx-db=off"]
    gate = pytester.path / "test_kv.py"
    path = pytester.path / "calibration" / "test_kv.json"
    gate.write_text(TINY_GATE.format(known_bad="2", drift="pytest.fail('no limits yet')"))

    result = pytester.runpytest_subprocess(*common, "--mlx-calibrate")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*known-bad KNOWN_BAD = 2: mean KL *", "*calibration file: calibration/test_kv.json written*"]
    )
    doc = json.loads(path.read_text())
    assert doc["module"] == "test_kv.py" and doc["model"]["commit"] and doc["machine"]["device"] == "cpu"
    assert doc["drift"]["n_prompts"] == 4 and doc["drift"]["metrics"]["mean"]["upper"] is not None
    assert doc["known_bad"]["value"] == 2 and doc["known_bad"]["drift"]["metrics"]["mean"]["lower"] is not None
    assert doc["serving_code"] == serving_code() and doc["speed"]["contexts"]["16"]["kv"]["ratio"] < 1
    good = path.read_bytes()

    # a quick look at other sizes suggests, but leaves the file as it was
    result = pytester.runpytest_subprocess(*common, "--mlx-calibrate", "--mlx-kl-prompts=2")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*calibration file: calibration/test_kv.json not written: --mlx-kl-prompts made "
            "this another measurement than the gate's own*(the one there is kept)"
        ]
    )
    assert path.read_bytes() == good
    # a known-bad variant that cannot be measured fails the calibration, and the file stays too
    gate.write_text(TINY_GATE.format(known_bad='"plain"', drift="pytest.fail('no limits yet')"))
    result = pytester.runpytest_subprocess(*common, "--mlx-calibrate")
    result.assert_outcomes(errors=1)
    assert "During handling of the above exception" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*the known-bad variant KNOWN_BAD = 'plain' could not be measured, so the "
            "calibration file was not written (calibration/test_kv.json is left as it was)*"
        ]
    )
    assert path.read_bytes() == good

    # --mlx-aa: limits the file shows wrong fail before any arm runs, saying which and how to fix them
    gate.write_text(TINY_GATE.format(known_bad="2", drift="assert_kl_below(paired, mean=1e-12)"))
    result = pytester.runpytest_subprocess(*common, "--mlx-aa")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_kv.py: its limits break the calibration rule against *test_kv.json:",
            "*mean=1e-12: the lever's 95% bound * is beyond it, so the gate does not pass the "
            "lever it was calibrated on*",
            "*fix: set the limits the calibration suggests*",
        ]
    )
    # limits that keep the rule (the tightest the check accepts for this file; the untrained tiny model's
    # top-1 A/A floor is too noisy for any top-1 limit): the A/A run goes on to its floor check
    metrics, floors = doc["drift"]["metrics"], doc["aa_floor"]
    least = {key: least_kl_limit(key, metrics[key]["upper"], floors[key]) for key in ("mean", "p99")}
    assert None not in least.values(), least
    drift = "assert_kl_below(paired, " + ", ".join(f"{k}={v!r}" for k, v in least.items()) + ")"
    gate.write_text(TINY_GATE.format(known_bad="2", drift=drift))
    result = pytester.runpytest_subprocess(
        *common, "--mlx-aa", "-W", "error::pytest_mlxgate.errors.StaleCalibrationWarning"
    )
    result.assert_outcomes(passed=1)
    # a stale file: the same run warns, naming the command that refreshes it
    stale = json.loads(good)
    stale["serving_code"]["files"]["serving/caches.py"] = "0" * 64
    path.write_text(json.dumps(stale))
    result = pytester.runpytest_subprocess(*common, "--mlx-aa")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*StaleCalibrationWarning: *test_kv.json is stale: the serving code changed since "
            "it was measured (serving/caches.py;*refresh it: pytest test_kv.py --mlx-calibrate"
        ]
    )
    # no file at all: --mlx-aa as before, silently
    path.unlink()
    result = pytester.runpytest_subprocess(*common, "--mlx-aa")
    result.assert_outcomes(passed=1)
    assert "StaleCalibrationWarning" not in result.stdout.str()


# -- a calibration file is validated, never taken on trust --------------------------------------------


def _set(doc: dict[str, Any], where: str, value: Any) -> None:
    *parents, last = where.split(".")
    for part in parents:
        doc = doc[part]
    doc[last] = value


@pytest.mark.parametrize(
    ("where", "value", "said"),
    [
        ("drift.metrics.mean.upper", -1.0, "drift.metrics.mean.upper -1.0 is a KL below 0"),
        ("aa_floor.mean", float("nan"), "aa_floor.mean nan is not a finite number"),
        ("aa_floor.mean", -5.0, "aa_floor.mean -5.0 is a KL below 0"),
        ("drift.metrics.top1.lower", 1.5, "drift.metrics.top1.lower 1.5 is an agreement rate outside [0, 1]"),
        ("drift.metrics.mean.upper", "abc", "drift.metrics.mean.upper 'abc' is not a finite number"),
        ("drift.metrics.mean.lower", 1.0, "drift.metrics.mean: lower 1.0 > upper"),
        ("drift", [1], "drift is list, not an object"),
        ("drift.metrics.mean", 3, "drift.metrics.mean is int, not {value, lower, upper}"),
        ("known_bad.drift.metrics.mean.value", "x", "known_bad.drift.metrics.mean.value 'x' is not a finite number"),
        ("calibration_format", 99, "calibration_format 99 is newer than this code's"),
        ("model.commit", 7, "model.commit is not text"),
    ],
)
def test_a_calibration_file_that_is_not_what_calibrate_writes_is_a_problem_naming_the_file_and_field(
    kv_gate: tuple[Path, dict[str, Any]], where: str, value: Any, said: str
) -> None:
    module, doc = kv_gate
    _set(doc, where, value)
    calibration_path(module).write_text(json.dumps(doc))  # NaN as JSON's NaN literal, which json.loads reads
    findings = module_findings(module, shown_as="gates/test_kv_cache.py")  # no raw TypeError / AttributeError
    assert len(findings.problems) == 1, findings.problems
    assert str(calibration_path(module)) in findings.problems[0] and said in findings.problems[0]
    assert "calibrate again" in findings.problems[0]


def test_speed_figures_of_the_wrong_kind_are_named(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, doc = kv_gate
    contexts = doc["speed"]["contexts"]
    first = next(iter(contexts))
    contexts["abc"] = contexts[first]
    contexts[first]["decode"]["ratio"] = "big"
    calibration_path(module).write_text(json.dumps(doc))
    (problem,) = module_findings(module).problems
    assert "speed.contexts key 'abc' is not a context length in tokens" in problem
    assert f"speed.contexts.{first}.decode.ratio 'big' is not a number" in problem


def test_a_calibration_of_another_model_at_this_model_s_path_is_a_problem(kv_gate: tuple[Path, dict[str, Any]]) -> None:
    module, _ = kv_gate
    gemma = json.loads((GATES / "calibration" / "gemma3-270m" / "test_kv_cache.json").read_text())
    calibration_path(module).write_text(json.dumps(gemma))
    (problem,) = module_findings(module, shown_as="gates/test_kv_cache.py").problems
    assert "holds a calibration of gemma3-270m, not of smollm2-135m" in problem
    assert "calibration/gemma3-270m/test_kv_cache.json" in problem


def test_every_calibration_file_belongs_to_a_gate_module_here() -> None:
    """A file for a module that does not exist (renamed, deleted) is never read: it would be silently stale."""
    for path in sorted((GATES / "calibration").rglob("*.json")):
        assert (GATES / f"{path.stem}.py").is_file(), f"{path.relative_to(GATES)} calibrates no module in gates/"
        model = None if path.parent.name == "calibration" else path.parent.name
        doc = read_calibration(path)
        assert doc is not None and calibration_model(doc["model"].get("name"), doc["model"].get("repo")) == model


def test_a_speed_goal_without_a_context_is_checked_at_the_longest_one_by_number_not_by_text() -> None:
    """ "1024" sorts before "768" as text: the goal with no `at` belongs to 1024 tokens."""
    from pytest_mlxgate.authoring.calibration_check import _speed_problems

    speed = {
        "contexts": {
            "768": {"decode": {"ratio": 1.5, "lower": 1.4, "upper": 1.6}},
            "1024": {"decode": {"ratio": 1.0, "lower": 0.9, "upper": 1.1}},
        }
    }
    (problem,) = _speed_problems(Limit("t", "assert_faster", "decode", 1.2), speed)
    assert problem.startswith("decode=1.2 @1024 tokens: the lever's interval lower end is x0.9")
    assert _speed_problems(Limit("t", "assert_faster", "decode", 1.2, at=768), speed) == []


def test_a_gate_s_imports_are_named_by_their_top_level_package() -> None:
    import ast

    from pytest_mlxgate.authoring.calibration_file import _imported

    tree = ast.parse("import os.path\nfrom gates.known.bad_ops import x\nfrom . import y\nimport numpy as np\n")
    assert _imported(tree) == ["gates", "numpy", "os"]  # relative imports are the gate's own folder
