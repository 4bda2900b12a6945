"""Measurement records: one JSON object per line (JSON Lines), appended crash-safely.

Schema ``ftplan.measurement/1`` (every record has every top-level key; unknown keys are kept):

``schema``      "ftplan.measurement/1"
``key``         stable string identifying the measured configuration (model ref, job, layout,
                device kind, tiny); ``ftplan measure --matrix`` skips rows whose key is present
``outcome``     "ok" | "oom" (CUDA/torch out-of-memory: a result, not a crash) | "error"
``error``       one-line message for "oom"/"error", else null
``timestamp``   UTC ISO-8601; ``host``: hostname
``model``       {ref, name, hf_id, family, params_total, tiny, config}: ``config`` is the raw
                config.json *actually built* (the shrunk one when tiny), so ``ftplan validate``
                can recompute the prediction with the current formulas without the catalog
``job``         every field of :class:`ftplan.job.Job` (lora / quant as nested objects)
``layout``      every field of :class:`ftplan.job.Layout` (measure runs single-GPU)
``run``         {device: "cuda"|"cpu", tiny, steps, warmup, seed, attn_implementation, notes}
``env``         {python, torch, transformers, peft, bitsandbytes, accelerate, cuda, driver,
                gpu_name, gpu_total_bytes, cpu}
``measured``    {baseline_allocated_bytes, baseline_reserved_bytes (after build, before the first
                step), peak_allocated_bytes, peak_reserved_bytes (torch.cuda.max_memory_*; null on
                cpu), nvml_used_before_bytes (device, before CUDA init), nvml_used_bytes (device,
                after the steps), nvml_process_bytes (this process, if NVML can see it),
                reserved_at_nvml_bytes (torch.cuda.memory_reserved when nvml_used_bytes was read),
                step_times_s [...], median_step_s, tokens_per_s, loss_first, loss_last,
                cpu: {param_bytes, grad_bytes, optimizer_state_bytes, saved_activation_bytes} or
                null (exact tensor accounting, recorded on every device)}
``predicted``   ftplan's prediction when measured: {peak_allocated_bytes, peak_reserved_bytes,
                device_total_bytes, components, model_states_bytes, tokens_per_s, ftplan_version}

Crash safety: a record is written with one ``write`` of the whole line plus ``\\n`` on a file
opened for appending, then flushed and fsync'ed; earlier lines are never rewritten or truncated.
If the file's last line lacks its newline (a writer killed mid-line), the new record starts on a
fresh line; the torn fragment stays and :func:`load_records` reports it as ``file:line``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import options
from ..errors import MeasurementError

__all__ = [
    "SCHEMA",
    "OUTCOMES",
    "append_record",
    "load_records",
    "record_key",
    "job_to_dict",
    "job_from_dict",
    "layout_to_dict",
    "layout_from_dict",
    "existing_keys",
]

SCHEMA = "ftplan.measurement/1"
OUTCOMES = ("ok", "oom", "error")
REQUIRED = ("schema", "key", "outcome", "model", "job", "layout", "run", "measured")


# ---------------------------------------------------------------------------------------------
# job / layout <-> plain dicts
# ---------------------------------------------------------------------------------------------
def job_to_dict(job) -> dict[str, Any]:
    """Every field of the Job (lora / quant as nested objects): :func:`ftplan.options.job_to_dict`."""
    return options.job_to_dict(job, full=True)


def job_from_dict(d: dict[str, Any]):
    d = dict(d)
    # records from before the loss path was a job option measured model(labels=...): transformers' loss
    d.setdefault("loss", "hf")
    return options.job_from_dict(d)


def layout_to_dict(layout) -> dict[str, Any]:
    return options.layout_to_dict(layout, full=True)


def layout_from_dict(d: dict[str, Any] | None):
    return options.layout_from_dict(d)


def record_key(model_ref: str, job, layout, device: str, tiny: bool) -> str:
    """The identity of a measured configuration (not of one run): used to resume matrices."""
    doc = {"model": model_ref, "job": job_to_dict(job), "layout": layout_to_dict(layout),
           "device": device, "tiny": bool(tiny)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------
def _needs_newline(path: Path) -> bool:
    """True when ``path`` is non-empty and does not end with a newline (a torn last line)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1) != b"\n"


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append ``record`` as one line of ``path`` (created with its folder if missing).

    One ``os.write`` of the complete line on an ``O_APPEND`` descriptor, then ``fsync``: a crash
    leaves either the whole line or (at worst) a torn tail that the next append steps over.
    """
    if record.get("schema") != SCHEMA:
        raise MeasurementError(f"record has schema {record.get('schema')!r}, expected {SCHEMA!r}")
    line = json.dumps(record, sort_keys=False, separators=(",", ":"), allow_nan=False) + "\n"
    p = Path(path)
    if p.exists() and not p.is_file():
        raise MeasurementError(f"{str(p)!r} is not a regular file", "pass a .jsonl file path as `out`")
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    data = line.encode("utf-8")
    if _needs_newline(p):
        data = b"\n" + data  # never truncate: start the record on a fresh line
    try:
        fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise MeasurementError(f"cannot open {str(p)!r} for appending: {e.strerror}") from None
    try:
        view = memoryview(data)
        while view:  # os.write may write less than asked (rare, e.g. signals); finish the line
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_record(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return "not a JSON object"
    from ..inputs import MAX_NESTING, nesting_depth

    if nesting_depth(obj, MAX_NESTING) > MAX_NESTING:
        return f"nested deeper than {MAX_NESTING} levels"
    if obj.get("schema") != SCHEMA:
        return f"schema {obj.get('schema')!r} is not {SCHEMA!r}"
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        return "missing field(s) " + ", ".join(missing)
    if not isinstance(obj["outcome"], str) or obj["outcome"] not in OUTCOMES:
        return f"outcome {str(obj['outcome'])[:40]!r} is not one of {', '.join(OUTCOMES)}"
    for key in ("model", "job", "measured", "run", "env", "layout", "predicted"):
        if key in obj and obj[key] is not None and not isinstance(obj[key], dict):
            return f"'{key}' is not a JSON object"
    if not isinstance(obj.get("key", ""), str):
        return "'key' is not text"
    return None


def load_records(paths: Iterable[str | os.PathLike], *, strict_files: bool = True
                 ) -> tuple[list[dict[str, Any]], list[str]]:
    """(valid records, problems). Each problem is ``file:line: what``; bad lines are skipped.

    Every record gets ``_source`` = ``file:line``. A missing file raises ``MeasurementError``
    when ``strict_files`` (the CLI's behaviour), else it is reported as a problem.
    """
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in paths:
        p = Path(path)
        shown = str(p) if len(str(p)) <= 200 else str(p)[:200] + "..."
        try:
            is_file = p.is_file()
        except (OSError, ValueError):  # a name longer than NAME_MAX, a NUL byte
            is_file = False
        if not is_file:
            if strict_files:
                raise MeasurementError(f"no record file {shown!r}", "pass existing .jsonl files")
            problems.append(f"{shown}: no such file")
            continue
        try:
            text = p.read_bytes().decode("utf-8", errors="replace")
        except OSError as e:
            raise MeasurementError(f"cannot read {shown!r}: {e.strerror}") from None
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line, parse_constant=_no_constant)
            except json.JSONDecodeError as e:
                problems.append(f"{p}:{i}: malformed JSON ({e.msg} at column {e.colno})")
                continue
            except ValueError as e:  # NaN/Infinity, an integer of more than 4300 digits
                problems.append(f"{p}:{i}: malformed JSON ({str(e)[:100]})")
                continue
            except RecursionError:
                problems.append(f"{p}:{i}: malformed JSON (nested too deeply)")
                continue
            why = _check_record(obj)
            if why:
                problems.append(f"{p}:{i}: {why}")
                continue
            obj["_source"] = f"{p}:{i}"
            records.append(obj)
    return records, problems


def existing_keys(path: str | os.PathLike, outcomes: tuple[str, ...] = ("ok", "oom")) -> set[str]:
    """Keys of the records in ``path`` with one of ``outcomes`` (errors are retried on resume)."""
    p = Path(path)
    if not p.is_file():
        return set()
    recs, _ = load_records([p], strict_files=False)
    return {canonical_key(r) for r in recs if r.get("outcome") in outcomes}


def canonical_key(record: dict[str, Any]) -> str:
    """The record's key as this version of ftplan writes it.

    A key is the JSON of every job and layout field, so a field added later (with its default)
    changes the key of a configuration that was already measured. Re-reading the stored job and
    layout through :func:`job_from_dict` / :func:`layout_from_dict` (which fill a new field with
    the value the older version measured, e.g. ``loss="hf"``) gives the key this version would
    write, so a resumed matrix skips what it already has. Falls back to the stored key when the
    record's job no longer parses.
    """
    stored = record["key"]
    try:
        ident = json.loads(stored)
        return record_key(ident["model"], job_from_dict(record["job"]), layout_from_dict(record["layout"]),
                          ident["device"], bool(ident["tiny"]))
    except Exception:  # noqa: BLE001 - an unparseable old record keeps its stored identity
        return stored
