"""The web API's request bodies, generated from the options schema (:mod:`ftplan.options`).

``JobRequest`` has a field per job option, ``EstimateRequest`` adds the layout options,
``SearchRequest`` the search and offer options (no file options: the web never reads a path),
``FitRequest`` the fit options; names, types, defaults, choices, bounds and descriptions are the
schema's (``web_max`` caps a request's size). Text forms are accepted where the CLI accepts them
(``"tokens": "50M"``, ``"providers": "aws, lambda"``) and normalized before validation, so that
equal requests have equal cache keys.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from ..options import EXPORT_TARGETS, FIT_OPTIONS, JOB_OPTIONS, LAYOUT_OPTIONS, OFFER_OPTIONS, SEARCH_OPTIONS
from ..optionspec import Option

__all__ = ["JobRequest", "EstimateRequest", "SearchRequest", "ExportRequest", "FitRequest", "option_fields"]


def _web_value(o: Option, v: Any) -> Any:
    """A request value in the CLI's text forms -> the option's value (pydantic validates the rest)."""
    if v is None:
        return None
    if o.type == "names":
        if isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            out = o.coerce(v)
            return None if out is None else list(out)
        raise ValueError("expected a comma-separated string or a list of strings")
    if o.type == "tokens" and isinstance(v, str):
        return o.coerce(v)
    if o.type == "str" and isinstance(v, str):
        out = o.coerce(v)
        return None if out == "" and o.default is None else out
    return v


def _annotation(o: Option) -> Any:
    if o.type == "bool":
        return bool
    if o.type in ("int", "tokens"):
        t: Any = int
    elif o.type == "float":
        t = float
    elif o.type == "names":
        return Optional[list[str]]  # null / [] / 'any' may mean "any" (pricing)
    elif o.choices is not None:
        t = Literal[tuple(o.choices)]
    else:
        t = str
    return Optional[t] if o.default is None else t


def _field(o: Option, **extra: Any) -> Any:
    kw: dict[str, Any] = {"description": o.help}
    for bound, key in (("minimum", "ge"), ("exclusive_minimum", "gt"), ("maximum", "le"), ("exclusive_maximum", "lt")):
        if getattr(o, bound) is not None:
            kw[key] = getattr(o, bound)
    if o.web_max is not None:  # the web's own (smaller) cap wins over the library's sanity bound
        if "le" in kw:
            kw["le"] = min(kw["le"], o.web_max)
        elif "lt" not in kw:
            kw["le"] = o.web_max
    if o.type == "float":
        kw["allow_inf_nan"] = False  # NaN and infinities are not numbers a job can have
    if o.example is not None and o.type == "tokens":
        kw["examples"] = [o.example]
    kw.update(extra)
    default = list(o.default) if isinstance(o.default, tuple) else o.default
    if "default" in kw:
        default = kw.pop("default")
    return Field(default, **kw)


def option_fields(*tables: tuple[Option, ...]) -> dict[str, tuple[Any, Any]]:
    """pydantic field definitions of the web options of ``tables``."""
    return {o.name: (_annotation(o), _field(o)) for t in tables for o in t if o.web}


def _validators(name: str, *tables: tuple[Option, ...]) -> dict[str, Any]:
    """A before-validator of the option fields of ``tables`` (``name``: unique per class, or a
    subclass's would replace its base's)."""
    opts = {o.name: o for t in tables for o in t if o.web}

    def normalize(cls, v: Any, info) -> Any:
        return _web_value(opts[info.field_name], v)

    return {f"normalize_{name}": field_validator(*opts, mode="before")(normalize)}


class _ModelRef(BaseModel):
    """A model of the bundled catalog or a pasted config.json (never a path, never the hub)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, max_length=200, examples=["llama-3.1-8b"],
                              description="a model of the bundled catalog: short name, hub id or alias "
                                          "(GET /api/models); never a path, never fetched from the hub")
    config: dict[str, Any] | None = Field(None, validate_default=True,
                                          description="a pasted Hugging Face config.json object "
                                          "(instead of model); parsed as data, never remote code")
    config_name: str | None = Field(None, max_length=100, description="display name for a pasted config")

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

    def cache_key(self, endpoint: str) -> str:
        # what was given, not the filled-in defaults: an answer lists the defaults it assumed
        return endpoint + json.dumps(self.model_dump(mode="json", exclude_unset=True), sort_keys=True,
                                     separators=(",", ":"))

    def values(self, *tables: tuple[Option, ...]) -> dict[str, Any]:
        """The option values of ``tables`` given in this request (name -> value; None = not set):
        options left out take the schema's defaults in the library, which lists them as assumed."""
        fields = type(self).model_fields
        given = self.model_fields_set
        return {o.name: getattr(self, o.name) for t in tables for o in t
                if o.web and o.name in fields and o.name in given}


JobRequest = create_model(
    "JobRequest", __base__=_ModelRef, __doc__="The job (job options of estimate/recommend/fit). Give model or config.",
    __validators__=_validators("job", JOB_OPTIONS), **option_fields(JOB_OPTIONS))

EstimateRequest = create_model(
    "EstimateRequest", __base__=JobRequest, __doc__="``ftplan estimate``: job + layout (+ gpu to say whether it fits).",
    __validators__=_validators("layout", LAYOUT_OPTIONS), **option_fields(LAYOUT_OPTIONS),
    gpu=(Optional[str], Field(None, max_length=100, description="a GPU name (GET /api/gpus)")))

SearchRequest = create_model(
    "SearchRequest", __base__=JobRequest,
    __doc__="``ftplan recommend`` / ``ftplan compare``: job + offer filters + search options.",
    __validators__=_validators("search", OFFER_OPTIONS, SEARCH_OPTIONS), **option_fields(OFFER_OPTIONS, SEARCH_OPTIONS),
    # a search picks the micro-batch per plan unless the request fixes one
    micro_batch=(Optional[int], Field(None, ge=1, le=65536,
                                      description="keep this micro-batch (sequences per GPU per step); "
                                                  "default: chosen per plan")))

ExportRequest = create_model(
    "ExportRequest", __base__=SearchRequest,
    __doc__="The plan ``plan_index`` (0 = best) of a recommend search, as a zip of launch files.",
    plan_index=(int, Field(0, ge=0, le=100_000, description="index into the ranked plans (0 = best)")),
    alternatives=(int, Field(9, ge=0, le=50, description="other plans of the search passed as alternatives "
                                                        "(listed in the README, SkyPilot fallbacks)")),
    dataset=(Optional[str], Field(None, max_length=300, description="dataset name for the exported files")),
    export_target=(Optional[Literal[EXPORT_TARGETS]], Field(
        None, description="files for accelerate (+ the TRL script) | deepspeed | axolotl | llamafactory "
                          "(default: the search's target)")))

FitRequest = create_model(
    "FitRequest", __base__=JobRequest, __doc__="``ftplan fit``: job + GPU types.",
    __validators__=_validators("fit", FIT_OPTIONS),
    **{name: spec for name, spec in option_fields(FIT_OPTIONS).items() if name != "gpu"},
    gpu=(list[str], Field(..., min_length=1, max_length=32, description="GPU names (list or comma-separated)")))
