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
from functools import cached_property
from typing import Any

from vmcp_actors.workflows._dag import StepSpec, validate_dag
from vmcp_actors.workflows._errors import TemplateError
from vmcp_actors.workflows._templates import (
    compile_template,
    free_names,
    iter_templates,
    referenced_steps,
)

ON_ERROR_ACTIONS = ("abort", "continue", "retry")
MAX_RETRY_COUNT = 10
MAX_FOR_EACH_ITERATIONS = 1000  # hard cap, whatever maxIterations says
STEP_TYPES = ("tool", "forEach", "elicitation")
# What an elicitation step does when the user declines or cancels (ToolHive's actions):
# fail the run, go on (later steps read the action), or end the run here, successfully.
ELICITATION_ACTIONS = ("abort", "continue", "skip_remaining")
# ToolHive caps how long an elicitation waits for a person, whatever its timeout says, so
# prompts nobody answers do not pile up.
MAX_ELICITATION_TIMEOUT = 600.0


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
    """One step. A ``forEach`` step's ``tool`` and ``arguments`` are its inner step's. An
    ``elicitation`` step has no tool: it asks the calling client ``message`` (a template)
    for what ``elicitation_schema`` describes (a flat object schema, as MCP requires); its
    output is ``{"action", "content"}``, and ``on_decline`` / ``on_cancel`` (a timeout
    counts as a cancel, as in ToolHive) say what an answer other than accept does."""

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
    message: str | None = None
    elicitation_schema: Mapping[str, Any] | None = None
    on_decline: str = "abort"
    on_cancel: str = "abort"

    def __post_init__(self) -> None:
        object.__setattr__(self, "depends_on", tuple(self.depends_on))
        if self.type not in STEP_TYPES:
            raise ValueError(f"step {self.id!r}: type must be one of {', '.join(STEP_TYPES)}, got {self.type!r}")
        if (self.type == "forEach") != (self.for_each is not None):
            raise ValueError(f"step {self.id!r}: a forEach step needs forEach settings, and only it has them")
        if self.type == "elicitation":
            if self.tool or not self.message or not isinstance(self.elicitation_schema, Mapping):
                raise ValueError(f"step {self.id!r}: an elicitation step needs a message and a schema, and no tool")
            for action in (self.on_decline, self.on_cancel):
                if action not in ELICITATION_ACTIONS:
                    raise ValueError(f"step {self.id!r}: action must be one of {', '.join(ELICITATION_ACTIONS)}")
        elif not self.tool:
            raise ValueError(f"step {self.id!r}: a tool step needs a tool")
        if self.timeout <= 0:
            raise ValueError(f"step {self.id!r}: timeout must be positive, got {self.timeout}")

    @property
    def attempt_timeout(self) -> float:
        """How long one attempt may take: ``timeout``, at most ``MAX_ELICITATION_TIMEOUT``
        for an elicitation."""
        if self.type == "elicitation":
            return min(self.timeout, MAX_ELICITATION_TIMEOUT)
        return self.timeout


OUTPUT_TYPES = ("string", "integer", "number", "boolean", "object", "array")


@dataclass(frozen=True)
class OutputProperty:
    """One property of the composite's structured output (ToolHive's ``OutputProperty``).

    ``value`` is a template; when it fails to render (an undefined value, a skipped step)
    or renders to nothing, ``default`` is used. The rendered value is coerced to ``type``
    as a step argument would be. An ``object`` property may instead be built from nested
    ``properties``. ``type`` and ``description`` also make the advertised outputSchema.
    """

    value: str | None = None
    default: Any = None
    type: str | None = None
    description: str | None = None
    properties: Mapping[str, OutputProperty] | None = None

    def __post_init__(self) -> None:
        if self.type is not None and self.type not in OUTPUT_TYPES:
            raise ValueError(f"output type must be one of {', '.join(OUTPUT_TYPES)}, got {self.type!r}")
        if self.properties is not None and self.type not in (None, "object"):
            raise ValueError("only an object output property can have nested properties")
        if self.properties is not None and self.value is not None:
            raise ValueError("an output property has either a value or nested properties, not both")


@dataclass(frozen=True)
class OutputSpec:
    properties: Mapping[str, OutputProperty]
    required: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "required", tuple(self.required))


def output_schema(output: OutputSpec) -> dict[str, Any]:
    """The JSON Schema a client sees as the composite's ``outputSchema``."""

    def properties_schema(properties: Mapping[str, OutputProperty]) -> dict[str, Any]:
        schemas: dict[str, Any] = {}
        for name, prop in properties.items():
            schema: dict[str, Any] = {}
            if prop.type is not None:
                schema["type"] = prop.type
            if prop.description:
                schema["description"] = prop.description
            if prop.properties is not None:
                schema["type"] = "object"
                schema["properties"] = properties_schema(prop.properties)
            schemas[name] = schema
        return schemas

    schema: dict[str, Any] = {"type": "object", "properties": properties_schema(output.properties)}
    if output.required:
        schema["required"] = list(output.required)
    return schema


