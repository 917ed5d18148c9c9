"""`kl.site` without a model: which functions a lever swaps, the per-layer rule's arithmetic, and its state."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from pytest_mlxgate.errors import LeverError
from pytest_mlxgate.kl.site import SITE, SITE_FLOAT32, SiteCheck, _Call, lever_sites
from pytest_mlxgate.levers import reference_ops
from pytest_mlxgate.levers.lever import Lever


def test_a_patch_lever_s_site_is_its_target_with_both_arms_functions() -> None:
    lever = Lever("norm", "patch", "mlx.core.fast.rms_norm", None, "pytest_mlxgate.reference_ops:rms_norm")
    (site,) = lever_sites(lever) or []
    assert site.target == "mlx.core.fast.rms_norm"
    assert site.plain is mx.fast.rms_norm and site.candidate is reference_ops.rms_norm


def test_fast_ops_names_a_site_for_each_op_it_swaps() -> None:
    lever = Lever("fused", "context", "pytest_mlxgate.reference_ops:fast_ops", "plain", "fused")
    sites = {s.target: s for s in lever_sites(lever) or []}
    assert set(sites) == {f"mlx.core.fast.{name}" for name in reference_ops.FAST_OPS}
    assert (
        sites["mlx.core.fast.rope"].plain is reference_ops.rope
        and sites["mlx.core.fast.rope"].candidate is mx.fast.rope
    )
    only_rope = Lever("rope", "context", "pytest_mlxgate.reference_ops:fast_ops", "rope", "fused")
    assert [s.target for s in lever_sites(only_rope) or []] == ["mlx.core.fast.rope"]  # the others run alike


def test_levers_with_no_callable_site_say_none() -> None:
    assert lever_sites(Lever("flag", "env", "MLXGATE_FLAG", "0", "1")) is None
    assert lever_sites(Lever("compile", "context", "pytest_mlxgate.reference_ops:compiled", "off", "on")) is None
    with pytest.raises(LeverError, match="is not a function"):
        lever_sites(Lever("norm", "patch", "mlx.core.fast.rms_norm", None, "pytest_mlxgate.reference_ops:FAST_OPS"))


def _call(at: int, cand: list[float], plain: list[float], cand32: list[float] | None = None) -> _Call:
    return _Call(
        "mlx.core.fast.rope", at, 0, tuple(cand), tuple(plain), None if cand32 is None else tuple(cand32), 0.0, 0.0, 1.0
    )


def _calls(bad_at: int | None, layers: int = 6, per: int = 12) -> SiteCheck:
    calls = []
    for forward in range(3):
        for at in range(layers):
            plain = [0.01 + 0.001 * ((i + at + forward) % 5) for i in range(per)]
            cand = [p * (3.0 if at == bad_at else 0.9) for p in plain]
            calls.append(_call(at, cand, plain, [1e-6] * per))
    return SiteCheck(sequences=1, calls=calls)


def test_one_layer_s_bug_fails_the_rule_however_many_layers_are_right() -> None:
    assert _calls(None).check(2.0)["verdict"] == "pass"
    failed = _calls(bad_at=4).check(2.0)
    assert failed["verdict"] == "fail" and failed["key"] == SITE
    assert failed["oracle"]["worst_site"] == 4.0 and failed["oracle"]["call_positions"] == 6.0


def test_the_float32_leg_judges_the_candidate_s_logic_against_its_tolerance() -> None:
    good = _calls(None).check_float32()
    assert good is not None and good["verdict"] == "pass" and good["key"] == SITE_FLOAT32
    off = SiteCheck(1, [_call(0, [0.01] * 8, [0.01] * 8, [0.02 + 0.001 * i for i in range(8)]) for _ in range(3)])
    assert (off.check_float32() or {})["verdict"] == "fail"
    no_f32 = SiteCheck(1, [_call(0, [0.01] * 4, [0.01] * 4, None)])
    assert no_f32.check_float32() is None  # a kernel built for low precision only: no float32 leg


def test_a_state_reads_back_and_a_damaged_one_is_refused() -> None:
    made = _calls(bad_at=2)
    back = SiteCheck.from_state(json.loads(json.dumps(made.state())))
    assert back.check(2.0) == made.check(2.0) and back.state() == made.state()
    state = made.state()
    for broken in ({**state, "calls": []}, {**state, "calls": [state["calls"][0][:3]]}, {"sequences": 1}):
        with pytest.raises(ValueError):
            SiteCheck.from_state(broken)
    uneven = [[*state["calls"][0][:3], [0.1], [0.1, 0.2], None, 0.0, 0.0, 1.0]]
    with pytest.raises(ValueError):
        SiteCheck.from_state({**state, "calls": uneven})
