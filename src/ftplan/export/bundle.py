"""Render and write the files of a plan: ``render_bundle`` (pure) and ``write_bundle`` (atomic).

A *plan document* (schema ``ftplan.plan/1``) is one plan of ``ftplan recommend --json``
(``offer``, ``layout``, ``strategy_label``, ``job``, ``memory``, ``runtime``, ``cost``, flags,
``notes``) plus ``schema`` and the search's ``model`` ({name, hf_id, params_total}). Build one from
a :class:`~ftplan.planner.Plan` with :func:`plan_document`, or from a saved ``recommend``/``compare``
document with :func:`plan_from_json`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FtplanError
from ..inputs import MAX_TEXT_CHARS, bad_characters, check_text
from ..job import Job, Layout
from ..options import job_from_dict, layout_from_dict

__all__ = ["PLAN_SCHEMA", "ACCEPTED_SCHEMAS", "plan_document", "plan_from_json", "load_plan_json",
           "exportable", "render_bundle", "render", "Rendered", "write_bundle",
           "ZERO3_BACKENDS", "BUNDLE_FILE_NAMES", "earlier_bundle_problem", "check_plan_document",
           "plan_problems"]

PLAN_SCHEMA = "ftplan.plan/1"
ACCEPTED_SCHEMAS = ("ftplan.recommend/1", "ftplan.compare/1", PLAN_SCHEMA)
ZERO3_BACKENDS = ("deepspeed", "fsdp")
_PLAN_KEYS = ("offer", "layout", "job")


# ---------------------------------------------------------------------------------------------
# plan documents
# ---------------------------------------------------------------------------------------------
def plan_document(model, plan, *, ref: str | None = None) -> dict[str, Any]:
    """The ``ftplan.plan/1`` dict of a planner ``Plan`` (the same fields as ``recommend --json``)."""
    from ..report import plan_dict

    m = {"name": model.name, "hf_id": model.hf_id, "params_total": model.params.total}
    if ref and ref not in (model.name, model.hf_id):
        m["ref"] = ref
    return {"schema": PLAN_SCHEMA, "model": m, **plan_dict(plan)}


def _bad(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}", "pass a file saved from `ftplan recommend --json`")


def plan_from_json(doc: Any, index: int = 1, *, where: str = "plan JSON") -> tuple[dict[str, Any], list[dict]]:
    """(plan document, the other plans) for the ``index``-th (1-based) plan of a saved document."""
    if not isinstance(doc, Mapping):
        raise _bad(where, "not a JSON object")
    schema = doc.get("schema")
    if schema not in ACCEPTED_SCHEMAS:
        got = f"schema {schema!r}" if schema else "no 'schema' field"
        raise _bad(where, f"{got}, expected one of {', '.join(ACCEPTED_SCHEMAS)}")
    model = doc.get("model")
    if not isinstance(model, Mapping) or not (model.get("name") or model.get("hf_id")):
        raise _bad(where, "no model name")
    if schema == PLAN_SCHEMA:
        plans = [doc]
        extra: list = []
    else:
        key = "plans" if schema == "ftplan.recommend/1" else "per_gpu"
        plans = doc.get(key)
        extra = doc.get("pareto") or [] if key == "plans" else []
        if not isinstance(plans, list) or not isinstance(extra, list):
            raise _bad(where, f"'{key}' is not a list")
    if not plans:
        raise ConfigError(f"{where}: holds no plan (the search found nothing feasible)",
                          "relax the constraints and run `ftplan recommend --json` again")
    if not 1 <= index <= len(plans):
        raise ConfigError(f"plan {index} is out of range: {where} holds {len(plans)} plan(s)",
                          f"use `plan=1..{len(plans)}`")
    for i, p in enumerate(plans + extra, 1):
        if not isinstance(p, Mapping) or any(not isinstance(p.get(k), Mapping) for k in _PLAN_KEYS):
            raise _bad(where, f"plan {i} lacks {', '.join(_PLAN_KEYS)}")
    chosen = dict(plans[index - 1])
    chosen.pop("schema", None)
    chosen.pop("model", None)
    pdoc = {"schema": PLAN_SCHEMA, "model": dict(model), **chosen}
    others: list[dict] = []
    for p in plans + extra:
        if p is plans[index - 1] or any(_same_plan(p, q) for q in [chosen, *others]):
            continue
        others.append(dict(p))
    return pdoc, others


def _same_plan(a: Mapping, b: Mapping) -> bool:
    return all(a.get(k) == b.get(k) for k in ("offer", "layout", "job"))


def load_plan_json(path: str | os.PathLike, index: int = 1) -> tuple[dict[str, Any], list[dict]]:
    """:func:`plan_from_json` on a file; every problem is a one-line ``ConfigError``."""
    from ..inputs import load_json_text, read_text_file

    hint = "pass a file saved from `ftplan recommend --json`"
    p = Path(path)
    text = read_text_file(p, "plan file", max_bytes=MAX_PLAN_BYTES, hint=hint)
    doc = load_json_text(text, str(p), hint=hint)
    return plan_from_json(doc, index, where=str(p))


# ---------------------------------------------------------------------------------------------
# plan document checks: a plan file is user input; every field a renderer reads is checked
# for its type (and strings for control characters) before anything is rendered
# ---------------------------------------------------------------------------------------------
_S, _I, _N, _B, _NONE = "text", "integer", "number", "boolean", "null"
#: (section, field) -> accepted kinds; absent fields are fine unless listed in _REQUIRED_FIELDS
_FIELD_KINDS: dict[str, dict[str, tuple[str, ...]]] = {
    "model": {"name": (_S, _NONE), "hf_id": (_S, _NONE), "ref": (_S, _NONE), "params_total": (_I, _NONE)},
    "offer": {"provider": (_S,), "sku": (_S,), "gpu": (_S,), "gpus_per_instance": (_I,),
              "usd_per_gpu_hour": (_N,), "usd_per_instance_hour": (_N, _NONE), "pricing": (_S,),
              "region": (_S, _NONE), "inter_node_network": (_S, _NONE), "inter_node_gbps": (_N, _NONE),
              "billing_granularity_s": (_I, _NONE), "as_of": (_S, _NONE), "stale": (_B, _NONE),
              "source": (_S, _NONE)},
    "layout": {"gpus_per_node": (_I,), "nodes": (_I,), "strategy": (_S,), "offload_optimizer": (_B,),
               "offload_params": (_B,), "tp": (_I,), "pp": (_I,), "world_size": (_I,), "dp": (_I,)},
    "job": {"method": (_S,), "precision": (_S,), "optimizer": (_S,), "micro_batch": (_I,), "seq_len": (_I,),
            "grad_accum": (_I,), "gradient_checkpointing": (_B,), "attn_impl": (_S,),
            "dataset_tokens": (_I, _NONE), "epochs": (_N,)},
    "lora": {"r": (_I,), "alpha": (_N,), "dropout": (_N,)},
    "quant": {"quant_type": (_S,), "double_quant": (_B,), "compute_dtype": (_S,)},
    "memory": {"device_total_bytes": (_N, _NONE), "peak_allocated_bytes": (_N, _NONE),
               "host_bytes": (_N, _NONE), "gpu_memory_bytes": (_N, _NONE)},
    "runtime": {k: (_N, _NONE) for k in (
        "step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_s", "optimizer_time_s", "dequant_time_s",
        "tokens_per_s", "mfu", "flops_per_token", "tokens_per_step", "total_tokens", "steps", "training_hours",
        "startup_hours", "total_hours")},
    "cost": {k: (_N, _NONE) for k in ("instances", "gpus_billed", "billed_hours", "usd", "usd_per_million_tokens",
                                       "energy_kwh_upper_bound")},
    "": {"strategy_label": (_S, _NONE), "cheapest": (_B, _NONE), "fastest": (_B, _NONE), "pareto": (_B, _NONE)},
}
_REQUIRED_FIELDS = {"offer": ("gpu",), "layout": ("gpus_per_node", "nodes", "strategy"),
                    "job": ("method", "precision", "optimizer", "micro_batch", "seq_len", "grad_accum",
                            "gradient_checkpointing")}
#: a number in a plan file beyond this is not a prediction ftplan made
_MAX_PLAN_NUMBER = 1e30
MAX_PLAN_BYTES = 64 * 2**20


def _kind_ok(v: Any, kinds: tuple[str, ...]) -> bool:
    if v is None:
        return _NONE in kinds
    if isinstance(v, bool):
        return _B in kinds
    if isinstance(v, int):
        return (_I in kinds or _N in kinds) and abs(v) <= _MAX_PLAN_NUMBER
    if isinstance(v, float):
        return _N in kinds and math.isfinite(v) and abs(v) <= _MAX_PLAN_NUMBER
    if isinstance(v, str):
        return _S in kinds and not bad_characters(v) and len(v) <= MAX_TEXT_CHARS
    return False


def _describe(v: Any) -> str:
    if isinstance(v, str):
        bad = bad_characters(v)
        if bad:
            return f"text with control characters ({', '.join(bad[:3])})"
        return repr(v) if len(v) <= 40 else f"text of {len(v):,} characters"
    if isinstance(v, (list, dict)):
        return "a list" if isinstance(v, list) else "an object"
    return repr(v) if not isinstance(v, int) or abs(v) < 10**20 else "a huge integer"


def plan_problems(plan: Any, label: str = "plan") -> list[str]:
    """Every type problem of one plan document (empty when it can be rendered)."""
    if not isinstance(plan, Mapping):
        return [f"{label} is not a JSON object"]
    out: list[str] = []
    for section, fields in _FIELD_KINDS.items():
        if section in ("lora", "quant"):
            node = (plan.get("job") or {}).get(section) if isinstance(plan.get("job"), Mapping) else None
            where = f"job.{section}"
        else:
            node = plan if not section else plan.get(section)
            where = section
        if node is None:
            if section in _REQUIRED_FIELDS:
                out.append(f"{label}: no '{section}'")
            continue
        if not isinstance(node, Mapping):
            out.append(f"{label}: bad '{where}' (not an object)")
            continue
        for key in _REQUIRED_FIELDS.get(section, ()):
            if key not in node:
                out.append(f"{label}: bad '{where}' ({key} is missing)")
        for key, kinds in fields.items():
            if key in node and not _kind_ok(node[key], kinds):
                out.append(f"{label}: bad '{where or 'plan'}' ({key} must be {' or '.join(kinds)}, "
                           f"got {_describe(node[key])})")
    job = plan.get("job")
    if isinstance(job, Mapping) and isinstance(job.get("lora"), Mapping):
        tm = job["lora"].get("target_modules")
        if tm is not None and not (isinstance(tm, list) and len(tm) <= 256
                                   and all(isinstance(t, str) and _kind_ok(t, (_S,)) for t in tm)):
            out.append(f"{label}: bad 'job' (lora.target_modules must be a list of module names)")
    if isinstance(job, Mapping) and isinstance(job.get("quant"), Mapping):
        sm = job["quant"].get("skip_modules")
        if sm is not None and not (isinstance(sm, list) and len(sm) <= 256
                                   and all(isinstance(t, str) and _kind_ok(t, (_S,)) for t in sm)):
            out.append(f"{label}: bad 'job' (quant.skip_modules must be a list of module names)")
    for key in ("notes",):
        v = plan.get(key)
        if v is not None and not (isinstance(v, list) and all(isinstance(n, str) and _kind_ok(n, (_S,)) for n in v)):
            out.append(f"{label}: {key} must be a list of text")
    for section in ("memory", "runtime"):
        node = plan.get(section)
        sub = {"memory": "components", "runtime": "breakdown"}[section]
        if isinstance(node, Mapping) and node.get(sub) is not None:
            d = node[sub]
            if not (isinstance(d, Mapping) and all(isinstance(k, str) and _kind_ok(v, (_N, _NONE))
                                                   for k, v in d.items())):
                out.append(f"{label}: {section}.{sub} must map names to numbers")
    return out


def check_plan_document(plan: Any, alternatives: Sequence[Any] = ()) -> None:
    """Raise one ``ConfigError`` listing every type problem of a plan and its alternatives."""
    problems = plan_problems(plan)
    for i, alt in enumerate(alternatives, 1):
        problems += plan_problems(alt, f"other plan {i}")
    if problems:
        shown = "; ".join(problems[:10]) + (f"; and {len(problems) - 10} more" if len(problems) > 10 else "")
        raise ConfigError(f"malformed plan document: {shown}",
                          "pass a file saved from `ftplan recommend --json` (unedited)")


def _job_and_layout(plan_doc: Mapping[str, Any]) -> tuple[Job, Layout]:
    parts = []
    for key, read in (("job", job_from_dict), ("layout", layout_from_dict)):
        try:
            parts.append(read(plan_doc[key]))
        except ConfigError as e:
            raise ConfigError(f"plan JSON: bad {key!r} ({e.one_line()})",
                              "pass a file saved from `ftplan recommend --json`") from None
    return parts[0], parts[1]


def _resolve(model: Mapping[str, Any]):
    from ..catalog.models import resolve_model

    refs = [r for r in (model.get("ref"), model.get("name"), model.get("hf_id")) if r]
    last: FtplanError | None = None
    for r in refs:
        try:
            return resolve_model(str(r))
        except FtplanError as e:
            last = e
    if last is None:
        raise ConfigError("plan JSON: no model name", "pass a file saved from `ftplan recommend --json`")
    raise ConfigError(f"cannot find the plan's model ({', '.join(map(repr, refs))}): {last.message}",
                      "run `ftplan export MODEL ...` with the search options instead of a saved plan")


def _local_ref(ref: str | None) -> str | None:
    """A model directory from what the user named (a config.json path means its folder)."""
    if not ref:
        return None
    return str(Path(ref).parent) if ref.endswith(".json") else ref


def exportable(plan: Mapping[str, Any], target: str = "accelerate") -> str | None:
    """Why a plan (document) cannot be exported to ``target`` (a short reason), or None when it can."""
    from .targets import exportable as rule

    lo = plan.get("layout") or {}
    try:
        layout = layout_from_dict(lo)
        job = job_from_dict(plan.get("job") or {})
    except ConfigError:
        return None  # render_bundle says what is wrong with the document
    model = None
    try:
        model = _resolve(plan.get("model") or {})
    except FtplanError:
        pass
    ok, why = rule(layout, job, target, model)
    if ok:
        return None
    return f"its layout {plan.get('strategy_label') or lo.get('strategy')} ({why})"


def _check_hardware(plan: Mapping[str, Any], job: Job) -> None:
    from ..catalog.gpus import get_gpu
    from ..planner import platform_job

    slug = str((plan.get("offer") or {}).get("gpu", ""))
    try:
        gpu = get_gpu(slug)
    except FtplanError:
        return  # a GPU ftplan does not know: nothing to check against
    adapted, _, why = platform_job(job, gpu)
    if adapted is None:
        raise ConfigError(f"the plan cannot run on {slug}: {why}",
                          "pick another plan (`plan=N`) or another `method`")
    if adapted.attn_impl != job.attn_impl:
        raise ConfigError(f"the plan asks for {job.attn_impl} attention, not available on {slug}",
                          "plan with `attn=sdpa` or pick another plan (`plan=N`)")


def _check_low_precision(job: Job, kind: str, target: str = "accelerate") -> None:
    """FP8 plans export only where accelerate's config selects the recipe and the launcher
    supports it (see ``export/accelerate.py`` FP8_CONFIG): the accelerate target, one GPU, DDP or
    FSDP2."""
    if not job.low_precision:
        return
    if target != "accelerate":
        raise ConfigError(f"{job.low_precision} plans export to the accelerate target only (its config selects "
                          "the FP8 recipe)", "use `target=accelerate`")
    if kind not in ("single", "ddp", "fsdp", "deepspeed"):
        raise ConfigError(f"{job.low_precision} with {kind} layouts is not set up by ftplan's export (torchao / "
                          "Transformer Engine FP8 with tensor parallelism is not wired through accelerate here)",
                          "pick a single-GPU, DDP or FSDP plan (`plan=N`)")
    from .accelerate import FP8_CONFIG

    if job.low_precision not in FP8_CONFIG:
        raise ConfigError(f"the plan's precision {job.low_precision} is selected in code, not by an accelerate "
                          "config: ftplan exports FP8 plans for fp8-tensorwise (torchao), fp8-te-delayed and "
                          "mxfp8-te (Transformer Engine)",
                          "plan with `precision=fp8` (or fp8-te-delayed), or set the recipe up by hand")
    if kind == "deepspeed":
        raise ConfigError(f"{job.low_precision} with DeepSpeed: accelerate runs FP8 under DeepSpeed only with "
                          "MS-AMP", "use the FSDP backend (`zero3_backend=fsdp`) or a DDP/single-GPU plan")


# ---------------------------------------------------------------------------------------------
# render
# ---------------------------------------------------------------------------------------------
#: safety margin for the HSDP check (the planner's default margin)
_HSDP_MARGIN = 0.05


def _kind(layout: Layout, job: Job, target: str, zero3_backend: str | None, model) -> str:
    """The launch kind: the target's rule, with the legacy ``zero3_backend`` choice for zero3 plans."""
    from .targets import engine

    if zero3_backend is not None and zero3_backend not in ZERO3_BACKENDS:
        raise ConfigError(f"unknown ZeRO-3 backend {zero3_backend!r}", "use deepspeed or fsdp")
    if (zero3_backend and layout.strategy == "zero3" and layout.tp == 1 and layout.pp == 1
            and target in ("accelerate", "deepspeed") and layout.world_size > 1):
        if zero3_backend == "fsdp" and layout.offload_optimizer and not layout.offload_params:
            raise ConfigError("FSDP cannot offload only the optimizer states (its CPU offload moves parameters, "
                              "gradients and the optimizer step together)",
                              "use `zero3_backend=deepspeed` for this plan")
        if zero3_backend == "deepspeed":
            return engine(layout, job, "deepspeed", model=model)
        return "fsdp"
    return engine(layout, job, target, model=model)


