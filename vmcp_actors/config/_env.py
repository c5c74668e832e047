"""Which environment variables a config refers to; reading them is the caller's job."""

from __future__ import annotations

from ._model import BackendAuthConfig, VmcpConfig


def required_env_vars(config: VmcpConfig) -> list[tuple[str, str]]:
    """``(field path, variable name)`` for every env var ``config`` names, in file order.

    Startup code reports the unset ones by path, e.g.
    ``outgoingAuth.backends.github.headerInjection.headerValueEnv: GITHUB_TOKEN is not set``.
    """
    found: list[tuple[str, str]] = []
    if config.operational.signing_key_env is not None:
        found.append(("operational.signingKeyEnv", config.operational.signing_key_env))
    if config.admin.token_env is not None:
        found.append(("admin.tokenEnv", config.admin.token_env))
    oidc = config.incoming_auth.oidc
    if oidc is not None and oidc.client_secret_env is not None:
        found.append(("incomingAuth.oidc.clientSecretEnv", oidc.client_secret_env))
    oauth = config.incoming_auth.oauth
    if oauth is not None:
        found.append(("incomingAuth.oauth.signingKeyEnv", oauth.signing_key_env))
        found.extend((f"incomingAuth.oauth.previousSigningKeyEnvs[{index}]", name)
                     for index, name in enumerate(oauth.previous_signing_key_envs))
        found.append(("incomingAuth.oauth.upstream.clientSecretEnv", oauth.upstream.client_secret_env))
    if config.admin.metrics_token_env is not None:
        found.append(("admin.metricsTokenEnv", config.admin.metrics_token_env))
    outgoing = config.outgoing_auth
    found.extend(_backend_auth_env_vars("outgoingAuth.default", outgoing.default))
    for name, auth in outgoing.backends.items():
        found.extend(_backend_auth_env_vars(f"outgoingAuth.backends.{name}", auth))
    return found


def _backend_auth_env_vars(path: str, auth: BackendAuthConfig) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if auth.oauth is not None and auth.oauth.client_secret_env is not None:
        found.append((f"{path}.oauth.clientSecretEnv", auth.oauth.client_secret_env))
    if auth.header_injection is not None and auth.header_injection.header_value_env is not None:
        found.append((f"{path}.headerInjection.headerValueEnv", auth.header_injection.header_value_env))
    if auth.token_exchange is not None and auth.token_exchange.client_secret_env is not None:
        found.append((f"{path}.tokenExchange.clientSecretEnv", auth.token_exchange.client_secret_env))
    return found
