"""``ftplan validate``: ftplan's predictions against measurement records.

For every record the prediction is *recomputed* with the current formulas from the stored model
config, job and layout (the stored prediction is history, not the yardstick). Errors are signed
``(predicted - measured) / measured`` in percent; statistics are over their absolute values:
median, p90 (nearest rank: the ``ceil(0.9 n)``-th smallest) and max.

Groups: ``gpu`` (CUDA, full-size models: the accuracy that counts), ``gpu-tiny`` and ``cpu``
(CPU runs; only exact tensor accounting, no allocator: model states and saved activations).
A *false fit* is a record measured OOM whose predicted device total (reserved + CUDA context + NCCL buffers) fits
the GPU's memory; a *missed fit* is the reverse (measured ok, predicted not to fit).

Targets (GPU group): peak allocated median <= 3 % and max <= 10 %, zero false fits, tokens/s
median <= 10 %. ``benchmarks/ratchet.json`` holds the best figures reached; ``--update-ratchet``
only ever lowers them (or fills an empty one).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import FtplanError, MeasurementError
from .records import canonical_key, job_from_dict, layout_from_dict, load_records

__all__ = [
    "TARGETS",
    "RATCHET_KEYS",
    "default_record_paths",
    "default_ratchet_path",
    "evaluate_record",
    "summarize",
    "stats",
    "validate_records",
    "validate_paths",
    "current_figures",
    "check_ratchet",
    "update_ratchet",
    "render_text",
]

TARGETS = {
    "gpu.peak_allocated.median_pct": 3.0,
    "gpu.peak_allocated.max_pct": 10.0,
    "gpu.false_fits": 0,
    "gpu.tokens_per_s.median_pct": 10.0,
}

#: figures the ratchet tracks (all: lower is better)
RATCHET_KEYS = (
    "gpu.peak_allocated.median_pct",
    "gpu.peak_allocated.max_pct",
    "gpu.peak_reserved.median_pct",
    "gpu.peak_reserved.max_pct",
    "gpu.tokens_per_s.median_pct",
    "gpu.false_fits",
    "cpu.model_states.median_pct",
    "cpu.model_states.max_pct",
    "cpu.activations.median_pct",
    "cpu.activations.max_pct",
)

METRICS = ("peak_allocated", "peak_reserved", "device_total", "tokens_per_s", "model_states", "activations")


def _repo_root() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "benchmarks").is_dir() and (parent / "pyproject.toml").is_file():
            return parent
    return Path.cwd()


def default_record_paths() -> list[Path]:
    """Every ``benchmarks/measurements/*.jsonl`` (of the working directory, else of the repo)."""
    for root in (Path.cwd(), _repo_root()):
        d = root / "benchmarks" / "measurements"
        if d.is_dir():
            return sorted(d.glob("*.jsonl"))
    return []


def default_ratchet_path() -> Path:
    for root in (Path.cwd(), _repo_root()):
        p = root / "benchmarks" / "ratchet.json"
        if p.is_file():
            return p
    return _repo_root() / "benchmarks" / "ratchet.json"


# ---------------------------------------------------------------------------------------------
# one record
# ---------------------------------------------------------------------------------------------
def _pct(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas <= 0:
        return None
    return (pred - meas) / meas * 100.0


def _group(rec: dict[str, Any]) -> str:
    run = rec.get("run") or {}
    if run.get("device") == "cuda":
        return "gpu-tiny" if run.get("tiny") else "gpu"
    return "cpu"


def evaluate_record(rec: dict[str, Any], predict_fn=None) -> dict[str, Any]:
    """One row of the validation: predicted (recomputed), measured, signed errors in %."""
    from ..model import model_from_config
    from .predict import predict

    predict_fn = predict_fn or predict
    m = rec["model"]
    spec = model_from_config(m["config"], name=m.get("name"), hf_id=m.get("hf_id"))
    job = job_from_dict(rec["job"])
    layout = layout_from_dict(rec.get("layout"))
    env = rec.get("env") or {}
    pred = predict_fn(spec, job, layout, env.get("gpu_name"))
    meas = rec["measured"] or {}
    ok = rec["outcome"] == "ok"
    row: dict[str, Any] = {
        "source": rec.get("_source"),
        "model": m.get("name"),
        "method": job.method,
        "group": _group(rec),
        "outcome": rec["outcome"],
        "job": f"{job.method} {job.precision} {job.optimizer} b={job.micro_batch} s={job.seq_len}"
               f"{' gc' if job.gradient_checkpointing else ''}"
               f"{'=' + job.ac_mode if job.gradient_checkpointing and job.ac_mode != 'full' else ''}"
               f" loss={job.loss}",
    }
    gpu_total = env.get("gpu_total_bytes")
    fits = None if not gpu_total else pred["device_total_bytes"] <= gpu_total
    row["predicted_fits"] = fits
    row["false_fit"] = bool(rec["outcome"] == "oom" and fits)
    row["missed_fit"] = bool(ok and fits is False)

    def put(name: str, p, x) -> None:
        row[f"{name}_predicted"] = p
        row[f"{name}_measured"] = x
        row[f"{name}_err_pct"] = _pct(p, x) if ok else None

    put("peak_allocated", pred["peak_allocated_bytes"], meas.get("peak_allocated_bytes"))
    put("peak_reserved", pred["peak_reserved_bytes"], meas.get("peak_reserved_bytes"))
    put("device_total", pred["device_total_bytes"], meas.get("nvml_process_bytes"))
    put("tokens_per_s", pred.get("tokens_per_s"), meas.get("tokens_per_s"))
    t = meas.get("tensors") or {}
    copies = t.get("saved_weight_copy_bytes") or 0
    ms = None
    if all(t.get(k) is not None for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes")):
        # autocast's low-precision weight copies are 'master_weights' in ftplan's model states
        ms = t["param_bytes"] + t["grad_bytes"] + t["optimizer_state_bytes"] + copies
    put("model_states", pred.get("model_states_bytes"), ms)
    comp = pred.get("components") or {}
    act_meas = None if t.get("saved_activation_bytes") is None else t["saved_activation_bytes"] - copies
    act_pred = (comp.get("activations", 0) + comp.get("logits_and_loss", 0)) if comp else None
    if act_pred is not None:
        # what the forward saved, not what is left of it at the peak (full fine-tuning's first
        # layer's backward); CPU kernels save different tensors than CUDA ones (flash-attention for
        # CPU, math fallback, float dropout masks): compare with the CPU form of the same formulas
        from ..job import planned_attention
        from ..memory import saved_activation_bytes

        # a record written before ``measure`` recorded the planned attention keeps the job as asked
        act_pred = saved_activation_bytes(spec, planned_attention(spec, job)[0], layout,
                                          backend="cpu" if row["group"] == "cpu" else "cuda")
    put("activations", act_pred, act_meas)
    return row


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------
def stats(errors: list[float | None]) -> dict[str, Any]:
    """n, median, p90 (nearest rank), max of the absolute values (None entries ignored)."""
    vals = sorted(abs(e) for e in errors if e is not None)
    n = len(vals)
    if n == 0:
        return {"n": 0, "median_pct": None, "p90_pct": None, "max_pct": None}
    mid = n // 2
    median = vals[mid] if n % 2 else (vals[mid - 1] + vals[mid]) / 2
    p90 = vals[max(0, math.ceil(0.9 * n) - 1)]
    return {"n": n, "median_pct": median, "p90_pct": p90, "max_pct": vals[-1]}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for metric in METRICS:
        out[metric] = stats([r.get(f"{metric}_err_pct") for r in rows])
    out["false_fits"] = sum(1 for r in rows if r["false_fit"])
    out["missed_fits"] = sum(1 for r in rows if r["missed_fit"])
    out["oom"] = sum(1 for r in rows if r["outcome"] == "oom")
    out["errors"] = sum(1 for r in rows if r["outcome"] == "error")
    return out


def validate_records(records: list[dict[str, Any]], problems: list[str] | None = None,
                     predict_fn=None, predict_for=None) -> dict[str, Any]:
    """``predict_fn``: one prediction function for every record; ``predict_for``: a function of the
    record that returns it (the measuring machine's host, :func:`machine_hosts`)."""
    problems = list(problems or [])
    records, superseded = latest_per_configuration(records)
    rows = []
    for rec in records:
        try:
            rows.append(evaluate_record(rec, predict_for(rec) if predict_for else predict_fn))
        except (FtplanError, KeyError, TypeError, ValueError, AttributeError, ArithmeticError, RecursionError) as e:
            msg = e.one_line() if isinstance(e, FtplanError) else f"{type(e).__name__}: {e}"
            problems.append(f"{rec.get('_source', '?')}: cannot recompute the prediction ({msg})")
    groups: dict[str, Any] = {}
    for g in ("gpu", "gpu-tiny", "cpu"):
        grows = [r for r in rows if r["group"] == g]
        if not grows:
            continue
        by_method = {}
        for meth in sorted({r["method"] for r in grows}):
            by_method[meth] = summarize([r for r in grows if r["method"] == meth])
        groups[g] = {"all": summarize(grows), "by_method": by_method}
    report: dict[str, Any] = {
        "schema": "ftplan.validation/1",
        "n_records": len(records),
        "superseded": superseded,
        "problems": problems,
        "groups": groups,
        "rows": rows,
        "targets": dict(TARGETS),
    }
    report["figures"] = current_figures(report)
    report["target_misses"] = _target_misses(report)
    report["meets_targets"] = not report["target_misses"]
    return report


def latest_per_configuration(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One record per measured configuration (:func:`canonical_key`): the last one written.

    Records are only ever appended, so a configuration measured again (a harness fix, a new
    library version) has its new record after the old; the old one is reported as superseded and
    not scored. A failed run (``outcome: error``) supersedes nothing.
    """
    last: dict[str, int] = {}
    for i, rec in enumerate(records):
        if rec.get("outcome") != "error":
            last[canonical_key(rec)] = i
    keep, superseded = [], []
    for i, rec in enumerate(records):
        if rec.get("outcome") != "error" and last[canonical_key(rec)] != i:
            superseded.append(str(rec.get("_source", "?")))
        else:
            keep.append(rec)
    return keep, superseded


#: files next to the records that name the host of the machine that measured them (the runtime
#: split: ``files`` and ``host``, see ``benchmarks/measurements/h100-sxm-runtime-split.json``)
HOST_FILE_GLOB = "*-runtime-split.json"


def machine_hosts(paths) -> tuple[dict[str, dict[str, float]], list[str]]:
    """(record file name -> host constants of the machine that measured it, problems): the
    ``host`` of every ``*-runtime-split.json`` in the records' folders, for the files it lists
    (``files`` and ``same_machine_files``).
    Tokens/s of a record are predicted with its machine's per-op dispatch cost (eager PyTorch is
    host-bound on short micro-batches), as ``benchmarks/runtime_accuracy.py`` does."""
    from pathlib import Path

    from ..catalog.efficiency import parse_host
    from ..errors import CatalogError

    out: dict[str, dict[str, float]] = {}
    problems: list[str] = []
    for d in sorted({Path(p).resolve().parent for p in paths}):
        for f in sorted(d.glob(HOST_FILE_GLOB)):
            try:
                doc = json.loads(f.read_text())
                host = parse_host(doc.get("host"), f.name) if isinstance(doc, dict) else {}
            except (OSError, json.JSONDecodeError, CatalogError) as e:
                problems.append(f"{f}: not used for the measuring machine's host ({e})")
                continue
            if host:
                for name in list(doc.get("files") or ()) + list(doc.get("same_machine_files") or ()):
                    out[str(d / name)] = host
    return out, problems


def host_predictor(hosts: dict[str, dict[str, float]]):
    """A predict function that uses each record's machine host (``machine_hosts``)."""
    from ..catalog.efficiency import host_variant
    from .predict import predict

    current: dict[str, Any] = {"eff": None}

    def fn(spec, job, layout, gpu_name):
        return predict(spec, job, layout, gpu_name, eff=current["eff"])

    def for_record(rec: dict[str, Any]):
        from pathlib import Path

        src = str(rec.get("_source", "")).rsplit(":", 1)[0]
        host = hosts.get(str(Path(src).resolve())) if src else None
        current["eff"] = host_variant(None, host) if host else None
        return fn

    return for_record


def validate_paths(paths, ratchet: str | os.PathLike | None = None) -> dict[str, Any]:
    """The report over record files, held against ``ratchet`` when one is given.

    The repository's ``benchmarks/ratchet.json`` describes the committed record set: pass it (or
    call :func:`ftplan.api.validate` without paths) to hold those records to it. A user's own
    record files are not held to figures that other records set.
    """
    paths = list(paths)
    records, problems = load_records(paths)
    hosts, host_problems = machine_hosts(paths)
    report = validate_records(records, problems + host_problems,
                              predict_for=host_predictor(hosts) if hosts else None)
    report["files"] = [str(p) for p in paths]
    if ratchet is None:
        return report
    ratchet_path = Path(ratchet)
    held = read_ratchet(ratchet_path)  # a missing or malformed file is a one-line MeasurementError
    report["ratchet"] = {"path": str(ratchet_path), "violations": check_ratchet(report, held)}
    if report["ratchet"]["violations"]:
        report["meets_targets"] = False
    return report


def _target_misses(report: dict[str, Any]) -> list[str]:
    figs = report["figures"]
    out = []
    for key, limit in TARGETS.items():
        v = figs.get(key)
        if v is not None and v > limit:
            out.append(f"{key} = {v:.2f} > target {limit}")
    return out


# ---------------------------------------------------------------------------------------------
# ratchet
# ---------------------------------------------------------------------------------------------
def current_figures(report: dict[str, Any]) -> dict[str, float | int | None]:
    figs: dict[str, float | int | None] = {}
    for key in RATCHET_KEYS:
        group, metric, *rest = key.split(".")
        g = report["groups"].get(group)
        if g is None:
            figs[key] = None
            continue
        a = g["all"]
        if metric == "false_fits":
            figs[key] = a["false_fits"] if a["n"] else None
        else:
            figs[key] = a[metric][rest[0]]
    return figs


def read_ratchet(path: str | os.PathLike) -> dict[str, Any]:
    from ..inputs import load_json_text, read_text_file

    where = f"ratchet {str(path)[:200]!r}"
    data = load_json_text(read_text_file(path, "ratchet file", max_bytes=2**20, error=MeasurementError), where,
                          error=MeasurementError)
    if not isinstance(data, dict) or not isinstance(data.get("figures"), dict):
        raise MeasurementError(f"{where} has no 'figures' object")
    bad = [k for k, v in data["figures"].items()
           if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v))]
    if bad:
        raise MeasurementError(f"{where}: figure(s) {', '.join(map(repr, bad[:5]))} are not numbers",
                               "restore benchmarks/ratchet.json from git")
    return data


def check_ratchet(report: dict[str, Any], ratchet: dict[str, Any], tol: float = 1e-6) -> list[str]:
    """Figures worse than the ratchet (or gone: the records that set them are missing)."""
    figs = report["figures"]
    out = []
    for key, best in ratchet["figures"].items():
        if best is None:
            continue
        cur = figs.get(key)
        if cur is None:
            out.append(f"{key}: no records now (ratchet {best})")
        elif cur > best + tol:
            out.append(f"{key}: {cur:.4f} is worse than the ratchet {best}")
    return out


def _ceil4(x: float | int) -> float | int:
    return x if isinstance(x, int) else math.ceil(x * 10000 - 1e-9) / 10000


def update_ratchet(report: dict[str, Any], path: Path | None = None) -> list[str]:
    """Lower each ratchet figure to the current one when better; never raise one. Returns changes.

    Without ``path`` the committed ``benchmarks/ratchet.json`` is tightened, and only from a report
    over the committed records (``report["files"]``, when present, must be that set): a user's own
    records name the file to tighten. A ``path`` that does not exist yet is created from the report
    (every figure it has). The file is replaced atomically (a temporary file in the same folder,
    then :func:`os.replace`): an interrupted write leaves the old ratchet as it was.
    """
    if path is None:
        files = report.get("files")
        if files is not None and sorted(map(str, files)) != sorted(map(str, default_record_paths())):
            raise MeasurementError("the committed benchmarks/ratchet.json is tightened only from the committed "
                                   "records, not from other record files",
                                   "pass the ratchet file to tighten as `ratchet`")
        path = default_ratchet_path()
    path = Path(path)
    try:
        exists = path.exists()
    except (OSError, ValueError):
        exists = False
    if exists and not path.is_file():
        raise MeasurementError(f"ratchet {str(path)[:200]!r} is not a regular file", "pass a .json file path")
    if not path.parent.is_dir():
        raise MeasurementError(f"ratchet {str(path)[:200]!r}: its folder does not exist", "create it first")
    data = read_ratchet(path) if exists else {"schema": "ftplan.ratchet/1", "figures": {}}
    figs = data["figures"]
    changed = []
    for key in RATCHET_KEYS:
        cur = report["figures"].get(key)
        best = figs.get(key)
        if cur is None:
            figs.setdefault(key, best)
            continue
        cur = _ceil4(cur)
        if best is None or cur < best:
            figs[key] = cur
            changed.append(f"{key}: {best} -> {cur}")
    if changed or not exists:
        try:
            _write_atomically(path, json.dumps(data, indent=2) + "\n")
        except OSError as e:  # e.g. a name too long for the file system, a read-only folder
            raise MeasurementError(f"ratchet {str(path)[:200]!r} cannot be written: {e.strerror or e}",
                                   "pass a writable .json file path as `ratchet`") from None
    return changed


def _write_atomically(path: Path, text: str) -> None:
    """``text`` to ``path`` through a uniquely named temporary file in the same folder, flushed to
    disk, then renamed over it (an existing file's permission bits are kept)."""
    from .._files import atomic_open

    with atomic_open(path) as f:
        f.write(text)


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------
def _f(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def render_text(report: dict[str, Any]) -> str:
    from ..report import table

    lines = [f"{report['n_records']} record(s) from {len(report.get('files', []))} file(s); "
             "errors in % of measured, |error| median / p90 / max"]
    if report.get("superseded"):
        sup = report["superseded"]
        lines.append(f"{len(sup)} earlier record(s) of a configuration measured again, not scored: "
                     f"{', '.join(sup[:3])}{', ...' if len(sup) > 3 else ''}")
    if "gpu" not in report["groups"]:
        lines.append("no GPU records yet: GPU accuracy targets not assessed "
                     "(run benchmarks/run_campaign.sh on a GPU machine)")
    rows = []
    for g, data in report["groups"].items():
        items = [("all", data["all"])] + (list(data["by_method"].items()) if len(data["by_method"]) > 1 else [])
        for name, s in items:
            def trio(metric: str) -> str:
                x = s[metric]
                return f"{_f(x['median_pct'])} / {_f(x['p90_pct'])} / {_f(x['max_pct'])}" if x["n"] else "-"

            if g == "cpu":
                rows.append((g, name, s["n"], "-", "-", "-", trio("model_states"), trio("activations"), "-", "-"))
            else:
                rows.append((g, name, s["n"], trio("peak_allocated"), trio("peak_reserved"),
                             trio("tokens_per_s"), trio("model_states"), trio("activations"),
                             s["false_fits"], s["oom"]))
    if rows:
        lines.append(table(("group", "method", "n", "peak alloc", "peak reserved", "tokens/s",
                            "model states", "saved act.", "false fits", "oom"), rows, "llrlllllrr"))
    if report["target_misses"]:
        lines.append("targets missed: " + "; ".join(report["target_misses"]))
    elif "gpu" in report["groups"]:
        lines.append("GPU targets met (alloc median <= 3 %, max <= 10 %, no false fits, tokens/s median <= 10 %)")
    rat = report.get("ratchet")
    if rat:
        if rat["violations"]:
            lines.append("worse than the ratchet: " + "; ".join(rat["violations"]))
        else:
            lines.append(f"ratchet {rat['path']}: held")
    if report.get("ratchet_updated"):
        lines.append("ratchet tightened: " + "; ".join(report["ratchet_updated"]))
    if report["problems"]:
        lines.append(f"{len(report['problems'])} problem line(s) skipped (see warnings)")
    return "\n".join(lines)
