"""Turn a plan into files that run it: accelerate/DeepSpeed configs, a TRL script, a SkyPilot task.

``render_bundle(plan_doc, target=...) -> {relative path: text}`` is pure (no I/O, never imports torch;
``render`` also gives the launch lines); ``exportable(layout, job, target)`` is the rule the planner
shares (``targets``: accelerate, deepspeed, axolotl, llamafactory);
``write_bundle(files, out_dir)`` writes them atomically. ``plan_document(model, plan)`` turns a
planner ``Plan`` into the ``ftplan.plan/1`` dict; ``plan_from_json`` / ``load_plan_json`` take one
plan out of a saved ``ftplan recommend --json`` document. CLI: ``ftplan export``.
"""

from __future__ import annotations

from .bundle import (
    PLAN_SCHEMA,
    ZERO3_BACKENDS,
    load_plan_json,
    plan_document,
    Rendered,
    plan_from_json,
    render,
    render_bundle,
    write_bundle,
)
from .targets import DEFAULT_TARGET, TARGETS, engine, exportable

__all__ = ["PLAN_SCHEMA", "ZERO3_BACKENDS", "DEFAULT_TARGET", "TARGETS", "Rendered", "engine", "exportable",
           "load_plan_json", "plan_document", "plan_from_json", "render", "render_bundle", "write_bundle"]