def _hsdp(plan_doc: Mapping[str, Any], model, job: Job, layout: Layout, kind: str) -> tuple[bool, str | None]:
    """(use HSDP, note): FSDP2 across nodes shards inside a node when one node's GPUs hold the states.

    Checked with ftplan's own memory model: the same job sharded over one node's GPUs
    (``Layout(gpus_per_node, 1, ...)``) must fit the GPU with the planner's default margin.
    """
    if kind != "fsdp" or layout.nodes == 1 or layout.gpus_per_node < 2:
        return False, None
    from dataclasses import replace

    from ..memory import estimate_memory

    cap = (plan_doc.get("memory") or {}).get("gpu_memory_bytes")
    if not cap:
        return False, None
    one_node = replace(layout, nodes=1)
    vendor = "amd" if str((plan_doc.get("offer") or {}).get("gpu", "")).startswith("mi") else "nvidia"
    try:
        need = estimate_memory(model, job, one_node, gpu_vendor=vendor).device_total_bytes
    except FtplanError:
        return False, None
    usable = cap * (1 - _HSDP_MARGIN)
    if need <= usable:
        return True, (f"HSDP: states sharded over the {layout.gpus_per_node} GPUs of a node and replicated across the "
                       f"{layout.nodes} nodes ({need / 1e9:,.1f} GB per GPU predicted, fits {usable / 1e9:,.1f} GB); "
                       "only the gradient all-reduce crosses nodes, so the plan's time is an upper bound")
    return False, (f"FSDP over all {layout.world_size} GPUs, not HSDP: sharded over one node's "
                   f"{layout.gpus_per_node} GPUs the job needs {need / 1e9:,.1f} GB per GPU > {usable / 1e9:,.1f} GB")


