"""explain: drift attribution on the embedded model (30 layers), at the default budget, for planted
single-layer breaks: is the planted layer named first, with an interval clear of every other scope's,
and what does it cost beside the gate?

* `kv`: the KV gate's shape (16 prompts x 128 tokens, 32 decoded) with an 8-bit plan whose layer
  `--kv-layer` (default 17) is 2-bit g32, against the plain cache;
* `scale`: the prefill path (16 x 128) with one layer's (`--scale-layer`, default 9) attention scale
  halved by a patch of the attention class.

Each case runs as a gate would: both arms (the reference stored in a reference cache), then the
attribution, which reads that cache. Goals: the planted layer first and separated; attribution
<= 3x the gate's two arms in time (the budget's own rule, `--mlx-explain-budget`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._common import TESTS_DIR, header, verdict

BUDGET_GOAL = 3.0


def _embedded() -> Any:
    import mlx_lm

    from pytest_mlxgate.models.embedded import EMBEDDED_REPO_ID, ensure_embedded_snapshot
    from pytest_mlxgate.models.loaded import LoadedModel
    from pytest_mlxgate.models.materialize import ResolvedSnapshot

    path = ensure_embedded_snapshot()
    model, tokenizer = mlx_lm.load(str(path))
    snap = ResolvedSnapshot(
        name="smollm2-135m",
        kind="embedded",
        repo_id=EMBEDDED_REPO_ID,
        commit=path.name,
        path=str(path),
        source="cached",
    )
    return LoadedModel(model, tokenizer, snap)


def _case(name: str, loaded: Any, lever: Any, shape: Any, planted: int, cache_dir: Path) -> bool:
    from pytest_mlxgate.explain.attribute import DEFAULT_BUDGET
    from pytest_mlxgate.kl.prompts import build_sequences, default_prompts, sequences_digest
    from pytest_mlxgate.kl.refcache import ReferenceCache
    from pytest_mlxgate.results.attribution_text import attribution_lines
    from pytest_mlxgate.results.record_kl import parse_attribution
    from pytest_mlxgate.session.paired_run import PairedRun

    header(f"explain {name}: planted break at layer {planted}")
    seqs = build_sequences(default_prompts(), loaded.tokenizer, n=16, tokens=shape.tokens)
    run = PairedRun(
        lever=lever,
        shape=shape,
        sequences=seqs,
        sequences_digest=sequences_digest(seqs),
        candidate=loaded,
        reference=None,
        machine={"device": "cpu", "bench": "explain"},
        cache=ReferenceCache(cache_dir),
        explain_budget=DEFAULT_BUDGET,  # what a failing gate gets from the session by default
    )
    t0 = time.perf_counter()
    kl = run.kl()
    gate_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    found = run.explanation(kl, "fail")
    explain_s = time.perf_counter() - t1
    assert found is not None
    a = parse_attribution(found)
    for line in attribution_lines(a):
        print(line)
    top = a.top(1)[0]
    others = [s for s in a.scopes if s.kind in ("layer", "block", "rest") and planted not in s.layers]
    lo = top.mean_ci.lower or 0.0
    separated = all(s.mean_ci.upper is not None and lo > s.mean_ci.upper for s in others)
    first = top.layers == (planted,)
    ratio = explain_s / gate_s
    print(f"gate (both arms) {gate_s:.1f} s · attribution {explain_s:.1f} s = {ratio:.2f}x the gate")
    print(f"planted layer first: {verdict(first)} · separated from every other scope: {verdict(separated)}")
    print(f"cost <= {BUDGET_GOAL:g}x the gate: {verdict(ratio <= BUDGET_GOAL)}")
    return first and separated and ratio <= BUDGET_GOAL


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="explain")
    parser.add_argument("--only", choices=("kv", "scale"))
    parser.add_argument("--kv-layer", type=int, default=17)
    parser.add_argument("--scale-layer", type=int, default=9)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(TESTS_DIR))
    from planted import halved_scale, patch_target

    from pytest_mlxgate.explain.layers import decoder_layers
    from pytest_mlxgate.kl.shape import RunShape
    from pytest_mlxgate.levers.lever import Lever

    loaded = _embedded()
    with tempfile.TemporaryDirectory(prefix="mlxgate-bench-explain-") as tmp:
        if args.only in (None, "kv"):
            plan = Path(tmp) / "plan.json"
            plan.write_text(
                json.dumps({"default": {"bits": 8}, "layers": {str(args.kv_layer): {"bits": 2, "group_size": 32}}})
            )
            lever = Lever("kv", "kv", None, None, str(plan), path="serving")
            _case("kv", loaded, lever, RunShape("serving", 128, 32), args.kv_layer, Path(tmp) / "cache")
        if args.only in (None, "scale"):
            attention = decoder_layers(loaded.model)[args.scale_layer].self_attn
            lever = Lever("scale", "patch", patch_target(attention), None, halved_scale(attention))
            _case("scale", loaded, lever, RunShape("prefill", 128, 32), args.scale_layer, Path(tmp) / "cache")
