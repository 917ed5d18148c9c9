"""`mlxgate plan kv`: the greedy meets its target with the fewest bytes it can find, never upgrades what
needs no upgrade, and a search on a real (tiny) model ends in a plan whose gate run is its verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_mlxgate.explain.plan_kv import PLAIN_OPTION, Option, greedy_plan

OPTIONS = [Option(4, 64), Option(6, 64), Option(8, 64), Option(8, 32)]
#: Quantization noise falls about 4x per bit: each option's drift relative to 4-bit g64's.
SCALE = {Option(4, 64): 1.0, Option(6, 64): 1 / 16, Option(8, 64): 1 / 256, Option(8, 32): 1 / 300}


@settings(max_examples=200, deadline=None)
@given(
    sens=st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=12),
    sizes=st.lists(st.sampled_from([128.0, 256.0, 512.0]), min_size=12, max_size=12),
    share=st.floats(1e-4, 2.0),
)
def test_the_greedy_meets_its_target_and_upgrades_nothing_it_need_not(
    sens: list[float], sizes: list[float], share: float
) -> None:
    layers = {i: sizes[i] for i in range(len(sens))}

    def drift(i: int, o: Option) -> float:
        return 0.0 if o.bits is None else sens[i] * SCALE[o]

    cheapest = sum(sens)
    target = cheapest * share
    plan = greedy_plan(layers, OPTIONS, drift, target=target, itemsize=2)
    assert set(plan) == set(layers) and all(o in [*OPTIONS, PLAIN_OPTION] for o in plan.values())
    assert sum(drift(i, o) for i, o in plan.items()) <= target + 1e-12  # plain is always there: always met
    if target >= cheapest:
        assert all(o == Option(4, 64) for o in plan.values())  # nothing to buy
    plain_bytes = sum(PLAIN_OPTION.bytes_per_value(2) * s for s in layers.values())
    assert sum(o.bytes_per_value(2) * layers[i] for i, o in plan.items()) <= plain_bytes
    # resuming from a plan that meets the target changes nothing (the search's later rounds start there)
    assert greedy_plan(layers, OPTIONS, drift, target=target, start=plan, itemsize=2) == plan


def test_the_byte_cost_counts_packed_bits_and_a_scale_and_bias_per_group() -> None:
    assert Option(8, 64).bytes_per_value(4) == 1 + 8 / 64
    assert Option(4, 32).bytes_per_value(2) == 0.5 + 4 / 32
    assert PLAIN_OPTION.bytes_per_value(2) == 2
    assert Option(8, 64, 4).bytes_per_value(2) == (1 + 0.5) / 2 + 4 / 64  # keys at 8 bits, values at 4
    assert Option(8, 64, 8) == Option(8, 64, 8) and Option(8, 64, 8).label == Option(8, 64).label == "8-bit g64"


def test_options_apart_are_every_pair_with_the_keys_wider_and_write_as_the_plan_reads() -> None:
    """`--apart` adds K>V pairs at each group size that fits; each option's kv_config entry parses to the
    spec it names (keys and values at their widths), so the plan the search writes serves what it priced."""
    from pytest_mlxgate.explain.plan_kv import search_options
    from pytest_mlxgate.serving.kv_plan import parse_kv_value

    alike = search_options([4, 8], [32, 64], {64}, apart=False)
    assert [o.label for o in alike] == ["4-bit g32", "4-bit g64", "8-bit g32", "8-bit g64"]
    apart = search_options([4, 6, 8], [64, 128], {64}, apart=True)  # 128 divides no head dim: left out
    assert [o.label for o in apart] == ["4-bit g64", "6-bit g64", "8-bit g64", "K6/V4 g64", "K8/V4 g64", "K8/V6 g64"]
    for o in apart:
        spec = parse_kv_value(o.spec()).default
        assert spec is not None and (spec.k_bits, spec.v_bits, spec.group_size) == (o.bits, o.v_bits, o.group_size)
    assert min(apart, key=lambda o: o.bytes_per_value(2)).label == "4-bit g64"
    assert Option(8, 64, 4).bytes_per_value(2) == Option(6, 64).bytes_per_value(2)  # K8/V4 costs what 6-bit does


GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=6, tokens=24, decode=8),
]


def test_drift(paired):
    assert_kl_below(paired, mean=0.02, top1=0.5)
"""


