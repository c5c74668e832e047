"""Code mode: a model's script over the tools a person may call, run in a sandbox
(``_sandbox``), offered to clients by the ``CodeMode`` layer (``vmcp_actors.decorators``)."""

from vmcp_actors.codemode._sandbox import (
    InnerCall,
    Sandbox,
    ScriptCancelled,
    ScriptRun,
    failure,
    script_result,
    tool_value,
)

__all__ = ["InnerCall", "Sandbox", "ScriptCancelled", "ScriptRun", "failure", "script_result", "tool_value"]
