"""The step graph of a composite tool: validation, scheduling, and levels for diagnostics.

Pure functions over :class:`StepSpec` values. Everything follows declaration order, so
the same config always gives the same problems in the same order and the same schedule.
Where an id is declared twice, the first declaration is the one the graph uses.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepSpec:
    """What the graph needs to know of a step.

    ``referenced`` holds the steps its templates read (``referenced_steps``);
    ``output_referenced`` those whose output they may read (``referenced_steps(...,
    output_only=True)``); ``None`` means all of ``referenced``.
    """

    id: str
    depends_on: tuple[str, ...] = ()
    referenced: frozenset[str] = frozenset()
    has_condition: bool = False
    has_default_results: bool = False
    output_referenced: frozenset[str] | None = None
    continues_on_error: bool = False  # onError continue: it may fail and leave no output

    @property
    def reads_output_of(self) -> frozenset[str]:
        return self.referenced if self.output_referenced is None else self.output_referenced


@dataclass(frozen=True)
class DagProblem:
    """One problem, keyed by the step's position so the caller can build the config path.

    ``field`` is the place within that step (``id``, ``dependsOn[1]``, ``defaultResults``),
    or ``""`` for the step as a whole (what its templates read). ``message`` names the
    composite and the step.
    """

    index: int
    field: str
    message: str

    def format(self, steps_path: str) -> str:
        """``format("compositeTools[0].steps")`` gives
        ``compositeTools[0].steps[2].dependsOn[0]: composite 'c', step 'x': ...``."""
        path = f"{steps_path}[{self.index}]"
        if self.field:
            path += f".{self.field}"
        return f"{path}: {self.message}"


def validate_dag(composite: str, steps: Sequence[StepSpec],
                 output_reads: Collection[str] = ()) -> list[DagProblem]:
    """Every problem of the graph, ordered by step position (rule order within a step):
    duplicate ids, unknown or repeated dependsOn entries, dependency cycles (one per
    cycle, as ``a -> b -> a``), templates reading a step that is not an ancestor, and
    steps that may end without output (a condition, or onError continue) whose output is
    read, by a step or by the composite's ``output`` (``output_reads``), without
    defaultResults."""
    graph = _Graph(steps)
    problems: list[DagProblem] = []

    def problem(index: int, field: str, message: str) -> None:
        problems.append(DagProblem(index, field, f"composite {composite!r}, step {steps[index].id!r}: {message}"))

    for index, step in enumerate(steps):
        first = graph.position[step.id]
        if first != index:
            problem(index, "id", f"the id is already used by steps[{first}]")
        listed: set[str] = set()
        for position, dependency in enumerate(step.depends_on):
            field = f"dependsOn[{position}]"
            if dependency not in graph.position:
                problem(index, field, f"depends on unknown step {dependency!r}")
            elif dependency in listed:
                problem(index, field, f"lists {dependency!r} more than once")
            listed.add(dependency)

    for index, field, cycle in graph.cycles():
        if len(cycle) == 2:
            problem(index, field, "depends on itself")
        else:
            problem(index, field, f"dependency cycle {' -> '.join(cycle)}")

    for index, step in enumerate(steps):
        ancestors = graph.ancestors(step)
        for read in sorted(step.referenced, key=graph.order_key):
            if read == step.id:
                problem(index, "", f"its templates read steps.{read}, its own result")
            elif read not in graph.position:
                problem(index, "", f"its templates read steps.{read}, but there is no step {read!r}")
            elif read not in ancestors:
                problem(index, "", f"its templates read steps.{read}, but {read!r} is not among the steps it "
                                   "depends on (add it to dependsOn, directly or through another step)")

    for index, step in enumerate(steps):
        if step.has_default_results or graph.position[step.id] != index:
            continue
        if step.has_condition:
            why, when = "it has a condition, so it may be skipped", "skipped"
        elif step.continues_on_error:
            why, when = "its onError action is continue, so it may fail without output", "failed"
        else:
            continue
        readers = [other.id for other in steps if other is not step and step.id in other.reads_output_of]
        subjects = []
        if readers:
            subjects.append(f"step {readers[0]!r}" if len(readers) == 1 else
                            f"steps {', '.join(repr(reader) for reader in readers)}")
        if step.id in output_reads:
            subjects.append("the output")
        if subjects:
            one_reader = len(readers) + (step.id in output_reads) == 1
            who = " and ".join(subjects) + (" reads" if one_reader else " read")
            problem(index, "defaultResults", f"{why}, and {who} its output; "
                                             f"give it defaultResults (its output when {when})")

    problems.sort(key=lambda found: found.index)  # stable: rule order stays within a step
    return problems


def ready_steps(steps: Sequence[StepSpec], done: Collection[str], running: Collection[str]) -> list[str]:
    """The steps that can start now: every dependency done, not done or running themselves;
    in declaration order (the scheduler starts them at once, up to maxParallel)."""
    ready = []
    seen: set[str] = set()
    for step in steps:
        if step.id in seen:
            continue
        seen.add(step.id)
        if step.id not in done and step.id not in running and all(dep in done for dep in step.depends_on):
            ready.append(step.id)
    return ready


def topological_levels(steps: Sequence[StepSpec]) -> list[list[str]]:
    """Steps grouped by depth: level 0 depends on nothing, level n on steps below n and at
    least one at n - 1; each level in declaration order. ``ValueError`` if some steps
    cannot be placed (a cycle, or an unknown dependency): validate first."""
    remaining = _first_declarations(steps)
    placed: set[str] = set()
    levels: list[list[str]] = []
    while remaining:
        level = [step.id for step in remaining if all(dep in placed for dep in step.depends_on)]
        if not level:
            stuck = ", ".join(repr(step.id) for step in remaining)
            raise ValueError(f"steps {stuck} cannot be ordered: a dependency cycle or an unknown dependency")
        levels.append(level)
        placed.update(level)
        remaining = [step for step in remaining if step.id not in placed]
    return levels


def _first_declarations(steps: Sequence[StepSpec]) -> list[StepSpec]:
    seen: set[str] = set()
    unique = []
    for step in steps:
        if step.id not in seen:
            seen.add(step.id)
            unique.append(step)
    return unique


class _Graph:
    """dependsOn edges between the first declarations of each id; unknown ids dropped."""

    def __init__(self, steps: Sequence[StepSpec]):
        self.steps = _first_declarations(steps)
        self.position: dict[str, int] = {}
        for index, step in enumerate(steps):
            self.position.setdefault(step.id, index)
        self.edges: dict[str, tuple[str, ...]] = {
            step.id: tuple(dict.fromkeys(dep for dep in step.depends_on if dep in self.position))
            for step in self.steps
        }
        self._reach = {step.id: self._reachable(self.edges[step.id]) for step in self.steps}

    def order_key(self, step_id: str) -> tuple[int, str]:
        """Declared steps in declaration order, then unknown ids alphabetically."""
        return (self.position.get(step_id, len(self.position)), step_id)

    def ancestors(self, step: StepSpec) -> set[str]:
        """Every step ``step`` depends on, directly or through others."""
        found: set[str] = set()
        for dep in step.depends_on:
            if dep in self.position:
                found.add(dep)
                found |= self._reach[dep]
        return found

    def cycles(self) -> list[tuple[int, str, list[str]]]:
        """One cycle per strongly connected group, as ``(index, dependsOn field, [a, b, a])``,
        starting at the group's first-declared step along the shortest way back to it."""
        found = []
        reported: set[str] = set()
        for step in self.steps:
            start = step.id
            if start in reported or start not in self._reach[start]:
                continue
            group = {other for other in self._reach[start] if start in self._reach[other]}
            reported |= group
            path = self._shortest_cycle(start, group)
            field = f"dependsOn[{step.depends_on.index(path[1])}]"
            found.append((self.position[start], field, path))
        return found

    def _shortest_cycle(self, start: str, group: set[str]) -> list[str]:
        came_from: dict[str, str] = {}
        queue = deque([start])
        while queue:
            current = queue.popleft()
            for dep in self.edges[current]:
                if dep not in group:
                    continue
                if dep == start:
                    path = [current]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if current != start else [start, start]
                if dep not in came_from:
                    came_from[dep] = current
                    queue.append(dep)
        raise AssertionError("a strongly connected group always leads back to its start")

    def _reachable(self, roots: Sequence[str]) -> set[str]:
        seen: set[str] = set()
        stack = list(roots)
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(self.edges[current])
        return seen