@pytest.mark.slow  # a search (2 layers x 4 options) and one gate run on the tiny llama, in subprocesses
def test_a_search_writes_a_plan_its_record_and_is_verified_by_running_the_gate(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(GATE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "kv_config.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_mlxgate.cli",
            "plan",
            "kv",
            "--gate",
            str(gate),
            "--model",
            str(tiny_kv_model_dir),
            "--out",
            str(out),
            "--bits",
            "2,8",
            "--group-sizes",
            "32,64",
            "--selection",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MLXGATE_ALLOW_UNTRAINED": "1"},
    )
    record = json.loads(out.with_suffix(".search.json").read_text())
    verification = record["verification"]
    # --out holds a verified plan or none: an unverified one stays beside it, saying so
    unverified = tmp_path / "kv_config.unverified.json"
    assert out.is_file() != unverified.is_file() and out.is_file() == verification["verified"], done.stderr
    plan = json.loads((out if out.is_file() else unverified).read_text())
    assert set(plan["layers"]) == {"0", "1"}
    assert list(verification["verdicts"]) == [f"{gate.name}::test_drift"]
    # the exit status is the gate's verdict on its own prompts, never the search's hope
    assert (done.returncode == 0) == verification["verified"], done.stderr
    assert ("VERIFIED: passes" in done.stderr) == verification["verified"]
    uniform = {u["option"]: u for u in record["uniform"]}
    assert set(uniform) == {"2-bit g32", "2-bit g64", "8-bit g32", "8-bit g64"}
    passing = [u["bytes_per_token"] for u in uniform.values() if u["passes"]]
    if record["chosen"] == "mixed" and passing:
        assert record["bytes_per_token"] < min(passing)  # a mixed plan must cost less than every uniform one
    assert all(r["verdict"] in ("pass", "fail", "inconclusive") for r in record["rounds"])


@pytest.mark.parametrize("where", ["missing-folder/kv_config.json", "a-folder", "read-only/kv_config.json"])
def test_an_out_that_cannot_be_written_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """Before: found after the whole search (524 s here), a raw FileNotFoundError, the result gone."""
    from pytest_mlxgate.cli import main

    (tmp_path / "a-folder").mkdir()
    (tmp_path / "read-only").mkdir(mode=0o500)
    if where.startswith("read-only") and os.access(tmp_path / "read-only", os.W_OK):
        pytest.skip("this user writes into read-only folders (root)")
    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(GATE)
    code = main(
        ["plan", "kv", "--gate", str(gate), "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / where)]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"--out {tmp_path / where}:" in err and "give a file in a folder you can write" in err, err
    assert "Traceback" not in err and not list(tmp_path.rglob("*.probe"))


# --- the search's decisions, each a test that fails when it is wrong (fast lane) -------------------------


def _stats(mean: float, *, sequences: int = 8, tokens: int = 16) -> Any:
    """Real statistics (`summarize`) of scores whose per-token KL sits within 5% of `mean`."""
    import numpy as np

    from pytest_mlxgate.stats.divergence import TokenScores
    from pytest_mlxgate.stats.kl_stats import summarize

    rng = np.random.default_rng(int(mean * 1e9) % 2**32)
    scores = []
    for _ in range(sequences):
        kl = mean * (1 + 0.05 * rng.uniform(-1, 1, tokens))
        same = np.zeros(tokens, dtype=np.int32)
        logprob = np.full(tokens, -1.0, dtype=np.float32)
        scores.append(
            TokenScores(
                kl=kl,
                ref_top1=same,
                cand_top1=same,
                near_tie=np.zeros(tokens, dtype=bool),
                ref_next_logprob=logprob,
                cand_next_logprob=logprob,
                next_tokens=same,
                positions=np.arange(tokens, dtype=np.int32),
            )
        )
    return summarize(scores)


FOUR, EIGHT = Option(4, 64), Option(8, 64)
LIMITS = {"mean": 0.01, "top1": 0.5}


def _measured(sens: dict[int, float], *, interaction: float = 0.0, floor: float = 0.0) -> tuple[Any, list[Any]]:
    """A measurement whose true drift is the layers' sum, raised by `interaction` per extra quantized
    layer (one layer alone is exact, as the sensitivities are), plus `floor`; it records every plan."""
    asked: list[dict[int, Option]] = []
    scale = {FOUR: 1.0, EIGHT: 1 / 256}

    def measure(plan: Any, what: str) -> Any:
        asked.append(dict(plan))
        quantized = [i for i, o in plan.items() if o.bits is not None]
        drift = sum(sens[i] * scale[plan[i]] for i in quantized) * (1 + interaction * max(len(quantized) - 1, 0))
        return _stats(max(drift + floor, 1e-9))

    return measure, asked


def test_a_plan_that_fails_backs_off_by_halving_then_bisects_for_the_cheapest_that_passes() -> None:
    """Halving until a plan passes, then the target bisects (geometrically) between the lowest that failed and
    the highest that passed; the answer is the cheapest plan that passed, never one that failed."""
    import math

    from pytest_mlxgate.explain.plan_kv import MAX_ROUNDS, TARGET_SHARE, choose_plan

    sizes = {i: 100.0 for i in range(8)}
    sens = {0: 2.5e-4, 1: 3e-4, 2: 0.025, 3: 2e-4, 4: 1.5e-3, 5: 1e-3, 6: 5e-4, 7: 4e-4}
    measure, asked = _measured(sens, interaction=0.5)  # layers interact: the additive guess is too low
    result = choose_plan(sizes, [FOUR, EIGHT], 2, LIMITS, measure)
    rounds = result.rounds
    plans = asked[-len(rounds) :]  # each round's plan, as measured
    verdicts = [r["verdict"] for r in rounds]
    assert 1 < len(rounds) <= MAX_ROUNDS and rounds[0]["target"] == LIMITS["mean"] * TARGET_SHARE
    first = verdicts.index("pass")
    assert first > 0 and len(rounds) > first + 1, rounds  # it halved, passed, then looked for cheaper
    for a, b in zip(rounds[:first], rounds[1 : first + 1], strict=False):  # halving below what was found
        assert b["target"] == min(a["target"], a["predicted"]) / 2 and b["predicted"] < a["predicted"]
    for k in range(first + 1, len(rounds)):  # then between the lowest failure and the highest pass so far
        failed = min(r["target"] for r in rounds[:k] if r["verdict"] != "pass")
        passed = max(r["target"] for r in rounds[:k] if r["verdict"] == "pass")
        assert (
            rounds[k]["target"] == pytest.approx(math.sqrt(failed * passed)) and passed < rounds[k]["target"] < failed
        )
    passing = [(r["bytes_per_token"], k) for k, r in enumerate(rounds) if r["verdict"] == "pass"]
    cheapest, k = min(passing)
    assert result.layers == plans[k] and result.bytes_per_token == cheapest and result.passed_selection
    assert len(passing) > 1 and cheapest < max(passing)[0]  # the bisection found a cheaper plan that passes
    assert result.chosen == "mixed" and result.succeeded  # no verification asked for: the selection's pass


def test_a_uniform_plan_wins_when_no_mixed_plan_costs_fewer_bytes() -> None:
    from pytest_mlxgate.explain.plan_kv import choose_plan

    sizes = {0: 100.0, 1: 100.0}
    measure, _ = _measured({0: 0.5, 1: 0.5})  # both layers need 8 bits: the "mixed" plan is uniform 8-bit
    result = choose_plan(sizes, [FOUR, EIGHT], 2, LIMITS, measure)
    assert result.chosen == "uniform 8-bit g64" and set(result.layers.values()) == {EIGHT}
    assert result.bytes_per_token == EIGHT.bytes_per_value(2) * 200
    assert result.passed_selection and result.succeeded  # the uniform plan passed its own measurement


def test_a_mixed_plan_wins_only_when_it_is_cheaper_than_every_uniform_plan_that_passes() -> None:
    from pytest_mlxgate.explain.plan_kv import choose_plan

    sizes = {0: 100.0, 1: 100.0, 2: 100.0}
    measure, _ = _measured({0: 0.5, 1: 1e-4, 2: 1e-4})  # one sensitive layer: 8 bits there, 4 elsewhere
    result = choose_plan(sizes, [FOUR, EIGHT], 2, LIMITS, measure)
    passing = [u["bytes_per_token"] for u in result.uniform if u["passes"]]
    assert result.chosen == "mixed" and result.layers == {0: EIGHT, 1: FOUR, 2: FOUR}
    assert passing and result.bytes_per_token < min(passing)


def test_when_nothing_passes_the_answer_is_none_and_never_a_success() -> None:
    from pytest_mlxgate.explain.plan_kv import MAX_ROUNDS, choose_plan

    measure, _ = _measured({0: 0.5, 1: 0.5}, floor=1.0)  # every plan drifts past the limit
    result = choose_plan({0: 100.0, 1: 100.0}, [FOUR, EIGHT], 2, LIMITS, measure)
    assert result.chosen == "none" and not result.passed_selection and not result.succeeded
    # every plan the greedy reaches was measured (down to every layer plain, here at once): no round repeats one
    assert 1 <= len(result.rounds) <= MAX_ROUNDS and "keep the plain cache" in result.notes[0]
    assert f"in {len(result.rounds)} measured round" in result.notes[0]


@pytest.mark.parametrize(
    ("chosen", "selection", "verification", "succeeded"),
    [
        ("mixed", True, {"verified": False}, False),  # the gate's verdict overrides the selection's
        ("uniform 8-bit g64", True, {"verified": False}, False),
        ("mixed", False, {"verified": True}, True),
        ("mixed", True, None, True),  # --no-verify: the selection's pass, said to be only that
        ("none", False, None, False),
        ("none", True, {"verified": True}, False),
    ],
)
def test_success_is_the_gate_s_verification_when_there_is_one(
    chosen: str, selection: bool, verification: Any, succeeded: bool
) -> None:
    from pytest_mlxgate.explain.plan_kv import PlanSearch

    result = PlanSearch({}, 0.0, 1.0, [], [], {}, selection, chosen, 0.0, 4, verification)
    assert result.succeeded is succeeded


@pytest.mark.parametrize(
    ("prompts", "tokens", "reserve"), [(16, 128, None), (6, 24, None), (3, 400, None), (8, 32, 128), (8, 32, None)]
)
def test_the_selection_never_reads_what_the_gate_reads_and_follows_its_domains(
    tiny_kv_model_dir: Path, prompts: int, tokens: int, reserve: int | None
) -> None:
    """A prompt the gate uses appears in the selection only past every id the gate's runs read (its first
    `reserve` + 1); and the selection's domains are the gate's where they can be. Before: free prompts in
    file order, so the weights gate (8 prompts of 32 tokens: all code) was planned on prose and math, and
    its plan, 1.6x easier there, failed the gate."""
    import mlx_lm

    from pytest_mlxgate.explain.plan_gate import GateSpec, selection_sequences
    from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, render
    from pytest_mlxgate.levers.lever import Lever

    _, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))
    gate = GateSpec(
        Path("g.py"), Lever("kv", "kv", None, None, None, path="serving"), prompts, tokens, 4, {"mean": 0.1}, ("t",)
    )
    prompts_by_id = {p.id: p for p in default_prompts()}
    own: set[str] = set()
    for length in {tokens, reserve or tokens}:
        own |= {
            s for seq in build_sequences(default_prompts(), tokenizer, n=prompts, tokens=length) for s in seq.sources
        }
    chosen = selection_sequences(tokenizer, gate, 4, reserve=reserve)
    assert len(chosen) == 4 and all(len(seq.ids) == tokens + 1 for seq in chosen)
    assert [s.index for s in chosen] == [0, 1, 2, 3] and len({s.text for s in chosen}) == 4  # four texts
    for seq in chosen:
        if seq.text not in own:
            continue
        ids = list(tokenizer.encode(render(prompts_by_id[seq.text], tokenizer)))
        at = [k for k in range(len(ids)) if tuple(ids[k : k + tokens + 1]) == seq.ids]
        assert at and min(at) >= (reserve or tokens) + 1, (seq.text, at)  # past all the gate reads of it
    gate_domains = {prompts_by_id[s].domain for s in own}
    chosen_domains = [prompts_by_id[s.text].domain for s in chosen]
    if (prompts, tokens) == (8, 32):  # the weights gate: all code, and so is its selection
        assert gate_domains == {"code"} and set(chosen_domains) == {"code"}


def test_a_gate_that_reads_every_prompt_whole_leaves_no_selection_and_says_so(tiny_kv_model_dir: Path) -> None:
    import mlx_lm

    from pytest_mlxgate.errors import MlxgateUsageError
    from pytest_mlxgate.explain.plan_gate import GateSpec, selection_sequences
    from pytest_mlxgate.kl.prompts import default_prompts
    from pytest_mlxgate.levers.lever import Lever

    _, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))
    everything = len(default_prompts())
    gate = GateSpec(
        Path("g.py"), Lever("kv", "kv", None, None, None, path="serving"), everything, 400, 4, {"mean": 0.1}, ("t",)
    )
    with pytest.raises(
        MlxgateUsageError,
        match=r"^--selection 4: the default prompts give 0 sequences of 401 tokens .* lower --selection",
    ):
        selection_sequences(tokenizer, gate, 4)
    gate = GateSpec(  # read only to 65 ids each: the rest of every prompt is still there to select from
        Path("g.py"), Lever("kv", "kv", None, None, None, path="serving"), everything, 64, 4, {"mean": 0.1}, ("t",)
    )
    assert len(selection_sequences(tokenizer, gate, 4)) == 4


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--bits", "0", "--bits 0: 0 is not"),
        ("--bits", "4,7", "--bits 4,7: 7 is not"),
        ("--group-sizes", "48", "--group-sizes 48: 48 is not"),
        ("--selection", "1", "--selection 1: "),
    ],
)
def test_a_bad_search_option_is_refused_by_its_own_name_before_any_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, named: str
) -> None:
    """Before: `--bits 0` was reported against an internal temporary file, after the search."""
    from pytest_mlxgate.cli import main

    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(GATE)
    argv = ["plan", "kv", "--gate", str(gate), "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "o.json")]
    code = main([*argv, option, value])
    err = capsys.readouterr().err
    assert code == 2 and named in err and "Traceback" not in err and "mlxgate-plan-" not in err, err
    assert not list(tmp_path.glob("o*.json"))


#: A gate whose limits any plan meets on the selection, and whose test then fails on its own prompts:
#: only the verification can say no.
FAILS_ON_ITS_OWN_PROMPTS = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=%d, tokens=%d, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=10.0, top1=0.0)
    raise AssertionError("the plan fails this gate on its own prompts")
