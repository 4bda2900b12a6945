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
import logging
import math
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


def _safe(obj: Any, depth: int = 0) -> Any:
    """``obj`` made JSON-safe for an error response: non-finite floats and unencodable strings
    (lone surrogates) become text, long strings and deep or large structures are cut."""
    if isinstance(obj, str):
        text = obj if len(obj) <= 300 else obj[:300] + "..."
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return text
    if isinstance(obj, bool) or obj is None:
        return obj
    if isinstance(obj, int):
        return obj if abs(obj) < 10**18 else "(a large integer)"
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if depth > 8:
        return "(omitted)"
    if isinstance(obj, dict):
        return {_safe(str(k), depth + 1): _safe(v, depth + 1) for k, v in list(obj.items())[:50]}
    if isinstance(obj, (list, tuple)):
        return [_safe(v, depth + 1) for v in list(obj)[:50]]
    return _safe(str(obj), depth + 1)


def _error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    errors = _safe(errors)
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query")]
        parts.append((".".join(loc) + ": " if loc else "") + str(err.get("msg", "")))
    return {"detail": errors, "message": "; ".join(parts)}


def _json_error(status: int, loc: list[Any], msg: str, kind: str) -> bytes:
    return json.dumps(_error_body([{"loc": loc, "msg": msg, "type": kind}]), ensure_ascii=True).encode()


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


class JsonGuardMiddleware:
    """422 (not 400, not 500) for a JSON request body that no option could hold: NaN or Infinity,
    nesting deeper than :data:`~ftplan.inputs.MAX_NESTING`, an integer of thousands of digits,
    invalid Unicode (lone surrogates, which a response could not even echo), or not JSON at all.
    The body is checked once, then handed on unchanged."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        ctype = next((v for k, v in scope.get("headers", ()) if k == b"content-type"), b"").lower()
        if b"json" not in ctype:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                await self.app(scope, _replay([msg]), send)
                return
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body"):
                break
        body = b"".join(chunks)
        problem = _json_problem(body) if body else None
        if problem is not None:
            raw = _json_error(422, ["body"], problem, "json_invalid")
            await send({"type": "http.response.start", "status": 422,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
            await send({"type": "http.response.body", "body": raw})
            return
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


def _replay(messages: list[dict[str, Any]], then=None):
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (give a finite number)")


def _json_problem(body: bytes) -> str | None:
    """Why ``body`` is not a JSON document any request model could hold (None when it is fine)."""
    from ..inputs import MAX_NESTING, nesting_depth

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"request body is not UTF-8 text (byte {e.start})"
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        return f"request body is not JSON (line {e.lineno}, column {e.colno}: {e.msg})"
    except ValueError as e:  # NaN/Infinity; an integer of more than 4300 digits
        if "digits" in str(e):
            return "request body holds an integer with thousands of digits"
        return f"request body: {str(e)[:200]}"
    except RecursionError:
        return f"request body is nested too deeply (at most {MAX_NESTING} levels)"
    if nesting_depth(doc, MAX_NESTING) > MAX_NESTING:
        return f"request body is nested deeper than {MAX_NESTING} levels"
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "request body holds invalid Unicode (a lone surrogate escape such as \\ud800)"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            return "request body holds a number out of range (such as 1e400)"
    return None


class CatchAllMiddleware:
    """A bug answers 500 with a JSON body and the connection stays usable: the exception is logged
    here and not re-raised (uvicorn closes a keep-alive connection when the app raises)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(msg) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 - the last line of defence, logged
            if started:
                raise
            logging.getLogger("ftplan.web").error("internal error on %s %s", scope.get("method"),
                                                  scope.get("path"), exc_info=exc)
            raw = _json_error(500, [], f"internal error: {type(exc).__name__} (please report it; the request "
                                       "was not at fault if it passed validation)", "internal_error")
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
            await send({"type": "http.response.body", "body": raw})


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
        return JSONResponse(_safe({"detail": exc.one_line(), "message": f"catalog error: {exc.one_line()}"}),
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

    app.add_middleware(CatchAllMiddleware)  # innermost: a bug's 500 passes the middlewares below
    app.add_middleware(JsonGuardMiddleware)
    app.add_middleware(GZipMiddleware, minimum_size=2048)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    return app
