"""The FastAPI app behind ``ftplan serve``: the page (``/``, ``/static/``), the JSON API
(:mod:`ftplan.web.routes`, documents of ``docs/json-schemas.md``), ``/docs`` and ``/openapi.json``.

Request bodies are generated from the options schema (:mod:`ftplan.web.schemas`: ``--seq-len`` ->
``seq_len``). Safety: a model is a name or hub id present in the bundled catalog, or a pasted
``config.json`` object; the app never reads a server path or fetches from a model hub for a
request, and never runs remote code. Bodies over ``max_body_bytes`` get 413; invalid input gets
422 with the field and the fix. Planning runs in FastAPI's thread pool (sync work); results are
kept in a small LRU cache (:mod:`ftplan.web.cache`) keyed on the normalized request.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.gzip import GZipMiddleware

from ..errors import CatalogError
from .cache import LRU
from .routes import ApiError, add_routes

__all__ = ["create_app", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 256 * 1024
STATIC_DIR = Path(__file__).with_name("static")

#: no external requests from the page: everything comes from this origin
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
       "form-action 'self'")


def _error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query")]
        parts.append((".".join(loc) + ": " if loc else "") + str(err.get("msg", "")))
    return {"detail": errors, "message": "; ".join(parts)}


# ---------------------------------------------------------------------------------------------
# middleware
# ---------------------------------------------------------------------------------------------
class BodyLimitMiddleware:
    """413 for request bodies over ``max_bytes`` (by Content-Length, or counted while streaming)."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send) -> None:
        body = json.dumps({"detail": [{"loc": ["body"], "msg": f"request body over {self.max_bytes} bytes",
                                       "type": "too_large"}],
                           "message": f"request body too large: the limit is {self.max_bytes // 1024} KiB "
                                      "(paste only config.json, not weights or tokenizer files)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    too_big = int(v) > self.max_bytes
                except ValueError:
                    too_big = True
                if too_big:
                    await self._reject(send)
                    return
        seen = 0
        state = {"started": False, "rejected": False}

        async def limited_receive():
            nonlocal seen
            if state["rejected"]:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes and not state["started"]:
                    # answer 413 now; the app sees a disconnected client and its reply is dropped
                    state["rejected"] = True
                    await self._reject(send)
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg):
            if state["rejected"]:
                return
            if msg["type"] == "http.response.start":
                state["started"] = True
            await send(msg)

        await self.app(scope, limited_receive, guarded_send)


class SecurityHeadersMiddleware:
    """CSP (same origin only), no sniffing, no referrer, no framing."""

    HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
               (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def add_headers(msg):
            if msg["type"] == "http.response.start":
                msg["headers"] = list(msg.get("headers", [])) + self.HEADERS
            await send(msg)

        await self.app(scope, receive, add_headers)


# ---------------------------------------------------------------------------------------------
# the app
# ---------------------------------------------------------------------------------------------
def _docs_page(spec: dict[str, Any]) -> str:
    rows = []
    for path, ops in spec.get("paths", {}).items():
        for method, op in ops.items():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            ref = body.get("$ref", "").rsplit("/", 1)[-1]
            params = ", ".join(p["name"] for p in op.get("parameters", []))
            rows.append(f"<tr><td><code>{html.escape(method.upper())}</code></td><td><code>{html.escape(path)}"
                        f"</code></td><td>{html.escape(op.get('summary', ''))}</td><td>"
                        f"{html.escape(ref or params)}</td></tr>")
    schemas = []
    for name, sch in spec.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            props = "".join(
                f"<li><code>{html.escape(k)}</code> — {html.escape(str(v.get('description', v.get('type', ''))))}"
                f"{' (default ' + html.escape(json.dumps(v['default'])) + ')' if 'default' in v else ''}</li>"
                for k, v in sch.get("properties", {}).items())
            schemas.append(f"<h3>{html.escape(name)}</h3><ul>{props}</ul>")
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>ftplan API</title>"
            "<link rel='icon' href='data:,'><link rel='stylesheet' href='/static/style.css'></head>"
            "<body class='docs'><h1>ftplan API</h1><p>The full OpenAPI document: <a href='/openapi.json'>"
            "/openapi.json</a>. Documents are the CLI's <code>--json</code> documents (docs/json-schemas.md). "
            "This page works offline: nothing is loaded from other sites.</p><table><thead><tr><th>method</th><th>path</th><th>what"
            "</th><th>body / query</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            + "".join(schemas) + "<p><a href='/'>back to the planner</a></p></body></html>")


def create_app(*, max_body_bytes: int = MAX_BODY_BYTES, cache_size: int = 64) -> FastAPI:
    """The ftplan web app. Nothing is loaded until a request needs it."""
    import ftplan

    app = FastAPI(title="ftplan", version=ftplan.__version__,
                  description="Plan LLM fine-tuning jobs: memory, time, cost. Documents follow "
                              "docs/json-schemas.md (the CLI's --json).",
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    cache = LRU(cache_size)
    app.state.cache = cache
    app.state.max_body_bytes = max_body_bytes

    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError):
        errors = jsonable_encoder(exc.errors(), custom_encoder={Exception: str})
        for err in errors:
            err.pop("url", None)
            if isinstance(err.get("ctx"), dict):
                err["ctx"] = {k: (v if isinstance(v, (str, int, float, bool, type(None))) else str(v))
                              for k, v in err["ctx"].items()}
            if isinstance(err.get("input"), (dict, list)) and len(json.dumps(err["input"], default=str)) > 500:
                err["input"] = "(omitted)"
            msg = str(err.get("msg", ""))
            msg = msg[len("Value error, "):] if msg.startswith("Value error, ") else msg
            if msg.startswith("a model is required"):
                err["loc"] = ["body", "model"]
            err["msg"] = msg
        return JSONResponse(_error_body(errors), status_code=422)

    @app.exception_handler(ApiError)
    async def _on_api_error(request: Request, exc: ApiError):
        return JSONResponse(_error_body(exc.errors), status_code=exc.status)

    @app.exception_handler(CatalogError)
    async def _on_catalog_error(request: Request, exc: CatalogError):
        return JSONResponse({"detail": exc.one_line(), "message": f"catalog error: {exc.one_line()}"},
                            status_code=500)

    # ---- the page ----
    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(_docs_page(app.openapi()))

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    add_routes(app, cache)

    app.add_middleware(GZipMiddleware, minimum_size=2048)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    return app
