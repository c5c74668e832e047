"""The Gateway root actor: session registry, identity binding, reaping, admin state."""

from vmcp_actors.gateway._actor import Gateway, short_id
from vmcp_actors.gateway._admin import collect_admin_state
from vmcp_actors.gateway._directory import SessionDirectory, SessionHandle, SessionRecord

__all__ = ["Gateway", "SessionDirectory", "SessionHandle", "SessionRecord", "collect_admin_state", "short_id"]
