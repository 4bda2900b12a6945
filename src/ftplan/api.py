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
    DATA_OPTIONS,
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
    "SearchCache",
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
    "ClaimsReport",
    "claims",
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
    #: the defaults the answer rests on (:class:`ftplan.advice.Assumption`)
    assumptions: tuple = ()
    #: with a GPU the job does not fit: the single changes that make it fit (:class:`ftplan.advice.Suggestion`)
    advice: tuple = ()
    dataset: Any = None  # ftplan.dataset.DatasetProfile (with ``dataset=``)
    batches: Any = None  # ftplan.dataset.Batches: the memory is at its largest batch
    #: with a GPU: step time, tokens/s, MFU and the calibrated band (ftplan.runtime.RuntimeEstimate)
    runtime: Any = None
    #: with a GPU and ``tokens``: the cheapest matching offer's plan (ftplan.planner.Plan), or why
    #: not (ftplan.planner.Infeasible)
    priced: Any = None
    runtime_notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool | None:
        return None if self.gpu is None else self.memory.fits(self.gpu.memory_bytes)

    @property
    def headroom_bytes(self) -> float | None:
        return None if self.gpu is None else self.memory.headroom_bytes(self.gpu.memory_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.estimate/1`` document."""
        from .report import dataset_dict, estimate_json

        doc = estimate_json(self.model, self.job, self.layout, self.memory, self.gpu, self.assumptions,
                            self.advice, self.runtime, self.priced, self.runtime_notes)
        if self.dataset is not None:
            doc["dataset"] = dataset_dict(self.dataset, self.batches)
        return doc

    def text(self, renderer: Any = None) -> str:
        """The text answer; ``renderer`` (:class:`ftplan.errors.Renderer`) writes option references
        (the CLI's writes flags)."""
        from .report import dataset_text, estimate_text

        out = estimate_text(self.model, self.job, self.layout, self.memory, self.gpu, self.assumptions,
                            self.advice, renderer, self.runtime, self.priced, self.runtime_notes)
        if self.dataset is not None:
            out += "\n" + dataset_text(self.dataset, self.batches, renderer)
        return out


def estimate(model: ModelRef, job: Job | None = None, layout: Layout | None = None, *, gpu: str | None = None,
             offer_list: Sequence[Any] | None = None, **options: Any) -> Estimate:
    """Per-GPU memory breakdown of a job (``ftplan estimate``). ``options``: job and layout
    options, and data options (``dataset``, ``tokenizer``, ``batching``: the memory is then taken
    at the largest batch the loader forms from the data, with ``seq_len`` as its max length).

    With ``gpu``: also the runtime of this exact layout (step time, tokens/s, MFU, with the
    calibrated band); with ``gpu`` and ``tokens``: hours and cost on the cheapest matching
    on-demand offer (``offer_list``: these offers instead of the bundled catalog).
    """
    from .memory import estimate_memory

    jv, lv, dv = split_values(options, JOB_OPTIONS, LAYOUT_OPTIONS, DATA_OPTIONS)
    spec = resolve_model(model)
    probs = _Problems()
    j, lay = _job_layout(spec, job, layout, jv, lv, probs)
    prof, batching = _dataset(dv, spec, probs)
    g = None
    if gpu:
        from .catalog.gpus import get_gpu

        g = probs.run(lambda: get_gpu(gpu), "gpu")
    if j is not None and lay is not None:
        probs.run(lambda: validate_job(spec, j, lay))
    if g is not None and j is not None and j.low_precision:
        from .lowprec import check_gpu

        probs.run(lambda: check_gpu(j, g), "precision")  # FP8/NVFP4 need the format's tensor cores
    probs.raise_any()
    batches = None
    mjob = j
    if prof is not None:
        from .dataset import simulate_batches

        batches = simulate_batches(prof, batching, j.seq_len, j.micro_batch, grad_accum=j.grad_accum)
        mjob = batches.memory_job(j)
        if batches.padding_free:
            mjob = mjob.with_(attn_impl="flash")
    mem = estimate_memory(spec, mjob, lay, gpu_vendor=g.vendor if g is not None else "nvidia")
    from .advice import fit_advice, job_assumptions

    # a ready Job counts as set where it differs from the defaults; options count where given
    given = {k for k, v in jv.items() if v is not None}
    assumed = job_assumptions(j, lay, explicit=given if job is None else None, model=spec)
    if job is not None:
        assumed = tuple(a for a in assumed if a.field not in given)
    advice = fit_advice(spec, mjob, lay, g) if g is not None and not mem.fits(g.memory_bytes) else ()
    if g is None:
        return Estimate(spec, mjob, lay, mem, g, assumed, advice, prof, batches)
    rt, priced, notes = _layout_runtime(spec, j, lay, g, offer_list)
    if rt is not None:
        from .runtime import fp32_experts_note

        xnote = fp32_experts_note(spec, j, lay, g, rt)
        notes = notes + ((xnote,) if xnote else ())
    return Estimate(spec, mjob, lay, mem, g, assumed, advice, prof, batches, runtime=rt, priced=priced,
                    runtime_notes=notes)


def _layout_runtime(spec: ModelSpec, job: Job, layout: Layout, gpu: Any, offer_list: Sequence[Any] | None):
    """(runtime, priced plan or why not, notes) of one layout of one GPU."""
    from .catalog.offers import filter_offers, load_offers
    from .planner import Infeasible, platform_job, price_layout
    from .runtime import estimate_runtime

    notes: list[str] = []
    gjob, pnotes, why = platform_job(job, gpu)
    if gjob is None:
        return None, None, (f"no runtime: {why}",)
    notes += pnotes
    offers = list(offer_list) if offer_list is not None else load_offers()
    offers = filter_offers(offers, gpus=[gpu.name], pricing=None if offer_list is not None else ("on-demand",))
    priced = price_layout(spec, gjob, layout, gpu, offers) if gjob.dataset_tokens else None
    if priced is not None and not isinstance(priced, Infeasible):
        return priced.runtime, priced, tuple(notes)
    net = None
    if layout.nodes > 1:  # the network comes from an offer: the cheapest one with one, if any
        with_net = sorted((o for o in offers if o.inter_node_gbps and int(o.gpus_per_instance) >= layout.gpus_per_node),
                          key=lambda o: o.usd_per_instance_hour)
        if not with_net:
            notes.append(f"no runtime: {layout.nodes} nodes need an offer of {gpu.name} with an inter-node network")
            return None, priced, tuple(notes)
        net = with_net[0]
        notes.append(f"inter-node network of {net.provider} {net.sku}: {net.inter_node_gbps:g} Gb/s per instance")
    return estimate_runtime(spec, gjob, layout, gpu, offer=net), priced, tuple(notes)


def _dataset(dv: Mapping[str, Any], spec: ModelSpec, probs: _Problems) -> tuple[Any, str]:
    """(the dataset's profile or None, the batching) from the data options."""
    vals = probs.run(lambda: check_values(dv, DATA_OPTIONS)) or {}
    batching = vals.get("batching") or "longest"
    path = vals.get("dataset")
    if not path:
        if vals.get("tokenizer"):
            probs.add("tokenizer", "a tokenizer needs a dataset to count", "pass `dataset=FILE`")
        return None, batching
    from .dataset import profile_dataset

    prof = probs.run(lambda: profile_dataset(path, tokenizer=vals.get("tokenizer"), model_name=spec.name,
                                             family=spec.family), "dataset")
    return prof, batching


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
    #: the export target the ranking is for (its files run every ranked layout); None: every layout
    target: str | None = "accelerate"
    dataset: Any = None  # ftplan.dataset.DatasetProfile (with ``dataset=``)

    @property
    def best(self):
        return self.plans.best

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.recommend/1`` document (``top`` plans, the Pareto frontier, why-not)."""
        from .report import dataset_dict, recommend_doc

        doc = recommend_doc(self.model, self.job, self.plans, self.top)
        if self.dataset is not None:
            doc["dataset"] = dataset_dict(self.dataset)
        return doc


@dataclass(frozen=True)
class Comparison:
    """The best plan per accelerator type (``per_gpu``), ranked by the cost of the completed job."""

    model: ModelSpec
    job: Job
    plans: Any  # ftplan.planner.PlanSet
    dataset: Any = None  # ftplan.dataset.DatasetProfile (with ``dataset=``)

    @property
    def per_gpu(self) -> tuple:
        from .report import compare_plans

        return compare_plans(self.plans)

    def to_dict(self) -> dict[str, Any]:
        """The ``ftplan.compare/1`` document."""
        from .report import compare_doc, dataset_dict

        doc = compare_doc(self.model, self.job, self.plans)
        if self.dataset is not None:
            doc["dataset"] = dataset_dict(self.dataset)
        return doc


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


def _search(model: ModelRef, job: Job | None, options: Mapping[str, Any], offer_list, progress,
            search_cache: Any = None):
    from .planner import recommend as _recommend

    jv, sv, ov, dv = split_values(options, JOB_OPTIONS, SEARCH_OPTIONS, OFFER_OPTIONS, DATA_OPTIONS)
    spec = resolve_model(model)
    probs = _Problems()
    j = probs.run(lambda: build_job(jv, spec, base=job))
    search = {o.name: o.default for o in SEARCH_OPTIONS} | (probs.run(lambda: check_values(sv, SEARCH_OPTIONS)) or {})
    offer_vals = _offer_values(ov, probs)
    prof, batching = _dataset(dv, spec, probs)
    precisions = search.get("precisions")
    if j is not None and j.precision == "auto":  # `precision=auto`: search the precisions per GPU
        j = j.with_(precision="bf16-mixed", low_precision=None)
        precisions = tuple(precisions or ()) + ("auto",)
    if j is not None:
        if not j.dataset_tokens and prof is None:
            probs.add("tokens", "the planner needs the dataset size", "pass `tokens`, e.g. `tokens=50M`")
        probs.run(lambda: validate_job(spec, j))
    probs.raise_any()
    offers = list(offer_list) if offer_list is not None else _load_offers(offer_vals)
    if offer_list is not None and (ov.keys() & {"providers", "gpus_filter", "pricing"}):
        from .catalog.offers import filter_offers

        offers = filter_offers(offers, providers=offer_vals.get("providers"), gpus=offer_vals.get("gpus_filter"),
                               pricing=offer_vals.get("pricing"))
    if prof is not None and not j.dataset_tokens:
        from .dataset import simulate_batches

        # the data's tokens after truncation at seq_len (what the planner trains on)
        j = j.with_(dataset_tokens=simulate_batches(prof, batching, j.seq_len, j.micro_batch).real_tokens)
    target = None if search["target"] == "any" else search["target"]
    # a micro-batch, strategy or GPU count given by the user is kept instead of searched
    ps = _recommend(spec, j, offers, objective=search["objective"], deadline_hours=search["deadline"],
                    budget_usd=search["budget"], max_gpus=search["max_gpus"], safety_margin=search["margin"],
                    global_batch=search["global_batch"], progress=progress, target=target,
                    preemption_rate=search["preemption_rate"], checkpoint_interval_s=search["checkpoint_interval"],
                    dataset=prof, batching=batching, cache=search_cache,
                    micro_batch=j.micro_batch if jv.get("micro_batch") is not None else None,
                    strategy=search.get("fixed_strategy"), num_gpus=search.get("fixed_gpus"),
                    precisions=tuple(precisions) if precisions else None)
    search["dataset"] = prof
    return spec, j, ps, search


def recommend(model: ModelRef, job: Job | None = None, *, offer_list: Sequence[Any] | None = None,
              progress: Callable[[int, int], None] | None = None, search_cache: Any = None,
              **options: Any) -> Recommendation:
    """Rank plans (offer, layout, micro-batch, checkpointing) by cost or time (``ftplan recommend``).

    ``options``: job options (``tokens`` is required; a given ``micro_batch`` is kept, not searched),
    search options (``objective``, ``deadline``, ``budget``, ``max_gpus``, ``global_batch``,
    ``margin``, ``top``; ``fixed_strategy`` and ``fixed_gpus`` keep those choices) and offer options
    (``providers``, ``gpus_filter``, ``pricing``, ``offers`` files, ...). ``offer_list``: search
    these :class:`~ftplan.catalog.offers.Offer` s instead of the catalog. ``search_cache``: a
    :class:`~ftplan.planner.SearchCache` shared with other searches of this process (same plans,
    less work; the web app keeps one).
    """
    spec, j, ps, search = _search(model, job, options, offer_list, progress, search_cache)
    return Recommendation(spec, j, ps, search["top"], None if search["target"] == "any" else search["target"],
                          search["dataset"])


def compare(model: ModelRef, job: Job | None = None, *, offer_list: Sequence[Any] | None = None,
            progress: Callable[[int, int], None] | None = None, search_cache: Any = None,
            **options: Any) -> Comparison:
    """The best plan per accelerator type (``ftplan compare``); options as :func:`recommend`."""
    spec, j, ps, search = _search(model, job, options, offer_list, progress, search_cache)
    return Comparison(spec, j, ps, search["dataset"])


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

    jv, dv = split_values(options, JOB_OPTIONS, DATA_OPTIONS)
    spec = resolve_model(model)
    probs = _Problems()
    j = probs.run(lambda: build_job(jv, spec, base=job))
    prof, _ = _dataset(dv, spec, probs)
    fv = probs.run(lambda: check_values({"gpu": gpu, "margin": margin, "max_gpus": max_gpus}, FIT_OPTIONS)) or {}
    names = fv.get("gpu") or ()
    if not names and "gpu" in fv:
        probs.add("gpu", "no GPU to fit on", "pass `gpu=NAME`, e.g. `gpu=h100-sxm`")
    gpus = [probs.run(lambda n=n: get_gpu(n), "gpu") for n in names]
    if j is not None:
        probs.run(lambda: validate_job(spec, j))
    probs.raise_any()
    results = tuple(_fit(spec, j, g, safety_margin=fv["margin"], max_gpus=fv["max_gpus"], dataset=prof)
                    for g in gpus)
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
    #: the export target (accelerate | deepspeed | axolotl | llamafactory) and how to launch the files:
    #: {target, engine, setup, command, sky} (``ftplan.export.Rendered.launch``)
    target: str = "accelerate"
    launch: dict[str, Any] | None = None

    def write(self, out: str | os.PathLike, *, force: bool = False) -> Path:
        """Write the files into the new directory ``out`` atomically (all or nothing)."""
        from .export.bundle import write_bundle

        return write_bundle(self.files, out, force=force)

    def to_dict(self, out: str | os.PathLike | None = None) -> dict[str, Any]:
        """The ``ftplan.export/1`` document."""
        return {"schema": "ftplan.export/1", "out": None if out is None else str(out),
                "files": sorted(self.files), "plan": self.plan, "target": self.target, "launch": self.launch}


def _plans_of_search(rec: Recommendation, index: int, ref: str | None,
                     target: str = "accelerate") -> tuple[dict, list[dict]]:
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
    why = exportable(chosen, target)
    if why:
        ok = next((i for i, d in enumerate(docs, 1) if exportable(d, target) is None), None)
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
                  zero3_backend: str | None = None, max_alternatives: int | None = None,
                  target: str | None = None) -> Bundle:
    """The launch files of the ``plan``-th plan (1 = best) of ``source``: a :func:`recommend` result,
    a saved ``recommend``/``compare``/``plan`` document (dict), or the path of one (``ftplan export``).

    ``target``: accelerate | deepspeed | axolotl | llamafactory (default: the target the search
    ranked for, else accelerate). ``ref``: how the user named the model (kept in plan.json when it is
    a path). ``model_ref``: what the files load (default: the hub id). ``dataset``: for the files and
    the README. ``zero3_backend`` (deepspeed | fsdp): how a zero3 plan runs under the accelerate and
    deepspeed targets (default: the target's rule, FSDP2 for accelerate). The other plans of the
    source become the README's alternatives and SkyPilot fallbacks (at most ``max_alternatives``).
    Nothing is written: see :meth:`Bundle.write`.
    """
    from .export import render
    from .export.bundle import ZERO3_BACKENDS, load_plan_json, plan_from_json
    from .export.targets import DEFAULT_TARGET, TARGETS

    if zero3_backend is not None and zero3_backend not in ZERO3_BACKENDS:
        raise ConfigError(f"unknown `zero3_backend` {zero3_backend!r}", "use deepspeed or fsdp", field="zero3_backend")
    if target is None:
        target = getattr(source, "target", None) or DEFAULT_TARGET
    if target not in TARGETS:
        raise ConfigError(f"unknown export `target` {target!r}", f"use one of {', '.join(TARGETS)}", field="target")
    if isinstance(source, Recommendation):
        pdoc, others = _plans_of_search(source, plan, ref, target)
    elif isinstance(source, Mapping):
        pdoc, others = plan_from_json(source, plan)
    else:
        pdoc, others = load_plan_json(source, plan)
    if max_alternatives is not None:
        others = others[:max_alternatives]
    r = render(pdoc, alternatives=tuple(others), model_ref=model_ref, dataset=dataset, zero3_backend=zero3_backend,
               target=target)
    return Bundle(pdoc, dict(r.files), plan, target, r.launch(dataset))


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


@dataclass(frozen=True)
class ClaimsReport:
    """The seed articles' FP8 / FP4 claims with ftplan's answers (``ftplan claims``)."""

    claims: tuple

    def to_dict(self) -> dict[str, Any]:
        from .claims import CLAIMS_SCHEMA

        return {"schema": CLAIMS_SCHEMA, "claims": [c.to_dict() for c in self.claims]}


def claims() -> ClaimsReport:
    """FP8 / FP4 claims of the seed articles answered with ftplan's numbers (``ftplan claims``)."""
    from .claims import seed_claims

    return ClaimsReport(tuple(seed_claims()))


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
    spec = _spec_for_defaults(model)
    j = probs.run(lambda: build_job(jv, spec, base=job))
    lay = probs.run(lambda: build_layout(lv, base=layout))
    if j is not None and j.low_precision:
        probs.add("precision", f"`ftplan measure` runs the base precisions only, not {j.low_precision}",
                  "measure with `precision=bf16-mixed` (FP8/FP4 runs are not measured yet)")
    probs.raise_any()
    return _measure(model, j, lay, steps=steps, warmup=warmup, device=device, tiny=tiny, seed=seed,
                    out=None if out is None else str(out), cache=cache if cache is not None else ModelCache(),
                    echo=echo)


def _spec_for_defaults(model: Any) -> ModelSpec | None:
    """The model's spec for the job's automatic defaults (``lora_dropout`` 0 where PEFT wraps MoE
    experts), as ``estimate`` gets them; ``None`` when it does not resolve here (the run itself then
    names the problem)."""
    try:
        return resolve_model(model)
    except FtplanError:
        return None


def validate(paths: Sequence[str | os.PathLike] | None = None,
             ratchet: str | os.PathLike | None = None) -> dict[str, Any]:
    """Predicted vs measured over measurement records (``ftplan validate``): the report dict.

    Without ``paths`` the committed records (``benchmarks/measurements/*.jsonl``) are scored and
    held to the committed ``benchmarks/ratchet.json``; given paths are held to ``ratchet`` only
    when one is passed.
    """
    from .measure.validate import default_ratchet_path, default_record_paths, validate_paths

    if paths:
        return validate_paths(list(paths), ratchet)
    if ratchet is None and default_ratchet_path().is_file():
        ratchet = default_ratchet_path()
    return validate_paths(default_record_paths(), ratchet)


def train(model_dir: str | os.PathLike, dataset: str, out: str | os.PathLike, job: Job | None = None,
          layout: Layout | None = None, *, max_steps: int | None = None, save_steps: int | None = None,
          logging_steps: int | None = None, seed: int = 42, record: str | None = None,
          echo: Callable[[str], None] = print, **options: Any) -> int:
    """Run a plan on this machine with the generated TRL script (``ftplan train``); the exit code.
    Needs the ``train`` extra."""
    from .train import train as _train

    jv, lv = split_values(options, JOB_OPTIONS, LAYOUT_OPTIONS)
    probs = _Problems()
    spec = _spec_for_defaults(model_dir)
    j = probs.run(lambda: build_job(jv, spec, base=job))
    lay = probs.run(lambda: build_layout(lv, base=layout))
    if j is not None and j.low_precision:
        probs.add("precision", f"`ftplan train` runs the base precisions only, not {j.low_precision}",
                  "export the plan (`ftplan export`) and run it with accelerate launch, which sets up FP8")
    probs.raise_any()
    return _train(str(model_dir), dataset, str(out), j, lay, max_steps=max_steps, save_steps=save_steps,
                  logging_steps=logging_steps, seed=seed, record=record, echo=echo)



def __getattr__(name: str) -> Any:
    # SearchCache lives with the planner, which ``import ftplan`` does not load
    if name == "SearchCache":
        from .planner import SearchCache

        return SearchCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