@dataclass(frozen=True)
class Rendered:
    """A rendered bundle: ``files`` (relative path -> text) and how to launch it."""

    files: dict[str, str]
    target: str
    kind: str  # the launch kind (export.targets.KINDS)
    command: str  # the launch line, run from the bundle's folder (<DATA> = the dataset)
    packages: tuple[str, ...]  # pip requirements of the GPU machine
    sky_command: str | None  # the SkyPilot line, when sky.yaml was written

    def launch(self, dataset: str | None = None) -> dict[str, Any]:
        """The launch lines with the dataset filled in (the ``launch`` object of ``ftplan.export/1``)."""
        data = dataset or "data.jsonl"
        return {"target": self.target, "engine": self.kind,
                "setup": "pip install " + " ".join(f'"{p}"' for p in self.packages) if self.packages else None,
                "command": self.command.replace("<DATA>", data),
                "sky": self.sky_command.replace("<DATA>", data) if self.sky_command else None}


def render_bundle(plan_doc: dict, *, alternatives: Sequence[dict] = (), model_ref: str | None = None,
                  dataset: str | None = None, zero3_backend: str | None = None,
                  target: str = "accelerate") -> dict[str, str]:
    """The files of the bundle: relative path -> text (:func:`render` without the launch lines)."""
    return render(plan_doc, alternatives=alternatives, model_ref=model_ref, dataset=dataset,
                  zero3_backend=zero3_backend, target=target).files


