"""ftplan's options schema, in one place to read: job, layout, search and offer options.

Job and layout options are declared on the fields of :class:`~ftplan.job.Job` and
:class:`~ftplan.job.Layout` (and their nested ``LoraSpec`` / ``QuantSpec``); search and offer
options, which configure a search rather than a job, are declared in the tables below. From these
declarations come, and only from them:

* the CLI flags (:mod:`ftplan.cli.options` builds argparse groups ``job``, ``layout``, ``search``,
  ``offers``),
* the web request models (:mod:`ftplan.web.schemas` generates the pydantic classes) and the page's
  defaults (``GET /api/options``),
* the keyword arguments of :mod:`ftplan.api` (``estimate(model, method="lora", seq_len=4096)``),
* the job/layout JSON of every document (:func:`job_to_dict`, :func:`job_from_dict`, ...),
* the choices and bounds :func:`ftplan.job.validate_job` checks.

``tests/test_options.py`` holds the CLI flags, the web fields and the JSON keys equal to this
schema. How to add an option: ``docs/extending.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .errors import ConfigError, Problem
from .job import STRATEGIES, Job, Layout
from .optionspec import Option, coerce_values, groups, sorted_names, walk

__all__ = [
    "Option",
    "OBJECTIVES",
    "JOB_OPTIONS",
    "LAYOUT_OPTIONS",
    "SEARCH_OPTIONS",
    "OFFER_OPTIONS",
    "FIT_OPTIONS",
    "DATA_OPTIONS",
    "OPTIONS",
    "options_by_name",
    "to_dict",
    "job_to_dict",
    "layout_to_dict",
    "job_from_dict",
    "layout_from_dict",
    "build_job",
    "build_layout",
    "split_values",
    "check_values",
    "schema_doc",
]

OBJECTIVES = ("cost", "time")


def _pricing(names: tuple[str, ...]) -> tuple[str, ...] | None:
    """'any'/'all' (or nothing) -> None: every pricing."""
    out = sorted_names(names)
    return None if out is None or any(x in ("any", "all") for x in out) else out


#: job options: the fields of Job and its nested LoraSpec / QuantSpec
JOB_OPTIONS: tuple[Option, ...] = tuple(o for o in walk(Job, group_name="job") if o.is_option)
#: layout options: the fields of Layout
LAYOUT_OPTIONS: tuple[Option, ...] = tuple(o for o in walk(Layout, group_name="layout") if o.is_option)

#: search options of recommend / compare / export (arguments of ftplan.planner.recommend)
#: the export targets (``ftplan.export.targets.TARGETS``; a test holds them equal, options stays below export)
EXPORT_TARGETS = ("accelerate", "deepspeed", "axolotl", "llamafactory")

SEARCH_OPTIONS: tuple[Option, ...] = (
    Option("objective", "str", "cost", "cost (default) | time", choices=OBJECTIVES, group="search"),
    Option("deadline", "float", None, "finish within this many hours (training + start-up)", group="search",
           metavar="HOURS", exclusive_minimum=0.0, example=24),
    Option("budget", "float", None, "spend at most this many USD", group="search", metavar="USD",
           exclusive_minimum=0.0, example=500),
    Option("max_gpus", "int", None, "search layouts up to N GPUs (default 64)", group="search", metavar="N",
           label="max GPUs", minimum=1, web_max=1024, example=16),
    Option("global_batch", "int", None, "sequences per optimizer step to keep (grad-accum is chosen per plan)",
           group="search", metavar="SEQS", label="global batch", minimum=1, web_max=1 << 24, example=64),
    Option("margin", "float", 0.05, "memory safety margin (default 0.05)", group="search",
           label="safety margin", minimum=0.0, exclusive_maximum=1.0, example=0.05),
    Option("top", "int", 10, "plans to print (default 10)", group="search", metavar="N", label="`top`",
           minimum=0, web_max=100_000, example=10),
    Option("fixed_strategy", "str", None, "keep this strategy instead of searching it: single | ddp | zero1 | "
           "zero2 | zero3 | fsdp", choices=STRATEGIES, group="search", flags=("--strategy",), label="strategy"),
    Option("fixed_gpus", "int", None, "keep this total GPU count instead of searching up to `max_gpus`",
           group="search", flags=("--gpus",), metavar="N", label="GPU count", minimum=1, web_max=1024, example=8),
    Option("precisions", "names", None, "also search these precisions per GPU (comma-separated, or auto = "
           "the job's precision + one FP8 and one FP4 recipe; `precision=auto` is the same)", group="search",
           metavar="LIST", example="auto"),
    Option("target", "str", "accelerate",
           "export target whose files must run the ranked layouts: accelerate (default) | deepspeed | axolotl | "
           "llamafactory | any (rank every layout, e.g. pipeline parallelism, which no exporter runs)",
           choices=EXPORT_TARGETS + ("any",), group="search", label="export target"),
    Option("preemption_rate", "float", None, "spot reclaims per instance-hour (default: the catalog's per "
           "provider / instance / GPU)", group="search", metavar="PER_HOUR", label="preemption rate",
           minimum=0.0, exclusive_maximum=1.0, example=0.01),
    Option("checkpoint_interval", "float", None, "seconds of training between checkpoints on spot offers "
           "(default: the Young/Daly optimum)", group="search", metavar="SECONDS", label="checkpoint interval",
           exclusive_minimum=0.0, web_max=1e7, example=1800),
)

#: which offers are searched (files only from the command line: the web never reads a path)
OFFER_OPTIONS: tuple[Option, ...] = (
    Option("offers", "paths", (), "extra offers CSV (repeatable), same columns as the bundled offers.csv",
           group="offers", metavar="FILE", repeat=True, web=False),
    Option("skypilot_catalog", "paths", (), "a SkyPilot catalog vms.csv to import offers from (repeatable)",
           group="offers", metavar="FILE", repeat=True, web=False),
    Option("no_bundled_offers", "bool", False, "use only --offers/--skypilot-catalog", group="offers", web=False),
    Option("providers", "names", None, "comma-separated providers, e.g. aws,lambda", group="offers",
           normalize=sorted_names),
    Option("gpus_filter", "names", None, "comma-separated GPU names, e.g. h100-sxm,b200", group="offers",
           normalize=sorted_names),
    Option("pricing", "names", ("on-demand",),
           "on-demand (default) | spot | reserved | any, or a comma-separated list", group="offers",
           normalize=_pricing),
)

#: the user's training data (files only from the command line: the web never reads a path)
DATA_OPTIONS: tuple[Option, ...] = (
    Option("dataset", "str", None, "training data (JSONL, Parquet or a datasets folder): memory at the largest "
           "batch it forms, time and cost from its tokens", group="data", metavar="FILE", web=False),
    Option("tokenizer", "str", None, "the model's tokenizer.json: exact token counts (default: a chars/token "
           "estimate per tokenizer family)", group="data", metavar="FILE", web=False),
    Option("batching", "str", "longest", "how the loader batches --dataset: padded | longest (default, HF "
           "collator) | bucketed (group_by_length) | packed (TRL bfd) | padding-free",
           choices=("padded", "longest", "bucketed", "packed", "padding-free"), group="data", web=False),
)

#: fit: the GPU types and the limits of its answers
FIT_OPTIONS: tuple[Option, ...] = (
    Option("gpu", "names", None, "GPU name (repeatable)", group="fit", repeat=True),
    Option("margin", "float", 0.05, "memory safety margin (default 0.05)", group="fit", label="safety margin",
           minimum=0.0, exclusive_maximum=1.0, example=0.05),
    Option("max_gpus", "int", 1024, "fewest-GPU answers up to N GPUs (default 1024)", group="fit",
           label="max GPUs", minimum=1, web_max=4096, example=16),
)

OPTIONS: tuple[Option, ...] = JOB_OPTIONS + LAYOUT_OPTIONS + SEARCH_OPTIONS + OFFER_OPTIONS + DATA_OPTIONS


def options_by_name(*tables: tuple[Option, ...]) -> dict[str, Option]:
    """name -> Option over ``tables`` (default: job, layout, search and offer options)."""
    out: dict[str, Option] = {}
    for t in tables or (OPTIONS,):
        for o in t:
            out.setdefault(o.name, o)
    return out


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _layout_of(cls: type) -> tuple[tuple[str, str | None, str | None], ...]:
    """(field, group's ``when`` or None, json mode or None for a group) per field of ``cls``."""
    active = groups(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in active:
            out.append((f.name, active[f.name][1] or "", None))
        else:
            out.append((f.name, None, f.metadata["ftplan"].json))
    return tuple(out)


def to_dict(obj: Any, *, full: bool = False, data: bool = False) -> dict[str, Any]:
    """The JSON object of an options dataclass (Job, Layout, ... or one that extends them)."""
    out: dict[str, Any] = {}
    for name, when, mode in _layout_of(type(obj)):
        value = getattr(obj, name)
        if mode is None:  # a nested group
            if full or not when or getattr(obj, when):
                out[name] = to_dict(value, full=full, data=data)
        elif full or mode == "always" or (mode == "data" and data):
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def job_to_dict(job: Job, *, data: bool = False, full: bool = False) -> dict[str, Any]:
    """The ``job`` object of ftplan's JSON documents.

    Default: the options a plan is made of, ``lora`` only for LoRA/QLoRA and ``quant`` only for
    QLoRA; ``data=True`` adds ``dataset_tokens`` and ``epochs`` (search documents);
    ``full=True`` is every field (measurement records: ``dataclasses.asdict`` with lists).
    """
    return to_dict(job, full=full, data=data)


def layout_to_dict(layout: Layout, *, full: bool = False) -> dict[str, Any]:
    """The ``layout`` object of ftplan's JSON documents (every field)."""
    return to_dict(layout, full=full, data=True)


def _from_dict(cls: type, d: Mapping[str, Any], problems: list[Problem], where: str) -> Any:
    if not isinstance(d, Mapping):
        problems.append(Problem(None, f"{where}: not a JSON object"))
        return cls()
    nested = groups(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in d or d[f.name] is None and f.name in nested:
            continue  # a missing key keeps the default (older documents, optional groups)
        if f.name in nested:
            kwargs[f.name] = _from_dict(nested[f.name][0], d[f.name], problems, f"{where}.{f.name}")
            continue
        opt: Option = f.metadata["ftplan"]
        value = d[f.name]
        if value is None:
            if f.default is not None:
                problems.append(Problem(None, f"{where}.{f.name}: expected a value, got null"))
            else:
                kwargs[f.name] = None
            continue
        try:
            if opt.type in ("names", "paths"):
                if isinstance(value, str) or not isinstance(value, (list, tuple)) \
                        or not all(isinstance(x, str) for x in value):
                    raise ValueError(f"expected a list of strings, got {value!r}")
                kwargs[f.name] = tuple(value)
            else:  # the type only: choices and bounds are validate_job's
                kwargs[f.name] = replace(opt, normalize=None, choices=None).coerce(value)
        except (TypeError, ValueError) as e:
            problems.append(Problem(None, f"{where}.{f.name}: {e}"))
    return cls(**kwargs)


def job_from_dict(d: Mapping[str, Any], *, where: str = "job") -> Job:
    """A Job from the ``job`` object of any ftplan document (plan, estimate, record).

    Missing keys keep their defaults; present keys must have the declared types
    (``ConfigError`` naming the key otherwise); unknown keys are ignored.
    """
    problems: list[Problem] = []
    job = _from_dict(Job, d, problems, where)
    if problems:
        raise ConfigError(problems=problems)
    return job


def layout_from_dict(d: Mapping[str, Any] | None, *, where: str = "layout") -> Layout:
    """A Layout from the ``layout`` object of any ftplan document (see :func:`job_from_dict`)."""
    problems: list[Problem] = []
    layout = _from_dict(Layout, d or {}, problems, where)
    if problems:
        raise ConfigError(problems=problems)
    return layout


# ---------------------------------------------------------------------------------------------
# options -> Job / Layout
# ---------------------------------------------------------------------------------------------
def _set(obj: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    if rest:
        return replace(obj, **{head: _set(getattr(obj, head), rest, value)})
    return replace(obj, **{head: value})


def _apply(base: Any, table: tuple[Option, ...], values: Mapping[str, Any]) -> Any:
    obj = base
    for opt in table:
        if opt.name in values and values[opt.name] is not None:
            v = values[opt.name]
            obj = _set(obj, opt.attr, (not v) if opt.invert else v)
    return obj


def check_values(values: Mapping[str, Any], *tables: tuple[Option, ...]) -> dict[str, Any]:
    """Coerce ``values`` (option name -> value, e.g. '50M' for tokens) against ``tables``; one
    ``ConfigError`` with every problem (unknown name, wrong type, choice, bound)."""
    opts = options_by_name(*tables)
    out, problems = coerce_values(opts, values)
    for k, v in out.items():
        if opts[k].attr is None:  # job/layout values are checked by validate_job with the model
            problems += opts[k].check(v)
    if problems:
        raise ConfigError(problems=problems)
    return out


def split_values(values: Mapping[str, Any], *tables: tuple[Option, ...]) -> list[dict[str, Any]]:
    """``values`` split by ``tables`` (one dict per table, in order); unknown names -> ConfigError."""
    out: list[dict[str, Any]] = [{} for _ in tables]
    unknown = []
    for k, v in values.items():
        for i, t in enumerate(tables):
            if any(o.name == k for o in t):
                out[i][k] = v
                break
        else:
            unknown.append(k)
    if unknown:
        opts = options_by_name(*tables)
        _, problems = coerce_values(opts, {k: values[k] for k in unknown})
        raise ConfigError(problems=problems)
    return out


def build_job(values: Mapping[str, Any] | None = None, model: Any = None, base: Job | None = None) -> Job:
    """The Job of option ``values`` (name -> value; text is parsed: ``tokens="50M"``) over ``base``
    (default: ``Job()``). Options with an automatic default (``lora_dropout``) get it from ``model``
    when not given and there is no ``base``. Types are checked here (``ConfigError``); choices and
    bounds by :func:`ftplan.job.validate_job`."""
    vals = check_values(values or {}, JOB_OPTIONS)
    job = _apply(base or Job(), JOB_OPTIONS, vals)
    if base is None and model is not None:
        for opt in JOB_OPTIONS:
            if opt.auto is not None and vals.get(opt.name) is None:
                job = _set(job, opt.attr, opt.auto(model, job))
    return job


def build_layout(values: Mapping[str, Any] | None = None, base: Layout | None = None, model: Any = None) -> Layout:
    """The Layout of option ``values`` over ``base`` (default: ``Layout()``). Without an explicit
    ``strategy``, a new layout (or one whose GPU count is given) gets single on one GPU, ddp on
    several (a sharded strategy of ``base`` is kept)."""
    vals = check_values(values or {}, LAYOUT_OPTIONS)
    layout = _apply(base or Layout(), LAYOUT_OPTIONS, vals)
    counts_given = any(vals.get(o.name) is not None for o in LAYOUT_OPTIONS if o.attr in ("gpus_per_node", "nodes"))
    if base is None or counts_given:
        for opt in LAYOUT_OPTIONS:
            if opt.auto is not None and vals.get(opt.name) is None:
                layout = _set(layout, opt.attr, opt.auto(model, layout))
    return layout


def schema_doc() -> dict[str, Any]:
    """``ftplan.options/1``: every option with type, default, choices, bounds and help."""
    return {"schema": "ftplan.options/1",
            "groups": {"job": [o.public() for o in JOB_OPTIONS],
                       "layout": [o.public() for o in LAYOUT_OPTIONS],
                       "search": [o.public() for o in SEARCH_OPTIONS],
                       "offers": [o.public() for o in OFFER_OPTIONS if o.web],
                       "fit": [o.public() for o in FIT_OPTIONS]}}
