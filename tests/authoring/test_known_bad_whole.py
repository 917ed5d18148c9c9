"""`authoring.known_bad` function by function, on made-up arms (no model): the known-bad arm's run field by
field for each kind of lever, the lever a value or a whole lever builds, every outcome of the drift test on
that arm and the message it gives, and a passed limit as the message names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_mlxgate.authoring import known_bad as known_bad_module
from pytest_mlxgate.authoring.known_bad import assert_known_bad_fails, known_bad_paired
from pytest_mlxgate.errors import LeverError, MlxgateUsageError, NonFiniteLogitsError
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.levers.weights import WeightsSpec
from pytest_mlxgate.verdicts.conclude import Conclusion
from pytest_mlxgate.verdicts.known_bad_step import known_bad_step

NODEID, RERUN = "gates/test_g.py::test_known_bad", "pytest gates/test_g.py::test_known_bad"
ENV = Lever("flag", "env", "MLXGATE_FLAG", "0", "1")
WEIGHTS = Lever("w", "weights", None, None, {"bits": 4, "group_size": 64})
BOTH_QUANTIZED = Lever("w", "weights", None, {"bits": 8, "group_size": 64}, {"bits": 4, "group_size": 64})
CONTEXT = Lever("fused", "context", "pytest_mlxgate.reference_ops:fast_ops", "plain", "fused", "serving")


class _Counters:
    pass


@dataclass
class _Run:
    """The fields of `PairedRun` the known-bad arm replaces, each with a value that shows whether it was
    (what a run measured lives in its runners, which `dataclasses.replace` makes afresh)."""

    lever: Lever
    candidate: object = "the candidate"
    reference: object = "the reference"
    speed_shape: object = "the speed shape"
    counters: object = field(default_factory=_Counters)
    aa: bool = False
    server: object = "the server"  # --mlx-cand-server: the known-bad never runs on it
    ref_server: object = "the reference server"  # --mlx-ref-server: nor against it


@dataclass
class _Paired:
    run: _Run
    item: Any = field(default_factory=lambda: SimpleNamespace(nodeid=NODEID, path=Path("/g/gates/test_g.py")))
    rerun: str = RERUN
    nodeid: str = NODEID
    published: bool = False

    @property
    def lever(self) -> Lever:
        return self.run.lever


def _arm_run(bad_paired: Any) -> dict[str, Any]:
    run = bad_paired.run
    return {k: v for k, v in vars(run).items() if k not in ("counters", "server", "ref_server")}


def _fresh(paired: _Paired, bad_paired: Any) -> None:
    """What every known-bad arm starts from: nothing measured, its own counters, no speed."""
    assert type(bad_paired).__name__ == "_KnownBadPaired"
    assert (bad_paired.item, bad_paired.rerun, bad_paired.nodeid) == (paired.item, RERUN, NODEID)
    assert bad_paired.run.server is None and paired.run.server == "the server"  # never the server asked again
    assert bad_paired.run.ref_server is None and paired.run.ref_server == "the reference server"
    assert (bad_paired.verdicts, bad_paired.checks, bad_paired.published) == ([], [], False)
    assert isinstance(bad_paired.run.counters, _Counters) and bad_paired.run.counters is not paired.run.counters
    assert paired.run.lever in (ENV, WEIGHTS, BOTH_QUANTIZED, CONTEXT)  # the module's run is left as it was


def test_a_value_known_bad_is_the_module_s_lever_with_that_candidate() -> None:
    paired = _Paired(_Run(ENV))
    bad = known_bad_paired(paired, "7")  # type: ignore[arg-type]
    _fresh(paired, bad)
    assert _arm_run(bad) == {
        "lever": Lever("flag", "env", "MLXGATE_FLAG", "0", "7"),
        "candidate": "the candidate",
        "reference": "the reference",
        "speed_shape": None,
        "aa": False,
    }


def test_the_module_s_own_reference_is_no_known_bad() -> None:
    with pytest.raises(MlxgateUsageError) as e:
        known_bad_paired(_Paired(_Run(ENV)), "0")  # type: ignore[arg-type]
    assert str(e.value) == (
        "KNOWN_BAD '0' is the gate's reference arm: it cannot show the limits catch anything; give a variant with a bug"
    )


def test_a_whole_lever_runs_its_own_arms_on_the_model_as_loaded() -> None:
    paired = _Paired(_Run(ENV))
    # its candidate is the gate's reference value, its own reference another: a bug against its own arm
    mark = pytest.mark.mlx_lever("other", env="MLXGATE_FLAG", ref="5", cand="0")
    bad = known_bad_paired(paired, mark)  # type: ignore[arg-type]
    _fresh(paired, bad)
    run = _arm_run(bad)
    assert (run["lever"], run["candidate"], run["reference"]) == (
        Lever("other", "env", "MLXGATE_FLAG", "5", "0"),
        "the candidate",
        None,
    )


def test_a_whole_lever_whose_arms_are_the_same_is_refused() -> None:
    mark = pytest.mark.mlx_lever("same", env="MLXGATE_FLAG", ref="1", cand="1")
    with pytest.raises(MlxgateUsageError) as e:
        known_bad_paired(_Paired(_Run(ENV)), mark)  # type: ignore[arg-type]
    assert str(e.value) == (
        "KNOWN_BAD mlx_lever 'same' (env MLXGATE_FLAG: 1 → 1, path=prefill): its candidate arm is its reference "
        "arm, so it cannot show the limits catch anything; give cand= a variant with a bug"
    )


def test_a_weights_gate_s_whole_lever_known_bad_runs_on_its_reference_the_weights_as_loaded() -> None:
    paired = _Paired(_Run(WEIGHTS))
    mark = pytest.mark.mlx_lever("bad", patch="mlx.core.fast.rope", ref=None, cand="pytest_mlxgate.reference_ops:rope")
    bad = known_bad_paired(paired, mark)  # type: ignore[arg-type]
    run = _arm_run(bad)
    assert (run["candidate"], run["reference"], run["lever"].name) == ("the reference", None, "bad")
    for gate, reference in ((BOTH_QUANTIZED, "the reference"), (WEIGHTS, None)):
        with pytest.raises(MlxgateUsageError) as e:
            known_bad_paired(_Paired(_Run(gate, reference=reference)), mark)  # type: ignore[arg-type]
        assert str(e.value) == (
            "KNOWN_BAD mlx_lever 'bad' (patch mlx.core.fast.rope: original → pytest_mlxgate.reference_ops:rope, "
            "path=prefill): the gate's lever 'w' quantizes both arms, so no arm has the model as loaded to run it "
            "on; give a quantization as KNOWN_BAD instead"
        )


def test_a_weights_known_bad_quantizes_the_weights_as_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(known_bad_module, "quantized_copy", lambda loaded, spec: ("quantized", loaded, spec))
    paired = _Paired(_Run(WEIGHTS))
    bad = known_bad_paired(paired, {"bits": 2, "group_size": 32})  # type: ignore[arg-type]
    _fresh(paired, bad)
    run = _arm_run(bad)
    assert run["candidate"] == ("quantized", "the reference", WeightsSpec(bits=2, group_size=32))
    assert run["reference"] == "the reference"
    assert run["lever"] == Lever("w", "weights", None, None, {"bits": 2, "group_size": 32})


@pytest.mark.parametrize("reference", ["the reference", None], ids=["both-quantized", "no-reference"])
def test_a_weights_known_bad_needs_a_reference_arm_as_loaded(reference: object) -> None:
    gate = BOTH_QUANTIZED if reference is not None else WEIGHTS
    with pytest.raises(MlxgateUsageError) as e:
        known_bad_paired(_Paired(_Run(gate, reference=reference)), 2)  # type: ignore[arg-type]
    assert str(e.value) == (
        "lever 'w': a known-bad weights variant needs the reference arm to keep the weights as loaded (ref=None); "
        "check it by hand with --mlx-lever/--mlx-cand-value"
    )


def test_a_weights_known_bad_as_loaded_is_the_reference_arm_itself() -> None:
    as_loaded = Lever("w", "weights", None, None, None)
    assert known_bad_module._quantized_candidate(_Run(WEIGHTS), as_loaded) == "the reference"  # type: ignore[arg-type]


# -- the lever a known-bad builds -------------------------------------------------------------------


def _factory(value: object) -> Any:
    raise AssertionError("never entered here")


@pytest.mark.parametrize(
    ("gate", "bad", "built"),
    [
        (ENV, "7", Lever("flag", "env", "MLXGATE_FLAG", "0", "7")),
        (
            Lever("p", "patch", "mlx.core.fast.rope", None, "m:a"),
            "m:b",
            Lever("p", "patch", "mlx.core.fast.rope", None, "m:b"),
        ),
        (Lever("kv", "kv", None, "plain", 8, "serving"), 2, Lever("kv", "kv", None, "plain", 2, "serving")),
        (WEIGHTS, 2, Lever("w", "weights", None, None, 2)),
        (CONTEXT, "broken", Lever("fused", "context", CONTEXT.target, "plain", "broken", "serving")),
        (
            Lever("c", "context", "x", "a", "b", factory=_factory),
            "z",
            Lever("c", "context", "test_known_bad_whole:_factory", "a", "z", factory=_factory),
        ),
    ],
    ids=["env", "patch", "kv", "weights", "context", "context-factory"],
)
def test_a_value_builds_the_module_s_lever_with_that_candidate(gate: Lever, bad: object, built: Lever) -> None:
    made = known_bad_module._bad_lever(gate, bad, base_dir=None)
    assert made == built


def test_a_kv_plan_named_by_a_known_bad_is_read_from_the_gate_s_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = '{"default": {"bits": 2, "group_size": 32}}'
    gates, cwd = tmp_path / "gates", tmp_path / "cwd"
    for folder in (gates, cwd):
        folder.mkdir()
        (folder / "bad.json").write_text(plan)
    monkeypatch.chdir(cwd)
    kv = Lever("kv", "kv", None, "plain", 8, "serving")
    assert known_bad_module._bad_lever(kv, "bad.json", base_dir=gates).cand == str(gates / "bad.json")
    paired = _Paired(_Run(kv))
    paired.item.path = gates / "test_g.py"
    assert known_bad_module.known_bad_lever(paired, "bad.json").cand == str(gates / "bad.json")  # type: ignore[arg-type]
    paired.item = SimpleNamespace(nodeid=NODEID)  # an item with no path: the working directory's
    assert known_bad_module.known_bad_lever(paired, "bad.json").cand == str(cwd / "bad.json")  # type: ignore[arg-type]
    # a whole KV lever's plan, likewise from the gate's folder
    whole = pytest.mark.mlx_lever("kv2", kv=True, ref="plain", cand="bad.json")
    assert known_bad_module._bad_lever(CONTEXT, whole, base_dir=gates).cand == str(gates / "bad.json")


def test_a_two_model_lever_has_no_known_bad_value() -> None:
    with pytest.raises(MlxgateUsageError) as e:
        known_bad_module._bad_lever(Lever("model", "model", None, None, None), "x", base_dir=None)
    assert str(e.value) == (
        "lever 'model' compares two models: its known-bad variant is another model, not a value; check it by hand "
        "with --mlx-candidate BROKEN_MODEL (the drift test must fail)"
    )


@pytest.mark.parametrize(
    "bad", [pytest.mark.skip(reason="x"), pytest.mark.skip(reason="x").mark], ids=["decorator", "mark"]
)
def test_another_marker_is_no_known_bad(bad: object) -> None:
    with pytest.raises(MlxgateUsageError) as e:
        known_bad_module._bad_lever(CONTEXT, bad, base_dir=None)
    assert str(e.value) == (
        "KNOWN_BAD is a pytest.mark.skip marker: a known-bad variant is a value of the gate's lever 'fused', or a "
        "whole lever, pytest.mark.mlx_lever(NAME, patch=..., ref=None, cand=BROKEN, path='serving')"
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            pytest.mark.mlx_lever("w", weights=True, ref=None, cand=2, path="serving"),
            "KNOWN_BAD mlx_lever 'w' (weights: weights as loaded → 2-bit g64 weights, path=serving): a weights lever "
            "compares two models, so its arms are not the gate's model with one bug; give a lever that changes a "
            "function, a setting or the KV cache of the model as loaded (patch=, context=, env=, kv=True), or, for "
            "weights, a gate of that kind with the bad value",
        ),
        (
            pytest.mark.mlx_lever("e", env="MLXGATE_FLAG", ref=None, cand="1"),
            "KNOWN_BAD mlx_lever 'e' (env MLXGATE_FLAG: unset → 1, path=prefill) runs on path='prefill', the gate's "
            "lever 'fused' on path='serving': the limits are the gate's on its path, so its known-bad must run "
            "there; write path='serving' in the KNOWN_BAD marker",
        ),
    ],
    ids=["two-models", "other-path"],
)
def test_a_whole_lever_that_cannot_stand_in_says_why_in_full(bad: pytest.MarkDecorator, message: str) -> None:
    with pytest.raises(MlxgateUsageError) as e:
        known_bad_module._bad_lever(CONTEXT, bad, base_dir=None)
    assert str(e.value) == message


def test_a_whole_lever_known_bad_is_that_lever_on_the_gate_s_path() -> None:
    mark = pytest.mark.mlx_lever("rope", patch="mlx.core.fast.rope", ref=None, cand="m:broken", path="serving")
    built = Lever("rope", "patch", "mlx.core.fast.rope", None, "m:broken", "serving")
    assert known_bad_module._bad_lever(CONTEXT, mark, base_dir=None) == built
    assert known_bad_module._bad_lever(CONTEXT, mark.mark, base_dir=None) == built


# -- the drift test on the known-bad arm -----------------------------------------------------------

BAD = "m:bad"
SHOWN = "'m:bad'"


def _check(metric: str, direction: str, verdict: str, lower: float | None, upper: float | None, limit: float) -> Any:
    return {
        "metric": metric,
        "key": metric,
        "value": None,
        "lower": lower,
        "upper": upper,
        "limit": limit,
        "direction": direction,
        "verdict": verdict,
        "n": 4,
        "n_needed": None,
        "method": "m",
    }


PASSED = [_check("mean KL", "max", "pass", 0.001, 0.002345, 50.0), _check("top-1", "min", "pass", 0.95, 0.99, 0.9)]


def _drift(verdicts: list[str], raises: BaseException | None = None) -> Callable[[Any], None]:
    def test_drift(paired: Any) -> None:
        for verdict in verdicts:
            paired.publish(
                Conclusion(mode="gate", checks=PASSED if verdict == "pass" else [], bounds={}, verdict=verdict)
            )
        if raises is not None:
            raise raises

    return test_drift


def _verdict(check: Callable[[Any], None], bad: object = BAD) -> str | None:
    bad_paired = known_bad_paired(_Paired(_Run(ENV)), bad)  # type: ignore[arg-type]
    return known_bad_module._verdict(bad_paired, bad, check, "test_drift", "gates/test_g.py")


INCONCLUSIVE = (
    f"test_drift could not tell the known-bad variant {SHOWN} apart from its limits (inconclusive): it is not shown "
    "to fail; run more prompts (--mlx-kl-prompts) or tighten the limits"
)


@pytest.mark.parametrize(
    ("verdicts", "raises", "message"),
    [
        ([], NonFiniteLogitsError("NaN"), None),
        (["pass", "fail"], AssertionError("crossed"), None),
        (["fail"], None, None),
        (["pass", "fail"], None, None),
        (["inconclusive"], AssertionError("not told"), f"{INCONCLUSIVE}\nnot told"),
        (["pass", "inconclusive"], None, INCONCLUSIVE),
        (
            [],
            LeverError("no kernel"),
            f"the known-bad variant {SHOWN} could not be measured, so it is not shown to fail: no kernel",
        ),
        (
            ["pass"],
            AssertionError("plain"),
            f"test_drift raised AssertionError on the known-bad variant {SHOWN} without a gate verdict: only a limit "
            "(assert_kl_below, assert_capability_at_least) shown crossed counts as catching it (plain)",
        ),
        ([], None, f"test_drift asserted nothing on the known-bad variant {SHOWN}: pass the gate's drift test itself"),
        (
            ["pass"],
            None,
            f"the known-bad variant {SHOWN} passes test_drift's limits (mean KL 95% bound 0.00234 <= limit 50; "
            "top-1 95% bound 0.95 >= limit 0.9): limits that pass a broken variant would pass a broken kernel; "
            "tighten them (`pytest gates/test_g.py --mlx-calibrate` sizes limits within the quality bounds), or "
            "check that KNOWN_BAD really breaks something",
        ),
    ],
    ids=[
        "non-finite",
        "failed-and-raised",
        "failed",
        "failed-quietly",
        "inconclusive-raised",
        "inconclusive",
        "unmeasured",
        "plain-assert",
        "nothing",
        "passed",
    ],
)
def test_each_outcome_of_the_drift_test_on_the_known_bad_says_what_it_means(
    verdicts: list[str], raises: BaseException | None, message: str | None
) -> None:
    assert _verdict(_drift(verdicts, raises)) == message


def test_a_drift_test_with_no_limits_yet_says_to_size_them() -> None:
    said = _verdict(_drift([], pytest.fail.Exception("no limits yet", pytrace=False)))
    assert said == (
        f"test_drift has no limits yet, so the known-bad variant {SHOWN} cannot be shown to fail: size them "
        "(`pytest gates/test_g.py --mlx-calibrate`), paste them, then run this again. test_drift said: no limits yet"
    )


def test_a_gate_s_own_failure_after_a_verdict_is_raised_as_it_is() -> None:
    with pytest.raises(pytest.fail.Exception, match="^inconclusive: fail$"):
        _verdict(_drift(["inconclusive"], pytest.fail.Exception("inconclusive: fail", pytrace=False)))


def test_a_whole_lever_is_named_by_what_it_switches_in_every_message() -> None:
    mark = pytest.mark.mlx_lever("other", env="MLXGATE_FLAG", ref="5", cand="0")
    assert _verdict(_drift([]), mark) == (
        "test_drift asserted nothing on the known-bad variant mlx_lever 'other' (env MLXGATE_FLAG: 5 → 0, "
        "path=prefill): pass the gate's drift test itself"
    )


@pytest.mark.parametrize(
    ("check", "text"),
    [
        (_check("mean KL", "max", "pass", 0.0011111, 0.0022222, 0.005), "mean KL 95% bound 0.00222 <= limit 0.005"),
        (_check("top-1", "min", "pass", 0.9333333, 0.99, 0.9), "top-1 95% bound 0.933 >= limit 0.9"),
        ({"metric": "p99 KL", "direction": "max"}, "p99 KL 95% bound None <= limit None"),
        ({}, "None 95% bound None >= limit None"),
    ],
)
def test_a_passed_limit_reads_as_the_bound_it_compared(check: Any, text: str) -> None:
    assert known_bad_module._check_text(check) == text


# -- the known-bad test itself ----------------------------------------------------------------------


def test_no_known_bad_yet_fails_saying_what_to_plant() -> None:
    paired = _Paired(_Run(ENV))
    with pytest.raises(pytest.fail.Exception) as e:
        assert_known_bad_fails(paired, None, _drift(["fail"]))  # type: ignore[arg-type]
    what = known_bad_step("gates/test_g.py", ENV.to_json())["what"]
    assert str(e.value) == (
        f"no known-bad variant shown to fail yet: set KNOWN_BAD in gates/test_g.py to a variant with a bug "
        f"test_drift's limits must catch, {what}; the test then runs test_drift on it and passes only when "
        "test_drift fails. Limits never shown to fail a broken variant may pass one."
    )
    assert paired.published is True
    assert e.value.pytrace is False


def test_under_aa_the_known_bad_test_skips() -> None:
    with pytest.raises(pytest.skip.Exception) as e:
        assert_known_bad_fails(_Paired(_Run(ENV, aa=True)), BAD, _drift(["fail"]))  # type: ignore[arg-type]
    assert str(e.value) == (
        "--mlx-aa: the reference against itself has no candidate arm to plant a known-bad variant in"
    )


def test_the_known_bad_test_passes_when_the_drift_test_fails_the_variant() -> None:
    paired = _Paired(_Run(ENV))
    assert assert_known_bad_fails(paired, BAD, _drift(["fail"], AssertionError("x"))) is None  # type: ignore[arg-type,func-returns-value]
    assert paired.published is True


@pytest.mark.parametrize(
    ("bad", "check", "message"),
    [
        ("0", _drift(["fail"]), "KNOWN_BAD '0' is the gate's reference arm: it cannot show the limits catch anything"),
        (BAD, _drift([]), f"test_drift asserted nothing on the known-bad variant {SHOWN}"),
        (BAD, _drift(["pass"]), f"the known-bad variant {SHOWN} passes test_drift's limits"),
    ],
    ids=["usage", "verdict", "passed"],
)
def test_the_known_bad_test_fails_with_the_message(bad: object, check: Callable[[Any], None], message: str) -> None:
    with pytest.raises(pytest.fail.Exception) as e:
        assert_known_bad_fails(_Paired(_Run(ENV)), bad, check)  # type: ignore[arg-type]
    assert str(e.value).startswith(message) and e.value.pytrace is False
    assert "`pytest gates/test_g.py --mlx-calibrate`" in str(e.value) or "passes" not in message


def test_a_check_with_no_name_is_the_check() -> None:
    class Check:
        def __call__(self, paired: Any) -> None:
            return None

    with pytest.raises(pytest.fail.Exception) as e:
        assert_known_bad_fails(_Paired(_Run(ENV)), BAD, Check())  # type: ignore[arg-type]
    assert (
        str(e.value)
        == f"the check asserted nothing on the known-bad variant {SHOWN}: pass the gate's drift test itself"
    )