"""


def _plan_command(gate: Path, model: Path, out: Path, *more: str) -> list[str]:
    return [
        sys.executable, "-m", "pytest_mlxgate.cli", "plan", "kv", "--gate", str(gate), "--model", str(model),
        "--out", str(out), "--bits", "8", "--group-sizes", "64", "--selection", "2", *more,
    ]  # fmt: skip


def test_the_exit_status_is_the_verification_s_even_when_the_selection_passed(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(FAILS_ON_ITS_OWN_PROMPTS % (2, 8))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "kv_config.json"
    done = subprocess.run(
        _plan_command(gate, tiny_kv_model_dir, out),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MLXGATE_ALLOW_UNTRAINED": "1"},
    )
    record = json.loads(out.with_suffix(".search.json").read_text())
    assert record["passed_selection"] and record["verification"]["verified"] is False, done.stderr
    assert done.returncode == 1 and "NOT verified" in done.stderr and "was not written" in done.stderr
    assert not out.exists() and (tmp_path / "kv_config.unverified.json").is_file()
    # the search and the gate's verification keep their references in one place: pytest's, where the gate runs
    shared = tmp_path / ".pytest_cache" / "d" / "mlxgate-reference"
    assert f"--mlx-reference-cache={shared}" in record["verification"]["command"]
    assert list((shared / "plans").glob("*.json")) and list(shared.glob("*.npz"))


def test_ctrl_c_during_the_search_ends_in_one_line_and_writes_nothing(tiny_kv_model_dir: Path, tmp_path: Path) -> None:
    """Before: a raw KeyboardInterrupt traceback. A real SIGINT, sent once the search is measuring."""
    import signal
    import time

    gate = tmp_path / "test_kv_gate.py"
    gate.write_text(FAILS_ON_ITS_OWN_PROMPTS % (4, 512))  # long enough to be caught measuring
    out = tmp_path / "kv_config.json"
    command = _plan_command(gate, tiny_kv_model_dir, out, "--bits", "2,3,4,5,6,8", "--group-sizes", "32,64,128")
    with subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "MLXGATE_ALLOW_UNTRAINED": "1", "PYTHONUNBUFFERED": "1"},
        # as a terminal's Ctrl-C finds it: an xdist worker ignores SIGINT, and a child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ) as proc:
        assert proc.stderr is not None
        seen = ""
        while "plan kv: uniform" not in seen:
            line = proc.stderr.readline()
            assert line, f"the search ended before it was interrupted: {seen}"
            seen += line
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        code = proc.wait(timeout=60)
    lines = [line for line in rest.splitlines() if line.strip() and not line.startswith("plan kv: ")]
    assert code == 130 and lines == [f"mlxgate plan kv: interrupted; {out} was not written"], rest
    assert not list(tmp_path.glob("kv_config*"))


# --- in process, so mutation testing sees them: reading the gate, the search on a real model, its words --


MODEL_LIMITS_GATE = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=5, tokens=20, decode=6),
]


def test_drift(paired):
    assert_kl_below(paired, mean=0.02, top1=0.5, models={"tiny": {"mean": 0.05, "p99": 0.4}})


def test_other(paired):
    assert_kl_below(paired, mean=0.03)
"""


