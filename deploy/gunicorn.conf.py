# gunicorn settings for vmcp-actors on a VM. `vmcp-actors serve` applies the same settings;
# use this file when running gunicorn directly:
#
#   VMCP_CONFIG=/etc/vmcp/config.yaml gunicorn -c deploy/gunicorn.conf.py \
#       --bind 127.0.0.1:4483 vmcp_actors.web.wsgi:application
#
# One gthread worker, threads for concurrency, actors started inside the worker (never
# preload), a post_fork hook that queues log lines to one writer thread, and a worker_exit
# hook that stops all actors so SIGTERM is prompt.
from vmcp_actors.web.gunicorn_settings import (  # noqa: F401
    control_socket_disable,
    graceful_timeout,
    keepalive,
    max_requests,
    post_fork,
    post_worker_init,
    preload_app,
    threads,
    timeout,
    worker_class,
    worker_connections,
    worker_exit,
    workers,
)

bind = "127.0.0.1:4483"
