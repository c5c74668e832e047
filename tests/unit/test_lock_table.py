"""Every lock, condition and event under vmcp_actors/ is in docs/architecture.md's lock
table (issue 35): adding one without saying what it guards, and in which order it may be
taken, fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("Lock", "RLock", "Condition", "Event", "Semaphore", "BoundedSemaphore")


class _Primitives(ast.NodeVisitor):
    """Each ``threading.<kind>()`` assigned: (class or None, function or None, name, kind, line)."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, str]] = []
        self.found: list[tuple[str | None, str | None, str, str, int]] = []

    def _scoped(self, kind: str, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append((kind, node.name))
        self.generic_visit(node)
        self.scopes.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped("class", node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scoped("function", node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _assigned(self, node: ast.AST, value: ast.AST | None, targets: list[ast.expr]) -> None:
        if not isinstance(value, ast.Call):
            return
        func = value.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == "threading" and func.attr in KINDS):
            return
        owner = next((name for kind, name in reversed(self.scopes) if kind == "class"), None)
        function = next((name for kind, name in reversed(self.scopes) if kind == "function"), None)
        kept = [target for target in targets if not isinstance(target, ast.Name)] or targets
        for target in kept:  # ``local = self._locks[key] = Lock()`` is named by where it is kept
            if isinstance(target, ast.Attribute):
                name = target.attr
            elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute):
                name = f"{target.value.attr}[key]"
            else:  # a local one (a call's flag): named as it is in the page
                name = getattr(target, "id", "?")
            self.found.append((owner, function, name, func.attr, node.lineno))

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned(node, node.value, node.targets)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._assigned(node, node.value, [node.target])
        self.generic_visit(node)


def test_every_lock_and_event_is_in_the_architecture_pages_lock_table():
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    locks_part = page[page.index("## Locks"):page.index("## Process model")]
    unlisted = []
    for path in sorted((ROOT / "vmcp_actors").rglob("*.py")):
        primitives = _Primitives()
        primitives.visit(ast.parse(path.read_text(encoding="utf-8")))
        for owner, function, name, kind, line in primitives.found:
            names = [f"`{owner}.{name}`", f"`{owner}`"] if owner else [f"`{name}`", f"`{function}`"]
            if kind == "Event":  # one-way flags: named by attribute in the flags sentence
                names.append(f"`{name}`")
                names.append(f"{name}`")
            if not any(candidate in locks_part for candidate in names):
                unlisted.append(f"{path.relative_to(ROOT)}:{line}: {owner or function or 'module'}.{name} "
                                f"(threading.{kind})")
    assert not unlisted, "not in docs/architecture.md's lock table (say what it guards, and its order):\n" + \
        "\n".join(unlisted)


def test_the_guard_finds_a_lock():
    primitives = _Primitives()
    primitives.visit(ast.parse("import threading\nclass Board:\n    def __init__(self):\n"
                               "        self._lock = threading.Lock()\n"))
    assert primitives.found == [("Board", "__init__", "_lock", "Lock", 4)]
