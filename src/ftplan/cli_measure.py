"""``ftplan measure`` and ``ftplan validate``: the measurement side of the command line.

Wired into :mod:`ftplan.cli` by ``_add_measure_commands(sub)`` calling
:func:`add_measure_commands`. torch is imported only when ``measure`` runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import ConfigError

__all__ = ["add_measure_commands", "cmd_measure", "cmd_validate", "row_to_argv"]

_BOOL_FLAGS = {"gc": "--gc", "gradient_checkpointing": "--gc", "no_double_quant": "--no-double-quant"}
_ROW_ONLY = {"model", "steps", "warmup", "seed", "tiny", "device", "name", "note", "notes"}


def _truthy(v) -> bool:
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "y", "on")


def row_to_argv(row: dict) -> list[str]:
    """Matrix row -> job-option argv (``micro_batch: 4`` -> ``--micro-batch 4``)."""
    argv: list[str] = []
    for k, v in row.items():
        key = str(k).strip().replace("-", "_")
        if key in _ROW_ONLY or v is None:
            continue
        if key in _BOOL_FLAGS:
            if _truthy(v):
                argv.append(_BOOL_FLAGS[key])
            continue
        if key == "double_quant":
            if not _truthy(v):
                argv.append("--no-double-quant")
            continue
        if key in ("batch", "batch_size"):
            key = "micro_batch"
        if key == "attn_impl":
            key = "attn"
        if isinstance(v, (list, tuple)):
            v = ",".join(map(str, v))
        argv += ["--" + key.replace("_", "-"), str(v)]
    return argv


def _job_parser():
    from .cli import _Parser, add_job_options

    p = _Parser(prog="ftplan measure --matrix (row)", add_help=False)
    add_job_options(p)
    return p


def _row_job(row: dict, where: str):
    from .cli import job_from_args
    from .errors import FtplanError

    try:
        a = _job_parser().parse_args(row_to_argv(row))
    except FtplanError as e:
        raise ConfigError(f"{where}: {e.message}", "matrix keys are job options: method, micro_batch, seq_len, "
                          "gc, optimizer, precision, lora_r, ...") from None
    return job_from_args(a)


def cmd_measure(a: argparse.Namespace) -> int:
    from .cli import job_from_args, layout_from_args
    from .measure.run import ModelCache, measure

    if a.matrix:
        return _run_matrix(a)
    if not a.model:
        raise ConfigError("measure needs a MODEL or --matrix FILE", "see 'ftplan measure --help'")
    job = job_from_args(a)
    layout = layout_from_args(a)
    rec = measure(a.model, job, layout, steps=a.steps, warmup=a.warmup, device=a.device,
                  tiny=True if a.tiny else None, seed=a.seed, out=a.out, cache=ModelCache(),
                  echo=None if a.json else print)
    if a.json:
        json.dump(rec, sys.stdout, indent=2)
        sys.stdout.write("\n")
    if a.out:
        print(f"appended to {a.out}", file=sys.stderr)
    return 0 if rec["outcome"] in ("ok", "oom") else 1


def _run_matrix(a: argparse.Namespace) -> int:
    from .measure.records import existing_keys, record_key
    from .measure.run import ModelCache, build_key, load_matrix, measure, progress

    if not a.out:
        raise ConfigError("--matrix needs --out FILE.jsonl", "the output file is what makes the matrix resumable")
    rows = load_matrix(a.matrix)
    jobs = []
    for i, row in enumerate(rows, 1):
        job = _row_job(row, f"{a.matrix}: row {i}")
        steps = int(row.get("steps", a.steps))
        tiny = True if (a.tiny or _truthy(row.get("tiny", False))) else None
        jobs.append((i, str(row["model"]), job, steps, tiny))
    # group rows by build key (stable) so each model is built once
    try:
        import torch

        dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    except ImportError:
        dev = a.device or "cpu"
    dev = "cuda" if dev.startswith("cuda") else dev
    order: dict[tuple, list] = {}
    for item in jobs:
        order.setdefault(build_key(item[1], item[2], dev, bool(item[4])), []).append(item)
    ordered = [it for group in order.values() for it in group]
    from .job import Layout

    layout = Layout()
    done = existing_keys(a.out)
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
                          seed=a.seed, out=a.out, cache=cache, echo=print)
        except ConfigError as e:  # a bad row does not stop the campaign
            counts["error"] += 1
            progress(k, n, f"{desc}: skipped: {e.one_line()}")
            continue
        counts[rec["outcome"]] += 1
        done.add(rec["key"])
        progress(k, n, f"{desc}: {rec['outcome']}")
    cache.clear()
    print(f"matrix {a.matrix}: {counts['ok']} ok, {counts['oom']} oom, {counts['error']} error, "
          f"{counts['skipped']} skipped (already measured) -> {a.out}", file=sys.stderr)
    return 0


def cmd_validate(a: argparse.Namespace) -> int:
    from .measure.validate import default_record_paths, render_text, update_ratchet, validate_paths

    paths = a.records or default_record_paths()
    report = validate_paths(paths)
    if a.update_ratchet:
        changed = update_ratchet(report, Path(a.ratchet) if a.ratchet else None)
        report["ratchet_updated"] = changed
    if a.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_text(report))
    for p in report["problems"]:
        print(f"ftplan: {'warning' if a.skip_bad else 'error'}: {p}", file=sys.stderr)
    if report["problems"] and not a.skip_bad:
        return 2  # malformed lines: reported with file:line; --skip-bad to accept them
    if a.check and report["meets_targets"] is False:
        return 1
    return 0


def add_measure_commands(sub) -> None:
    """Add ``measure`` and ``validate`` to the ``ftplan`` sub-command parser ``sub``."""
    from .cli import add_job_options, add_layout_options

    s = sub.add_parser("measure", help="train a model for a few steps and record memory and speed "
                       "(needs the 'measure' extra)")
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
    m.add_argument("--json", action="store_true", help="print the record as JSON")
    s.set_defaults(func=cmd_measure)

    v = sub.add_parser("validate", help="predicted vs measured over measurement records")
    v.add_argument("records", nargs="*", help=".jsonl files (default: benchmarks/measurements/*.jsonl)")
    v.add_argument("--json", action="store_true")
    v.add_argument("--update-ratchet", action="store_true",
                   help="tighten benchmarks/ratchet.json to the figures reached (never loosens)")
    v.add_argument("--ratchet", default=None, help="ratchet file (default benchmarks/ratchet.json)")
    v.add_argument("--check", action="store_true", help="exit 1 when a target or the ratchet is missed")
    v.add_argument("--skip-bad", action="store_true",
                   help="skip malformed record lines with a warning (default: report them, exit 2)")
    v.set_defaults(func=cmd_validate)


def main(argv=None) -> int:
    """``python -m ftplan.cli_measure ...``: the ftplan CLI with measure/validate wired in."""
    from . import cli

    cli._add_measure_commands = add_measure_commands
    return cli.main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
