"""Gate: `mx.compile` on vs off: the fused graphs mlx_lm's models run vs the same functions op by op.

mlx_lm wraps its hot elementwise functions in `mx.compile` (the SwiGLU and GELU activations,
gemma's logit softcap and its other helpers; mlx.nn some activations of its own). The reference arm
runs with compilation off for the arm (`pytest_mlxgate.reference_ops:compiled`, through
`mx.disable_compile()`), so every one of them runs op by op; the candidate runs them compiled, as
mlx_lm ships them. Serving path: compiled functions are traced per input shape (or shapeless), and
decode's one-token shapes are where a stale or wrongly shapeless trace would show.

Limits: `gates/calibration/test_compile.json` holds what they were set from (`pytest
gates/test_compile.py --mlx-calibrate` measures it again; the calibration files' test checks the
limits against it). On this CPU compiled and uncompiled graphs give bit-identical logits ("identical
on this backend"), so the limits come from the A/A floor alone; Metal's compiled kernels may round
differently: calibrate there. What a fused kernel gets wrong must fail them: KNOWN_BAD, the compiled
activations with the hard sigmoid in place of the sigmoid (a fast-math shortcut: mlx_lm's SwiGLU on
llama-style models, mlx.nn's tanh-approximate GELU on gemma's; `gates/known_bad_ops.py`), fails every
limit by orders of magnitude on both calibrated models. This lever has no broken value, so KNOWN_BAD
is a whole lever on the same path; its reference arm is the activations as they ship.

Speed (`mlx_speed`: the default contexts, one on a CPU, 600 and 8192 tokens on a GPU): on this CPU
compiling the activations buys nothing for decode and may cost prefill (compiled CPU kernels are
generated C++, not the vectorized fallbacks), so no goal is asserted here. On Metal fusion saves kernel
launches: calibrate there for a goal.

In the precision it ships (`--mlx-dtype bfloat16`): `relative=2.0` judges the candidate against the float32
oracle (the reference's weights upcast, every activation in float32): its KL from the oracle at most twice
the plain bf16 path's (`mx.compile` swaps no function the plugin can call on its own, so this model-level
rule alone judges it). The absolute limits above were sized in float32; in bf16 those below plain bf16's own
distance from float32 are set aside for this rule (the record says which). In float32 the reference arm is
the oracle: the rule reads the candidate's KL against 1e-5.
"""

from __future__ import annotations

import pytest

from pytest_mlxgate import Paired, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever(
        "mx_compile", context="pytest_mlxgate.reference_ops:compiled", ref="off", cand="on", path="serving"
    ),
    pytest.mark.mlx_kl(prompts=16, tokens=128, decode=32),
    pytest.mark.mlx_speed(),
]

# the compiled activations with the hard sigmoid in place of the sigmoid (gates/known_bad_ops.py)
KNOWN_BAD = pytest.mark.mlx_lever(
    "activations_hard_sigmoid", context="known_bad_ops:hard_sigmoid_activations", ref="off", cand="on", path="serving"
)


def test_drift(paired: Paired) -> None:
    assert_kl_below(paired, mean=3e-7, p99=2e-6, top1=0.9, relative=2.0)