@pytest.mark.parametrize(
    ("model", "limits"), [(None, {"mean": 0.02, "top1": 0.5}), ("tiny", {"mean": 0.05, "top1": 0.5, "p99": 0.4})]
)
def test_read_gate_takes_the_marks_sizes_and_the_limits_for_the_model(
    tmp_path: Path, model: str | None, limits: dict[str, float]
) -> None:
    from pytest_mlxgate.explain.plan_gate import read_gate

    path = tmp_path / "test_kv_gate.py"
    path.write_text(MODEL_LIMITS_GATE)
    gate = read_gate(path, model=model)
    assert (gate.path, gate.prompts, gate.tokens, gate.decode) == (path, 5, 20, 6)
    assert gate.limits == limits  # the first test's own, then the model's entry over them
    assert gate.kl_tests == ("test_drift", "test_other") and gate.lever.kind == "kv"
    assert gate.lever.kv_plan("reference").is_plain and not gate.lever.kv_plan("candidate").is_plain


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "no such file"),
        ("import pytest\n", "declares no mlx_lever"),
        (GATE.replace('kv=True, ref="plain"', 'kv=True, ref={"bits": 8}'), "reference arm is not the plain cache"),
        (GATE.replace("mean=0.02, top1=0.5", "top1=0.5"), "asserts no mean KL limit"),
    ],
)
def test_read_gate_refuses_what_the_search_cannot_use(tmp_path: Path, text: str | None, message: str) -> None:
    from pytest_mlxgate.errors import MlxgateUsageError
    from pytest_mlxgate.explain.plan_gate import read_gate

    path = tmp_path / "test_kv_gate.py"
    if text is not None:
        path.write_text(text)
    with pytest.raises(MlxgateUsageError, match=message):
        read_gate(path)


