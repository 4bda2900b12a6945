"""Turn a plan into files that run it: accelerate/DeepSpeed configs, a TRL script, a SkyPilot task.

``render_bundle(plan_doc, ...) -> {relative path: text}`` is pure (no I/O, never imports torch);
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
    plan_from_json,
    render_bundle,
    write_bundle,
)

__all__ = ["PLAN_SCHEMA", "ZERO3_BACKENDS", "load_plan_json", "plan_document", "plan_from_json",
           "render_bundle", "write_bundle"]