def render(plan_doc: dict, *, alternatives: Sequence[dict] = (), model_ref: str | None = None,
           dataset: str | None = None, zero3_backend: str | None = None, target: str = "accelerate") -> Rendered:
    """The files of the bundle and its launch lines. Pure: reads only ftplan's bundled catalogs.

    ``target`` (:data:`ftplan.export.targets.TARGETS`) picks the engine: ``accelerate`` (default:
    accelerate + the TRL script, FSDP2 / DeepSpeed / TP as :func:`ftplan.export.targets.engine` says),
    ``deepspeed`` (the same with DeepSpeed for every sharded layout, AutoTP for TP), ``axolotl`` or
    ``llamafactory`` (their YAML). ``alternatives`` are the other plans of the same search (the
    README lists them; those that run the same files become SkyPilot fallbacks). ``model_ref`` is what
    the files load (default: the model's hub id). ``dataset`` is written into the files and the
    README. ``zero3_backend`` (``deepspeed`` | ``fsdp``) overrides how a ``zero3`` plan runs under the
    accelerate/deepspeed targets. Raises ``ConfigError`` for a plan that cannot be exported.
    """
    from ..job import validate_job
    from .readme import render_readme
    from .skypilot import render_sky_yaml
    from .targets import check_target
    from .yamltext import user_text

    if not isinstance(plan_doc, Mapping) or any(not isinstance(plan_doc.get(k), Mapping)
                                                for k in ("model", *_PLAN_KEYS)):
        raise ConfigError("not a plan document (needs model, offer, layout, job)",
                          "pass one plan of `ftplan recommend --json` (see plan_document / plan_from_json)")
    check_target(target)
    if zero3_backend is not None and zero3_backend not in ZERO3_BACKENDS:
        raise ConfigError(f"unknown ZeRO-3 backend {str(zero3_backend)[:40]!r}", "use deepspeed or fsdp")
    alternatives = list(alternatives)
    check_plan_document(plan_doc, alternatives)
    if model_ref is not None:
        model_ref = user_text(model_ref, "`model_ref`", field="model_ref")
    if dataset is not None:
        dataset = user_text(dataset, "`dataset`", field="dataset")
    job, layout = _job_and_layout(plan_doc)
    model = _resolve(plan_doc["model"])
    validate_job(model, job, layout)
    why = exportable(plan_doc, target)
    if why:
        raise ConfigError(f"this plan cannot be exported to {target}: {why}",
                          "pick another plan with `plan=N` (`ftplan recommend` lists them) or another `target`")
    _check_hardware(plan_doc, job)
    if job.loss == "torchtune":
        raise ConfigError("the plan's loss is torchtune's chunked-output cross-entropy, which the exported "
                          "TRL / axolotl / LLaMA-Factory launches do not run (ftplan writes no torchtune recipe)",
                          "plan with `loss=trl` (TRL's default fused head) or `loss=liger` to export")
    kind = _kind(layout, job, target, zero3_backend, model)
    hsdp, hsdp_note = _hsdp(plan_doc, model, job, layout, kind)
    _check_low_precision(job, kind, target)
    model_ref = user_text(model_ref or model.hf_id or _local_ref(plan_doc["model"].get("ref")) or model.name,
                          "model reference")
    title = f"{model.name} {job.method} on {layout.world_size} x {plan_doc['offer'].get('gpu')}"
    notes = _notes(plan_doc, job, layout, kind, target)
    if hsdp_note:
        notes.append(hsdp_note)

    files: dict[str, str] = {}
    if target in ("accelerate", "deepspeed"):
        launch = _render_accelerate_files(files, model, job, layout, kind, hsdp, title, model_ref, notes)
    elif target == "axolotl":
        from .axolotl import render_axolotl

        launch = render_axolotl(files, model, job, layout, kind=kind, hsdp=hsdp, title=title,
                                model_ref=model_ref, dataset=dataset, notes=notes)
    else:
        from .llamafactory import render_llamafactory

        launch = render_llamafactory(files, model, job, layout, kind=kind, hsdp=hsdp, title=title,
                                     model_ref=model_ref, dataset=dataset, notes=notes)
    sky, sky_notes, cands = render_sky_yaml(plan_doc, alternatives, job=job, layout=layout, kind=kind,
                                            model_ref=model_ref, dataset=dataset, title=title,
                                            params_total=plan_doc["model"].get("params_total"), launch=launch)
    notes += sky_notes
    if sky is not None:
        files["sky.yaml"] = sky
    names = [*files, "README.md", "plan.json"]
    files["README.md"] = render_readme(plan_doc, job=job, layout=layout, kind=kind, model_ref=model_ref,
                                       dataset=dataset, files=names, alternatives=alternatives,
                                       sky_candidates=cands, notes=notes, launch=launch, target=target)
    files["plan.json"] = json.dumps(plan_doc, indent=2) + "\n"
    sky_cmd = None
    if "sky.yaml" in files:
        spot = any(c.get("use_spot") for c in cands)
        sky_cmd = ("sky jobs launch -n ftplan sky.yaml --env DATASET=<DATA>" if spot
                   else "sky launch -c ftplan sky.yaml --env DATASET=<DATA>")
    return Rendered(files, target, kind, launch["command"], tuple(launch.get("packages", ())), sky_cmd)


