"""Command line: serve, validate, demo."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from vmcp_actors.config import VmcpConfig, config_from_mapping, config_warnings, load_config
from vmcp_actors.exceptions import ConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4483
EXIT_CONFIG_ERROR = 2

logger = logging.getLogger("vmcp_actors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmcp-actors", description="A virtual MCP server in front of many MCP servers.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway under gunicorn")
    serve.add_argument("--config", required=True, help="YAML config file")
    serve.add_argument("--host", default=DEFAULT_HOST)
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)

    validate = commands.add_parser("validate", help="check a config file; exit 0, or 2 with every error")
    validate.add_argument("--config", required=True, help="YAML config file")

    demo = commands.add_parser("demo", help="run the gateway on the bundled demo backends")
    demo.add_argument("--host", default=DEFAULT_HOST)
    demo.add_argument("--port", type=int, default=DEFAULT_PORT)

    args = parser.parse_args(argv)
    _configure_logging()
    if args.command == "validate":
        return _validate(args.config)
    if args.command == "serve":
        return _serve(args.config, args.host, args.port)
    return _demo(args.host, args.port)


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "mcp", "uvicorn", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _load(path: str) -> VmcpConfig | None:
    try:
        return load_config(path)
    except ConfigError as error:
        for line in error.errors:
            print(line, file=sys.stderr)
        return None


def _validate(path: str) -> int:
    config = _load(path)
    if config is None:
        return EXIT_CONFIG_ERROR
    for warning in config_warnings(config):
        print(f"warning: {warning}", file=sys.stderr)
    composites = len(config.composite_tools)
    print(f"{path}: ok ({len(config.backends)} backends, {composites} composite tool{'' if composites == 1 else 's'})")
    return 0


def _serve(path: str, host: str, port: int) -> int:
    if _load(path) is None:
        return EXIT_CONFIG_ERROR
    from gunicorn.app.base import BaseApplication

    from vmcp_actors.web.gunicorn_settings import SETTINGS

    class GatewayApplication(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            for key, value in {**SETTINGS, "bind": f"{_bracketed(host)}:{port}"}.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            # Runs in the worker after the fork: the actors start there.
            from vmcp_actors.web import create_app

            return create_app(load_config(path), host=host)

    GatewayApplication().run()
    return 0


def _demo(host: str, port: int) -> int:
    from vmcp_actors.demo import demo_config_mapping, start_demo_backends, stop_demo_backends

    try:
        backends = start_demo_backends()
    except RuntimeError as error:  # the demo extra is missing
        print(error, file=sys.stderr)
        return 1
    try:
        from werkzeug.serving import make_server

        from vmcp_actors.web import create_app, stop_app

        app = create_app(config_from_mapping(demo_config_mapping(backends)), host=host)
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
