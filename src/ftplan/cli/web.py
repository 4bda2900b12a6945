"""CLI command for the local web app: serve.

FastAPI and uvicorn (the ``web`` extra) are imported only when ``ftplan serve`` runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from ..errors import ConfigError
from ..inputs import check_text
from .options import Command

__all__ = ["COMMANDS", "run_serve", "KEEP_ALIVE_S"]

#: idle keep-alive connections live this long (uvicorn's default, 5 s, races with clients such as
#: httpx that reuse an idle connection for a POST just as the server closes it: a failed request)
KEEP_ALIVE_S = 30
#: more worker processes than this is a typo (each loads the catalogs and keeps its own cache)
MAX_WORKERS = 64


def _port(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= v <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535 (got {v})")
    return v


def _serve_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; the API has no authentication)")
    s.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0 = any free port)")
    s.add_argument("--workers", type=int, default=1,
                   help="worker processes (default 1; each keeps its own result cache)")
    s.add_argument("--log-level", default="info", help="uvicorn log level (default info)")


def _is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run_serve(a: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise ConfigError(f"ftplan serve needs fastapi and uvicorn ({e.name or e} is not installed)",
                          "pip install 'ftplan[web]'") from None
    from uvicorn.config import LOG_LEVELS

    if not 1 <= a.workers <= MAX_WORKERS:
        raise ConfigError(f"`workers` must be in 1..{MAX_WORKERS} (got {a.workers})", "e.g. `workers=2`",
                          field="workers")
    level = a.log_level.strip().lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"unknown log level {a.log_level[:40]!r}", f"use one of {', '.join(LOG_LEVELS)}",
                          field="log_level")
    check_text(a.host, "host")
    _check_bind(a.host, a.port)
    if not _is_loopback(a.host):
        print(f"ftplan serve: warning: binding to {a.host}: the API has no authentication; anyone who can "
              "reach this address can use it", file=sys.stderr)
    shown = f"[{a.host}]" if ":" in a.host else a.host
    print(f"ftplan serve: http://{shown}:{a.port}/  (API docs: /docs, OpenAPI: /openapi.json; Ctrl+C stops)",
          file=sys.stderr)
    # an import string + factory: what uvicorn needs for more than one worker
    try:
        uvicorn.run("ftplan.web.app:create_app", factory=True, host=a.host, port=a.port, workers=a.workers,
                    log_level=level, ws="none", timeout_keep_alive=KEEP_ALIVE_S)
    except SystemExit as e:  # uvicorn exits 1 or 3 when it cannot start: one line, exit code 2
        if e.code not in (0, None):
            raise ConfigError(f"the web server could not start on {a.host}:{a.port} (uvicorn exit code {e.code})",
                              "see the message above") from None
    return 0


def _check_bind(host: str, port: int) -> None:
    """Fail before uvicorn starts (and prints a traceback-like log) when the address cannot be bound."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as e:
        raise ConfigError(f"cannot bind to host {host[:100]!r}: {getattr(e, 'strerror', None) or e}",
                          "pass `host=127.0.0.1` (this machine) or an address of this machine", field="host") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is already in use",
                                  "stop the other server, or pass another `port` (0 = any free port)",
                                  field="port") from None
            raise ConfigError(f"cannot bind to {host}:{port}: {e.strerror or e}",
                              "pass another `host` or `port`", field="host") from None


COMMANDS = {
    "serve": Command("the local web app: job form, plan charts and a JSON API (/api/, /docs)", _serve_args,
                     run_serve),
}