def _notes(plan_doc: Mapping[str, Any], job: Job, layout: Layout, kind: str, target: str) -> list[str]:
    notes: list[str] = []
    if layout.strategy == "zero3" and kind in ("fsdp", "deepspeed") and layout.world_size > 1:
        notes.append(f"zero3 plan run with {'DeepSpeed ZeRO-3' if kind == 'deepspeed' else 'FSDP2 (fully_shard)'}: "
                     "ftplan's memory model treats ZeRO-3 and FSDP alike (every model state sharded over the "
                     "data-parallel ranks, one gathered layer plus one prefetched)")
    if kind == "tp":
        notes.append(f"tensor parallelism ({layout.tp}) with transformers' TP plan: weights are split (the input "
                     "embedding and lm_head too), the logits are gathered on every rank (lm_head "
                     "colwise_gather_output), as ftplan's memory model assumes")
        if layout.dp > 1:
            notes.append(f"planned as ZeRO-1 + TP; runs as FSDP2 over the {layout.dp} data-parallel ranks + TP "
                         "(accelerate does not compose DDP/ZeRO-1 with TP): every model state is sharded at least "
                         "as much as planned, FSDP2 gathers layers (about 1.5x the planned data-parallel traffic)")
    if kind == "autotp":
        notes.append(f"DeepSpeed AutoTP ({layout.tp}) with ZeRO stage {0 if layout.strategy == 'single' else layout.strategy[-1]}: "
                     "each process loads the whole model in host RAM before DeepSpeed shards it "
                     "(host RAM per node >= GPUs per node x the model in its load dtype)")
    if job.gradient_checkpointing and target in ("accelerate", "deepspeed"):
        notes.append("gradient checkpointing is turned on by train.py (trainer, non-reentrant); the launcher "
                     "configs leave it off so that only one place does it")
    if kind == "deepspeed" and layout.offload_optimizer:
        notes.append("optimizer offload: DeepSpeed runs AdamW on the CPU (DeepSpeedCPUAdam, built on first use); "
                     "the optimizer name in the training config is not used")
    if job.precision in ("bf16", "fp16") and kind in ("deepspeed", "autotp"):
        notes.append(f"pure {job.precision} training: DeepSpeed's bf16/fp16 modes are off (no autocast), "
                     "the model trains in the dtype it is loaded in")
    if str((plan_doc.get("offer") or {}).get("gpu", "")).startswith("mi"):
        notes.append("AMD GPU: use a ROCm build of PyTorch (e.g. a ROCm image), not the CUDA wheel that "
                     "'pip install torch' picks")
    return notes


