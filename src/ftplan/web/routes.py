"""The JSON API under ``/api/``: thin over :mod:`ftplan.api`, answers cached.

==========================  ===========================  =================================
``GET  /api/options``       ``ftplan.options/1``         the options schema (the page's defaults)
``GET  /api/models``        ``ftplan.models/1``          ``ftplan models --json``
``GET  /api/gpus``          ``ftplan.gpus/1``            ``ftplan gpus --json``
``GET  /api/offers``        ``ftplan.offers/1``          ``ftplan offers --json``
``POST /api/estimate``      ``ftplan.estimate/1``        ``ftplan estimate --json``
``POST /api/recommend``     ``ftplan.recommend/1``       ``ftplan recommend --json``
``POST /api/compare``       ``ftplan.compare/1``         ``ftplan compare --json``
``POST /api/fit``           ``ftplan.fit/1``             ``ftplan fit --json``
``POST /api/export``        a zip of launch files        ``ftplan export``
==========================  ===========================  =================================

Errors of the library become 422 with one entry per problem, located at its option
(``["body", "seq_len"]``) and worded with field names (:data:`RENDERER`).
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import re
import weakref
import zipfile
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI, Query
from fastapi.responses import Response

from .. import api
from ..errors import CatalogError, FtplanError, NotFoundError, Renderer
from ..options import FIT_OPTIONS, JOB_OPTIONS, LAYOUT_OPTIONS, OFFER_OPTIONS, SEARCH_OPTIONS
from .cache import LRU
from .schemas import EstimateRequest, ExportRequest, FitRequest, SearchRequest

__all__ = ["add_routes", "ApiError", "RENDERER", "api_error", "SEARCH_THREADS", "LIGHT_THREADS"]

#: planning threads at a time: searches (recommend/compare, ~0.1-0.5 s each) and the light
#: estimate/fit; few threads keep each request fast under the GIL, cache hits need none
SEARCH_THREADS = 2
LIGHT_THREADS = 4

#: commands named in messages -> the endpoint that answers the same
_ENDPOINTS = {"models": "GET /api/models", "gpus": "GET /api/gpus", "offers": "GET /api/offers",
              "estimate": "POST /api/estimate", "recommend": "POST /api/recommend", "compare": "POST /api/compare",
              "fit": "POST /api/fit", "export": "POST /api/export"}


def _command(text: str) -> str:
    words = text.split()
    return _ENDPOINTS.get(words[1], f"'{text}'") if len(words) > 1 else f"'{text}'"


#: the library's references as the API says them: fields by name (``seq_len=4096``), commands as endpoints
RENDERER = Renderer(field=lambda name, value: name if value is None else f"{name}={value}", command=_command)


class ApiError(Exception):
    """An input error on request fields (-> ``status`` in FastAPI's error format)."""

    def __init__(self, errors: list[dict[str, Any]], status: int = 422) -> None:
        super().__init__(errors[0]["msg"] if errors else "")
        self.errors = errors
        self.status = status


def api_error(e: FtplanError, field: str | None = None) -> ApiError:
    """An ftplan error -> 422, one entry per problem located at its field (or ``field``)."""
    kind = f"ftplan.{type(e).__name__}"
    errors = []
    for p in e.problems:
        f = p.field or field
        errors.append({"loc": ["body", f] if f else ["body"], "msg": p.one_line(RENDERER), "type": kind})
    return ApiError(errors)


def _fail(field: str | None, message: str, kind: str = "ftplan.ConfigError") -> ApiError:
    return ApiError([{"loc": ["body", field] if field else ["body"], "msg": message, "type": kind}])


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _json(raw: bytes, hit: bool | None = None) -> Response:
    headers = {} if hit is None else {"x-ftplan-cache": "hit" if hit else "miss"}
    return Response(content=raw, media_type="application/json", headers=headers)


def _call(fn: Callable[[], Any], field: str | None = None) -> Any:
    """Run ftplan code; its input errors become 422 on their fields (catalog errors stay 500)."""
    try:
        return fn()
    except CatalogError:
        raise
    except FtplanError as e:
        raise api_error(e, field) from None


def _model(req) -> Any:
    """A ModelSpec from the bundled catalog or a pasted config (never a path, never the hub)."""
    if req.config is not None:
        return _call(lambda: api.model_from_config(req.config, name=req.config_name, source="pasted config.json"),
                     "config")
    ref = req.model or ""
    try:
        return api.resolve_model(ref, catalog_only=True)
    except NotFoundError as e:
        if ref.count("/") == 1 and " " not in ref and not ref.startswith((".", "/", "~")):
            raise _fail("model", f"model {ref!r} is not in the bundled catalog and the web app never fetches from "
                                 "the hub (paste its config.json into config instead, or GET /api/models for the "
                                 "catalog)", "ftplan.NotFoundError") from None
        raise api_error(e, "model") from None


# ---------------------------------------------------------------------------------------------
# planning (sync: runs in the thread pool)
# ---------------------------------------------------------------------------------------------
def estimate_bytes(req) -> bytes:
    spec = _model(req)
    est = _call(lambda: api.estimate(spec, gpu=req.gpu, **req.values(JOB_OPTIONS, LAYOUT_OPTIONS)))
    return _dumps(est.to_dict())


def _search_values(req) -> dict[str, Any]:
    return req.values(JOB_OPTIONS, SEARCH_OPTIONS, OFFER_OPTIONS)


def recommend_bytes(req, search_cache: Any = None) -> bytes:
    spec = _model(req)
    return _dumps(_call(lambda: api.recommend(spec, search_cache=search_cache, **_search_values(req))).to_dict())


def compare_bytes(req, search_cache: Any = None) -> bytes:
    spec = _model(req)
    return _dumps(_call(lambda: api.compare(spec, search_cache=search_cache, **_search_values(req))).to_dict())


def fit_bytes(req) -> bytes:
    spec = _model(req)
    return _dumps(_call(lambda: api.fit(spec, **req.values(FIT_OPTIONS, JOB_OPTIONS))).to_dict())


def _safe_member(name: str) -> str:
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or ":" in parts[0]:
        raise ValueError(f"render_bundle returned an unsafe path {name!r}")
    return "/".join(parts)


def export_zip(req, cache: LRU) -> tuple[bytes, str]:
    """The launch files of one plan of the (cached) recommend search, zipped in memory."""
    if req.config is not None:
        # the exporter resolves the model by name again: only catalog models are safe to pass
        raise _fail("config", "export needs a model of the bundled catalog (model); for a pasted config.json "
                              "save the plan as JSON and run 'ftplan export' with the config file")
    top = min(100_000, max(req.top, req.plan_index + 1 + req.alternatives))
    sreq = SearchRequest(**{k: getattr(req, k) for k in SearchRequest.model_fields} | {"top": top})
    raw, _ = cache.get(sreq.cache_key("recommend"), lambda: recommend_bytes(sreq))
    doc = json.loads(raw)
    plans = doc["plans"]
    if req.plan_index >= len(plans):
        raise _fail("plan_index", f"plan_index {req.plan_index} is out of range: the search found "
                                  f"{len(plans)} plan(s) (use 0 for the best)")
    target = req.export_target or (None if req.target == "any" else req.target)
    bundle = _call(lambda: api.export_bundle(doc, req.plan_index + 1, model_ref=doc["model"].get("hf_id") or None,
                                             dataset=req.dataset, max_alternatives=req.alternatives, target=target),
                   "plan_index")
    names = {_safe_member(name): text for name, text in bundle.files.items()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(names):
            text = names[name]
            z.writestr(name, text.encode() if isinstance(text, str) else bytes(text))
        if "plan.json" not in names:
            z.writestr("plan.json", json.dumps(bundle.plan, indent=2) + "\n")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-",
                  f"ftplan-{doc['model']['name']}-{bundle.plan['offer']['gpu']}-{bundle.target}")[:120]
    return buf.getvalue(), slug + ".zip"


# ---------------------------------------------------------------------------------------------
# the routes
# ---------------------------------------------------------------------------------------------
def add_routes(app: FastAPI, cache: LRU) -> None:
    """The ``/api/`` endpoints of ``app``, answers cached in ``cache``; searches share memory and
    step-time answers through one :class:`~ftplan.planner.SearchCache` (a search that differs from
    an earlier one only in data size, objective or constraints recomputes neither)."""
    import ftplan

    shared: dict[str, Any] = {}

    def search_cache() -> Any:  # made on the first search: creating the app loads no planner
        if "cache" not in shared:
            from ..api import SearchCache

            shared["cache"] = SearchCache()
        return shared["cache"]

    @app.get("/api/health", summary="liveness and cache statistics")
    def health() -> dict[str, Any]:
        return {"ok": True, "version": ftplan.__version__, "cache": {"hits": cache.hits, "misses": cache.misses}}

    @app.get("/api/options", summary="the options schema: names, types, defaults, choices, bounds (ftplan.options/1)")
    def options() -> Response:
        raw, hit = cache.get("options", lambda: _dumps(api.options_schema()))
        return _json(raw, hit)

    @app.get("/api/models", summary="the bundled model catalog (ftplan.models/1)")
    def models() -> Response:
        raw, hit = cache.get("models", lambda: _dumps(api.models().to_dict()))
        return _json(raw, hit)

    @app.get("/api/gpus", summary="the GPU catalog (ftplan.gpus/1)")
    def gpus() -> Response:
        raw, hit = cache.get("gpus", lambda: _dumps(api.gpus().to_dict()))
        return _json(raw, hit)

    @app.get("/api/offers", summary="the offers catalog, filtered and sorted (ftplan.offers/1)")
    def offers(providers: str | None = Query(None, max_length=2000, description="comma-separated providers"),
               gpus_filter: str | None = Query(None, max_length=2000, description="comma-separated GPU names"),
               pricing: str = Query("any", max_length=200, description="any (default), on-demand, spot, reserved"),
               max_age_days: int = Query(120, ge=0, le=100_000, description="older prices are flagged stale"),
               sort: Literal["price", "provider", "gpu", "age"] = Query("price")) -> Response:
        def build() -> bytes:
            res = _call(lambda: api.offers(sort=sort, max_age_days=max_age_days, providers=providers,
                                           gpus_filter=gpus_filter, pricing=pricing))
            return _dumps(res.to_dict())

        key = "offers" + json.dumps([providers, gpus_filter, pricing, max_age_days, sort, str(_dt.date.today())])
        raw, hit = cache.get(key, build)
        return _json(raw, hit)

    # ---- planning: cache hits answer on the event loop, misses compute in a bounded thread pool ----
    limiters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per event loop

    async def answer(key: str, compute: Callable[[], bytes], heavy: bool) -> Response:
        raw = cache.peek(key)
        if raw is not None:
            return _json(raw, True)
        import asyncio

        import anyio
        import anyio.to_thread

        mine = limiters.setdefault(asyncio.get_running_loop(), {})
        if heavy not in mine:
            mine[heavy] = anyio.CapacityLimiter(SEARCH_THREADS if heavy else LIGHT_THREADS)
        raw, hit = await anyio.to_thread.run_sync(cache.get, key, compute, limiter=mine[heavy])
        return _json(raw, hit)

    @app.post("/api/estimate", summary="per-GPU memory breakdown of a job (ftplan.estimate/1)")
    async def estimate(req: EstimateRequest) -> Response:
        return await answer(req.cache_key("estimate"), lambda: estimate_bytes(req), heavy=False)

    @app.post("/api/recommend", summary="ranked plans, Pareto frontier, why-not (ftplan.recommend/1)")
    async def recommend(req: SearchRequest) -> Response:
        return await answer(req.cache_key("recommend"), lambda: recommend_bytes(req, search_cache()), heavy=True)

    @app.post("/api/compare", summary="the best plan per accelerator type (ftplan.compare/1)")
    async def compare(req: SearchRequest) -> Response:
        return await answer(req.cache_key("compare"), lambda: compare_bytes(req, search_cache()), heavy=True)

    @app.post("/api/fit", summary="longest sequence, largest micro-batch, fewest GPUs (ftplan.fit/1)")
    async def fit(req: FitRequest) -> Response:
        return await answer(req.cache_key("fit"), lambda: fit_bytes(req), heavy=False)

    @app.post("/api/export", summary="launch files of one plan as a zip (ftplan export)",
              responses={200: {"content": {"application/zip": {}}}})
    def export(req: ExportRequest) -> Response:
        data, filename = export_zip(req, cache)
        return Response(content=data, media_type="application/zip",
                        headers={"content-disposition": f'attachment; filename="{filename}"'})
