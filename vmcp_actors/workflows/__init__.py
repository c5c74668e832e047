"""Composite tools: templating, argument coercion, and the step graph.

Pure modules for now; the WorkflowRun actor and the config wiring build on them.
"""

from vmcp_actors.workflows._coercion import coerce_arguments
from vmcp_actors.workflows._dag import DagProblem, StepSpec, ready_steps, topological_levels, validate_dag
from vmcp_actors.workflows._errors import TemplateError, TemplateRenderError, TemplateSyntaxError, UnsafeTemplate
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
    "DagProblem",
    "ForEachItem",
    "StepOutcome",
    "StepSpec",
    "Template",
    "TemplateError",
    "TemplateRenderError",
    "TemplateSyntaxError",
    "UnsafeTemplate",
    "coerce_arguments",
    "compile_template",
    "is_template",
    "iter_templates",
    "ready_steps",
    "referenced_steps",
    "render_condition",
    "render_value",
    "template_context",
    "topological_levels",
    "validate_dag",
]
