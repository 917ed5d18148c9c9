"""What the KL arms promise beyond the serving path's numbers (tests/kl/test_serving_path.py): the
prefill path fed in chunks is the one forward in pieces, and a patch lever's site is counted in
each arm that ran (the record's `lever_calls`), so a site the model never calls is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pytest_mlxgate.errors import VacuousLeverError
from pytest_mlxgate.kl import arms
from pytest_mlxgate.kl.prompts import build_sequences, default_prompts
from pytest_mlxgate.kl.shape import ArmCounters, RunShape
from pytest_mlxgate.levers.lever import Lever
from pytest_mlxgate.serving.kv_plan import PLAIN

TOKENS = 24


@pytest.fixture(scope="module")
def llama(tiny_model_dir: Path) -> tuple[Any, Any]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(tiny_model_dir))[:2]
    return model, tokenizer


@pytest.mark.parametrize("chunk", [1, 7, 12, 23])
def test_a_chunked_prefill_is_the_one_forward_in_pieces(llama: tuple[Any, Any], chunk: int) -> None:
    """Through a KV cache, `chunk` tokens per call: the same logits as the model's own single forward
    (float rounding only), one call per chunk, and row i predicting id i + 1 at position i."""
    import mlx.core as mx

    model, tok = llama
    (seq,) = build_sequences(default_prompts(), tok, n=1, tokens=TOKENS)
    ids = list(seq.ids)
    out, calls = arms.sequence_logits(model, ids, RunShape(path="prefill", tokens=TOKENS, decode=0, chunk=chunk), PLAIN)
    whole = np.asarray(model(mx.array([ids[:TOKENS]]))[0].astype(mx.float32))
    assert calls == -(-TOKENS // chunk)
    assert out.logits.shape == whole.shape and np.abs(out.logits - whole).max() <= 1e-4
    np.testing.assert_array_equal(out.positions, np.arange(TOKENS))
    np.testing.assert_array_equal(out.next_tokens, ids[1:])
    assert out.next_tokens.dtype == np.int32 and out.positions.dtype == np.int32  # as SequenceLogits documents
    single, one = arms.sequence_logits(model, ids, RunShape(path="prefill", tokens=TOKENS, decode=0), PLAIN)
    assert one == 1 and single.next_tokens.dtype == np.int32
    np.testing.assert_array_equal(single.next_tokens, out.next_tokens)


def _patch(target: str) -> Lever:
    return Lever(name="site", kind="patch", target=target, ref=None, cand=None, path="prefill")


def test_a_patch_levers_site_is_counted_in_each_arm(llama: tuple[Any, Any]) -> None:
    """Both arms run the original attention here, so each counts one call per layer per forward."""
    model, tok = llama
    seqs = build_sequences(default_prompts(), tok, n=3, tokens=TOKENS)
    shape = RunShape(path="prefill", tokens=TOKENS, decode=0)
    lever = _patch("mlx_lm.models.llama:scaled_dot_product_attention")
    counters = ArmCounters()
    refs = arms.run_reference(model, seqs, shape, lever, counters=counters)
    arms.run_candidate(model, seqs, shape, lever, refs, counters=counters)
    per_arm = len(seqs) * len(model.layers)  # one forward per sequence on the prefill path
    assert counters.lever_calls == {"reference": per_arm, "candidate": per_arm}
    assert counters.reference_forwards == counters.candidate_forwards == len(seqs)


def test_a_patch_lever_the_model_never_calls_is_refused(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    seqs = build_sequences(default_prompts(), tok, n=2, tokens=TOKENS)
    shape = RunShape(path="prefill", tokens=TOKENS, decode=0)
    lever = _patch("mlx.core.fast.layer_norm")  # a llama normalizes with rms_norm only
    counters = ArmCounters()
    refs = arms.run_reference(model, seqs, shape, lever, counters=counters)
    with pytest.raises(VacuousLeverError, match="never called during the candidate arm's prefill path"):
        arms.run_candidate(model, seqs, shape, lever, refs, counters=counters)
    assert counters.lever_calls == {"reference": 0, "candidate": 0}


def test_a_kv_lever_has_no_site_to_count_so_its_arms_record_no_lever_calls(tiny_kv_model_dir: Path) -> None:
    """Only a patch lever has a site: a KV lever's arms run and count their forwards, but leave
    `lever_calls` empty (the record then has none, rather than calls of 0 that read as never exercised)."""
    import mlx_lm

    model, tok = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    seqs = build_sequences(default_prompts(), tok, n=2, tokens=TOKENS)
    shape = RunShape(path="serving", tokens=TOKENS, decode=3)
    lever = Lever(name="kv", kind="kv", target=None, ref="plain", cand="bits=8,group_size=32,start=0", path="serving")
    counters = ArmCounters()
    refs = arms.run_reference(model, seqs, shape, lever, counters=counters)
    arms.run_candidate(model, seqs, shape, lever, refs, counters=counters)
    assert counters.lever_calls == {}
    assert counters.reference_forwards > 0 and counters.candidate_forwards == counters.reference_forwards


def test_a_serving_batch_of_the_wrong_length_is_refused_saying_the_length_it_needs(llama: tuple[Any, Any]) -> None:
    model, tok = llama
    (seq,) = build_sequences(default_prompts(), tok, n=1, tokens=TOKENS)
    shape = RunShape(path="serving", tokens=TOKENS, decode=3)
    with pytest.raises(ValueError, match=rf"^a sequence must hold tokens \+ 1 = {TOKENS + 1} ids, got {TOKENS}$"):
        arms.serving_logits(model, [list(seq.ids)[:TOKENS]], shape, PLAIN)


@pytest.fixture(scope="module")
def half_llama(tiny_model_dir: Path) -> Any:
    """The tiny llama computing in float16 (its own copy: `llama` stays float32)."""
    import mlx.core as mx
    import mlx_lm

    model = mlx_lm.load(str(tiny_model_dir), lazy=True)[0]
    model.set_dtype(mx.float16)
    return model


@pytest.mark.parametrize(
    "shape",
    [
        RunShape(path="prefill", tokens=TOKENS, decode=0),
        RunShape(path="prefill", tokens=TOKENS, decode=0, chunk=7),
        RunShape(path="serving", tokens=TOKENS, decode=5),
        RunShape(path="serving", tokens=TOKENS, decode=1, chunk=4),
    ],
    ids=["prefill", "chunked", "serving", "serving-one-step"],
)
def test_every_path_records_the_models_own_logits_dtype(
    llama: tuple[Any, Any], half_llama: Any, shape: RunShape
) -> None:
    """A half-precision model's logits are cast to float32 for scoring; the record keeps the dtype the
    model computed in (near-ties depend on it), on every path, not the float32 of the cast."""
    import mlx.core as mx

    (seq,) = build_sequences(default_prompts(), llama[1], n=1, tokens=TOKENS)
    ids = list(seq.ids)
    assert half_llama(mx.array([ids[:TOKENS]])).dtype == mx.float16
    out, _ = arms.sequence_logits(half_llama, ids, shape, PLAIN)
    assert out.dtype == "float16" and out.logits.dtype == np.float32
    assert out.logits.shape[0] == shape.scored


class _Ticks:
    """Stands in for an arm's `ArmWatch`: the positions each forward reported, in order."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def advance(self, n: int = 1) -> None:
        self.seen.append(n)


