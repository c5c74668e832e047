"""The Gateway root actor: session registry, identity binding, reaping, admin state."""

from vmcp_actors.gateway._actor import Gateway, SessionHandle, short_id
from vmcp_actors.gateway._admin import collect_admin_state

__all__ = ["Gateway", "SessionHandle", "collect_admin_state", "short_id"]
