"""A composite tool as values: what the config schema produces and a WorkflowRun executes.

Frozen dataclasses, so a definition can be shared by every run and session without
copying (DESIGN rule 4). Field names follow ToolHive's vMCP config in snake case
(``dependsOn`` -> ``depends_on``, ``onError.retryCount`` -> ``on_error.retry_count``).
``__post_init__`` checks what a value alone can tell (ranges, enumerations); the graph
(unknown dependencies, cycles, templates reading non-ancestors) is checked by
``validate_dag`` over :func:`step_specs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vmcp_actors.workflows._dag import StepSpec
from vmcp_actors.workflows._templates import iter_templates, referenced_steps

ON_ERROR_ACTIONS = ("abort", "continue", "retry")
MAX_RETRY_COUNT = 10
MAX_FOR_EACH_ITERATIONS = 1000  # hard cap, whatever maxIterations says
STEP_TYPES = ("tool", "forEach")


@dataclass(frozen=True)
class OnError:
    """What a failed step does to the run: ``abort`` it, ``continue`` (the step is
    ``failed`` and its dependents run), or ``retry`` up to ``retry_count`` times with
    exponential backoff from ``retry_delay`` seconds, then abort."""

    action: str = "abort"
    retry_count: int = 0
    retry_delay: float = 1.0

    def __post_init__(self) -> None:
        if self.action not in ON_ERROR_ACTIONS:
            raise ValueError(f"onError.action must be one of {', '.join(ON_ERROR_ACTIONS)}, got {self.action!r}")
        if not 0 <= self.retry_count <= MAX_RETRY_COUNT:
            raise ValueError(f"onError.retryCount must be between 0 and {MAX_RETRY_COUNT}, got {self.retry_count}")
        if self.retry_delay < 0:
            raise ValueError(f"onError.retryDelay cannot be negative, got {self.retry_delay}")


@dataclass(frozen=True)
class ForEach:
    """Run the step's tool once per item of ``collection`` (a template rendering to a JSON
    array, or to a string holding one), with ``forEach.<item_var>`` and ``forEach.index``."""

    collection: str
    item_var: str = "item"
    max_parallel: int = 10
    max_iterations: int = 100

    def __post_init__(self) -> None:
        if self.item_var == "index":
            raise ValueError("forEach.itemVar cannot be 'index': forEach.index is the iteration number")
        if self.max_parallel < 1:
            raise ValueError(f"forEach.maxParallel must be at least 1, got {self.max_parallel}")
        if not 1 <= self.max_iterations <= MAX_FOR_EACH_ITERATIONS:
            raise ValueError(f"forEach.maxIterations must be between 1 and {MAX_FOR_EACH_ITERATIONS}, "
                             f"got {self.max_iterations}")


@dataclass(frozen=True)
class Step:
    """One step. A ``forEach`` step's ``tool`` and ``arguments`` are its inner step's."""

    id: str
    tool: str | None
    arguments: Any = None
    depends_on: tuple[str, ...] = ()
    condition: str | None = None
    on_error: OnError = field(default_factory=OnError)
    timeout: float = 300
    default_results: Any = None
    type: str = "tool"
    for_each: ForEach | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "depends_on", tuple(self.depends_on))
        if self.type not in STEP_TYPES:
            raise ValueError(f"step {self.id!r}: type must be one of {', '.join(STEP_TYPES)}, got {self.type!r}")
        if (self.type == "forEach") != (self.for_each is not None):
            raise ValueError(f"step {self.id!r}: a forEach step needs forEach settings, and only it has them")
        if not self.tool:
            raise ValueError(f"step {self.id!r}: a tool step needs a tool")
        if self.timeout <= 0:
            raise ValueError(f"step {self.id!r}: timeout must be positive, got {self.timeout}")


@dataclass(frozen=True)
class OutputProperty:
    """One property of the composite's structured output: ``value`` is a template; when it
    fails to render (an undefined value, a skipped step), ``default`` is used. ``type``, if
    given, coerces the rendered value as a step argument would be."""

    value: str
    default: Any = None
    type: str | None = None


@dataclass(frozen=True)
class OutputSpec:
    properties: Mapping[str, OutputProperty]


@dataclass(frozen=True)
class CompositeTool:
    name: str
    description: str
    parameters: Mapping[str, Any]
    steps: tuple[Step, ...]
    timeout: float = 1800
    output: OutputSpec | None = None
    annotations: Mapping[str, Any] | None = None
    max_parallel: int = 10

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        if not self.steps:
            raise ValueError(f"composite {self.name!r} has no steps")
        if self.timeout <= 0:
            raise ValueError(f"composite {self.name!r}: timeout must be positive, got {self.timeout}")
        if self.max_parallel < 1:
            raise ValueError(f"composite {self.name!r}: maxParallel must be at least 1, got {self.max_parallel}")


def step_specs(tool: CompositeTool) -> list[StepSpec]:
    """The graph's view of ``tool``'s steps, in declaration order, for ``validate_dag``
    and ``ready_steps``. Raises ``TemplateSyntaxError`` for a template that cannot parse."""
    specs = []
    for step in tool.steps:
        sources = [source for _, source in iter_templates(step.arguments)]
        if step.condition:
            sources.append(step.condition)
        if step.for_each is not None:
            sources.append(step.for_each.collection)
        referenced: set[str] = set()
        output_referenced: set[str] = set()
        for source in sources:
            referenced |= referenced_steps(source)
            output_referenced |= referenced_steps(source, output_only=True)
        specs.append(StepSpec(
            id=step.id,
            depends_on=step.depends_on,
            referenced=frozenset(referenced),
            has_condition=step.condition is not None,
            has_default_results=step.default_results is not None,
            output_referenced=frozenset(output_referenced),
        ))
    return specs