def output_templates(output: OutputSpec | None) -> list[tuple[str, str]]:
    """``(location, source)`` of every value template in ``output``, e.g.
    ``("properties.summary.value", "{{ steps.a.output.text }}")``."""
    found: list[tuple[str, str]] = []

    def walk(properties: Mapping[str, OutputProperty], location: str) -> None:
        for name, prop in properties.items():
            where = f"{location}.{name}"
            if prop.value is not None:
                found.append((f"{where}.value", prop.value))
            if prop.properties is not None:
                walk(prop.properties, f"{where}.properties")

    if output is not None:
        walk(output.properties, "properties")
    return found


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

    # Worked out once per definition, not per call: every run of it reads them. (A
    # cached_property writes the instance dict directly, so it works on a frozen
    # dataclass, and stays out of eq and repr.)
    @cached_property
    def problems(self) -> tuple[tuple[str, str], ...]:
        """:func:`composite_problems` of this definition."""
        return tuple(composite_problems(self))

    @cached_property
    def graph(self) -> tuple[StepSpec, ...]:
        """:func:`step_specs` of this definition (valid only when it has no problems)."""
        return tuple(step_specs(self))


def step_specs(tool: CompositeTool) -> list[StepSpec]:
    """The graph's view of ``tool``'s steps, in declaration order, for ``validate_dag``
    and ``ready_steps``. Raises ``TemplateSyntaxError`` for a template that cannot parse."""
    specs = []
    for step in tool.steps:
        sources = [source for _, source in iter_templates(step.arguments)]
        sources += [source for _, source in iter_templates(step.message)]
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
            continues_on_error=step.on_error.action == "continue",
            output_referenced=frozenset(output_referenced),
        ))
    return specs


def output_reads(tool: CompositeTool) -> set[str]:
    """The steps whose output the composite's ``output`` templates read."""
    found: set[str] = set()
    for _, source in output_templates(tool.output):
        found |= referenced_steps(source, output_only=True)
    return found


def composite_problems(tool: CompositeTool) -> list[tuple[str, str]]:
    """Every problem :func:`step_specs` and :func:`validate_dag` can find, as
    ``(path within the composite, message)``: templates that do not compile (at their
    place in ``arguments``, ``condition``, ``forEach.collection`` or ``output``) or that
    read names the context will not have, then the
    graph's problems, then output templates reading unknown steps."""
    problems: list[tuple[str, str]] = []
    label = f"composite {tool.name!r}"
    for index, step in enumerate(tool.steps):
        places = [(f"steps[{index}].arguments" + (f".{where}" if where else ""), source)
                  for where, source in iter_templates(step.arguments)]
        places += [(f"steps[{index}].message", source) for _, source in iter_templates(step.message)]
        if step.condition is not None:
            places.append((f"steps[{index}].condition", step.condition))
        if step.for_each is not None:
            places.append((f"steps[{index}].collection", step.for_each.collection))
        for path, source in places:
            error = _compile_error(source) or _unknown_names(source, for_each_item=(
                step.for_each is not None and path.startswith(f"steps[{index}].arguments")))
            if error is not None:
                problems.append((path, f"{label}, step {step.id!r}: {error}"))
    for path, source in output_templates(tool.output):
        error = _compile_error(source) or _unknown_names(source, for_each_item=False)
        if error is not None:
            problems.append((f"output.{path}", f"{label}: {error}"))
    if problems:
        return problems  # the graph cannot be read from templates that do not parse

    declared = {step.id for step in tool.steps}
    for problem in validate_dag(tool.name, step_specs(tool), output_reads(tool)):
        path = f"steps[{problem.index}]" + (f".{problem.field}" if problem.field else "")
        problems.append((path, problem.message))
    for path, source in output_templates(tool.output):
        for read in sorted(referenced_steps(source) - declared):
            problems.append((f"output.{path}", f"{label}: the output reads steps.{read}, but there is no step {read!r}"))
    if tool.output is not None:
        for position, name in enumerate(tool.output.required):
            if name not in tool.output.properties:
                problems.append((f"output.required[{position}]", f"{label}: {name!r} is not an output property"))
    return problems


CONTEXT_NAMES = ("params", "steps", "workflow")


def _unknown_names(source: str, *, for_each_item: bool) -> str | None:
    """Why ``source`` reads a name its context will not have (e.g. a Go-template function
    such as ``eq`` that Jinja reads as a variable), or None."""
    allowed = set(CONTEXT_NAMES) | ({"forEach"} if for_each_item else set())
    unknown = sorted(free_names(source) - allowed)
    if not unknown:
        return None
    if unknown == ["forEach"]:
        return "forEach is only defined in the arguments of a forEach step's inner step"
    names = ", ".join(repr(name) for name in unknown)
    return (f"reads {names}, which templates do not have (they read {', '.join(CONTEXT_NAMES)}, and forEach in "
            "a forEach step's arguments; Go-template functions such as eq are not supported, write Jinja)")


def _compile_error(source: str) -> str | None:
    try:
        compile_template(source)
    except TemplateError as err:
        return err.message
    return None
