import pytest

from vmcp_actors.workflows import (
    DagProblem,
    StepSpec,
    ready_steps,
    topological_levels,
    validate_dag,
)


def step(step_id, *depends_on, reads=(), reads_output=None, condition=False, defaults=False):
    return StepSpec(
        id=step_id,
        depends_on=tuple(depends_on),
        referenced=frozenset(reads),
        has_condition=condition,
        has_default_results=defaults,
        output_referenced=None if reads_output is None else frozenset(reads_output),
    )


CHAIN = [step("a"), step("b", "a"), step("c", "b")]
FAN_OUT = [step("root"), step("x", "root"), step("y", "root"), step("z", "root")]
DIAMOND = [step("top"), step("left", "top"), step("right", "top"), step("bottom", "left", "right")]


def lines(steps, composite="triage"):
    return [problem.format("compositeTools[0].steps") for problem in validate_dag(composite, steps)]


# -- valid graphs ----------------------------------------------------------------------


@pytest.mark.parametrize("steps", [CHAIN, FAN_OUT, DIAMOND], ids=["chain", "fan-out", "diamond"])
def test_valid_graphs_have_no_problems(steps):
    assert validate_dag("triage", steps) == []


def test_reading_an_ancestor_through_another_step_is_allowed():
    assert validate_dag("t", [step("a"), step("b", "a"), step("c", "b", reads={"a", "b"})]) == []


# -- problems --------------------------------------------------------------------------


def test_a_duplicate_id_is_reported_at_the_second_declaration():
    assert lines([step("a"), step("b"), step("a")]) == [
        "compositeTools[0].steps[2].id: composite 'triage', step 'a': the id is already used by steps[0]",
    ]


def test_an_unknown_dependency_is_reported_at_its_dependson_entry():
    assert lines([step("a"), step("b", "a", "fetc")]) == [
        "compositeTools[0].steps[1].dependsOn[1]: composite 'triage', step 'b': depends on unknown step 'fetc'",
    ]


def test_a_dependency_listed_twice_is_reported():
    assert lines([step("a"), step("b", "a", "a")]) == [
        "compositeTools[0].steps[1].dependsOn[1]: composite 'triage', step 'b': lists 'a' more than once",
    ]


def test_a_self_dependency_is_reported():
    assert lines([step("a", "a")]) == [
        "compositeTools[0].steps[0].dependsOn[0]: composite 'triage', step 'a': depends on itself",
    ]


def test_a_cycle_of_two_is_reported_once_from_its_first_declared_step():
    assert lines([step("a", "b"), step("b", "a")]) == [
        "compositeTools[0].steps[0].dependsOn[0]: composite 'triage', step 'a': dependency cycle a -> b -> a",
    ]


def test_a_cycle_of_three_is_reported_along_dependson():
    assert lines([step("start"), step("a", "start", "c"), step("b", "a"), step("c", "b")]) == [
        "compositeTools[0].steps[1].dependsOn[1]: composite 'triage', step 'a': dependency cycle a -> c -> b -> a",
    ]


def test_separate_cycles_are_reported_separately():
    problems = validate_dag("t", [step("a", "b"), step("b", "a"), step("c", "d"), step("d", "c")])
    assert [(problem.index, problem.message.split(": ", 1)[1]) for problem in problems] == [
        (0, "dependency cycle a -> b -> a"),
        (2, "dependency cycle c -> d -> c"),
    ]


def test_a_template_reading_a_step_that_is_not_an_ancestor_is_reported():
    assert lines([step("a"), step("b"), step("c", "a", reads={"b"})]) == [
        "compositeTools[0].steps[2]: composite 'triage', step 'c': its templates read steps.b, but 'b' is not "
        "among the steps it depends on (add it to dependsOn, directly or through another step)",
    ]


def test_a_template_reading_a_later_sibling_is_reported():
    problems = validate_dag("t", [step("a", reads={"b"}), step("b")])
    assert [problem.index for problem in problems] == [0]
    assert "steps.b" in problems[0].message


def test_a_template_reading_an_unknown_step_is_reported():
    assert lines([step("a", reads={"ghost"})]) == [
        "compositeTools[0].steps[0]: composite 'triage', step 'a': its templates read steps.ghost, "
        "but there is no step 'ghost'",
    ]


