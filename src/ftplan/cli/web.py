"""CLI command for the local web app: serve.

FastAPI and uvicorn (the ``web`` extra) are imported only when ``ftplan serve`` runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from ..errors import ConfigError
from .options import Command

__all__ = ["COMMANDS", "run_serve", "KEEP_ALIVE_S"]

#: idle keep-alive connections live this long (uvicorn's default, 5 s, races with clients such as
#: httpx that reuse an idle connection for a POST just as the server closes it: a failed request)
KEEP_ALIVE_S = 30


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
    if a.workers < 1:
        raise ConfigError(f"`workers` must be >= 1 (got {a.workers})", "e.g. `workers=2`")
    if not _is_loopback(a.host):
        print(f"ftplan serve: warning: binding to {a.host}: the API has no authentication; anyone who can "
              "reach this address can use it", file=sys.stderr)
    shown = f"[{a.host}]" if ":" in a.host else a.host
    print(f"ftplan serve: http://{shown}:{a.port}/  (API docs: /docs, OpenAPI: /openapi.json; Ctrl+C stops)",
          file=sys.stderr)
    # an import string + factory: what uvicorn needs for more than one worker
    uvicorn.run("ftplan.web.app:create_app", factory=True, host=a.host, port=a.port, workers=a.workers,
                log_level=a.log_level.lower(), ws="none", timeout_keep_alive=KEEP_ALIVE_S)
    return 0


COMMANDS = {
    "serve": Command("the local web app: job form, plan charts and a JSON API (/api/, /docs)", _serve_args,
                     run_serve),
}
