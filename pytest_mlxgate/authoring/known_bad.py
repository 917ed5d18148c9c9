"""`assert_known_bad_fails`: a gate's limits shown to fail a broken variant, or the gate does not pass.

Limits sized from the lever alone can pass anything: a gate earns trust only once a variant with a
real bug has been run through the same assertion and failed. A gate module declares that variant
as `KNOWN_BAD` (a candidate value for its own lever, in the lever's marker form: "mymod:broken" for
a patch, a value for an environment variable, a KV or weights setting) and a test that runs its
drift check against it::

    KNOWN_BAD = "mymod:rms_norm_without_the_root"

    def test_known_bad(paired):
        assert_known_bad_fails(paired, KNOWN_BAD, test_drift)

The known-bad arm is the module's own lever with only its candidate value replaced, on the same
model, prompts and sizes (the reference arm comes from the same cache). A lever whose broken variant
is no value of it (a context lever: `mx.compile` on/off, fused ops plain/fused) names a whole lever
instead, on the gate's path, whose candidate has the bug; its own reference arm is the known-bad's
(a patch with ref=None: the model as loaded)::

    KNOWN_BAD = pytest.mark.mlx_lever("rope_base_off", patch="mlx.core.fast.rope", ref=None,
                                      cand="known_bad_ops:rope_base_off", path="serving")

The test passes only when the check gives a *fail* verdict there; with no KNOWN_BAD, a pass, an
inconclusive, or a check that has no limits yet, it fails and says which. `mlxgate new-gate` writes
both into every skeleton.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from ..common.format import figure
from ..errors import MlxgateError, MlxgateUsageError, NonFiniteLogitsError
from ..levers.parsing import lever_from_marker
from ..levers.weights import quantized_copy
from ..session.paired import Paired
from ..verdicts.known_bad_step import known_bad_step, known_bad_text

if TYPE_CHECKING:
    from ..kl.result import KLResult
    from ..levers.lever import Lever
    from ..results.wire import Check
    from ..session.paired_run import PairedRun
    from ..verdicts.conclude import Conclusion

__all__ = ["assert_known_bad_fails", "is_whole_lever", "known_bad_lever", "known_bad_paired", "known_bad_shown"]


class _KnownBadPaired(Paired):
    """The `paired` a check sees on the known-bad arm: verdicts are kept here, not published as the
    test's record (the test's outcome is whether they failed), and speed is not measured."""

    def __init__(self, run: PairedRun, item: Any, rerun: str) -> None:
        super().__init__(run, item, rerun)
        self.verdicts: list[str] = []
        self.checks: list[Check] = []

    def publish(self, conclusion: Conclusion, *, measure: bool = True) -> None:
        self.verdicts.append(conclusion.verdict)
        self.checks.extend(conclusion.checks)

    def speed_if_asked(self) -> dict[str, Any] | None:
        return None

    def vouch(self, conclusion: Conclusion) -> Conclusion:
        return conclusion  # the known-bad arm proves limits; nothing proves it

    def explanation(self, kl: KLResult, verdict: str) -> dict[str, Any] | None:
        return None  # a known-bad arm is meant to fail: where its drift comes from is not asked

    def finish(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"<paired known-bad {self.run.lever.describe()}>"


def known_bad_paired(paired: Paired, bad: object) -> _KnownBadPaired:
    """`paired` with its lever's candidate value replaced by `bad` (or, `bad` a `pytest.mark.mlx_lever`
    marker, with that whole lever): same model, prompts and sizes; the reference arm is the module's
    (a value) or that lever's own (a whole lever). MlxgateUsageError (a LeverError) when `bad` is no
    value for this lever, or a lever that cannot stand in for it."""
    run = paired.run
    lever = known_bad_lever(paired, bad)
    whole = is_whole_lever(bad)
    if lever.key("candidate") == (lever if whole else run.lever).key("reference"):
        if whole:
            raise MlxgateUsageError(
                f"KNOWN_BAD {known_bad_shown(bad, lever)}: its candidate arm is its reference arm, so it cannot "
                "show the limits catch anything; give cand= a variant with a bug"
            )
        raise MlxgateUsageError(
            f"KNOWN_BAD {bad!r} is the gate's reference arm: it cannot show the limits catch anything; give a "
            "variant with a bug"
        )
    candidate, reference = run.candidate, run.reference
    if whole:
        candidate, reference = _loaded_model(run, lever), None
    elif lever.kind == "weights":
        candidate = _quantized_candidate(run, lever)
    bad_run = replace(
        run,
        lever=lever,
        candidate=candidate,
        reference=reference,
        speed_shape=None,
        counters=type(run.counters)(),
        server=None,  # the known-bad runs in process: under --mlx-cand-server, never the server asked again
        ref_server=None,  # and against the reference in process, which it is measured beside
    )
    return _KnownBadPaired(bad_run, paired.item, paired.rerun)


def known_bad_lever(paired: Paired, bad: object) -> Lever:
    """The lever whose candidate arm is KNOWN_BAD on this module: the module's lever with `bad` as its
    candidate value, or the whole lever `bad` is. MlxgateUsageError when it is neither."""
    path = getattr(paired.item, "path", None)
    return _bad_lever(paired.run.lever, bad, base_dir=path.parent if path is not None else None)


def known_bad_shown(bad: object, lever: Lever | None = None) -> str:
    """KNOWN_BAD as messages name it: a value by its repr; a whole lever (`lever`, built from it) as
    `calibrate.known_bad_text` writes one, the form the calibration file keeps."""
    mark = _lever_mark(bad)
    if mark is None:
        return repr(bad)
    if lever is not None:
        return known_bad_text(lever.to_json())
    name = mark.args[0] if mark.args else "?"
    return f"pytest.mark.mlx_lever({name!r}, ...)"


def assert_known_bad_fails(paired: Paired, bad: object, check: Callable[[Paired], object]) -> None:
    """Pass only when `check` (the gate's drift test, e.g. `test_drift`) gives a *fail* verdict on the
    known-bad arm: the module's lever with `bad` as its candidate value (or the whole lever `bad` is).

    `bad` None (not declared yet), a pass, an inconclusive verdict, or a check with no limits yet fail
    the test, saying which and what to do. A skip (an untrained model) skips; under --mlx-aa the test
    skips (the A/A run has no candidate arm)."""
    __tracebackhide__ = True
    paired.published = True  # this test's outcome is the known-bad verdict, not a second copy of the module's
    name = getattr(check, "__name__", "the check")
    module = paired.nodeid.split("::")[0]
    if bad is None:
        pytest.fail(_none_yet(paired.lever, module, name), pytrace=False)
    if paired.run.aa:
        pytest.skip("--mlx-aa: the reference against itself has no candidate arm to plant a known-bad variant in")
    message: str | None
    try:
        bad_paired = known_bad_paired(paired, bad)
    except MlxgateUsageError as e:
        message = str(e)
    else:
        message = _verdict(bad_paired, bad, check, name, module)
    if message is not None:
        pytest.fail(message, pytrace=False)


def _verdict(
    bad_paired: _KnownBadPaired, bad: object, check: Callable[[Paired], object], name: str, module: str
) -> str | None:
    """None when the check failed the known-bad arm; otherwise what went wrong."""
    shown = known_bad_shown(bad, bad_paired.lever)
    try:
        check(bad_paired)
    except NonFiniteLogitsError:
        return None  # NaN or inf logits: the gate goes red on them, so the variant is caught
    except MlxgateError as e:
        return f"the known-bad variant {shown} could not be measured, so it is not shown to fail: {e}"
    except AssertionError as e:
        if "fail" in bad_paired.verdicts:
            return None
        if "inconclusive" in bad_paired.verdicts:
            return _inconclusive(shown, name, e)
        return (
            f"{name} raised AssertionError on the known-bad variant {shown} without a gate verdict: only a "
            f"limit (assert_kl_below, assert_capability_at_least) shown crossed counts as catching it ({e})"
        )
    except pytest.fail.Exception as e:
        if bad_paired.verdicts:
            raise
        return (
            f"{name} has no limits yet, so the known-bad variant {shown} cannot be shown to fail: size them "
            f"(`pytest {module} --mlx-calibrate`), paste them, then run this again. {name} said: {e}"
        )
    if "fail" in bad_paired.verdicts:
        return None  # a verdict raised nothing (an exploratory policy); it was still shown crossed
    if "inconclusive" in bad_paired.verdicts:
        return _inconclusive(shown, name, None)
    if not bad_paired.verdicts:
        return f"{name} asserted nothing on the known-bad variant {shown}: pass the gate's drift test itself"
    crossed = "; ".join(_check_text(c) for c in bad_paired.checks)
    return (
        f"the known-bad variant {shown} passes {name}'s limits ({crossed}): limits that pass a broken variant "
        f"would pass a broken kernel; tighten them (`pytest {module} --mlx-calibrate` sizes limits within the "
        "quality bounds), or check that KNOWN_BAD really breaks something"
    )


def _inconclusive(shown: str, name: str, error: BaseException | None) -> str:
    detail = f"\n{error}" if error is not None else ""
    return (
        f"{name} could not tell the known-bad variant {shown} apart from its limits (inconclusive): it is not "
        f"shown to fail; run more prompts (--mlx-kl-prompts) or tighten the limits{detail}"
    )


def _check_text(check: Check) -> str:
    """The bound a pass compared with the limit: the upper end for a "max" limit, the lower for a "min"."""
    bound, rel = (check.get("upper"), "<=") if check.get("direction") == "max" else (check.get("lower"), ">=")
    return f"{check.get('metric')} 95% bound {figure(bound)} {rel} limit {figure(check.get('limit'))}"


def _none_yet(lever: Lever, module: str, name: str) -> str:
    step = known_bad_step(module, lever.to_json())
    return (
        f"no known-bad variant shown to fail yet: set KNOWN_BAD in {module} to a variant with a bug {name}'s "
        f"limits must catch, {step['what']}; the test then runs {name} on it and passes only when {name} "
        "fails. Limits never shown to fail a broken variant may pass one."
    )


def _bad_lever(lever: Lever, bad: object, *, base_dir: Any) -> Lever:
    """The module's lever with `bad` as its candidate value, built through the marker's own checks; or,
    `bad` an `mlx_lever` marker, that lever (`_whole_lever`)."""
    if lever.kind == "model":
        raise MlxgateUsageError(
            f"lever {lever.name!r} compares two models: its known-bad variant is another model, not a value; check "
            "it by hand with --mlx-candidate BROKEN_MODEL (the drift test must fail)"
        )
    mark = _lever_mark(bad)
    if mark is not None:
        return _whole_lever(lever, mark, base_dir)
    if isinstance(bad, (pytest.MarkDecorator, pytest.Mark)):
        other = bad.mark.name if isinstance(bad, pytest.MarkDecorator) else bad.name
        raise MlxgateUsageError(
            f"KNOWN_BAD is a pytest.mark.{other} marker: a known-bad variant is a value of the gate's lever "
            f"{lever.name!r}, or a whole lever, pytest.mark.mlx_lever(NAME, patch=..., ref=None, cand=BROKEN, "
            f"path={lever.path!r})"
        )
    what: object = {"kv": True, "weights": True}.get(lever.kind, lever.target)
    if lever.kind == "context" and lever.factory is not None:
        what = lever.factory
    mark = pytest.mark.mlx_lever(lever.name, **{lever.kind: what}, ref=lever.ref, cand=bad, path=lever.path).mark
    return lever_from_marker(mark, base_dir=base_dir)


def is_whole_lever(bad: object) -> bool:
    """KNOWN_BAD is a whole lever (a `pytest.mark.mlx_lever(...)` marker), not a value of the gate's."""
    return _lever_mark(bad) is not None


def _lever_mark(bad: object) -> pytest.Mark | None:
    """The `mlx_lever` marker KNOWN_BAD is (a whole known-bad lever), else None."""
    mark = bad.mark if isinstance(bad, pytest.MarkDecorator) else bad
    return mark if isinstance(mark, pytest.Mark) and mark.name == "mlx_lever" else None


def _whole_lever(lever: Lever, mark: pytest.Mark, base_dir: Any) -> Lever:
    """A whole known-bad lever, refused where it could not show the gate's limits anything: another path
    than the gate's (its limits hold on theirs), or two models (the gate's model is the one judged)."""
    bad = lever_from_marker(mark, base_dir=base_dir)
    shown = known_bad_text(bad.to_json())
    if bad.two_models:
        raise MlxgateUsageError(
            f"KNOWN_BAD {shown}: a {bad.kind} lever compares two models, so its arms are not the gate's model with "
            "one bug; give a lever that changes a function, a setting or the KV cache of the model as loaded "
            f"(patch=, context=, env=, kv=True), or, for {bad.kind}, a gate of that kind with the bad value"
        )
    if bad.path != lever.path:
        raise MlxgateUsageError(
            f"KNOWN_BAD {shown} runs on path={bad.path!r}, the gate's lever {lever.name!r} on path={lever.path!r}: "
            f"the limits are the gate's on its path, so its known-bad must run there; write path={lever.path!r} "
            "in the KNOWN_BAD marker"
        )
    return bad


def _loaded_model(run: PairedRun, lever: Lever) -> Any:
    """The model a whole known-bad lever runs on: the gate's, with the weights as loaded."""
    if not run.lever.two_models:
        return run.candidate
    if run.lever.weights_spec("reference") is None and run.reference is not None:
        return run.reference  # a weights gate: its reference arm keeps the weights as loaded
    raise MlxgateUsageError(
        f"KNOWN_BAD {known_bad_text(lever.to_json())}: the gate's lever {run.lever.name!r} quantizes both arms, "
        "so no arm has the model as loaded to run it on; give a quantization as KNOWN_BAD instead"
    )


def _quantized_candidate(run: PairedRun, lever: Lever) -> Any:
    """A weights lever's known-bad arm: the weights as loaded, quantized as `bad` says."""
    spec = lever.weights_spec("candidate")
    if lever.weights_spec("reference") is not None or run.reference is None:
        raise MlxgateUsageError(
            f"lever {lever.name!r}: a known-bad weights variant needs the reference arm to keep the weights as "
            "loaded (ref=None); check it by hand with --mlx-lever/--mlx-cand-value"
        )
    if spec is None:
        return run.reference
    return quantized_copy(run.reference, spec)