def _render_accelerate_files(files: dict[str, str], model, job: Job, layout: Layout, kind: str, hsdp: bool,
                             title: str, model_ref: str, notes: list[str]) -> dict[str, Any]:
    from .accelerate import launch_command, render_accelerate_config
    from .deepspeed import render_deepspeed_config
    from .skypilot import setup_packages

    files["accelerate_config.yaml"] = render_accelerate_config(layout, job, kind=kind, title=title, hsdp=hsdp)
    if kind in ("deepspeed", "autotp"):
        files["ds_config.json"] = render_deepspeed_config(layout, job)
    from .script import render_train_script

    files["train.py"] = render_train_script(model, job, layout, model_ref=model_ref, kind=kind)
    args = '--model "$MODEL" --dataset "$DATASET" --output-dir "$OUTPUT_DIR"'
    return {
        "packages": setup_packages(job, kind, model.family),
        "command": launch_command(layout, "--dataset <DATA> --output-dir output"),
        "sky_command": launch_command(layout, args),
        "multinode": "accelerate",
    }


# ---------------------------------------------------------------------------------------------
# write
# ---------------------------------------------------------------------------------------------
#: every file name an ftplan export writes (renderers that add files add their names here); with
#: ``--force`` a directory is replaced only when it holds an earlier bundle and nothing else
BUNDLE_FILE_NAMES = frozenset({"README.md", "plan.json", "train.py", "sky.yaml", "accelerate_config.yaml",
                               "ds_config.json", "axolotl.yaml", "llamafactory.yaml", "dataset_info.json"})


