"""The client edge below the views: incoming authentication, what each MCP message means
in each revision (2025 sessions, 2026-07-28 stateless), the call driver, request
lifetimes and the audit log."""
