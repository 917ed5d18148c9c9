"""A record's `oracle` part (`kl.oracle`): read into the typed model, written back as it was, and said in the
summary beside the n it rests on."""

from __future__ import annotations

from typing import Any

from pytest_mlxgate.results.model import parse_record
from pytest_mlxgate.results.summary import n_parts

ORACLE: dict[str, Any] = {
    "dtype": "bfloat16",
    "oracle": "float32",
    "same": False,
    "source": "computed",
    "n": 8,
    "plain": {"mean": 2.0e-3, "ci": [1.5e-3, 2.5e-3]},
    "candidate": {"mean": 1.6e-3, "ci": [1.2e-3, 2.0e-3]},
    "site": {"sequences": 2, "seconds": 12.9, "sites": [{"target": "mlx.core.fast.rope", "calls": 120, "by_call": []}]},
}


def _record(**more: Any) -> dict[str, Any]:
    return {"nodeid": "gates/test_g.py::test_drift", "mode": "gate", "verdict": "pass", "record_version": 2, **more}


def test_the_oracle_part_reads_both_distances_and_writes_back_what_it_read() -> None:
    record = parse_record(_record(oracle=ORACLE))
    assert record.oracle is not None
    assert (record.oracle.dtype, record.oracle.plain, record.oracle.candidate) == ("bfloat16", 2.0e-3, 1.6e-3)
    assert record.to_json()["oracle"] == ORACLE  # the site's calls included, as written
    assert parse_record(record.to_json()) == record


def test_the_summary_says_both_distances_and_their_ratio_or_that_the_reference_is_the_oracle() -> None:
    assert "f32 oracle: plain bfloat16 2.00e-03, candidate 1.60e-03 (0.80x)" in n_parts(
        parse_record(_record(oracle=ORACLE))
    )
    same = parse_record(_record(oracle={**ORACLE, "same": True, "dtype": "float32"}))
    assert "the reference arm is the float32 oracle" in n_parts(same)
    assert not any("oracle" in part for part in n_parts(parse_record(_record())))
    assert "oracle" not in parse_record(_record()).to_json()  # a record without one writes none


def test_the_html_report_shows_both_distances_and_the_site_s_errors_call_by_call() -> None:
    from pytest_mlxgate.results.html_kl import kl_sections

    rows = [{"at": 0, "calls": 4, "cand_max": 0.1, "plain_max": 0.003, "cand_mean": 0.01, "plain_mean": 0.0004}]
    site = {"sequences": 2, "sites": [{"target": "mlx.core.fast.rope", "calls": 4, "by_call": rows}]}
    html = kl_sections(parse_record(_record(oracle={**ORACLE, "site": site})))
    assert "Against the float32 oracle" in html and "candidate 1.60e-03 (0.80x)" in html
    assert "mlx.core.fast.rope: 4 calls" in html and "1.00e-01" in html and "3.00e-03" in html
    assert "Against the float32 oracle" not in kl_sections(parse_record(_record()))


def test_junit_carries_the_precision_and_both_distances() -> None:
    from pytest_mlxgate.results.junit import junit_properties

    limits = {"status": "proven", "model": "smollm2-135m", "backend": "cpu", "dtype": "bfloat16"}
    props = dict(junit_properties(parse_record(_record(oracle=ORACLE, limits_from=limits))))
    assert props["mlxgate.oracle.plain_mean"] == "0.002" and props["mlxgate.oracle.candidate_mean"] == "0.0016"
    assert props["mlxgate.limits_from.dtype"] == "bfloat16"
    assert props["mlxgate.limits_from"].startswith("limits proven on smollm2-135m (cpu, bfloat16)")