def test_a_template_reading_its_own_step_is_reported():
    assert lines([step("a", reads={"a"})]) == [
        "compositeTools[0].steps[0]: composite 'triage', step 'a': its templates read steps.a, its own result",
    ]


def test_a_skippable_step_whose_output_is_read_needs_default_results():
    assert lines([step("check", condition=True), step("use", "check", reads={"check"})]) == [
        "compositeTools[0].steps[0].defaultResults: composite 'triage', step 'check': it has a condition, so it "
        "may be skipped, and step 'use' reads its output; give it defaultResults (its output when skipped)",
    ]


def test_a_skippable_step_lists_every_step_that_reads_its_output():
    problems = validate_dag("t", [step("s", condition=True), step("x", "s", reads={"s"}), step("y", "s", reads={"s"})])
    assert "steps 'x', 'y' read its output" in problems[0].message


def test_a_skippable_step_with_default_results_is_fine():
    steps = [step("check", condition=True, defaults=True), step("use", "check", reads={"check"})]
    assert validate_dag("t", steps) == []


def test_a_skippable_step_whose_status_alone_is_read_needs_no_default_results():
    steps = [step("check", condition=True), step("use", "check", reads={"check"}, reads_output=())]
    assert validate_dag("t", steps) == []


def test_a_skippable_step_nobody_reads_needs_no_default_results():
    assert validate_dag("t", [step("check", condition=True), step("after", "check")]) == []


def test_problems_are_ordered_by_step_position():
    problems = validate_dag("t", [step("a", "zz"), step("b", "a", reads={"c"}), step("c"), step("a")])
    assert [(problem.index, problem.field) for problem in problems] == [(0, "dependsOn[0]"), (1, ""), (3, "id")]


def test_a_problem_without_a_field_formats_as_the_step_path():
    assert DagProblem(2, "", "m").format("compositeTools[1].steps") == "compositeTools[1].steps[2]: m"


# -- ready_steps -----------------------------------------------------------------------


def test_a_chain_starts_with_its_first_step():
    assert ready_steps(CHAIN, done=set(), running=set()) == ["a"]


def test_a_chain_advances_one_step_at_a_time():
    assert ready_steps(CHAIN, done={"a"}, running=set()) == ["b"]


def test_a_fan_out_starts_every_branch_at_once_in_declaration_order():
    assert ready_steps(FAN_OUT, done={"root"}, running=set()) == ["x", "y", "z"]


def test_running_and_done_steps_are_not_ready():
    assert ready_steps(FAN_OUT, done={"root", "x"}, running={"y"}) == ["z"]


def test_a_diamond_join_waits_for_both_branches():
    assert ready_steps(DIAMOND, done={"top", "left"}, running={"right"}) == []
    assert ready_steps(DIAMOND, done={"top", "left", "right"}, running=set()) == ["bottom"]


def test_nothing_is_ready_when_everything_is_done():
    assert ready_steps(DIAMOND, done={"top", "left", "right", "bottom"}, running=set()) == []


def test_a_step_with_an_unknown_dependency_is_never_ready():
    assert ready_steps([step("a", "ghost")], done=set(), running=set()) == []


def test_steps_in_a_cycle_are_never_ready():
    assert ready_steps([step("a", "b"), step("b", "a")], done=set(), running=set()) == []


# -- topological_levels ----------------------------------------------------------------


def test_a_chain_has_one_step_per_level():
    assert topological_levels(CHAIN) == [["a"], ["b"], ["c"]]


def test_a_fan_out_has_its_branches_on_one_level():
    assert topological_levels(FAN_OUT) == [["root"], ["x", "y", "z"]]


def test_a_diamond_has_three_levels():
    assert topological_levels(DIAMOND) == [["top"], ["left", "right"], ["bottom"]]


def test_a_step_sits_one_level_below_its_deepest_dependency():
    steps = [step("a"), step("b", "a"), step("c", "b"), step("d", "a", "c"), step("e")]
    assert topological_levels(steps) == [["a", "e"], ["b"], ["c"], ["d"]]


def test_levels_refuse_a_cycle():
    with pytest.raises(ValueError, match="'a', 'b' cannot be ordered"):
        topological_levels([step("a", "b"), step("b", "a")])


def test_levels_refuse_an_unknown_dependency():
    with pytest.raises(ValueError, match="'a' cannot be ordered"):
        topological_levels([step("a", "ghost")])
