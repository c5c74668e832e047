"""Guards on the test suite itself: no assertion in tests/ that cannot fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def _always_true(node: ast.expr) -> bool:
    """Whether ``node`` is truthy whatever the code under test does: a truthy constant, a
    non-empty tuple or list (``assert (x, "message")``), or an ``or`` with such an operand."""
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
        return len(node.keys if isinstance(node, ast.Dict) else node.elts) > 0
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return any(_always_true(value) for value in node.values)
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return all(_always_true(value) for value in node.values)
    return False


def assertions_that_cannot_fail(source: str, filename: str = "<test>") -> list[str]:
    """``file:line: source`` for every ``assert`` in ``source`` whose test is always true."""
    tree = ast.parse(source, filename)
    return [f"{filename}:{node.lineno}: {ast.get_source_segment(source, node)}"
            for node in ast.walk(tree) if isinstance(node, ast.Assert) and _always_true(node.test)]


@pytest.mark.parametrize("source", [
    "assert 'error' in answer or True",
    "assert True",
    "assert (answer == 1, 'the answer')",
    "assert [x]",
    "assert x or (y or 1)",
    "assert 1 and 'yes'",
])
def test_the_guard_finds_an_assertion_that_cannot_fail(source: str) -> None:
    assert assertions_that_cannot_fail(source)


@pytest.mark.parametrize("source", [
    "assert 'error' in answer",
    "assert x or y",
    "assert x and True",
    "assert not True",
    "assert ()",
    "assert 0 or x",
])
def test_the_guard_passes_an_assertion_that_can_fail(source: str) -> None:
    assert not assertions_that_cannot_fail(source)


def test_no_assertion_in_the_suite_is_always_true() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50, f"the scan found only {len(files)} files under {TESTS}"
    found = [problem for path in files
             for problem in assertions_that_cannot_fail(path.read_text(encoding="utf-8"), str(path.relative_to(TESTS)))]
    assert not found, "assertions that cannot fail:\n" + "\n".join(found)
