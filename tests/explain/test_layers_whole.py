"""What attribution reads of a layer's call: its hidden state, whatever the architecture returns."""

from __future__ import annotations

from pytest_mlxgate.explain.layers import output_of


def test_a_layer_s_output_is_the_array_or_the_first_of_a_tuple() -> None:
    hidden, kvs, offset = object(), object(), 3
    assert output_of(hidden) is hidden  # llama-style layers return the hidden state
    assert output_of((hidden, kvs, offset)) is hidden  # gemma-4's return (h, kvs, offset)
    assert output_of([hidden, kvs]) == [hidden, kvs]  # only a tuple is unpacked
