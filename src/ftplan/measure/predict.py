"""ftplan's prediction of a measured job, as measurement records store it (no torch)."""

from __future__ import annotations

from typing import Any

from ..errors import FtplanError

__all__ = ["predict", "runtime_prediction"]


def runtime_prediction(spec, job, layout, gpu_name: str | None, eff=None) -> tuple[float | None, str | None]:
    """(tokens/s from :func:`ftplan.runtime.estimate_runtime`, None), or (None, why not): the GPU is
    not in the catalog, or the runtime model cannot price this job on it. ``eff``: the runtime
    constants (default: the bundled ones; a measurement machine's host, see
    :func:`ftplan.measure.validate.machine_hosts`)."""
    from ..catalog.gpus import get_gpu
    from ..runtime import estimate_runtime

    try:
        gpu = get_gpu(gpu_name) if gpu_name else None
    except FtplanError:
        gpu = None
    if gpu is None:
        return None, f"GPU {gpu_name!r} not matched in the GPU catalog"
    try:
        est = estimate_runtime(spec, job, layout, gpu, eff=eff)
    except FtplanError as e:
        return None, f"estimate_runtime failed: {e.one_line()}"
    return float(est.tokens_per_s), None


def predict(spec, job, layout, gpu_name: str | None = None, eff=None) -> dict[str, Any]:
    """ftplan's prediction for ``job`` on ``spec``, as stored in records (bytes; tokens/s)."""
    from ..memory import estimate_memory
    from ..version import __version__

    mem = estimate_memory(spec, job, layout)
    tps, why = runtime_prediction(spec, job, layout, gpu_name, eff)
    return {
        "peak_allocated_bytes": mem.peak_allocated_bytes,
        "peak_reserved_bytes": mem.peak_reserved_bytes,
        "device_total_bytes": mem.device_total_bytes,
        "model_states_bytes": mem.model_states_bytes,
        "components": dict(mem.components),
        "params_total": mem.params_total,
        "params_trainable": mem.params_trainable,
        "tokens_per_s": tps,
        "tokens_per_s_note": why,
        "ftplan_version": __version__,
    }
