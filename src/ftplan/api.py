"""ftplan's Python API: what the CLI and the web app call, and what programs call.

Every function takes a model reference (a catalog name, hub id or alias, a path to a
``config.json``, a pasted ``config.json`` dict, or a :class:`~ftplan.model.ModelSpec`) and options
by name, exactly the options of the command line without the dashes
(:mod:`ftplan.options`): ``estimate("llama-3.1-8b", method="lora", seq_len=4096, gpus=2)``.
A ready :class:`~ftplan.job.Job` / :class:`~ftplan.job.Layout` may be given instead (options
given with it override its fields). Results are typed; ``to_dict()`` gives the versioned JSON
document of ``docs/json-schemas.md`` (the CLI's ``--json``, the web app's ``/api/``).

Bad input raises :class:`~ftplan.errors.ConfigError` (or ``NotFoundError``) with every problem
found, each naming its option (``problem.field``). Nothing heavy is imported here: catalogs,
the planner, torch (measure/train only) are imported when a function needs them.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from .errors import ConfigError, FtplanError, InfeasibleError, Problem
from .job import Job, Layout, validate_job
from .model import ModelSpec
from .options import (
    FIT_OPTIONS,
    JOB_OPTIONS,
    LAYOUT_OPTIONS,
    OFFER_OPTIONS,
    SEARCH_OPTIONS,
    build_job,
    build_layout,
    check_values,
    schema_doc,
    split_values,
)

__all__ = [
    "ModelRef",
    "resolve_model",
    "model_from_config",
    "build_job",
    "build_layout",
    "Estimate",
    "estimate",
    "Recommendation",
    "recommend",
    "Comparison",
    "compare",
    "FitReport",
    "fit",
    "Bundle",
    "export_bundle",
    "ModelList",
    "models",
    "GpuList",
    "gpus",
    "OfferList",
    "offers",
    "options_schema",
    "measure",
    "validate",
    "train",
]

#: a model: catalog name / hub id / alias / path to config.json, a config.json dict, or a ModelSpec
ModelRef = Union[str, "os.PathLike[str]", Mapping[str, Any], ModelSpec]


# ---------------------------------------------------------------------------------------------
# collecting problems
# ---------------------------------------------------------------------------------------------
class _Problems:
    """Run steps, keep going after input errors, raise every problem at the end."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.kinds: list[type] = []

    def run(self, fn: Callable[[], Any], field: str | None = None) -> Any:
        try:
            return fn()
        except ConfigError as e:
            err = e.at(field) if field else e
            self.problems += err.problems
            self.kinds.append(type(e))
            return None

    def add(self, field: str | None, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(field, message, hint))
        self.kinds.append(ConfigError)

    def raise_any(self) -> None:
        if self.problems:
            kind = self.kinds[0] if len(set(self.kinds)) == 1 else ConfigError
            raise kind(problems=self.problems)


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------
def model_from_config(config: Mapping[str, Any], *, name: str | None = None, source: str = "config.json") -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` object (parsed as data; never remote code).
    Any problem is a ``ConfigError`` on the field ``config``."""
    from .model import model_from_config as _from_config

    if not isinstance(config, Mapping):
        raise ConfigError("config.json is not a JSON object", "paste a Hugging Face config.json", field="config")
    shown = (name or str(config.get("_name_or_path") or "") or "pasted-config").strip()[:100] or "pasted-config"
    try:
        return _from_config(dict(config), name=shown, source=source)
    except FtplanError as e:
        raise e.at("config") from None
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as e:
        raise ConfigError(f"config.json is not usable: {type(e).__name__}: {e}",
                          "paste a Hugging Face config.json of a causal LM", field="config") from None


def resolve_model(model: ModelRef, *, catalog_only: bool = False) -> ModelSpec:
    """A :class:`ModelSpec` from any model reference (see :data:`ModelRef`).

    With ``catalog_only`` a string must name a bundled model (no path is read, nothing is
    fetched): what the web app uses. Errors name the field ``model`` (``config`` for a dict).
    """
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return model_from_config(model)
    from .catalog.models import get_model
    from .catalog.models import resolve_model as _resolve

    ref = os.fspath(model) if isinstance(model, os.PathLike) else model
    if not isinstance(ref, str):
        raise ConfigError(f"not a model reference: {ref!r}", "pass a catalog name, a path to config.json or a "
                          "ModelSpec", field="model")
    try:
        return get_model(ref).spec() if catalog_only else _resolve(ref)
    except FtplanError as e:
        raise e.at("model") from None


def _job_layout(spec: ModelSpec, job: Job | None, layout: Layout | None, jv: Mapping[str, Any],
                lv: Mapping[str, Any] | None, probs: _Problems) -> tuple[Job | None, Layout | None]:
    j = probs.run(lambda: build_job(jv, spec, base=job))
    lay = probs.run(lambda: build_layout(lv or {}, base=layout, model=spec)) if lv is not None else (layout or Layout())
    return j, lay


# ---------------------------------------------------------------------------------------------
# estimate
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Estimate:
    """The per-GPU memory of a job under a layout (and, with a GPU, whether it fits)."""

    model: ModelSpec
    job: Job
    layout: Layout
    memory: Any  # ftplan.memory.MemoryBreakdown
    gpu: Any = None  # ftplan.catalog.gpus.GpuSpec

    @property
    def fits(self) -> bool | None:
        return None if self.gpu is None else self.memory.fits(self.gpu.memory_bytes)

    @property
    def headroom_bytes(self) -> float | None:
        return None if self.gpu is None else self.memory.headroom_bytes(self.gpu.memory_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.estimate/1`` document."""
        from .report import estimate_json

        return estimate_json(self.model, self.job, self.layout, self.memory, self.gpu)

    def text(self) -> str:
        from .report import estimate_text

        return estimate_text(self.model, self.job, self.layout, self.memory, self.gpu)


def estimate(model: ModelRef, job: Job | None = None, layout: Layout | None = None, *, gpu: str | None = None,
             **options: Any) -> Estimate:
    """Per-GPU memory breakdown of a job (``ftplan estimate``). ``options``: job and layout options."""
    from .memory import estimate_memory

    jv, lv = split_values(options, JOB_OPTIONS, LAYOUT_OPTIONS)
    spec = resolve_model(model)
    probs = _Problems()
    j, lay = _job_layout(spec, job, layout, jv, lv, probs)
    g = None
    if gpu:
        from .catalog.gpus import get_gpu

        g = probs.run(lambda: get_gpu(gpu), "gpu")
    if j is not None and lay is not None:
        probs.run(lambda: validate_job(spec, j, lay))
    probs.raise_any()
    mem = estimate_memory(spec, j, lay, gpu_vendor=g.vendor if g is not None else "nvidia")
    return Estimate(spec, j, lay, mem, g)


# ---------------------------------------------------------------------------------------------
# recommend / compare
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recommendation:
    """Every plan that fits, ranked (``plans``: a :class:`ftplan.planner.PlanSet`)."""

    model: ModelSpec
    job: Job
    plans: Any  # ftplan.planner.PlanSet
    top: int = 10

    @property
    def best(self):
        return self.plans.best

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.recommend/1`` document (``top`` plans, the Pareto frontier, why-not)."""
        from .report import recommend_doc

        return recommend_doc(self.model, self.job, self.plans, self.top)


@dataclass(frozen=True)
class Comparison:
    """The best plan per accelerator type (``per_gpu``), ranked by the cost of the completed job."""

    model: ModelSpec
    job: Job
    plans: Any  # ftplan.planner.PlanSet

    @property
    def per_gpu(self) -> tuple:
        from .report import compare_plans

        return compare_plans(self.plans)

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.compare/1`` document."""
        from .report import compare_doc

        return compare_doc(self.model, self.job, self.plans)


def _offer_filters(values: Mapping[str, Any], probs: _Problems) -> None:
    """Unknown GPU names and pricing kinds of the offer filters, as problems on their fields."""
    from .catalog.gpus import resolve_gpu_name
    from .catalog.offers import PRICING

    for g in values.get("gpus_filter") or ():
        probs.run(lambda g=g: resolve_gpu_name(g), "gpus_filter")
    unknown = sorted(set(values.get("pricing") or ()) - set(PRICING))
    if unknown:
        probs.add("pricing", f"unknown pricing {', '.join(unknown)}", f"use one of {', '.join(PRICING)}")


def _load_offers(values: Mapping[str, Any]) -> list:
    from .catalog.offers import filter_offers, import_skypilot_catalog, load_offers

    offers = list(load_offers(list(values.get("offers") or ()) or None,
                              include_bundled=not values.get("no_bundled_offers")))
    for path in values.get("skypilot_catalog") or ():
        offers.extend(import_skypilot_catalog(path))
    if not offers:
        raise ConfigError("no offers to search", "drop `no_bundled_offers` or pass `offers=FILE`",
                          field="no_bundled_offers")
    return filter_offers(offers, providers=values.get("providers"), gpus=values.get("gpus_filter"),
                         pricing=values.get("pricing"))


def _offer_values(ov: Mapping[str, Any], probs: _Problems, default_pricing: Any = ("on-demand",)) -> dict[str, Any]:
    vals = probs.run(lambda: check_values(ov, OFFER_OPTIONS)) or {}
    if "pricing" not in ov:
        vals["pricing"] = default_pricing
    _offer_filters(vals, probs)
    return vals


def _search(model: ModelRef, job: Job | None, options: Mapping[str, Any], offer_list, progress):
    from .planner import recommend as _recommend

    jv, sv, ov = split_values(options, JOB_OPTIONS, SEARCH_OPTIONS, OFFER_OPTIONS)
    spec = resolve_model(model)
    probs = _Problems()
    j = probs.run(lambda: build_job(jv, spec, base=job))
    search = {o.name: o.default for o in SEARCH_OPTIONS} | (probs.run(lambda: check_values(sv, SEARCH_OPTIONS)) or {})
    offer_vals = _offer_values(ov, probs)
    if j is not None:
        if not j.dataset_tokens:
            probs.add("tokens", "the planner needs the dataset size", "pass `tokens`, e.g. `tokens=50M`")
        probs.run(lambda: validate_job(spec, j))
    probs.raise_any()
    offers = list(offer_list) if offer_list is not None else _load_offers(offer_vals)
    if offer_list is not None and (ov.keys() & {"providers", "gpus_filter", "pricing"}):
        from .catalog.offers import filter_offers

        offers = filter_offers(offers, providers=offer_vals.get("providers"), gpus=offer_vals.get("gpus_filter"),
                               pricing=offer_vals.get("pricing"))
    ps = _recommend(spec, j, offers, objective=search["objective"], deadline_hours=search["deadline"],
                    budget_usd=search["budget"], max_gpus=search["max_gpus"], safety_margin=search["margin"],
                    global_batch=search["global_batch"], progress=progress)
    return spec, j, ps, search


def recommend(model: ModelRef, job: Job | None = None, *, offer_list: Sequence[Any] | None = None,
              progress: Callable[[int, int], None] | None = None, **options: Any) -> Recommendation:
    """Rank plans (offer, layout, micro-batch, checkpointing) by cost or time (``ftplan recommend``).

    ``options``: job options (``tokens`` is required), search options (``objective``, ``deadline``,
    ``budget``, ``max_gpus``, ``global_batch``, ``margin``, ``top``) and offer options
    (``providers``, ``gpus_filter``, ``pricing``, ``offers`` files, ...). ``offer_list``: search
    these :class:`~ftplan.catalog.offers.Offer` s instead of the catalog.
    """
    spec, j, ps, search = _search(model, job, options, offer_list, progress)
    return Recommendation(spec, j, ps, search["top"])


def compare(model: ModelRef, job: Job | None = None, *, offer_list: Sequence[Any] | None = None,
            progress: Callable[[int, int], None] | None = None, **options: Any) -> Comparison:
    """The best plan per accelerator type (``ftplan compare``); options as :func:`recommend`."""
    spec, j, ps, _ = _search(model, job, options, offer_list, progress)
    return Comparison(spec, j, ps)


# ---------------------------------------------------------------------------------------------
# fit
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FitReport:
    """Per GPU type: longest sequence, largest micro-batch, fewest GPUs per strategy."""

    model: ModelSpec
    job: Job
    results: tuple  # ftplan.planner.FitResult
    margin: float
    max_gpus: int = 1024

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.fit/1`` document."""
        from .report import fit_doc

        return fit_doc(self.model, self.job, self.results, self.margin)


def fit(model: ModelRef, job: Job | None = None, *, gpu: str | Sequence[str], margin: float = 0.05,
        max_gpus: int = 1024, **options: Any) -> FitReport:
    """What fits on each GPU type in ``gpu`` (``ftplan fit``); ``options``: job options."""
    from .catalog.gpus import get_gpu
    from .planner import fit as _fit

    (jv,) = split_values(options, JOB_OPTIONS)
    spec = resolve_model(model)
    probs = _Problems()
    j = probs.run(lambda: build_job(jv, spec, base=job))
    fv = probs.run(lambda: check_values({"gpu": gpu, "margin": margin, "max_gpus": max_gpus}, FIT_OPTIONS)) or {}
    names = fv.get("gpu") or ()
    if not names and "gpu" in fv:
        probs.add("gpu", "no GPU to fit on", "pass `gpu=NAME`, e.g. `gpu=h100-sxm`")
    gpus = [probs.run(lambda n=n: get_gpu(n), "gpu") for n in names]
    if j is not None:
        probs.run(lambda: validate_job(spec, j))
    probs.raise_any()
    results = tuple(_fit(spec, j, g, safety_margin=fv["margin"], max_gpus=fv["max_gpus"]) for g in gpus)
    return FitReport(spec, j, results, fv["margin"], fv["max_gpus"])


# ---------------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bundle:
    """The launch files of one plan: ``files`` (relative path -> text) and the plan document."""

    plan: dict[str, Any]
    files: dict[str, str]
    index: int = 1

    def write(self, out: str | os.PathLike, *, force: bool = False) -> Path:
        """Write the files into the new directory ``out`` atomically (all or nothing)."""
        from .export.bundle import write_bundle

        return write_bundle(self.files, out, force=force)

    def to_dict(self, out: str | os.PathLike | None = None) -> dict[str, Any]:
        """The ``ftplan.export/1`` document."""
        return {"schema": "ftplan.export/1", "out": None if out is None else str(out),
                "files": sorted(self.files), "plan": self.plan}


def _plans_of_search(rec: Recommendation, index: int, ref: str | None) -> tuple[dict, list[dict]]:
    from .export.bundle import exportable, plan_document

    ps = rec.plans
    if not ps.plans:
        reasons = "; ".join(f"{i.gpu}: {i.reason}" for i in ps.infeasible[:3])
        raise InfeasibleError("no feasible plan to export" + (f" ({reasons})" if reasons else ""),
                              "relax the constraints; `ftplan recommend` explains every GPU type")
    n = len(ps.plans)
    if not 1 <= index <= n:
        raise ConfigError(f"plan {index} is out of range: the search found {n} plan(s)", f"use `plan=1..{n}`",
                          field="plan")
    docs = [plan_document(rec.model, p, ref=ref) for p in ps.plans]
    chosen = docs[index - 1]
    why = exportable(chosen)
    if why:
        ok = next((i for i, d in enumerate(docs, 1) if exportable(d) is None), None)
        hint = (f"plan {ok} is the best one that can be exported: add `plan={ok}`" if ok
                else "no plan of this search can be exported; try other `gpus_filter` / `max_gpus`")
        raise ConfigError(f"plan {index} cannot be exported: {why}", hint, field="plan")
    others = [d for i, d in enumerate(docs, 1) if i != index]
    for d in others:
        d.pop("schema", None)
        d.pop("model", None)
    return chosen, others


def export_bundle(source: Recommendation | Mapping[str, Any] | str | os.PathLike, plan: int = 1, *,
                  ref: str | None = None, model_ref: str | None = None, dataset: str | None = None,
                  zero3_backend: str = "deepspeed", max_alternatives: int | None = None) -> Bundle:
    """The launch files of the ``plan``-th plan (1 = best) of ``source``: a :func:`recommend` result,
    a saved ``recommend``/``compare``/``plan`` document (dict), or the path of one (``ftplan export``).

    ``ref``: how the user named the model (kept in plan.json when it is a path). ``model_ref``: what
    train.py loads (default: the hub id). ``dataset``: for sky.yaml and the README. The other plans
    of the source become the README's alternatives and SkyPilot fallbacks (at most
    ``max_alternatives``). Nothing is written: see :meth:`Bundle.write`.
    """
    from . import export as _export
    from .export.bundle import ZERO3_BACKENDS, load_plan_json, plan_from_json

    if zero3_backend not in ZERO3_BACKENDS:
        raise ConfigError(f"unknown `zero3_backend` {zero3_backend!r}", "use deepspeed or fsdp", field="zero3_backend")
    if isinstance(source, Recommendation):
        pdoc, others = _plans_of_search(source, plan, ref)
    elif isinstance(source, Mapping):
        pdoc, others = plan_from_json(source, plan)
    else:
        pdoc, others = load_plan_json(source, plan)
    if max_alternatives is not None:
        others = others[:max_alternatives]
    files = _export.render_bundle(pdoc, alternatives=tuple(others), model_ref=model_ref, dataset=dataset,
                                  zero3_backend=zero3_backend)
    return Bundle(pdoc, dict(files), plan)


# ---------------------------------------------------------------------------------------------
# catalogs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelList:
    """The bundled model catalog (name -> ``CatalogModel``)."""

    models: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.models/1`` document."""
        from .report import models_doc

        return models_doc(self.models)


def models() -> ModelList:
    """The bundled model catalog (``ftplan models``)."""
    from .catalog.models import load_model_catalog

    return ModelList(load_model_catalog())


@dataclass(frozen=True)
class GpuList:
    """A GPU catalog (name -> ``GpuSpec``)."""

    gpus: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.gpus/1`` document."""
        from .report import gpus_doc

        return gpus_doc(self.gpus)


def gpus(path: str | os.PathLike | None = None) -> GpuList:
    """The GPU catalog (``ftplan gpus``): the bundled one, or a GPU CSV at ``path``."""
    from .catalog.gpus import load_gpus

    return GpuList(load_gpus(path))


@dataclass(frozen=True)
class OfferList:
    """Offers (sorted), with the date and age limit that mark prices stale."""

    offers: tuple
    today: _dt.date
    max_age_days: int = 120

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.offers/1`` document."""
        from .report import offers_doc

        return offers_doc(self.offers, self.today, self.max_age_days)


OFFER_SORTS = ("price", "provider", "gpu", "age")


def offers(*, sort: str = "price", max_age_days: int = 120, today: _dt.date | None = None,
           **options: Any) -> OfferList:
    """The offers catalog, filtered and sorted (``ftplan offers``); ``options``: offer options
    (``pricing`` defaults to any here)."""
    (ov,) = split_values(options, OFFER_OPTIONS)
    probs = _Problems()
    if sort not in OFFER_SORTS:
        probs.add("sort", f"unknown sort {sort!r}", "use price, provider, gpu or age")
    vals = _offer_values(ov, probs, default_pricing=None)
    probs.raise_any()
    keys = {"price": lambda o: (o.usd_per_gpu_hour, o.provider), "provider": lambda o: (o.provider.lower(), o.sku),
            "gpu": lambda o: (o.gpu, o.usd_per_gpu_hour), "age": lambda o: (o.as_of, o.provider)}
    rows = sorted(_load_offers(vals), key=keys[sort])
    return OfferList(tuple(rows), today or _dt.date.today(), max_age_days)


def options_schema() -> dict[str, Any]:
    """The options schema as JSON (``ftplan.options/1``; the web page's defaults)."""
    return schema_doc()


# ---------------------------------------------------------------------------------------------
# measurement and training (torch is imported only when they run)
# ---------------------------------------------------------------------------------------------
def measure(model: str, job: Job | None = None, layout: Layout | None = None, *, steps: int = 5,
            warmup: int | None = None, device: str | None = None, tiny: bool | None = None, seed: int = 0,
            out: str | os.PathLike | None = None, echo: Callable[[str], None] | None = None,
            cache: Any = None, **options: Any) -> dict[str, Any]:
    """Train ``model`` for ``steps`` real steps and return its ``ftplan.measurement/1`` record
    (appended to ``out``); ``ftplan measure``. Needs the ``measure`` extra."""
    from .measure.run import ModelCache
    from .measure.run import measure as _measure

    jv, lv = split_values(options, JOB_OPTIONS, LAYOUT_OPTIONS)
    probs = _Problems()
    j = probs.run(lambda: build_job(jv, base=job))
    lay = probs.run(lambda: build_layout(lv, base=layout))
    probs.raise_any()
    return _measure(model, j, lay, steps=steps, warmup=warmup, device=device, tiny=tiny, seed=seed,
                    out=None if out is None else str(out), cache=cache if cache is not None else ModelCache(),
                    echo=echo)


def validate(paths: Sequence[str | os.PathLike] | None = None) -> dict[str, Any]:
    """Predicted vs measured over measurement records (``ftplan validate``): the report dict."""
    from .measure.validate import default_record_paths, validate_paths

    return validate_paths(list(paths) if paths else default_record_paths())


def train(model_dir: str | os.PathLike, dataset: str, out: str | os.PathLike, job: Job | None = None,
          layout: Layout | None = None, *, max_steps: int | None = None, save_steps: int | None = None,
          logging_steps: int | None = None, seed: int = 42, record: str | None = None,
          echo: Callable[[str], None] = print, **options: Any) -> int:
    """Run a plan on this machine with the generated TRL script (``ftplan train``); the exit code.
    Needs the ``train`` extra."""
    from .train import train as _train

    jv, lv = split_values(options, JOB_OPTIONS, LAYOUT_OPTIONS)
    probs = _Problems()
    j = probs.run(lambda: build_job(jv, base=job))
    lay = probs.run(lambda: build_layout(lv, base=layout))
    probs.raise_any()
    return _train(str(model_dir), dataset, str(out), j, lay, max_steps=max_steps, save_steps=save_steps,
                  logging_steps=logging_steps, seed=seed, record=record, echo=echo)