@pytest.mark.parametrize(
    "shape",
    [
        RunShape(path="prefill", tokens=TOKENS, decode=0),
        RunShape(path="prefill", tokens=TOKENS, decode=0, chunk=7),
        RunShape(path="serving", tokens=TOKENS, decode=4, batched=False),
        RunShape(path="serving", tokens=TOKENS, decode=4),
    ],
    ids=["prefill", "chunked", "serving-one-at-a-time", "serving-batched"],
)
def test_the_arm_s_watch_hears_every_position_on_every_path(llama: tuple[Any, Any], shape: RunShape) -> None:
    """Progress lines and the arm's time limit are driven by these ticks: a path that never ticks
    would run past --mlx-arm-timeout unseen. Every forward reports, and they add up to the positions
    run; the record's positions are int32 on every path, as `SequenceLogits` documents."""
    model, tok = llama
    seqs = build_sequences(default_prompts(), tok, n=3, tokens=TOKENS)
    ticks = _Ticks()
    lever = _patch("mlx_lm.models.llama:scaled_dot_product_attention")
    arms.run_reference(model, seqs, shape, lever, counters=ArmCounters(), watch=ticks)  # type: ignore[arg-type]
    assert ticks.seen and all(n > 0 for n in ticks.seen)
    assert sum(ticks.seen) == len(seqs) * TOKENS
    outs, _ = arms.serving_logits(model, [s.ids for s in seqs], shape, PLAIN) if shape.path == "serving" else ([], 0)
    singles = [arms.sequence_logits(model, s.ids, shape, PLAIN)[0] for s in seqs]
    assert all(o.positions.dtype == np.int32 for o in [*outs, *singles])


@pytest.mark.parametrize(
    ("bad", "columns", "what"), [(np.inf, [5], "inf"), (-np.inf, slice(None), "inf"), (np.nan, [5], "NaN")]
)
def test_non_finite_logits_say_which_kind_where(bad: float, columns: Any, what: str) -> None:
    """An overflow (inf) and a NaN read differently to whoever debugs the kernel: the message names which.
    (-inf alone is a masked token, legal; a row of nothing but -inf predicts nothing.)"""
    from pytest_mlxgate.errors import NonFiniteLogitsError
    from pytest_mlxgate.kl.prompts import TokenSequence

    logits = np.zeros((4, 8), np.float32)
    logits[1, 3] = -np.inf  # a masked token: fine
    logits[2, columns] = bad
    out = arms.SequenceLogits(logits, np.arange(4, dtype=np.int32), np.arange(10, 14, dtype=np.int32), "float16")
    seq = TokenSequence(index=3, ids=tuple(range(5)), sources=("p",), preview="def f(")
    lever = Lever(name="k", kind="env", target="MLXGATE_TEST_UNUSED", ref="0", cand="1")
    with pytest.raises(NonFiniteLogitsError, match=rf"the candidate arm \(k=1\) produced {what} logits at prompt 3 "):
        arms._check_finite(seq, out, "candidate", lever)
    fine = arms.SequenceLogits(np.zeros((4, 8), np.float32), out.next_tokens, out.positions, out.dtype)
    arms._check_finite(seq, fine, "candidate", lever)  # finite: no error