def earlier_bundle_problem(out: Path, new_files: Mapping[str, str] = {}) -> str | None:
    """Why ``out`` is not a directory holding only an earlier ftplan bundle (None when it is).

    A bundle directory has a ``plan.json`` of schema ``ftplan.plan/1`` and, besides it, only
    regular files named like bundle files (:data:`BUNDLE_FILE_NAMES` or a file of the new bundle):
    a training run's ``output/``, a user's notes or anything else makes it foreign.
    """
    try:
        entries = list(out.iterdir())
    except OSError as e:
        return f"cannot list it ({e.strerror or e})"
    names = BUNDLE_FILE_NAMES | {Path(n).name for n in new_files if len(Path(n).parts) == 1}
    foreign = [p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in entries
               if p.is_symlink() or not p.is_file() or p.name not in names]
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        return f"it holds {shown}, which no ftplan export writes"
    plan = out / "plan.json"
    try:
        doc = json.loads(plan.read_text(encoding="utf-8")) if plan.stat().st_size <= MAX_PLAN_BYTES else None
    except FileNotFoundError:
        return "it has no plan.json"
    except (OSError, ValueError, RecursionError):
        doc = None
    if not isinstance(doc, Mapping) or doc.get("schema") != PLAN_SCHEMA:
        return f"its plan.json is not an ftplan plan ({PLAN_SCHEMA})"
    return None