def test_a_search_on_a_real_model_measures_each_option_and_layer_and_says_what_it_found(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    import mlx_lm

    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_kv import plan_summary, search_kv_plan

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    path = tmp_path / "test_kv_gate.py"
    path.write_text(GATE)
    said: list[str] = []
    result = search_kv_plan(model, tokenizer, read_gate(path), bits=(2, 8), groups=(64,), selection=2, say=said.append)
    assert result.selection == 2 and result.seconds > 0 and set(result.sensitivity) == {0, 1}
    assert [u["option"] for u in result.uniform] == ["2-bit g64", "8-bit g64"]
    assert said[0].startswith("plan kv: reference arm on 2 selection sequences (the gate's 6 prompts held out)")
    # each layer alone, at the cheapest option: side by side in one batch (plan_rows)
    assert [s for s in said if "alone" in s] == [
        "plan kv: each of 2 layers alone at 2-bit g64 (fake-quant, 2 plans batched)"
    ]
    record = result.to_json()
    assert record["selection_sequences"] == 2 and record["chosen"] == result.chosen
    assert record["kv_config"] == result.kv_config() and set(record["sensitivity"]) == {"0", "1"}
    assert record["bytes_per_token"] == result.bytes_per_token and record["verification"] is None
    assert isinstance(record["seconds"], float) and record["seconds"] == round(result.seconds, 1)
    lines = plan_summary(result)
    assert lines[0].startswith(f"plan ({result.chosen}): ") and "KV bytes per token" in lines[0]
    assert [line.split(":")[0].strip() for line in lines[1:3]] == ["uniform 2-bit g64", "uniform 8-bit g64"]
    assert any(line.strip().startswith("round 1: predicted") for line in lines)
    if result.chosen != "none":  # no verification ran: the summary says the plan is unverified
        assert any("not verified (--no-verify)" in line for line in lines)


def test_a_search_apart_measures_each_pair_and_writes_a_plan_that_serves_each_half_at_its_width(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    """With `apart`, K8/V2 is an option beside 2- and 8-bit: measured uniform like them, and the plan
    written reads back as the widths the search chose for each layer."""
    import mlx_lm

    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_kv import search_kv_plan
    from pytest_mlxgate.serving.kv_plan import parse_kv_value

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    path = tmp_path / "test_kv_gate.py"
    path.write_text(GATE)
    result = search_kv_plan(model, tokenizer, read_gate(path), bits=(2, 8), groups=(64,), selection=2, apart=True)
    assert [u["option"] for u in result.uniform] == ["2-bit g64", "8-bit g64", "K8/V2 g64"]
    by_label = {u["option"]: u for u in result.uniform}
    assert by_label["2-bit g64"]["mean"] > by_label["K8/V2 g64"]["mean"] > by_label["8-bit g64"]["mean"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(result.kv_config()))
    plan = parse_kv_value(plan_file)
    for i, o in result.layers.items():
        spec = plan.for_layer(i)
        assert (None if spec is None else (spec.k_bits, spec.v_bits)) == (
            None if o.bits is None else (o.bits, o.v_bits)
        )


def test_verify_plan_runs_the_gate_s_kl_tests_on_the_plan_and_reads_their_verdicts(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import verify_plan

    path = tmp_path / "test_kv_gate.py"
    path.write_text(FAILS_ON_ITS_OWN_PROMPTS % (2, 8))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"default": {"bits": 8, "group_size": 64}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLXGATE_ALLOW_UNTRAINED", "1")
    got = verify_plan(read_gate(path), plan, candidate=str(tiny_kv_model_dir), report=tmp_path / "r.json")
    assert got["verdicts"] == {f"{path.name}::test_drift": "error"}  # it raised after its KL assertion
    assert got["verified"] is False and got["exit"] == 1 and got["output_tail"]
    assert f"--mlx-cand-value={plan}" in got["command"] and "-k test_drift" in got["command"]
    assert f"--mlx-candidate={tiny_kv_model_dir}" in got["command"] and got["checks"]


def test_group_sizes_that_divide_no_head_dimension_are_refused_naming_both(
    tiny_kv_model_dir: Path, tmp_path: Path
) -> None:
    import mlx_lm

    from pytest_mlxgate.errors import MlxgateUsageError
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_kv import search_kv_plan

    model, tokenizer = mlx_lm.load(str(tiny_kv_model_dir))[:2]
    path = tmp_path / "test_kv_gate.py"
    path.write_text(GATE)
    with pytest.raises(
        MlxgateUsageError, match=r"no group size among \[128\] divides this model's head dimensions \[64\]"
    ):
        search_kv_plan(model, tokenizer, read_gate(path), bits=(8,), groups=(128,), selection=2)


@pytest.mark.parametrize("verified", [True, False])
def test_the_summary_ends_with_the_gate_s_own_verdict_on_its_prompts(verified: bool) -> None:
    from pytest_mlxgate.explain.plan_kv import PlanSearch, plan_summary

    verdicts = {"g.py::test_drift": "pass" if verified else "fail"}
    result = PlanSearch(
        {0: Option(8, 64)},
        100.0,
        200.0,
        [],
        [],
        {0: 1e-3},
        True,
        "mixed",
        3.0,
        4,
        {"verified": verified, "verdicts": verdicts},
    )
    lines = plan_summary(result)
    word = "VERIFIED: passes" if verified else "NOT verified: does not pass"
    assert any(line.startswith(f"  {word} the gate on its own (held-out) prompts: {verdicts}") for line in lines)
    assert lines[0] == "plan (mixed): 1 layers 8-bit g64 · 100 KV bytes per token (50.0% of plain)"
    assert not any("--no-verify" in line for line in lines) and lines[-1] == "  took 3 s"


@pytest.mark.parametrize(
    ("fixture", "expected", "dims"),
    [
        ("tiny_kv_model_dir", {0: 256.0, 1: 256.0}, {64}),  # 2 KV heads x head_dim 64, K and V
        # sliding layers: 1 KV head x 64; full layer 3: x global_head_dim 128; KV-shared layers 5-7 keep none
        ("tiny_gemma4_dir", {0: 128.0, 1: 128.0, 2: 128.0, 3: 256.0, 4: 128.0}, {64, 128}),
    ],
)
def test_each_cached_layer_is_sized_by_its_k_and_v_values_per_token(
    fixture: str, expected: dict[int, float], dims: set[int], request: pytest.FixtureRequest
) -> None:
    """The bytes a plan saves are counted from these sizes: per cached layer, the K and V values one token
    adds (heads x head dimension each), the cache's item size, and the head dimensions the group sizes
    must divide."""
    import mlx_lm

    from pytest_mlxgate.explain.plan_kv import _layer_sizes

    model = mlx_lm.load(str(request.getfixturevalue(fixture)))[0]
    assert _layer_sizes(model) == (expected, 4, dims)  # float32 weights: a 4-byte cache


SHORT_AND_LONG = """
import pytest
from pytest_mlxgate import assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=6, tokens=12, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=%g)
"""
#: Between the two figures by orders of magnitude: measured 5.1e-5 (bound 9.4e-5) at 12 tokens, where the
#: sliding layers never quantize, and 0.93 (bound 1.5) at 48, where they are at 2 bits past token 24.
SHORT_AND_LONG_LIMIT = 1e-2


def test_a_plan_that_passes_at_the_gate_s_length_and_fails_past_the_window_is_refused_with_both_figures(
    tiny_gemma4_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the tiny gemma-4 (sliding window 16): full layers at 8 bits from the first token, sliding layers at
    2 bits from token 24. The gate's 13-token sequences never reach token 24, so it passes; the long
    verification (48 tokens: 4x, past the window) quantizes the sliding layers and fails: not verified,
    and the summary says both figures."""
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import long_context, verification_lines, verify_plan
    from pytest_mlxgate.serving.caches import sliding_window
    from pytest_mlxgate.serving.kv_plan import parse_kv_value

    path = tmp_path / "test_kv_gate.py"
    path.write_text(SHORT_AND_LONG % SHORT_AND_LONG_LIMIT)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"types": {"full": {"bits": 8}, "sliding": {"bits": 2, "start": 24}}}))
    assert parse_kv_value(plan).apart is False
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLXGATE_ALLOW_UNTRAINED", "1")
    gate = read_gate(path)
    import mlx_lm

    long = long_context(gate, sliding_window(mlx_lm.load(str(tiny_gemma4_dir))[0]))
    assert long == 48
    got = verify_plan(gate, plan, candidate=str(tiny_gemma4_dir), report=tmp_path / "r.json", long=long)
    assert got["verdicts"] == {f"{path.name}::test_drift": "pass"}, got["output_tail"]
    assert got["long"]["verdicts"] == {f"{path.name}::test_drift": "fail"} and got["long"]["tokens"] == 48
    assert got["verified"] is False and "--mlx-kl-tokens=48" in got["long"]["command"]
    lines = verification_lines(got)
    assert lines[0].startswith("  NOT verified: passes the gate at 12 tokens but not at 48 tokens")
    assert lines[1].startswith("    at 12 tokens: mean ") and lines[1].endswith("pass")
    assert lines[2].startswith("    at 48 tokens: mean ") and lines[2].endswith("fail")


def test_a_plan_that_passes_the_selection_with_no_room_is_not_a_pass() -> None:
    """The gate judges a plan on prompts the selection never saw: a round whose mean bound passes the limit
    but reaches past SELECTION_MARGIN of it reads inconclusive, and the search goes on to a safer plan.
    Before: a KV plan at bound 1.74e-3 of 2e-3 on the selection was returned and read 2.5e-3 (bound 5.5e-3)
    on the gate's own prompts."""
    from pytest_mlxgate.explain.plan_kv import SELECTION_MARGIN, measured_rounds

    sizes = {0: 100.0, 1: 100.0}
    drift = {FOUR: 1.0, EIGHT: 0.0}

    def measure(plan: Any, what: str) -> Any:
        mean = 0.9 * LIMITS["mean"] if any(o == FOUR for o in plan.values()) else 0.2 * LIMITS["mean"]
        return _stats(mean)  # a bound just above its mean: within the limit either way

    plan, rounds, passed = measured_rounds(
        sizes, [FOUR, EIGHT], lambda i, o: 0.0 if o.bits is None else drift[o] * 1e-3 * (i + 1), 2, LIMITS, measure
    )
    first = rounds[0]
    assert first["mean_ci"][1] < LIMITS["mean"] and first["mean_ci"][1] > SELECTION_MARGIN * LIMITS["mean"]
    assert first["verdict"] == "inconclusive" and first["checks"]["mean"].startswith("within the limit but not 70%")
    assert passed and all(o != FOUR for o in plan.values())  # the answer has the room
    assert rounds[-1]["verdict"] == "pass" and rounds[-1]["mean_ci"][1] <= SELECTION_MARGIN * LIMITS["mean"]


WITH_CAPABILITY = """
import pytest
from pytest_mlxgate import assert_capability_at_least, assert_kl_below

pytestmark = [
    pytest.mark.mlx_lever("kv_cache", kv=True, ref="plain", cand={"bits": 8, "group_size": 64}, path="serving"),
    pytest.mark.mlx_kl(prompts=3, tokens=16, decode=4),
]


def test_drift(paired):
    assert_kl_below(paired, mean=10.0, top1=0.0)


def test_tasks(paired):
    assert_capability_at_least(paired, "hashhop", max_drop=0.9, n=4)
    %s
"""


def _capability_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str = "") -> tuple[Path, Path]:
    """A KV gate with a KL test and a HashHop test (`body` after its assertion), an 8-bit plan beside it."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"default": {"bits": 8, "group_size": 64}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLXGATE_ALLOW_UNTRAINED", "1")
    path = tmp_path / "test_kv_gate.py"
    path.write_text(WITH_CAPABILITY % body)
    return path, plan


def test_a_plan_that_passes_the_gate_s_capability_tests_too_is_verified(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4 of issue 43: where the gate asks for capability tasks (HashHop), a plan that passes its KL
    tests runs them too, each run with its own -k and report, and is verified when they pass."""
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import verification_lines, verify_plan

    path, plan = _capability_gate(tmp_path, monkeypatch)
    gate = read_gate(path)
    assert gate.kl_tests == ("test_drift",) and gate.capability_tests == ("test_tasks",)
    got = verify_plan(gate, plan, candidate=str(tiny_kv_model_dir), report=tmp_path / "r.json")
    assert got["verified"] is True, got["capability"]["output_tail"]
    assert got["verdicts"] == {f"{path.name}::test_drift": "pass"}
    assert got["capability"]["verdicts"] == {f"{path.name}::test_tasks": "pass"}
    assert "-k test_tasks" in got["capability"]["command"] and "-k test_drift" in got["command"]
    assert verification_lines(got)[0].endswith(f"and its capability tests: {{'{path.name}::test_tasks': 'pass'}}")


@pytest.mark.slow  # the gate under pytest: its KL test, then its capability test (HashHop, 4 items), twice
def test_a_plan_is_refused_where_the_gate_s_capability_tests_do_not_pass_or_says_they_were_not_run(
    tiny_kv_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`capability=False` says the capability tests were not run; a plan that fails them is not verified."""
    from pytest_mlxgate.explain.plan_gate import read_gate
    from pytest_mlxgate.explain.plan_verify import verification_lines, verify_plan

    path, plan = _capability_gate(tmp_path, monkeypatch)
    gate, model = read_gate(path), str(tiny_kv_model_dir)
    skipped = verify_plan(gate, plan, candidate=model, report=tmp_path / "s.json", capability=False)
    assert skipped["verified"] is True and skipped["capability"] == "not run"
    assert "capability tests were not run (--no-capability): KL only" in verification_lines(skipped)[0]

    path.write_text(WITH_CAPABILITY % 'raise AssertionError("the plan loses this task")')
    failed = verify_plan(read_gate(path), plan, candidate=model, report=tmp_path / "f.json")
    assert failed["verdicts"] == {f"{path.name}::test_drift": "pass"}  # the KL passed: the tasks refused it
    assert failed["verified"] is False and failed["capability"]["verdicts"] == {f"{path.name}::test_tasks": "error"}
    lines = verification_lines(failed)
    assert lines[0].startswith("  NOT verified: passes the gate's KL tests at 16 tokens but not its capability tests")


def test_the_reference_cache_is_pytest_s_where_the_gate_runs_a_folder_or_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import argparse

    from pytest_mlxgate.plan_cli import reference_cache_dir

    monkeypatch.chdir(tmp_path)
    assert reference_cache_dir(argparse.Namespace(reference_cache=None)) == (
        tmp_path / ".pytest_cache" / "d" / "mlxgate-reference"
    )
    assert reference_cache_dir(argparse.Namespace(reference_cache="elsewhere")) == Path("elsewhere")
    assert reference_cache_dir(argparse.Namespace(reference_cache="OFF")) is None
