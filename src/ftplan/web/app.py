"""The FastAPI app behind ``ftplan serve``: the page (``/``, ``/static/``) and a JSON API.

API (``/api/``; documents are the CLI's ``--json`` documents, see ``docs/json-schemas.md``):

==========================  ===========================  =================================
``GET  /api/models``        ``ftplan.models/1``          ``ftplan models --json``
``GET  /api/gpus``          ``ftplan.gpus/1``            ``ftplan gpus --json``
``GET  /api/offers``        ``ftplan.offers/1``          ``ftplan offers --json``
``POST /api/estimate``      ``ftplan.estimate/1``        ``ftplan estimate --json``
``POST /api/recommend``     ``ftplan.recommend/1``       ``ftplan recommend --json``
``POST /api/compare``       ``ftplan.compare/1``         ``ftplan compare --json``
``POST /api/fit``           ``ftplan.fit/1``             ``ftplan fit --json``
``POST /api/export``        a zip of launch files        ``ftplan.export.render_bundle``
==========================  ===========================  =================================

Request bodies mirror the CLI options (``--seq-len`` -> ``seq_len``). Safety: a model is a name
or hub id present in the bundled catalog, or a pasted ``config.json`` object; the app never reads
a server path or fetches from a model hub for a request, and never runs remote code. Bodies over
``max_body_bytes`` get 413; invalid input gets 422 with the field and the fix. Planning runs in
FastAPI's thread pool (sync endpoints); results are kept in a small LRU cache keyed on the
normalized request.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import html
import io
import json
import re
import threading
import weakref
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.encoders import jsonable_encoder
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.middleware.gzip import GZipMiddleware

from ..errors import CatalogError, FtplanError

__all__ = ["create_app", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 256 * 1024
#: planning threads at a time: searches (recommend/compare, ~0.1-0.5 s each) and the light
#: estimate/fit; few threads keep each request fast under the GIL, cache hits need none
SEARCH_THREADS = 2
LIGHT_THREADS = 4
STATIC_DIR = Path(__file__).with_name("static")

#: no external requests from the page: everything comes from this origin
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
       "form-action 'self'")


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
class ApiError(Exception):
    """An input error on a named request field (-> 422 in FastAPI's error format)."""

    def __init__(self, field: str | None, message: str, status: int = 422, kind: str = "ftplan.ConfigError"):
        super().__init__(message)
        self.field = field
        self.message = message
        self.status = status
        self.kind = kind
        loc = ["body", field] if field else ["body"]
        self.errors = [{"loc": loc, "msg": message, "type": kind}]


#: message keyword -> request field (first match wins; messages are ftplan's own)
_FIELD_WORDS: tuple[tuple[str, str], ...] = (
    ("lora target", "lora_targets"), ("lora rank", "lora_r"), ("lora alpha", "lora_alpha"),
    ("lora dropout", "lora_dropout"), ("quant type", "quant_type"), ("compute dtype", "compute_dtype"),
    ("method", "method"), ("precision", "precision"), ("optimizer offload", "offload_optimizer"),
    ("optimizer", "optimizer"), ("attention implementation", "attn"), ("micro-batch", "micro_batch"),
    ("sequence length", "seq_len"), ("gradient accumulation", "grad_accum"), ("epochs", "epochs"),
    ("dataset", "tokens"), ("tp x pp", "tp"), ("tensor-parallel", "tp"), ("tensor parallelism", "tp"), ("pipeline", "pp"),
    ("parameter offload", "offload_params"), ("strategy", "strategy"), ("gpus per node", "gpus"),
    ("data-parallel", "strategy"), ("gpus per node and nodes", "gpus"), ("safety margin", "margin"), ("max gpus", "max_gpus"),
    ("global batch", "global_batch"), ("deadline", "deadline"), ("budget", "budget"),
    ("objective", "objective"), ("pricing", "pricing"), ("unknown gpu", "gpu"),
)


def _api_words(text: str) -> str:
    """CLI wording -> API wording: '--seq-len' -> 'seq_len', 'ftplan models' -> GET /api/models."""
    text = text.replace("run 'ftplan models' to list the catalog", "GET /api/models lists the catalog")
    text = re.sub(r"'ftplan (gpus|offers)'", r"GET /api/\1", text)
    text = re.sub(r"--([a-z][a-z0-9-]*) (?=[\w.$])", lambda m: m.group(1).replace("-", "_") + "=", text)
    return re.sub(r"--([a-z][a-z0-9-]*)", lambda m: m.group(1).replace("-", "_"), text)


def _field_of(message: str) -> str | None:
    low = message.lower()
    return next((f for word, f in _FIELD_WORDS if word in low), None)


def _config_error(e: FtplanError, field: str | None = None) -> ApiError:
    """An ftplan input error -> 422 naming the field; several problems -> one error each."""
    kind = f"ftplan.{type(e).__name__}"
    parts = [p.strip() for p in e.message.split("; ") if p.strip()] if field is None else [e.message]
    errors = []
    for part in parts or [e.message]:
        hint = None if e.hint == "fix the options above" else e.hint
        text = part if not hint else f"{part} ({hint})"
        errors.append({"loc": ["body", field or _field_of(part)] if (field or _field_of(part)) else ["body"],
                       "msg": _api_words(" ".join(text.split())), "type": kind})
    err = ApiError(field or _field_of(parts[0] if parts else e.message), errors[0]["msg"], kind=kind)
    err.errors = errors
    return err


def _error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    parts = []
    for err in errors:
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query")]
        parts.append((".".join(loc) + ": " if loc else "") + str(err.get("msg", "")))
    return {"detail": errors, "message": "; ".join(parts)}


# ---------------------------------------------------------------------------------------------
# request bodies (mirror the CLI options)
# ---------------------------------------------------------------------------------------------
def _lower(v: Any) -> Any:
    return v.strip().lower() if isinstance(v, str) else v


def _names(v: Any) -> Any:
    """'a, b' or ['a', 'b'] -> sorted unique lower-case names (None/empty -> None)."""
    if v is None:
        return None
    if isinstance(v, str):
        v = v.split(",")
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError("expected a comma-separated string or a list of strings")
    out = sorted({x.strip().lower() for x in v if x.strip()})
    return out or None


class JobRequest(BaseModel):
    """The job (``ftplan estimate/recommend/fit`` job options). Give ``model`` or ``config``."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, max_length=200, examples=["llama-3.1-8b"],
                              description="a model of the bundled catalog: short name, hub id or alias "
                                          "(GET /api/models); never a path, never fetched from the hub")
    config: dict[str, Any] | None = Field(None, validate_default=True,
                                          description="a pasted Hugging Face config.json object "
                                          "(instead of model); parsed as data, never remote code")
    config_name: str | None = Field(None, max_length=100, description="display name for a pasted config")
    method: Literal["full", "lora", "qlora"] = "full"
    precision: Literal["bf16-mixed", "fp16-mixed", "bf16", "fp16", "fp32"] = "bf16-mixed"
    optimizer: Literal["adamw", "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd"] = "adamw"
    micro_batch: int = Field(1, ge=1, le=65536)
    seq_len: int = Field(2048, ge=1, le=1 << 21)
    grad_accum: int = Field(1, ge=1, le=1 << 20)
    gradient_checkpointing: bool = False
    attn: Literal["sdpa", "flash", "eager"] = "sdpa"
    lora_r: int = Field(16, ge=1, le=65536)
    lora_alpha: int = Field(32, gt=0, le=1 << 20)
    lora_dropout: float | None = Field(None, ge=0.0, lt=1.0,
                                       description="default 0.05; 0 where PEFT requires it (all-linear on MoE)")
    lora_targets: list[str] = Field(default_factory=lambda: ["all-linear"],
                                    description="PEFT target_modules (list or comma-separated), or all-linear")
    quant_type: Literal["nf4", "fp4"] = "nf4"
    no_double_quant: bool = False
    compute_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    tokens: int | None = Field(None, ge=1, le=10**15, examples=["20M"],
                               description="dataset tokens per epoch: an integer or '50M', '1.5B'")
    epochs: float = Field(1.0, gt=0.0, le=1000.0)

    @field_validator("method", "precision", "attn", "quant_type", "compute_dtype", mode="before")
    @classmethod
    def _v_lower(cls, v: Any) -> Any:
        return _lower(v)

    @field_validator("optimizer", mode="before")
    @classmethod
    def _v_optimizer(cls, v: Any) -> Any:
        return _lower(v).replace("-", "_") if isinstance(v, str) else v

    @field_validator("model", mode="before")
    @classmethod
    def _v_model(cls, v: Any) -> Any:
        return v.strip() or None if isinstance(v, str) else v

    @field_validator("config", mode="after")
    @classmethod
    def _v_config(cls, v: Any, info) -> Any:
        model = info.data.get("model")
        if v is not None and model:
            raise ValueError("give either model (a catalog name) or config (a pasted config.json), not both")
        if v is None and not model and "model" in info.data:
            raise ValueError("a model is required: model (a catalog name, GET /api/models) or config "
                             "(a pasted config.json object)")
        return v

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _v_targets(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.split(",")
        if isinstance(v, list) and all(isinstance(x, str) for x in v):
            v = [x.strip() for x in v if x.strip()] or ["all-linear"]
        return v

    @field_validator("tokens", mode="before")
    @classmethod
    def _v_tokens(cls, v: Any) -> Any:
        if isinstance(v, str):
            from ..cli import _tokens

            if not v.strip():
                return None
            try:
                return _tokens(v)
            except argparse.ArgumentTypeError as e:
                raise ValueError(str(e)) from None
        return v

    def namespace(self) -> argparse.Namespace:
        """The argparse namespace the CLI would build (for ``job_from_args``/``layout_from_args``)."""
        return argparse.Namespace(
            method=self.method, precision=self.precision, optimizer=self.optimizer,
            micro_batch=self.micro_batch, seq_len=self.seq_len, grad_accum=self.grad_accum,
            gc=self.gradient_checkpointing, attn_impl=self.attn, lora_r=self.lora_r,
            lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
            lora_targets=",".join(self.lora_targets), quant_type=self.quant_type,
            no_double_quant=self.no_double_quant, compute_dtype=self.compute_dtype,
            tokens=self.tokens, epochs=self.epochs)

    def cache_key(self, endpoint: str) -> str:
        return endpoint + json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


class EstimateRequest(JobRequest):
    """``ftplan estimate``: job + layout (+ gpu to say whether it fits)."""

    gpus: int = Field(1, ge=1, le=1024, description="GPUs per node (CLI --gpus)")
    nodes: int = Field(1, ge=1, le=1024)
    strategy: Literal["single", "ddp", "zero1", "zero2", "zero3", "fsdp"] | None = Field(
        None, description="default: single, or ddp with more than one GPU")
    offload_optimizer: bool = False
    offload_params: bool = False
    tp: int = Field(1, ge=1, le=1024)
    pp: int = Field(1, ge=1, le=1024)
    gpu: str | None = Field(None, max_length=100, description="a GPU name (GET /api/gpus)")

    @field_validator("strategy", mode="before")
    @classmethod
    def _v_strategy(cls, v: Any) -> Any:
        v = _lower(v)
        return v or None


class SearchRequest(JobRequest):
    """``ftplan recommend`` / ``ftplan compare``: job + offer filters + search options."""

    providers: list[str] | None = Field(None, description="providers (list or comma-separated), e.g. aws,lambda")
    gpus_filter: list[str] | None = Field(None, description="GPU types (list or comma-separated), e.g. h100-sxm")
    pricing: list[str] | None = Field(["on-demand"], description="on-demand (default), spot, reserved; "
                                      "null, [] or 'any' for all")
    objective: Literal["cost", "time"] = "cost"
    deadline: float | None = Field(None, gt=0, description="hours")
    budget: float | None = Field(None, gt=0, description="USD")
    max_gpus: int | None = Field(None, ge=1, le=1024)
    global_batch: int | None = Field(None, ge=1, le=1 << 24, description="sequences per optimizer step")
    margin: float = Field(0.05, ge=0.0, lt=1.0, description="memory safety margin")
    top: int = Field(10, ge=0, le=100_000, description="plans to return")

    @field_validator("providers", "gpus_filter", mode="before")
    @classmethod
    def _v_names(cls, v: Any) -> Any:
        return _names(v)

    @field_validator("pricing", mode="before")
    @classmethod
    def _v_pricing(cls, v: Any) -> Any:
        v = _names(v)
        if v is None or any(x in ("any", "all") for x in v):
            return None
        return v

    @field_validator("objective", mode="before")
    @classmethod
    def _v_objective(cls, v: Any) -> Any:
        return _lower(v)

    def namespace(self) -> argparse.Namespace:
        a = super().namespace()
        a.offers, a.skypilot_catalog, a.no_bundled_offers = [], [], False  # never server paths
        a.providers = ",".join(self.providers) if self.providers else None
        a.gpus_filter = ",".join(self.gpus_filter) if self.gpus_filter else None
        a.pricing = ",".join(self.pricing) if self.pricing else "any"
        a.objective, a.deadline, a.budget, a.max_gpus = self.objective, self.deadline, self.budget, self.max_gpus
        a.global_batch, a.margin, a.top = self.global_batch, self.margin, self.top
        return a


class ExportRequest(SearchRequest):
    """The plan ``plan_index`` (0 = best) of a recommend search, as a zip of launch files."""

    plan_index: int = Field(0, ge=0, le=100_000, description="index into the ranked plans (0 = best)")
    alternatives: int = Field(9, ge=0, le=50, description="other plans of the search passed as alternatives "
                                                          "(listed in the README, SkyPilot fallbacks)")
    dataset: str | None = Field(None, max_length=300, description="dataset name for the exported files")


class FitRequest(JobRequest):
    """``ftplan fit``: job + GPU types."""

    gpu: list[str] = Field(..., min_length=1, max_length=32, description="GPU names (list or comma-separated)")
    margin: float = Field(0.05, ge=0.0, lt=1.0)
    max_gpus: int = Field(1024, ge=1, le=4096)

    @field_validator("gpu", mode="before")
    @classmethod
    def _v_gpu(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        return v


# ---------------------------------------------------------------------------------------------
# planning (sync: runs in the thread pool)
# ---------------------------------------------------------------------------------------------
class _LRU:
    """A small thread-safe LRU of response bytes; concurrent misses of one key compute once."""

    def __init__(self, maxsize: int = 64, max_bytes: int = 64 << 20) -> None:
        self.maxsize, self.max_bytes = maxsize, max_bytes
        self._d: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self.hits = self.misses = 0

    def peek(self, key: str) -> bytes | None:
        """The cached value, or None (no computing: safe on the event loop)."""
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
                self.hits += 1
            return v

    def get(self, key: str, compute: Callable[[], bytes]) -> tuple[bytes, bool]:
        with self._lock:
            if key in self._d:
                self._d.move_to_end(key)
                self.hits += 1
                return self._d[key], True
            ev = self._inflight.get(key)
            owner = ev is None
            if owner:
                ev = self._inflight[key] = threading.Event()
        if not owner:
            ev.wait(60)
            with self._lock:
                if key in self._d:
                    self.hits += 1
                    return self._d[key], True
            return compute(), False  # the first one failed: raise our own error
        try:
            val = compute()
            with self._lock:
                self.misses += 1
                if self.maxsize > 0 and len(val) <= self.max_bytes:
                    self._d[key] = val
                    self._bytes += len(val)
                    while len(self._d) > self.maxsize or self._bytes > self.max_bytes:
                        _, old = self._d.popitem(last=False)
                        self._bytes -= len(old)
            return val, False
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            ev.set()


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _resolve(req: JobRequest):
    """A ModelSpec from the bundled catalog or a pasted config (never a path, never the hub)."""
    from ..catalog.models import get_model
    from ..errors import NotFoundError
    from ..model import model_from_config

    if req.config is not None:
        name = req.config_name or str(req.config.get("_name_or_path") or "") or "pasted-config"
        name = name.strip()[:100] or "pasted-config"
        try:
            return model_from_config(req.config, name=name, source="pasted config.json")
        except FtplanError as e:
            raise _config_error(e, "config") from None
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as e:
            raise ApiError("config", f"config.json is not usable: {type(e).__name__}: {e} (paste a Hugging "
                                     "Face config.json of a causal LM)") from None
    ref = req.model or ""
    try:
        return get_model(ref).spec()
    except NotFoundError as e:
        msg = _api_words(e.one_line())
        if ref.count("/") == 1 and " " not in ref and not ref.startswith((".", "/", "~")):
            msg = (f"model {ref!r} is not in the bundled catalog and the web app never fetches from the "
                   "hub (paste its config.json into config instead, or GET /api/models for the catalog)")
        raise ApiError("model", msg, kind="ftplan.NotFoundError") from None


def _job(req: JobRequest, model):
    from ..cli import job_from_args

    return job_from_args(req.namespace(), model)


def _plan(fn: Callable[[], Any], field: str | None = None) -> Any:
    """Run ftplan code; its input errors become 422 on the right field."""
    try:
        return fn()
    except ApiError:
        raise
    except CatalogError:
        raise
    except FtplanError as e:
        raise _config_error(e, field) from None


def models_doc() -> dict[str, Any]:
    """The ``ftplan.models/1`` document (as ``ftplan models --json``)."""
    from ..catalog.models import load_model_catalog

    docs = []
    for name, m in load_model_catalog().items():
        spec = m.spec()
        p = spec.params
        docs.append({"name": name, "hf_id": m.hf_id, "family": spec.family, "params_total": p.total,
                     "params_active": p.active, "layers": spec.num_layers, "hidden_size": spec.hidden_size,
                     "vocab_size": spec.vocab_size, "source": m.source})
    return {"schema": "ftplan.models/1", "models": docs}


def estimate_bytes(req: EstimateRequest) -> bytes:
    from ..cli import layout_from_args
    from ..memory import estimate_memory
    from ..report import estimate_json

    model = _resolve(req)
    job = _job(req, model)
    a = req.namespace()
    a.gpus_per_node, a.nodes, a.strategy = req.gpus, req.nodes, req.strategy
    a.offload_optimizer, a.offload_params, a.tp, a.pp = req.offload_optimizer, req.offload_params, req.tp, req.pp
    layout = layout_from_args(a)
    gpu = None
    vendor = "nvidia"
    if req.gpu:
        from ..catalog.gpus import get_gpu

        gpu = _plan(lambda: get_gpu(req.gpu), "gpu")
        vendor = gpu.vendor
    mem = _plan(lambda: estimate_memory(model, job, layout, gpu_vendor=vendor))
    return _dumps(estimate_json(model, job, layout, mem, gpu))


def _search(req: SearchRequest):
    from ..planner import recommend

    model = _resolve(req)
    job = _job(req, model)
    a = req.namespace()
    offers = _load_offers_api(a)
    ps = _plan(lambda: recommend(model, job, offers, objective=a.objective, deadline_hours=a.deadline,
                                 budget_usd=a.budget, max_gpus=a.max_gpus, safety_margin=a.margin,
                                 global_batch=a.global_batch))
    return model, job, ps


def _load_offers_api(a: argparse.Namespace) -> list:
    """The bundled offers through the CLI's filters (unknown GPU -> gpus_filter, pricing -> pricing)."""
    from ..cli_planner import _load_offers
    from ..errors import NotFoundError

    try:
        return _load_offers(a)
    except NotFoundError as e:
        raise _config_error(e, "gpus_filter") from None
    except FtplanError as e:
        raise _config_error(e) from None


def recommend_bytes(req: SearchRequest) -> bytes:
    from ..cli_planner import recommend_doc

    model, job, ps = _search(req)
    return _dumps(recommend_doc(model, job, ps, req.top))


def compare_bytes(req: SearchRequest) -> bytes:
    from ..cli_planner import compare_doc

    model, job, ps = _search(req)
    return _dumps(compare_doc(model, job, ps))


def fit_bytes(req: FitRequest) -> bytes:
    from ..catalog.gpus import get_gpu
    from ..cli_planner import fit_doc
    from ..planner import fit

    model = _resolve(req)
    job = _job(req, model)
    gpus = [_plan(lambda g=g: get_gpu(g), "gpu") for g in req.gpu]
    results = [_plan(lambda g=g: fit(model, job, g, safety_margin=req.margin, max_gpus=req.max_gpus))
               for g in gpus]
    return _dumps(fit_doc(model, job, results, req.margin))


def _safe_member(name: str) -> str:
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or ":" in parts[0]:
        raise ValueError(f"render_bundle returned an unsafe path {name!r}")
    return "/".join(parts)


def export_zip(req: ExportRequest, cache: _LRU) -> tuple[bytes, str]:
    """The launch files of one plan (``ftplan.export.render_bundle``) zipped in memory."""
    try:
        from .. import export as export_mod

        render_bundle = getattr(export_mod, "render_bundle")
        plan_from_json = getattr(export_mod, "plan_from_json", None)
    except (ImportError, AttributeError):
        raise ApiError(None, "export is not available in this ftplan build (ftplan.export.render_bundle is "
                             "missing); download the plan as JSON instead", status=501,
                       kind="ftplan.NotImplemented") from None
    if req.config is not None:
        # render_bundle resolves the model by name again: only catalog models are safe to pass
        raise ApiError("config", "export needs a model of the bundled catalog (model); for a pasted config.json "
                                 "save the plan as JSON and run 'ftplan export' with the config file")
    top = min(100_000, max(req.top, req.plan_index + 1 + req.alternatives))
    sreq = SearchRequest(**{k: getattr(req, k) for k in SearchRequest.model_fields} | {"top": top})
    raw, _ = cache.get(sreq.cache_key("recommend"), lambda: recommend_bytes(sreq))
    doc = json.loads(raw)
    plans = doc["plans"]
    if req.plan_index >= len(plans):
        raise ApiError("plan_index", f"plan_index {req.plan_index} is out of range: the search found "
                                     f"{len(plans)} plan(s) (use 0 for the best)")
    if plan_from_json is not None:
        pdoc, others = plan_from_json(doc, req.plan_index + 1)
    else:
        pdoc = {"schema": "ftplan.plan/1", "model": dict(doc["model"]), **plans[req.plan_index]}
        others = [p for i, p in enumerate(plans) if i != req.plan_index]
    alts = tuple(others[: req.alternatives])
    try:
        files = render_bundle(pdoc, alternatives=alts, model_ref=doc["model"].get("hf_id") or None,
                              dataset=req.dataset)
    except FtplanError as e:
        raise _config_error(e, "plan_index") from None
    buf = io.BytesIO()
    names = {}
    for name in files:
        names[_safe_member(name)] = files[name]
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sorted(names):
            text = names[name]
            z.writestr(name, text.encode() if isinstance(text, str) else bytes(text))
        if "plan.json" not in names:
            z.writestr("plan.json", json.dumps(pdoc, indent=2) + "\n")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"ftplan-{doc['model']['name']}-{pdoc['offer']['gpu']}")[:120]
    return buf.getvalue(), slug + ".zip"


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
def _json(raw: bytes, hit: bool | None = None) -> Response:
    headers = {} if hit is None else {"x-ftplan-cache": "hit" if hit else "miss"}
    return Response(content=raw, media_type="application/json", headers=headers)


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
    cache = _LRU(cache_size)
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
            msg = _api_words(str(err.get("msg", "")))
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

    # ---- catalogs ----
    @app.get("/api/health", summary="liveness and cache statistics")
    def health() -> dict[str, Any]:
        return {"ok": True, "version": ftplan.__version__, "cache": {"hits": cache.hits, "misses": cache.misses}}

    @app.get("/api/models", summary="the bundled model catalog (ftplan.models/1)")
    def models() -> Response:
        raw, hit = cache.get("models", lambda: _dumps(models_doc()))
        return _json(raw, hit)

    @app.get("/api/gpus", summary="the GPU catalog (ftplan.gpus/1)")
    def gpus() -> Response:
        from ..catalog.gpus import load_gpus
        from ..cli_planner import gpus_doc

        raw, hit = cache.get("gpus", lambda: _dumps(gpus_doc(load_gpus())))
        return _json(raw, hit)

    @app.get("/api/offers", summary="the offers catalog, filtered and sorted (ftplan.offers/1)")
    def offers(providers: str | None = Query(None, max_length=2000, description="comma-separated providers"),
               gpus_filter: str | None = Query(None, max_length=2000, description="comma-separated GPU names"),
               pricing: str = Query("any", max_length=200, description="any (default), on-demand, spot, reserved"),
               max_age_days: int = Query(120, ge=0, le=100_000, description="older prices are flagged stale"),
               sort: Literal["price", "provider", "gpu", "age"] = Query("price")) -> Response:
        from ..cli_planner import offers_doc

        a = argparse.Namespace(offers=[], skypilot_catalog=[], no_bundled_offers=False, providers=providers,
                               gpus_filter=gpus_filter, pricing=pricing)

        def build() -> bytes:
            today = _dt.date.today()
            keys = {"price": lambda o: (o.usd_per_gpu_hour, o.provider),
                    "provider": lambda o: (o.provider.lower(), o.sku),
                    "gpu": lambda o: (o.gpu, o.usd_per_gpu_hour), "age": lambda o: (o.as_of, o.provider)}
            rows = sorted(_load_offers_api(a), key=keys[sort])
            return _dumps(offers_doc(rows, today, max_age_days))

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
        return await answer(req.cache_key("recommend"), lambda: recommend_bytes(req), heavy=True)

    @app.post("/api/compare", summary="the best plan per accelerator type (ftplan.compare/1)")
    async def compare(req: SearchRequest) -> Response:
        return await answer(req.cache_key("compare"), lambda: compare_bytes(req), heavy=True)

    @app.post("/api/fit", summary="longest sequence, largest micro-batch, fewest GPUs (ftplan.fit/1)")
    async def fit(req: FitRequest) -> Response:
        return await answer(req.cache_key("fit"), lambda: fit_bytes(req), heavy=False)

    @app.post("/api/export", summary="launch files of one plan as a zip (ftplan.export.render_bundle)",
              responses={200: {"content": {"application/zip": {}}}, 501: {"description": "export not available"}})
    def export(req: ExportRequest) -> Response:
        data, filename = export_zip(req, cache)
        return Response(content=data, media_type="application/zip",
                        headers={"content-disposition": f'attachment; filename="{filename}"'})

    app.add_middleware(GZipMiddleware, minimum_size=2048)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    return app
