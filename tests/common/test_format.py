"""`common/format.py`: the one place a clipped text and a measured figure get their form."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_mlxgate.common.format import DASH, clip, figure


@given(st.text(max_size=60), st.integers(1, 50), st.sampled_from(["start", "end"]))
def test_a_clipped_text_fits_its_width_and_keeps_the_end_asked_for(text: str, width: int, keep: str) -> None:
    got = clip(text, width, keep=keep)
    assert len(got) <= width
    if len(text) <= width:
        assert got == text  # nothing cut, nothing marked
    else:
        kept = got.removesuffix("…") if keep == "start" else got.removeprefix("…")
        assert got != kept and len(kept) == width - 1  # one ellipsis, where the cut is
        assert text.startswith(kept) if keep == "start" else text.endswith(kept)


def test_a_figure_is_three_significant_figures_and_anything_else_is_itself_or_the_word_given() -> None:
    assert [figure(x) for x in (0.011812, 3e-07, 12345, 2.0)] == ["0.0118", "3e-07", "1.23e+04", "2"]
    assert figure(None) == "None" and figure(None, other=DASH) == DASH
    assert figure(True) == "True"  # a flag is no measurement
