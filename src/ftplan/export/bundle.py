"""Render and write the files of a plan: ``render_bundle`` (pure) and ``write_bundle`` (atomic).

A *plan document* (schema ``ftplan.plan/1``) is one plan of ``ftplan recommend --json``
(``offer``, ``layout``, ``strategy_label``, ``job``, ``memory``, ``runtime``, ``cost``, flags,
``notes``) plus ``schema`` and the search's ``model`` ({name, hf_id, params_total}). Build one from
a :class:`~ftplan.planner.Plan` with :func:`plan_document`, or from a saved ``recommend``/``compare``
document with :func:`plan_from_json`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, FtplanError
from ..job import Job, Layout
from ..options import job_from_dict, layout_from_dict

__all__ = ["PLAN_SCHEMA", "ACCEPTED_SCHEMAS", "plan_document", "plan_from_json", "load_plan_json",
           "exportable", "render_bundle", "write_bundle",
           "ZERO3_BACKENDS"]

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
    return ConfigError(f"{where}: {what}", "pass a file saved from 'ftplan recommend --json'")


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
                          "relax the constraints and run 'ftplan recommend --json' again")
    if not 1 <= index <= len(plans):
        raise ConfigError(f"plan {index} is out of range: {where} holds {len(plans)} plan(s)",
                          f"use --plan 1..{len(plans)}")
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
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such file: {p}", "pass a file saved from 'ftplan recommend --json'") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {p}: {e}", "pass a file saved from 'ftplan recommend --json'") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not JSON (line {e.lineno}: {e.msg})",
                          "pass a file saved from 'ftplan recommend --json'") from None
    return plan_from_json(doc, index, where=str(p))


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
        raise ConfigError("plan JSON: no model name", "pass a file saved from 'ftplan recommend --json'")
    raise ConfigError(f"cannot find the plan's model ({', '.join(map(repr, refs))}): {last.message}",
                      "run 'ftplan export MODEL ...' with the search options instead of --from-json")


def _local_ref(ref: str | None) -> str | None:
    """A model directory from what the user named (a config.json path means its folder)."""
    if not ref:
        return None
    return str(Path(ref).parent) if ref.endswith(".json") else ref


def exportable(plan: Mapping[str, Any]) -> str | None:
    """Why a plan cannot be exported (a short reason), or None when it can."""
    lo = plan.get("layout") or {}
    if int(lo.get("tp", 1) or 1) > 1 or int(lo.get("pp", 1) or 1) > 1:
        return (f"its layout {plan.get('strategy_label') or lo.get('strategy')} uses tensor/pipeline "
                "parallelism, which accelerate + TRL do not run")
    return None


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
                          "pick another plan (--plan N) or another method")
    if adapted.attn_impl != job.attn_impl:
        raise ConfigError(f"the plan asks for {job.attn_impl} attention, not available on {slug}",
                          "plan with --attn sdpa or pick another plan (--plan N)")


# ---------------------------------------------------------------------------------------------
# render
# ---------------------------------------------------------------------------------------------
def render_bundle(plan_doc: dict, *, alternatives: Sequence[dict] = (), model_ref: str | None = None,
                  dataset: str | None = None, zero3_backend: str = "deepspeed") -> dict[str, str]:
    """The files of the bundle: relative path -> text. Pure: reads only ftplan's bundled catalogs.

    ``alternatives`` are the other plans of the same search (the README lists them; those that run
    the same files become SkyPilot fallbacks). ``model_ref`` is what ``train.py`` loads (default:
    the model's hub id). ``dataset`` is written into ``sky.yaml`` and the README. ``zero3_backend``
    says how a ``zero3`` plan runs: ``deepspeed`` (ZeRO-3) or ``fsdp`` (FULL_SHARD).
    Raises ``ConfigError`` for a plan that cannot be exported.
    """
    from ..job import validate_job
    from .accelerate import backend, render_accelerate_config
    from .deepspeed import render_deepspeed_config
    from .readme import render_readme
    from .skypilot import render_sky_yaml, setup_packages

    if not isinstance(plan_doc, Mapping) or any(not isinstance(plan_doc.get(k), Mapping)
                                                for k in ("model", *_PLAN_KEYS)):
        raise ConfigError("not a plan document (needs model, offer, layout, job)",
                          "pass one plan of 'ftplan recommend --json' (see plan_document / plan_from_json)")
    if zero3_backend not in ZERO3_BACKENDS:
        raise ConfigError(f"unknown ZeRO-3 backend {zero3_backend!r}", "use deepspeed or fsdp")
    why = exportable(plan_doc)
    if why:
        raise ConfigError(f"this plan cannot be exported: {why}",
                          "pick a plan without tp/pp with --plan N ('ftplan recommend' lists them)")
    job, layout = _job_and_layout(plan_doc)
    model = _resolve(plan_doc["model"])
    validate_job(model, job, layout)
    _check_hardware(plan_doc, job)
    kind = backend(layout, zero3_backend)
    if kind == "fsdp" and layout.offload_optimizer and not layout.offload_params:
        raise ConfigError("FSDP cannot offload only the optimizer states (its CPU offload moves parameters, "
                          "gradients and the optimizer step together)",
                          "use --zero3-backend deepspeed for this plan")
    model_ref = model_ref or model.hf_id or _local_ref(plan_doc["model"].get("ref")) or model.name
    title = f"{model.name} {job.method} on {layout.world_size} x {plan_doc['offer'].get('gpu')}"
    notes: list[str] = []
    if layout.strategy == "zero3":
        notes.append(f"zero3 plan run with {'DeepSpeed ZeRO-3' if kind == 'deepspeed' else 'FSDP FULL_SHARD'} "
                     f"(--zero3-backend {'fsdp' if kind == 'deepspeed' else 'deepspeed'} for the other; ftplan "
                     "models both alike)")
    if job.gradient_checkpointing:
        notes.append("gradient checkpointing is turned on by train.py (trainer, non-reentrant); the launcher "
                     "configs leave it off so that only one place does it")
    if kind == "deepspeed" and layout.offload_optimizer:
        notes.append("optimizer offload: DeepSpeed runs AdamW on the CPU (DeepSpeedCPUAdam, built on first use); "
                     "train.py's optim= is not used")
    if job.precision in ("bf16", "fp16") and kind == "deepspeed":
        notes.append(f"pure {job.precision} training: DeepSpeed's bf16/fp16 modes are off (no autocast), "
                     "the model trains in the dtype train.py loads it in")
    if str((plan_doc.get("offer") or {}).get("gpu", "")).startswith("mi"):
        notes.append("AMD GPU: use a ROCm build of PyTorch (e.g. a ROCm image), not the CUDA wheel that "
                     "'pip install torch' picks")

    files: dict[str, str] = {}
    files["accelerate_config.yaml"] = render_accelerate_config(layout, job, kind=kind, title=title)
    if kind == "deepspeed":
        files["ds_config.json"] = render_deepspeed_config(layout, job)
    from .script import render_train_script

    files["train.py"] = render_train_script(model, job, layout, model_ref=model_ref)
    sky, sky_notes, cands = render_sky_yaml(plan_doc, alternatives, job=job, layout=layout, kind=kind,
                                            model_ref=model_ref, dataset=dataset, title=title,
                                            params_total=plan_doc["model"].get("params_total"))
    notes += sky_notes
    if sky is not None:
        files["sky.yaml"] = sky
    names = [*files, "README.md", "plan.json"]
    files["README.md"] = render_readme(plan_doc, job=job, layout=layout, kind=kind, model_ref=model_ref,
                                       dataset=dataset, files=names, alternatives=alternatives,
                                       sky_candidates=cands, notes=notes, packages=setup_packages(job, kind))
    files["plan.json"] = json.dumps(plan_doc, indent=2) + "\n"
    return files


# ---------------------------------------------------------------------------------------------
# write
# ---------------------------------------------------------------------------------------------
def write_bundle(files: Mapping[str, str], out_dir: str | os.PathLike, *, force: bool = False) -> Path:
    """Write ``files`` into ``out_dir`` atomically: all of them or nothing.

    The files go to a temporary directory next to ``out_dir`` that is then renamed into place. An
    existing non-empty ``out_dir`` is refused (``ConfigError``) unless ``force``, in which case it is
    replaced only after the new one is complete.
    """
    out = Path(os.path.abspath(out_dir))
    if out == Path(out.anchor) or out == Path.cwd() or out in Path.cwd().parents:
        raise ConfigError(f"refusing to write the bundle over {out} (the current directory or one above it)",
                          "pass --out with a new directory")
    for name in files:
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ConfigError(f"bad bundle path {name!r}", "paths must be relative, inside the bundle")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} exists and is not a directory", "pass --out with a new directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"{out} exists and is not empty", "pass a new --out directory, or --force to replace it")
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
