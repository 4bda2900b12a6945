"""``ftplan measure`` and ``ftplan validate``: the measurement side of the command line.

torch is imported only when ``measure`` runs (in :mod:`ftplan.measure.run`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .. import api
from ..errors import ConfigError, FtplanError
from ..options import JOB_OPTIONS, LAYOUT_OPTIONS, build_job
from .options import RENDERER, Command, echo, emit_json, values
from .plan import add_job_options, add_layout_options

__all__ = ["COMMANDS", "row_to_argv", "row_values"]

#: matrix keys that are not job options, and the other names a matrix may use for job options
_ROW_ONLY = {"model", "steps", "warmup", "seed", "tiny", "device", "name", "note", "notes"}
_ROW_ALIASES = {"gc": "gradient_checkpointing", "batch": "micro_batch", "batch_size": "micro_batch",
                "attn_impl": "attn", "dataset_tokens": "tokens"}
_JOB_NAMES = {o.name: o for o in JOB_OPTIONS}


def _truthy(v) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "y", "on")


def row_values(row: dict) -> dict:
    """Matrix row -> job option values (``gc: true`` -> ``gradient_checkpointing: True``)."""
    out = {}
    for k, v in row.items():
        key = str(k).strip().replace("-", "_")
        if key in _ROW_ONLY or v is None:
            continue
        key = _ROW_ALIASES.get(key, key)
        if key == "double_quant":
            key, v = "no_double_quant", not _truthy(v)
        elif key in _JOB_NAMES and _JOB_NAMES[key].type == "bool":
            v = _truthy(v)
        out[key] = v
    return out


def row_to_argv(row: dict) -> list[str]:
    """Matrix row -> job-option argv (``micro_batch: 4`` -> ``--micro-batch 4``)."""
    argv: list[str] = []
    for key, v in row_values(row).items():
        opt = _JOB_NAMES.get(key)
        flag = opt.flags[-1] if opt is not None and opt.type == "bool" and opt.flags else \
            (opt.flag if opt is not None else "--" + key.replace("_", "-"))
        if opt is not None and opt.type == "bool":
            if v:
                argv.append(flag)
            elif opt.negatable:  # on by default: say off
                argv.append("--no-" + flag[2:])
            continue
        if isinstance(v, (list, tuple)):
            v = ",".join(map(str, v))
        argv += [flag, str(v)]
    return argv


def _row_job(row: dict, where: str):
    try:
        return build_job(row_values(row), api._spec_for_defaults(row.get("model")))
    except FtplanError as e:
        raise ConfigError(f"{where}: {e.message}", "matrix keys are job options: method, micro_batch, seq_len, "
                          "gc, optimizer, precision, lora_r, ...") from None


def run_measure(a: argparse.Namespace) -> int:
    if a.matrix:
        return _run_matrix(a)
    if not a.model:
        raise ConfigError("measure needs a MODEL or `matrix=FILE`", "see `ftplan measure --help`")
    rec = api.measure(a.model, steps=a.steps, warmup=a.warmup, device=a.device, tiny=True if a.tiny else None,
                      seed=a.seed, out=a.out, echo=None if a.json else echo,
                      **values(a, JOB_OPTIONS, LAYOUT_OPTIONS))
    if a.json:
        emit_json(rec)
    if a.out:
        print(f"appended to {a.out}", file=sys.stderr)
    return 0 if rec["outcome"] in ("ok", "oom") else 1


def _run_matrix(a: argparse.Namespace) -> int:
    from ..job import Layout
    from ..measure.records import existing_keys, record_key
    from ..measure.run import ModelCache, build_key, check_run_options, import_torch, load_matrix, measure, progress
    from ..optionspec import parse_int

    if not a.out:
        raise ConfigError("`matrix` needs `out=FILE.jsonl`", "the output file is what makes the matrix resumable")
    check_run_options(a.steps, a.warmup, a.seed, a.out)  # before any row runs
    rows = load_matrix(a.matrix)
    jobs = []
    for i, row in enumerate(rows, 1):
        job = _row_job(row, f"{a.matrix}: row {i}")
        try:
            steps = parse_int(str(row.get("steps", a.steps)))
        except ValueError as e:
            raise ConfigError(f"{a.matrix}: row {i}: steps: {e}") from None
        check_run_options(steps, a.warmup, a.seed, None)
        tiny = True if (a.tiny or _truthy(row.get("tiny", False))) else None
        jobs.append((i, str(row["model"]), job, steps, tiny))
    # group rows by build key (stable) so each model is built once
    torch = import_torch()
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = "cuda" if dev.startswith("cuda") else dev
    order: dict[tuple, list] = {}
    for item in jobs:
        order.setdefault(build_key(item[1], item[2], dev, bool(item[4])), []).append(item)
    ordered = [it for group in order.values() for it in group]
    layout = Layout()
    done = set() if a.remeasure else existing_keys(a.out)
    cache = ModelCache()
    n = len(ordered)
    counts = {"ok": 0, "oom": 0, "error": 0, "skipped": 0}
    for k, (i, model, job, steps, tiny) in enumerate(ordered, 1):
        desc = (f"row {i}: {model} {job.method} b={job.micro_batch} s={job.seq_len}"
                f"{' gc' if job.gradient_checkpointing else ''}")
        # the key uses the tiny flag as measure() would resolve it; auto-tiny rows are keyed after the run
        keys = {record_key(model, job, layout, dev, t) for t in ((True,) if tiny else (False, True))}
        if keys & done:
            counts["skipped"] += 1
            progress(k, n, desc + " (already in output, skipped)")
            continue
        progress(k - 1, n, desc + " ...")
        try:
            rec = measure(model, job, layout, steps=steps, warmup=a.warmup, device=a.device, tiny=tiny,
                          seed=a.seed, out=a.out, cache=cache, echo=echo)
        except ConfigError as e:  # a bad row does not stop the campaign
            counts["error"] += 1
            progress(k, n, f"{desc}: skipped: {e.one_line(RENDERER)}")
            continue
        counts[rec["outcome"]] += 1
        done.add(rec["key"])
        progress(k, n, f"{desc}: {rec['outcome']}")
    cache.clear()
    print(f"matrix {a.matrix}: {counts['ok']} ok, {counts['oom']} oom, {counts['error']} error, "
          f"{counts['skipped']} skipped (already measured) -> {a.out}", file=sys.stderr)
    return 0


def run_validate(a: argparse.Namespace) -> int:
    from ..measure.validate import default_record_paths, render_text, update_ratchet

    if a.update_ratchet and a.records and not a.ratchet:  # before anything is read or written
        raise ConfigError("`update_ratchet` with your own record files needs `ratchet=FILE`, the ratchet file "
                          "to tighten", "the committed benchmarks/ratchet.json is tightened only from the "
                          "committed records, by `ftplan validate --update-ratchet` without RECORDS")
    ratchet = Path(a.ratchet) if a.ratchet else None
    if a.update_ratchet and ratchet is not None and not _exists(ratchet):
        # a new ratchet, made from these records' figures: nothing to hold them to yet (the
        # committed records are named so that the committed ratchet is not used instead)
        report = api.validate(a.records or default_record_paths())
        created = True
    else:
        report = api.validate(a.records, ratchet)
        created = False
    if a.update_ratchet and (a.skip_bad or not report["problems"]):  # a run that exits 2 writes nothing
        report["ratchet_updated"] = update_ratchet(report, ratchet)
        if created:
            print(f"created {ratchet}", file=sys.stderr)
    if a.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_text(report))
    for p in _capped_problems(report["problems"]):
        print(f"ftplan: {'warning' if a.skip_bad else 'error'}: {p}", file=sys.stderr)
    if report["problems"] and not a.skip_bad:
        return 2  # malformed lines: reported with file:line; --skip-bad to accept them
    if a.check and report["meets_targets"] is False:
        return 1
    return 0


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except (OSError, ValueError):  # a name too long, a NUL byte: reading it reports that
        return True


def _capped_problems(problems: list[str], per_file: int = 5) -> list[str]:
    """The first ``per_file`` problem lines of each file, then one line counting the rest (a file
    that is not a record file at all reads as a few lines, not one per line of it; ``--json``
    lists every problem)."""
    shown: list[str] = []
    left: dict[str, int] = {}
    for p in problems:
        m = re.match(r"(.+?):\d+: ", p)  # ``file:line: what`` (load_records' and the report's form)
        file = m.group(1) if m else p
        if sum(1 for q in shown if q.startswith(file + ":")) < per_file:
            shown.append(p)
        else:
            left[file] = left.get(file, 0) + 1
    return shown + [f"{f}: {n} more problem line(s) (ftplan validate --json lists them all)" for f, n in left.items()]


def _measure_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("model", nargs="?", help="catalog name, hub id, or path to config.json")
    add_job_options(s)
    add_layout_options(s)
    m = s.add_argument_group("measurement")
    m.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    m.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the median step time (default 1, or 2 above 5 steps)")
    m.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    m.add_argument("--tiny", action="store_true",
                   help="shrink to a tiny config of the same family (automatic on CPU above 1B params)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--out", default=None, help="append the record to this .jsonl file")
    m.add_argument("--matrix", default=None, help="YAML/CSV file of jobs; resumable with --out")
    m.add_argument("--remeasure", action="store_true",
                   help="with --matrix: measure rows already in --out again (appended; validate scores the "
                        "latest record of a configuration), e.g. after a library upgrade or a harness fix")
    m.add_argument("--json", action="store_true", help="print the record as JSON")


def _validate_args(v: argparse.ArgumentParser) -> None:
    v.add_argument("records", nargs="*", help=".jsonl files (default: benchmarks/measurements/*.jsonl)")
    v.add_argument("--json", action="store_true")
    v.add_argument("--update-ratchet", action="store_true",
                   help="tighten the ratchet to the figures reached (never loosens): without RECORDS "
                        "benchmarks/ratchet.json; with your own RECORDS only the --ratchet FILE given "
                        "(created when missing); nothing is written when malformed lines make it exit 2")
    v.add_argument("--ratchet", default=None, metavar="FILE",
                   help="hold the records to this ratchet file (default: benchmarks/ratchet.json when "
                        "no RECORDS are given, none for your own record files)")
    v.add_argument("--check", action="store_true", help="exit 1 when a target or the ratchet is missed")
    v.add_argument("--skip-bad", action="store_true",
                   help="skip malformed record lines with a warning (default: report them, exit 2)")


COMMANDS = {
    "measure": Command("train a model for a few steps and record memory and speed (needs the 'measure' extra)",
                       _measure_args, run_measure),
    "validate": Command("predicted vs measured over measurement records", _validate_args, run_validate),
}
