"""The Gateway root actor and what it owns: the directory of sessions and live users,
opening and reaping, the request service below the view, the admin state."""

from vmcp_actors.gateway._actor import Gateway, short_id
from vmcp_actors.gateway._admin import collect_admin_state, explain_for_admin
from vmcp_actors.gateway._directory import Directory, Lease
from vmcp_actors.gateway._service import Answer, McpService, Unavailable

__all__ = ["Answer", "Directory", "Gateway", "Lease", "McpService", "Unavailable", "collect_admin_state", "explain_for_admin", "short_id"]
