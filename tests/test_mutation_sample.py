"""`./dev mutate --sample`'s arithmetic (tests/support/mutation_sample.py): the allocation draws exactly
the asked number, proportionally, from every module; the triage's equivalents are read only where a
line gives a reason."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mutation_sample import allocate, equivalents

sizes_st = st.dictionaries(
    st.from_regex(r"pytest_mlxgate\.[a-z]{1,8}", fullmatch=True), st.integers(1, 900), min_size=1
)


@given(sizes_st, st.data())
def test_the_allocation_draws_exactly_n_one_from_each_module_the_rest_by_size(sizes: dict[str, int], data) -> None:
    total = sum(sizes.values())
    n = data.draw(st.integers(len(sizes), total))
    alloc = allocate(sizes, n)
    assert sum(alloc.values()) == n and alloc.keys() == sizes.keys()
    assert all(1 <= alloc[m] <= sizes[m] for m in sizes)
    rest, rooms = n - len(sizes), total - len(sizes)
    for module, size in sizes.items():  # the rest in proportion to each module's room: within one draw
        assert abs((alloc[module] - 1) - rest * (size - 1) / max(1, rooms)) < 1


@given(sizes_st, st.data())
def test_fewer_draws_than_modules_go_one_each_to_the_largest(sizes: dict[str, int], data) -> None:
    n = data.draw(st.integers(1, len(sizes)))
    alloc = allocate(sizes, n)
    assert sum(alloc.values()) == n and set(alloc.values()) == {1}
    assert min(sizes[m] for m in alloc) >= max((sizes[m] for m in sizes if m not in alloc), default=0)


def test_equivalents_are_the_triage_lines_that_say_e_with_a_reason() -> None:
    triage = """
- `pytest_mlxgate.kl.arms.x_run__mutmut_3`: E: dtype=None where the value is float64 already
- `serving.batch.x_greedy_batch__mutmut_35`: E: under the precondition both reach every start
- `pytest_mlxgate.stats.verdicts.x_floor_n_needed__mutmut_14`: E in practice: a float exactly on the floor
- `pytest_mlxgate.hub.fetch.x__publish__mutmut_4`: L: a real difference no fast test pins
- `pytest_mlxgate.hub.fetch.x__publish__mutmut_9`: killed by test_publish_is_atomic
- `pytest_mlxgate.hub.fetch.x__publish__mutmut_10`: E:
"""
    assert equivalents(triage) == {
        "pytest_mlxgate.kl.arms.x_run__mutmut_3",
        "pytest_mlxgate.serving.batch.x_greedy_batch__mutmut_35",  # the package prefix may be left out
        "pytest_mlxgate.stats.verdicts.x_floor_n_needed__mutmut_14",
    }


# -- ./dev mutate --function: one function's mutants, read from mutmut's mutated source ----------------

_MUTATED = """\
def x_f__mutmut_orig(a, b):
    if a > b:
        return "big"
    return "small"
def x_f__mutmut_1(a, b):
    if a >= b:
        return "big"
    return "small"
def x_f__mutmut_12(a, b):
    if a > b:
        return "XXbigXX"
    return "small"
class C:
    def xǁCǁg__mutmut_orig(self):
        return 1
    def xǁCǁg__mutmut_2(self):
        return 2
def x_h__mutmut_orig(
    a,
) -> int:
    return a
def x_h__mutmut_1(
    a,
) -> int:
    return None
x_f__mutmut_mutants = {}
"""


def test_a_function_s_mutants_are_its_numbered_definitions_and_each_diff_is_the_changed_line() -> None:
    from mutation_kill import mutant_diff, mutant_numbers

    assert mutant_numbers(_MUTATED, "x_f") == [1, 12]
    assert mutant_numbers(_MUTATED, "xǁCǁg") == [2]
    assert mutant_diff(_MUTATED, "x_f", 1) == ["-    if a > b:", "+    if a >= b:"]
    assert mutant_diff(_MUTATED, "x_f", 12) == ['-        return "big"', '+        return "XXbigXX"']
    # a method's body ends at its class's next definition, not at the module's next line
    assert mutant_diff(_MUTATED, "xǁCǁg", 2) == ["-        return 1", "+        return 2"]
    # a signature over several lines: its closing parenthesis in column 0 is not the end of the body
    assert mutant_diff(_MUTATED, "x_h", 1) == ["-    return a", "+    return None"]