def write_bundle(files: Mapping[str, str], out_dir: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``files`` into ``out_dir`` atomically: all of them or nothing.

    The files go to a temporary directory next to ``out_dir`` that is then renamed into place. An
    existing non-empty ``out_dir`` is refused (``ConfigError``) unless ``force`` *and* it holds an
    earlier bundle and nothing else (:func:`earlier_bundle_problem`): then it is replaced, only
    after the new one is complete. ``force`` never deletes a foreign directory (``--out ~``).
    """
    try:
        out = Path(os.path.abspath(out_dir))
        cwd = Path.cwd()
    except (OSError, ValueError) as e:
        raise ConfigError(f"bad output directory {str(out_dir)[:200]!r}: {e}", "pass a new `out` directory") \
            from None
    check_text(str(out_dir), "output directory")
    if out == Path(out.anchor) or out == cwd or out in cwd.parents or out == Path.home() \
            or out in Path.home().parents:
        raise ConfigError(f"refusing to write the bundle over {out} (the current directory, the home directory "
                          "or one above them)", "pass a new `out` directory")
    for name in files:
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ConfigError(f"bad bundle path {name!r}", "paths must be relative, inside the bundle")
    try:
        if out.is_symlink():
            raise ConfigError(f"{out} is a symbolic link", "pass a new `out` directory")
        if out.exists() and not out.is_dir():
            raise ConfigError(f"{out} exists and is not a directory", "pass a new `out` directory")
        non_empty = out.is_dir() and any(out.iterdir())
    except OSError as e:
        raise ConfigError(f"cannot use {out}: {e.strerror or e}", "check the path and permissions") from None
    if non_empty and not force:
        raise ConfigError(f"{out} exists and is not empty", "pass a new `out` directory, or `force` to replace it")
    if non_empty:
        why = earlier_bundle_problem(out, files)
        if why:
            raise ConfigError(f"`force` only replaces an earlier ftplan bundle, and {out} is not one: {why}",
                              "pass a new `out` directory (nothing was deleted)")
    parent = out.parent
    if not parent.is_dir():
        raise ConfigError(f"{parent} does not exist", "create the parent directory first")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as e:
        raise ConfigError(f"cannot write in {parent}: {e.strerror or e}", "check the path and permissions") from None
    old: Path | None = None
    try:
        for name, text in files.items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            if name.endswith(".py"):
                path.chmod(0o755)
        tmp.chmod(0o755)
        if out.is_dir():
            if any(out.iterdir()):
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
                old.rmdir()
                out.rename(old)
            else:
                out.rmdir()
        tmp.rename(out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            old.rename(out)
            old = None
        if isinstance(e, OSError):
            raise ConfigError(f"cannot write {out}: {e.strerror or e}", "check the path and permissions") from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out
