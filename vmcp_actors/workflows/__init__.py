"""Composite tools: definitions, templating, argument coercion, the step graph, and the
WorkflowRun actor that executes one call. The config and session wiring build on them.
"""

from vmcp_actors.workflows._annotations import (
    ANNOTATION_KEYS,
    HINTS,
    composite_annotations,
    derive_annotations,
    step_hints,
    unsafe_claims,
)
from vmcp_actors.workflows._coercion import coerce_arguments
from vmcp_actors.workflows._dag import DagProblem, StepSpec, ready_steps, topological_levels, validate_dag
from vmcp_actors.workflows._definition import (
    CompositeTool,
    ForEach,
    OnError,
    OutputProperty,
    OutputSpec,
    Step,
    composite_problems,
    output_schema,
    output_templates,
    step_specs,
)
from vmcp_actors.workflows._errors import TemplateError, TemplateRenderError, TemplateSyntaxError, UnsafeTemplate
from vmcp_actors.workflows._run import (
    StepCaller,
    WorkflowCancelled,
    WorkflowRun,
    error_result,
    step_output,
    validate_params,
)
from vmcp_actors.workflows._templates import (
    ForEachItem,
    StepOutcome,
    Template,
    compile_template,
    is_template,
    iter_templates,
    referenced_steps,
    render_condition,
    render_value,
    template_context,
)

__all__ = [
    "ANNOTATION_KEYS",
    "HINTS",
    "composite_annotations",
    "derive_annotations",
    "step_hints",
    "unsafe_claims",
    "CompositeTool",
    "DagProblem",
    "ForEach",
    "ForEachItem",
    "OnError",
    "OutputProperty",
    "OutputSpec",
    "Step",
    "StepCaller",
    "StepOutcome",
    "StepSpec",
    "Template",
    "TemplateError",
    "TemplateRenderError",
    "TemplateSyntaxError",
    "UnsafeTemplate",
    "WorkflowCancelled",
    "WorkflowRun",
    "coerce_arguments",
    "compile_template",
    "composite_problems",
    "output_schema",
    "output_templates",
    "error_result",
    "is_template",
    "iter_templates",
    "ready_steps",
    "referenced_steps",
    "render_condition",
    "render_value",
    "step_output",
    "step_specs",
    "template_context",
    "topological_levels",
    "validate_dag",
    "validate_params",
]
