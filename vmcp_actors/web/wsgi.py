"""WSGI entry for running under a plain `gunicorn` command line.

    VMCP_CONFIG=/etc/vmcp/config.yaml gunicorn -c deploy/gunicorn.conf.py vmcp_actors.web.wsgi:application

The app (and its actors) is built on first import, which gunicorn does in the worker.
"""

from __future__ import annotations

import os

from vmcp_actors.config import load_config
from vmcp_actors.runtime import start_runtime
from vmcp_actors.web import create_app

application = create_app(start_runtime(load_config(os.environ["VMCP_CONFIG"]), os.environ.get("VMCP_HOST", "127.0.0.1")))
