"""Command line: serve, validate, explain, demo."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

from vmcp_actors.config import (
    BackendConfig,
    VmcpConfig,
    config_from_mapping,
    config_warnings,
    load_config,
    read_mcp_servers,
)
from vmcp_actors.exceptions import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4483
EXIT_CONFIG_ERROR = 2

logger = logging.getLogger("vmcp_actors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmcp-actors", description="A virtual MCP server in front of many MCP servers.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway under gunicorn")
    _add_config_source(serve)
    serve.add_argument("--host", default=DEFAULT_HOST)
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--workers", type=int, default=1,
                       help="gunicorn worker processes; above 1 needs sessionStorage.provider: redis")

    validate = commands.add_parser("validate", help="check a config file; exit 0, or 2 with every error")
    _add_config_source(validate)
    validate.add_argument("--discover", action="store_true",
                          help="also discover the backends (as --user) and report the tool names and ui:// URIs "
                               "two of them claim, and the backends that do not answer")
    _add_caller(validate)

    explain = commands.add_parser("explain", help="say why a caller does or does not see a tool, layer by layer")
    explain.add_argument("--config", required=True, help="YAML config file")
    explain.add_argument("--tool", required=True, help="the tool's name as a client would see it (or a backend's)")
    _add_caller(explain)
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")

    demo = commands.add_parser("demo", help="run the gateway on the bundled demo backends")
    demo.add_argument("--host", default=DEFAULT_HOST)
    demo.add_argument("--port", type=int, default=DEFAULT_PORT)

    args = parser.parse_args(argv)
    _configure_logging()
    if args.command == "validate":
        return _validate(args.mcp_servers or args.config, mcp_servers=args.mcp_servers is not None,
                         discover=(args.user, args.claims) if args.discover else None)
    if args.command == "serve":
        return _serve(args.mcp_servers or args.config, args.host, args.port, args.workers,
                      mcp_servers=args.mcp_servers is not None)
    if args.command == "explain":
        return _explain(args.config, args.tool, args.user, args.claims, args.json)
    return _demo(args.host, args.port)


def _add_caller(command: argparse.ArgumentParser) -> None:
    command.add_argument("--user", help="the caller's subject (sub claim); default: anonymous")
    command.add_argument("--claims", help="the caller's other token claims as a JSON object (groups, roles, ...)")


def _add_config_source(command: argparse.ArgumentParser) -> None:
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="YAML config file")
    source.add_argument("--mcp-servers", metavar="FILE",
                        help="a desktop client's JSON file (mcpServers: Claude Desktop, Cursor; servers: VS Code) "
                             "whose servers become the backends")


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "mcp", "uvicorn", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _load(path: str, mcp_servers: bool = False) -> VmcpConfig | None:
    """The YAML config at ``path``, or the one an mcpServers file makes (what it could not
    use is printed as warnings, also when the result is invalid: they may say why)."""
    try:
        if not mcp_servers:
            return load_config(path)
        imported = read_mcp_servers(path)
        for note in imported.notes:
            print(f"warning: {note}", file=sys.stderr)
        return imported.config()
    except ConfigError as error:
        for line in error.errors:
            print(line, file=sys.stderr)
        return None


def _validate(path: str, mcp_servers: bool = False, discover: tuple[str | None, str | None] | None = None) -> int:
    """``discover``: (user, claims) to discover the backends as, and report what two of them claim."""
    config = _load(path, mcp_servers)
    if config is None:
        return EXIT_CONFIG_ERROR
    for warning in config_warnings(config):
        print(f"warning: {warning}", file=sys.stderr)
    if discover is not None:
        identity = _caller(config, *discover)
        if identity is False:
            return EXIT_CONFIG_ERROR
        from vmcp_actors.core import build
        from vmcp_actors.core import discover as discover_backends

        found = discover_backends(build(config), identity)
        for backend, why in sorted(found.failures.items()):
            print(f"warning: backend {backend!r} was not discovered: {why}", file=sys.stderr)
        for clash in found.clashes:
            print(f"clash: {clash}")
    if mcp_servers:
        for backend in config.backends:
            print(f"backend {_describe(config, backend)}")
        print(f"{path}: ok ({len(config.backends)} backends)")
        return 0
    composites = len(config.composite_tools)
    print(f"{path}: ok ({len(config.backends)} backends, {composites} composite tool{'' if composites == 1 else 's'})")
    return 0


def _describe(config: VmcpConfig, backend: BackendConfig) -> str:
    """Name, transport, and the program or the URL's host: args, env, paths and header
    values may hold credentials."""
    if backend.is_process:
        return f"{backend.name}: {backend.transport}, command {backend.command}"
    parts = urlsplit(backend.url or "")
    host = parts.hostname or "?"
    described = f"{backend.name}: {backend.transport}, host {_bracketed(host)}"
    if parts.port is not None:
        described += f":{parts.port}"
    injection = config.outgoing_auth.for_backend(backend.name).header_injection
    if injection is not None:
        described += f", header {injection.header_name}"
    return described


def _serve(path: str, host: str, port: int, workers: int = 1, mcp_servers: bool = False) -> int:
    config = _load(path, mcp_servers)
    if config is None:
        return EXIT_CONFIG_ERROR
    from vmcp_actors.core import build, serve

    try:
        return serve(build(config), host=host, port=port, workers=workers)
    except ValueError as error:  # --workers the config cannot serve
        print(f"--workers: {error}", file=sys.stderr)
        return EXIT_CONFIG_ERROR


def _caller(config: VmcpConfig, user: str | None, claims_json: str | None) -> Any:
    """The caller --user and --claims describe: an Identity, None (anonymous), or False
    when --claims is not a JSON object (said on stderr)."""
    claims: dict[str, Any] = {}
    if claims_json:
        try:
            claims = json.loads(claims_json)
        except json.JSONDecodeError as error:
            print(f"--claims: not JSON: {error.msg}", file=sys.stderr)
            return False
        if not isinstance(claims, dict):
            print("--claims: must be a JSON object of claims", file=sys.stderr)
            return False
    if user is None and not claims:
        return None
    from vmcp_actors.identity import Identity

    subject = user or str(claims.get("sub", "cli-user"))
    issuer = config.incoming_auth.oidc.issuer if config.incoming_auth.oidc is not None else "vmcp-actors explain"
    return Identity(issuer, subject, claims={**claims, "sub": subject})


def _explain(path: str, tool: str, user: str | None, claims_json: str | None, as_json: bool) -> int:
    config = _load(path)
    if config is None:
        return EXIT_CONFIG_ERROR
    identity = _caller(config, user, claims_json)
    if identity is False:
        return EXIT_CONFIG_ERROR
    from vmcp_actors.core import build, explain
    from vmcp_actors.protocol import JsonRpcError

    try:
        explanation = explain(build(config), tool, identity)
    except JsonRpcError as error:
        print(f"cannot explain {tool!r}: {error.message}", file=sys.stderr)
        return 1
    print(json.dumps(explanation.to_json(), indent=2) if as_json else explanation.to_text())
    return 0


def _demo(host: str, port: int) -> int:
    from vmcp_actors.demo import (
        demo_config_mapping,
        start_demo_backends,
        stop_demo_backends,
    )

    try:
        backends = start_demo_backends()
    except RuntimeError as error:  # the demo extra is missing
        print(error, file=sys.stderr)
        return 1
    try:
        from werkzeug.serving import make_server

        from vmcp_actors.runtime import start_runtime
        from vmcp_actors.web import create_app, stop_app

        app = create_app(start_runtime(config_from_mapping(demo_config_mapping(backends)), host))
        server = make_server(host, port, app, threaded=True)
        url = f"http://{_bracketed(host)}:{port}/mcp"
        print(f"vmcp-actors demo: gateway on {url} over backends {', '.join(n for n, _ in backends)}", flush=True)
        print("Press Ctrl-C to stop.", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
            stop_app(app)
    finally:
        stop_demo_backends(backends)
    return 0


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


if __name__ == "__main__":
    sys.exit(main())
