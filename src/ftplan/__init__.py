"""ftplan: plan LLM fine-tuning jobs before buying GPU-hours.

The public API is re-exported here from private modules (httpx-style)::

    import ftplan

    est = ftplan.estimate("llama-3.1-8b", method="lora", seq_len=4096, gpu="h100-sxm")
    rec = ftplan.recommend("llama-3.1-70b", method="qlora", tokens="20M", seq_len=4096)
    best = rec.best                      # a ftplan.planner.Plan
    doc = rec.to_dict()                  # the ftplan.recommend/1 document

Measurement and training (``ftplan.api.measure``, ``validate``, ``train``) stay in
:mod:`ftplan.api` (``ftplan.measure`` and ``ftplan.train`` are their packages).

Importing ftplan never imports torch, transformers or fastapi and loads no data file: catalogs
are read on first use.
"""

from .api import (
    Bundle,
    Comparison,
    Estimate,
    FitReport,
    GpuList,
    ModelList,
    OfferList,
    Recommendation,
    compare,
    estimate,
    export_bundle,
    fit,
    gpus,
    model_from_config,
    models,
    offers,
    options_schema,
    recommend,
    resolve_model,
)
from .errors import CatalogError, ConfigError, FtplanError, InfeasibleError, MeasurementError, NotFoundError, Problem
from .job import Job, Layout, LoraSpec, QuantSpec
from .model import ModelSpec
from .version import __version__

__all__ = [
    "__version__",
    # planning
    "estimate",
    "recommend",
    "compare",
    "fit",
    "export_bundle",
    "Estimate",
    "Recommendation",
    "Comparison",
    "FitReport",
    "Bundle",
    # catalogs and options
    "models",
    "gpus",
    "offers",
    "options_schema",
    "ModelList",
    "GpuList",
    "OfferList",
    "resolve_model",
    "model_from_config",
    # jobs, models
    "Job",
    "Layout",
    "LoraSpec",
    "QuantSpec",
    "ModelSpec",
    # errors
    "FtplanError",
    "ConfigError",
    "CatalogError",
    "NotFoundError",
    "InfeasibleError",
    "MeasurementError",
    "Problem",
]
