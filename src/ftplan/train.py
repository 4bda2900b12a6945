"""``ftplan train``: run a plan on this machine with the generated TRL script.

The steps, in order (everything that can be wrong with the *input* is found before anything heavy
starts, and reported as one line with exit code 2):

1. check the model directory (``config.json``, tokenizer files, weights) and the dataset (it exists;
   a local file/folder has a ``messages``, ``prompt`` + ``completion`` or ``text`` field);
2. check the job against the model (:func:`ftplan.job.validate_job`) and against this machine:
   installed packages, GPU count, bf16 support, flash-attn (torch is imported here, lazily);
3. write ``train.py`` (:func:`ftplan.export.script.render_train_script`), ``plan.json`` and, for
   several GPUs, the accelerate (+ DeepSpeed) config into the output directory: written in a
   temporary sibling directory and renamed, so a failure leaves nothing behind;
4. run it (``python train.py`` on one GPU or CPU, ``accelerate launch --num_processes N`` on
   several), streaming its output (the trainer's progress bar) to the terminal and ``train.log``;
5. print predicted (:func:`ftplan.memory.estimate_memory`, :mod:`ftplan.runtime`) vs measured peak
   memory and tokens/s from the script's ``--report-json``; with ``record`` append a
   ``ftplan.measurement/1`` record (:mod:`ftplan.measure.records`).

Planning never imports torch; this module imports it only inside :func:`check_machine`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError, Problem

__all__ = [
    "FIELD_SETS",
    "check_model_dir",
    "check_dataset",
    "load_plan_json",
    "check_machine",
    "Machine",
    "write_run_dir",
    "launch_command",
    "run_streaming",
    "compare_text",
    "build_record",
    "train",
]

#: the fields the script trains on, in order of preference (the first complete set wins)
FIELD_SETS: tuple[tuple[str, ...], ...] = (("messages",), ("prompt", "completion"), ("text",))
DATA_EXTS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
REPORT = "report.json"
#: a .json dataset larger than this is not parsed here to find its fields (the script does)
_MAX_CHECKED_JSON_BYTES = 256 * 2**20
SCRIPT = "train.py"
#: largest --max-steps / --save-steps / --logging-steps accepted (a validation limit)
MAX_STEPS = 10**9
LOG = "train.log"


def _fields_error(spec: str, found: list[str]) -> ConfigError:
    return ConfigError(
        f"dataset {spec!r} has no 'messages', 'prompt'+'completion' or 'text' field "
        f"(fields found: {', '.join(found) or 'none'})",
        "rename the column, e.g. to 'text'")


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def check_model_dir(path: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """(directory, config.json) of a local model directory, or ``ConfigError``."""
    from .inputs import check_text

    check_text(str(path), "model directory")
    p = Path(os.path.expanduser(str(path)))
    try:
        found = p.exists()
    except (OSError, ValueError) as e:  # e.g. a name too long for the file system
        raise ConfigError(f"model directory {str(p)[:200]!r} cannot be read: {getattr(e, 'strerror', None) or e}",
                          "pass a local folder with config.json, tokenizer and weights") from None
    if not found:
        raise ConfigError(f"no model directory {str(p)!r}",
                          "pass a local folder with config.json, tokenizer and weights "
                          "(e.g. huggingface-cli download ORG/NAME --local-dir DIR)")
    if not p.is_dir():
        raise ConfigError(f"model {str(p)!r} is not a directory", "pass the folder that holds config.json")
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"model directory {str(p)!r} has no config.json", "pass a Hugging Face model folder")
    from .inputs import load_json_text, read_text_file

    cfg = load_json_text(read_text_file(cfg_path, "config file", max_bytes=8 * 2**20), str(cfg_path))
    if not isinstance(cfg, dict):
        raise ConfigError(f"{cfg_path}: not a JSON object")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"model directory {str(p)!r} has no tokenizer files ({', '.join(TOKENIZER_FILES)})",
                          "save the tokenizer there too (tokenizer.save_pretrained(DIR))")
    names = [f.name for f in p.iterdir()]
    if not any(n.endswith(".safetensors") or n.endswith(".bin") or n.endswith(".index.json") for n in names):
        raise ConfigError(f"model directory {str(p)!r} has no weights (*.safetensors or *.bin)",
                          "save the model there with save_pretrained(DIR)")
    return p, cfg


def _looks_local(spec: str) -> bool:
    """A path rather than a hub dataset name (``name`` or ``org/name``)."""
    s = spec.strip()
    return (s.startswith(("/", ".", "~")) or "\\" in s or s.count("/") > 1
            or Path(s).suffix.lower() in DATA_EXTS)


def _jsonl_keys(path: Path, rows: int = 50) -> list[str]:
    keys: dict[str, None] = {}
    n = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except RecursionError:
                raise ConfigError(f"dataset {str(path)!r}: line {i} is nested too deeply") from None
            except ValueError as e:
                raise ConfigError(f"dataset {str(path)!r}: line {i} is not JSON ({e})",
                                  "one JSON object per line") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"dataset {str(path)!r}: line {i} is not a JSON object",
                                  "one JSON object per line")
            keys.update(dict.fromkeys(obj))
            n += 1
            if n >= rows:
                break
    if n == 0:
        raise ConfigError(f"dataset {str(path)!r} has no rows")
    return list(keys)


def _file_keys(path: Path) -> list[str] | None:
    """Column names of a data file, or None when they cannot be read without extra packages."""
    ext = path.suffix.lower()
    if ext == ".jsonl":
        return _jsonl_keys(path)
    if ext == ".json":
        try:
            with open(path, encoding="utf-8") as f:
                head = f.read(1)
                while head and head.isspace():
                    head = f.read(1)
            if head == "{":
                try:  # JSON Lines written as .json
                    return _jsonl_keys(path)
                except ConfigError:
                    pass
            if path.stat().st_size > _MAX_CHECKED_JSON_BYTES:
                return None  # too big to parse whole here: the script checks its fields
            doc = json.loads(path.read_text(encoding="utf-8"))
        except RecursionError:
            raise ConfigError(f"dataset {str(path)!r}: nested too deeply") from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"dataset {str(path)!r}: not valid JSON ({e})") from None
        if isinstance(doc, list):
            if not doc:
                raise ConfigError(f"dataset {str(path)!r} has no rows")
            return list({k: None for row in doc[:50] if isinstance(row, dict) for k in row})
        if isinstance(doc, dict):
            return list(doc)  # columnar {"text": [...]}
        raise ConfigError(f"dataset {str(path)!r}: expected a list of objects")
    if ext == ".csv":
        import csv

        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            header = next(csv.reader(f), None)
        if not header:
            raise ConfigError(f"dataset {str(path)!r} has no header row")
        return [h.strip() for h in header]
    return None  # parquet: the script checks


def _saved_dataset_keys(p: Path, depth: int = 0) -> list[str] | None:
    """Features of a ``datasets.save_to_disk`` folder (Dataset or DatasetDict, 'train' preferred)."""
    if (p / "dataset_dict.json").is_file():
        try:
            doc = json.loads((p / "dataset_dict.json").read_text())
        except (OSError, ValueError, RecursionError):
            return None
        splits = doc.get("splits") if isinstance(doc, dict) else None
        if not isinstance(splits, list) or not all(isinstance(x, str) and x and "/" not in x and x not in (".", "..")
                                                   for x in splits):
            return None
        split = "train" if "train" in splits else (splits[0] if splits else None)
        return _saved_dataset_keys(p / split, depth + 1) if split and depth < 2 else None
    info = p / "dataset_info.json"
    if info.is_file():
        try:
            doc = json.loads(info.read_text())
        except (OSError, ValueError, RecursionError):
            return None
        feats = doc.get("features") if isinstance(doc, dict) else None
        return list(feats) if isinstance(feats, dict) else None
    return None


def check_dataset(spec: str) -> tuple[str, tuple[str, ...] | None]:
    """('local' | 'hub', the field set the script will use or None if not checkable here).

    A local file or folder must exist and (for JSONL/JSON/CSV and ``save_to_disk`` folders) have
    one of :data:`FIELD_SETS`; a hub name (``org/name``) is checked by the script when it loads it.
    """
    from .inputs import check_text

    check_text(spec, "dataset")
    p = Path(os.path.expanduser(spec))
    try:
        exists = p.exists()
    except OSError:  # a name longer than NAME_MAX: not a local path
        exists = False
    if not exists:
        if _looks_local(spec) or not spec.strip():
            raise ConfigError(f"no dataset {spec!r}",
                              "pass a JSONL/JSON/Parquet/CSV file, a folder of them, a save_to_disk "
                              "folder or a hub dataset name")
        return "hub", None
    keys: list[str] | None
    if p.is_file():
        if p.suffix.lower() not in DATA_EXTS:
            raise ConfigError(f"dataset file {spec!r} must end in {', '.join(DATA_EXTS)}")
        keys = _file_keys(p)
    else:
        keys = _saved_dataset_keys(p)
        if keys is None:
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in DATA_EXTS
                           and not f.name.startswith("."))
            jsonish = [f for f in files if f.suffix.lower() in (".jsonl", ".json")]
            if not files:
                raise ConfigError(f"dataset folder {spec!r} holds no {', '.join(DATA_EXTS)} files "
                                  "and is not a save_to_disk folder")
            keys = _file_keys((jsonish or files)[0])
    if keys is None:
        return "local", None
    for fields in FIELD_SETS:
        if all(f in keys for f in fields):
            return "local", fields
    raise _fields_error(spec, keys)


def _has_chat_template(model_dir: Path) -> bool:
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((model_dir / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


# ---------------------------------------------------------------------------------------------
# plans from JSON
# ---------------------------------------------------------------------------------------------
def load_plan_json(path: str | os.PathLike, index: int = 1):
    """(Job, Layout) from a ``--json`` document of estimate, recommend or compare (``index`` from 1).

    ``recommend``: the index-th of ``plans``; ``compare``: the index-th of ``per_gpu``; any other
    object with ``job`` and ``layout`` (``estimate``, a bundle's plan.json) is used as is.
    """
    from .inputs import check_text, load_json_text, read_text_file, show_value
    from .job import check_job_fields
    from .options import job_from_dict, layout_from_dict

    check_text(str(path), "plan file")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ConfigError(f"`plan` must be an integer (got {show_value(index)})", field="plan")
    p = Path(os.path.expanduser(str(path)))
    hint = "save the document of `ftplan recommend --json` to a file and pass that"
    if not p.exists():
        raise ConfigError(f"no plan file {str(p)!r}", hint)
    doc = load_json_text(read_text_file(p, "plan file", max_bytes=64 * 2**20, hint=hint), str(p), hint=hint)
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: not a JSON object")
    entry: Any = doc
    for key in ("plans", "per_gpu"):
        if isinstance(doc.get(key), list):
            plans = doc[key]
            if not plans:
                raise ConfigError(f"{p}: the document has no plans", "relax the constraints of `ftplan recommend`")
            if not 1 <= index <= len(plans):
                raise ConfigError(f"`plan={index}` is out of range", f"{p} has plans 1..{len(plans)}")
            entry = plans[index - 1]
            break
    else:
        if isinstance(doc.get("plan"), dict):
            entry = doc["plan"]
    if not isinstance(entry, dict):
        raise ConfigError(f"{p}: plan {index} is not a JSON object",
                          "pass a document saved from `ftplan recommend --json` (or from estimate / compare)")
    job_d, layout_d = entry.get("job"), entry.get("layout")
    if not isinstance(job_d, dict) or not isinstance(layout_d, dict):
        raise ConfigError(f"{p}: no 'job' and 'layout' in the plan",
                          "pass a document saved from `ftplan recommend --json` (or from estimate / compare)")
    doc_job = doc.get("job") if isinstance(doc.get("job"), dict) else {}
    base = dict(doc_job) if entry is not doc else {}
    base.update(job_d)  # a plan's job variant over the document's job (dataset_tokens, epochs, lora ...)
    for k in ("lora", "quant"):
        if isinstance(doc_job.get(k), dict) and k not in job_d:
            base[k] = doc_job[k]
    for k in ("lora", "quant"):
        if k in base and base[k] is not None and not isinstance(base[k], dict):
            raise ConfigError(f"{p}: malformed job ('{k}' is not an object)",
                              "pass a document saved from `ftplan recommend --json` (or from estimate / compare)")
    try:
        job, layout = job_from_dict(base), layout_from_dict(layout_d)
    except ConfigError as e:
        raise ConfigError(f"{p}: malformed job or layout ({e.one_line()})",
                          "pass a document saved from `ftplan recommend --json` (or from estimate / compare)") from None
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as e:
        raise ConfigError(f"{p}: malformed job or layout ({type(e).__name__}: {str(e)[:200]})",
                          "pass a document saved from `ftplan recommend --json` (or from estimate / compare)") from None
    try:
        check_job_fields(job, layout)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e.one_line()}") from None
    return job, layout


# ---------------------------------------------------------------------------------------------
# this machine
# ---------------------------------------------------------------------------------------------
@dataclass
class Machine:
    device: str  # "cuda" | "cpu"
    gpus: int
    gpu_name: str | None = None
    notes: list[str] = field(default_factory=list)


def _need(module: str, why: str, pip: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"{why} needs the {module} package, which is not installed", f"pip install {pip}")


def check_machine(job, layout) -> Machine:
    """What this machine can run of ``job``/``layout``; ``ConfigError`` for what it cannot."""
    if job.torchao_nf4:
        raise ConfigError("ftplan train runs the TRL/PEFT/bitsandbytes script; torchao-nf4 plans torchtune's QLoRA",
                          "use `quant_type=nf4`, or torchtune's own recipe")
    if layout.nodes > 1:
        raise ConfigError(f"ftplan train runs on this machine; the plan spans {layout.nodes} nodes",
                          "use `ftplan export` for a multi-node launch, or `nodes=1`")
    if layout.tp > 1 or layout.pp > 1:
        raise ConfigError("the TRL/accelerate script does not do tensor or pipeline parallelism",
                          "set `tp=1` and `pp=1` (`strategy=zero3` or `strategy=fsdp` shard a large model)")
    for mod in ("torch", "transformers", "accelerate", "trl", "datasets"):
        _need(mod, "ftplan train", "'ftplan[train]'")
    if job.uses_lora:
        _need("peft", f"`method={job.method}`", "peft")
    if job.method == "qlora" or job.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        _need("bitsandbytes", "QLoRA" if job.method == "qlora" else f"`optimizer={job.optimizer}`", "bitsandbytes")
    if layout.strategy in ("zero1", "zero2", "zero3") and layout.world_size > 1:
        _need("deepspeed", f"`strategy={layout.strategy}`", "deepspeed (or use `strategy=fsdp`)")
    import torch  # the one place torch is imported

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        m = Machine("cpu", 0)
        if layout.world_size > 1:
            raise ConfigError(f"the plan uses {layout.world_size} GPUs and this machine has no CUDA GPU",
                              "run it on a GPU machine, or `gpus=1` to try it on CPU")
        if job.attn_impl == "flash":
            raise ConfigError("`attn=flash` needs a CUDA GPU", "use `attn=sdpa` on CPU")
        if job.method == "qlora":
            m.notes.append("QLoRA on CPU runs bitsandbytes' CPU kernels: slow, for checking a setup")
        m.notes.append("no CUDA GPU: training on CPU (tokens/s measured, peak memory not)")
        return m
    name = torch.cuda.get_device_name(0)
    m = Machine("cuda", n, name)
    if layout.world_size > n:
        raise ConfigError(f"the plan uses {layout.world_size} GPUs and this machine has {n}",
                          f"use `gpus={n}` (and a strategy that fits), or a bigger machine")
    from .job import PRECISIONS

    compute = job.quant.compute_dtype if job.method == "qlora" else PRECISIONS[job.precision]["compute"]
    if compute == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"{name} has no bf16 support", "use `precision=fp16-mixed` (and `compute_dtype=fp16`)")
    if job.attn_impl == "flash":
        _need("flash_attn", "`attn=flash`", "flash-attn")
    return m


# ---------------------------------------------------------------------------------------------
# the run directory
# ---------------------------------------------------------------------------------------------
def write_run_dir(out: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (name -> text) into ``out`` atomically: a temporary sibling, then a rename.

    ``out`` must not exist, or be an empty directory.
    """
    out = Path(os.path.expanduser(str(out)))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"output directory {str(out)!r} already exists and is not empty",
                          "pass a new `out` directory (checkpoints and the trained model go there)")
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    except OSError as e:
        raise ConfigError(f"cannot create {str(out)!r}: {e.strerror}") from None
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        if (tmp / SCRIPT).exists():
            (tmp / SCRIPT).chmod(0o755)
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _accelerate_files(job, layout, title: str) -> dict[str, str]:
    """accelerate (+ DeepSpeed) config for a multi-GPU launch.

    The same files ``ftplan export`` puts in its bundle (:mod:`ftplan.export.accelerate`,
    :mod:`ftplan.export.deepspeed`); a minimal config if those modules are missing.
    """
    try:
        from .export.accelerate import backend, render_accelerate_config
        from .export.deepspeed import render_deepspeed_config
    except ImportError:
        return {"accelerate_config.yaml": _minimal_accelerate_config(job, layout)}
    kind = backend(layout)
    files = {"accelerate_config.yaml": render_accelerate_config(layout, job, kind=kind, title=title)}
    if kind == "deepspeed":
        files["ds_config.json"] = render_deepspeed_config(layout, job)
    return files


def _minimal_accelerate_config(job, layout) -> str:
    mp = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}.get(job.precision, "no")
    s = layout.strategy
    lines = ["# accelerate config written by ftplan train", "compute_environment: LOCAL_MACHINE"]
    if s == "ddp":
        lines.append("distributed_type: MULTI_GPU")
    elif s in ("zero1", "zero2", "zero3"):
        lines += ["distributed_type: DEEPSPEED", "deepspeed_config:",
                  f"  zero_stage: {s[-1]}",
                  f"  offload_optimizer_device: {'cpu' if layout.offload_optimizer else 'none'}",
                  f"  offload_param_device: {'cpu' if layout.offload_params else 'none'}",
                  f"  zero3_init_flag: {'true' if s == 'zero3' else 'false'}",
                  "  gradient_accumulation_steps: auto", "  gradient_clipping: auto"]
    else:  # fsdp
        lines += ["distributed_type: FSDP", "fsdp_config:",
                  "  fsdp_version: 1", "  fsdp_sharding_strategy: FULL_SHARD",
                  "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
                  f"  fsdp_offload_params: {'true' if layout.offload_params else 'false'}",
                  "  fsdp_cpu_ram_efficient_loading: true", "  fsdp_sync_module_states: true",
                  "  fsdp_use_orig_params: false", "  fsdp_state_dict_type: SHARDED_STATE_DICT"]
    lines += [f"mixed_precision: {mp}", "machine_rank: 0", "num_machines: 1",
              f"num_processes: {layout.world_size}", "rdzv_backend: static", "same_network: true",
              "use_cpu: false", ""]
    return "\n".join(lines)


def launch_command(out: Path, layout, script_args: list[str]) -> list[str]:
    script = str(out / SCRIPT)
    if layout.world_size == 1:
        return [sys.executable, script, *script_args]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(out / "accelerate_config.yaml"), "--num_processes", str(layout.world_size),
            script, *script_args]


def run_streaming(cmd: list[str], log_path: Path, *, env: dict[str, str] | None = None,
                  echo=None, cwd: Path | None = None) -> tuple[int, str]:
    """Run ``cmd``; its stdout+stderr go to ``echo`` (default: this process's stdout) and ``log_path``
    as they come (progress bars included). Returns (exit code, last 4 KiB of output)."""
    echo = echo or sys.stdout
    sink = getattr(echo, "buffer", None)
    tail = b""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, cwd=cwd)
        assert proc.stdout is not None
        try:
            while True:
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                log.write(chunk)
                if sink is not None:
                    sink.write(chunk)
                else:
                    echo.write(chunk.decode("utf-8", errors="replace"))
                echo.flush()
                tail = (tail + chunk)[-4096:]
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    return rc, tail.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# predicted vs measured
# ---------------------------------------------------------------------------------------------
def _gib(n: float | None) -> str:
    from .units import human_bytes

    return human_bytes(n)


def _err(pred: float | None, meas: float | None) -> str:
    if pred is None or not meas:
        return ""
    return f"{(pred - meas) / meas * 100:+.1f} %"


def _tps(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def compare_text(report: dict[str, Any], predicted: dict[str, Any] | None,
                 predicted_seen: dict[str, Any] | None, job) -> str:
    """The end-of-run summary: measured (and, on CUDA, predicted) peak memory and tokens/s."""
    lines = [f"trained {report.get('steps')} steps in {report.get('wall_s', 0):.1f} s on "
             f"{report.get('device_name') or report.get('device')}"
             + (f" x {report['world_size']}" if (report.get("world_size") or 1) > 1 else "")]
    seen = report.get("max_seq_len_seen")
    if report.get("device") != "cuda":
        lines.append(f"  tokens/s (measured): {_tps(report.get('tokens_per_s'))}; peak memory was not "
                     "measured (CPU run: no CUDA allocator)")
        return "\n".join(lines)
    p = predicted or {}
    ps = predicted_seen or {}
    head = f"  {'':16} {'measured':>12} {'predicted':>12} {'error':>9}"
    if predicted_seen:
        head += f"   {f'predicted @ {seen} tokens':>24} {'error':>9}"
    lines.append(head)
    for label, key in (("peak allocated", "peak_allocated_bytes"), ("peak reserved", "peak_reserved_bytes")):
        m = report.get(key)
        row = f"  {label:16} {_gib(m):>12} {_gib(p.get(key)):>12} {_err(p.get(key), m):>9}"
        if predicted_seen:
            row += f"   {_gib(ps.get(key)):>24} {_err(ps.get(key), m):>9}"
        lines.append(row)
    m = report.get("tokens_per_s")
    row = f"  {'tokens/s':16} {_tps(m):>12} {_tps(p.get('tokens_per_s')):>12} {_err(p.get('tokens_per_s'), m):>9}"
    if predicted_seen:
        row += f"   {_tps(ps.get('tokens_per_s')):>24} {_err(ps.get('tokens_per_s'), m):>9}"
    lines.append(row)
    if p.get("tokens_per_s") is None and p.get("tokens_per_s_note"):
        lines.append(f"  (no tokens/s prediction: {p['tokens_per_s_note']})")
    if seen and seen < job.seq_len:
        lines.append(f"  note: the longest padded batch had {seen} tokens (planned `seq_len={job.seq_len}`); "
                     "memory for full-length batches is the 'predicted' column")
    return "\n".join(lines)


def _predict(spec, job, layout, gpu_name):
    from .measure.predict import predict

    try:
        return predict(spec, job, layout, gpu_name)
    except Exception:  # a prediction problem must not hide the measurement
        return None


def build_record(*, model_ref: str, spec, config: dict, job, layout, report: dict | None,
                 predicted: dict | None, outcome: str, error: str | None, seed: int,
                 machine: Machine, notes: list[str]) -> dict[str, Any]:
    """A ``ftplan.measurement/1`` record of this run (see :mod:`ftplan.measure.records`)."""
    from .version import __version__
    from .measure.records import SCHEMA, job_to_dict, layout_to_dict, record_key

    r = report or {}
    versions = r.get("versions") or {}
    device = machine.device
    times = r.get("step_times_s") or []
    measured = {
        "baseline_allocated_bytes": None, "baseline_reserved_bytes": None,
        "peak_allocated_bytes": r.get("peak_allocated_bytes"),
        "peak_reserved_bytes": r.get("peak_reserved_bytes"),
        "peak_is_lower_bound": outcome == "oom",
        "nvml_used_before_bytes": None, "nvml_used_bytes": None, "nvml_process_bytes": None,
        "reserved_at_nvml_bytes": None,
        "step_times_s": times, "median_step_s": r.get("median_step_s"),
        "tokens_per_s": r.get("tokens_per_s"),
        "loss_first": r.get("loss_first"), "loss_last": r.get("loss_last"),
        "tensors": None,
        "max_seq_len_seen": r.get("max_seq_len_seen"),
        "mean_tokens_per_micro_batch": r.get("mean_tokens_per_micro_batch"),
        "real_tokens_seen": r.get("real_tokens_seen"),
    }
    return {
        "schema": SCHEMA,
        "key": record_key(model_ref, job, layout, device, False),
        "outcome": outcome,
        "error": error,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "model": {"ref": model_ref, "name": spec.name, "hf_id": spec.hf_id, "family": spec.family,
                  "params_total": spec.params.total, "tiny": False, "config": config},
        "job": job_to_dict(job),
        "layout": layout_to_dict(layout),
        "run": {"device": device, "tiny": False, "steps": r.get("steps"), "warmup": 1 if len(times) > 1 else 0,
                "seed": seed, "attn_implementation": (r.get("plan") or {}).get("ATTN_IMPLEMENTATION"),
                "source": "ftplan train (TRL SFTTrainer, real data)", "world_size": layout.world_size,
                "notes": list(notes)},
        "env": {"python": platform.python_version(), "torch": versions.get("torch"),
                "transformers": versions.get("transformers"), "peft": versions.get("peft"),
                "bitsandbytes": versions.get("bitsandbytes"), "accelerate": versions.get("accelerate"),
                "trl": versions.get("trl"), "datasets": versions.get("datasets"),
                "cuda": r.get("cuda"), "driver": None, "gpu_name": r.get("device_name") if device == "cuda" else None,
                "gpu_total_bytes": r.get("device_total_bytes"),
                "cpu": platform.processor() or platform.machine(), "ftplan": __version__},
        "measured": measured,
        "predicted": predicted,
    }


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------
def train(model_dir: str, dataset: str, out: str, job, layout, *, max_steps: int | None = None,
          save_steps: int | None = None, logging_steps: int | None = None, seed: int = 42,
          record: str | None = None, echo: Callable[[str], None] = print, stream=None) -> int:
    """``ftplan train``: validate, write the run directory, run the script, compare, record."""
    from .catalog.models import resolve_model
    from .export.script import render_train_script
    from .job import validate_job

    from .inputs import check_text, show_value

    problems: list[Problem] = []
    for value, name in ((max_steps, "max_steps"), (save_steps, "save_steps"), (logging_steps, "logging_steps")):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(Problem(name, f"`{name}` must be an integer (got {show_value(value)})"))
        elif not 1 <= value <= MAX_STEPS:
            problems.append(Problem(name, f"`{name}` must be in 1..{MAX_STEPS:,} (got {show_value(value)})"))
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        problems.append(Problem("seed", f"`seed` must be an integer in 0..{2**32 - 1} (got {show_value(seed)})"))
    if problems:
        raise ConfigError(problems=problems)
    check_text(out, "output folder")
    if record is not None:
        check_text(record, "record file")
    mdir, config = check_model_dir(model_dir)
    spec = resolve_model(str(mdir))
    validate_job(spec, job, layout)
    _kind, fields = check_dataset(dataset)
    if fields == ("messages",) and not _has_chat_template(mdir):
        raise ConfigError(f"dataset {dataset!r} is chat ('messages') but the tokenizer in {str(mdir)!r} has "
                          "no chat_template", "use a 'text' dataset, or a model with a chat template")
    outp = Path(os.path.expanduser(out))
    if outp.exists() and (not outp.is_dir() or any(outp.iterdir())):
        raise ConfigError(f"output directory {str(outp)!r} already exists and is not empty",
                          "pass a new `out` directory (checkpoints and the trained model go there)")
    if record:
        rp = Path(os.path.expanduser(record))
        if rp.exists() and not rp.is_file():
            raise ConfigError(f"`record` {record!r} is not a regular file", "pass a .jsonl file path", field="record")
        if not rp.parent.is_dir():  # found now, not after an hour of training
            raise ConfigError(f"`record` {record!r}: the folder {str(rp.parent)!r} does not exist",
                              "create it first, or pass another path", field="record")
    machine = check_machine(job, layout)  # imports torch

    # everything checked: write the run directory
    from .report import estimate_json
    from .memory import estimate_memory

    model_ref = str(mdir.resolve())
    files = {SCRIPT: render_train_script(spec, job, layout, model_ref=model_ref)}
    mem = estimate_memory(spec, job, layout)
    plan = estimate_json(spec, job, layout, mem)
    plan["job"]["epochs"] = job.epochs
    plan["train"] = {"model_dir": model_ref, "dataset": dataset, "max_steps": max_steps,
                     "save_steps": save_steps, "seed": seed, "device": machine.device}
    files["plan.json"] = json.dumps(plan, indent=2) + "\n"
    if layout.world_size > 1:
        files.update(_accelerate_files(job, layout, f"{spec.name} {job.method}"))
    outp = write_run_dir(outp, files).resolve()  # absolute: the script runs with the run folder as cwd
    for n in machine.notes:
        echo(f"ftplan: {n}")

    ds_arg = str(Path(os.path.expanduser(dataset)).resolve()) if _kind == "local" else dataset
    args = ["--dataset", ds_arg, "--output-dir", str(outp), "--report-json", str(outp / REPORT),
            "--seed", str(seed)]
    if max_steps is not None:
        args += ["--max-steps", str(max_steps)]
    if save_steps is not None:
        args += ["--save-steps", str(save_steps)]
    if logging_steps is not None:
        args += ["--logging-steps", str(logging_steps)]
    cmd = launch_command(outp, layout, args)
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if machine.device == "cuda" and layout.world_size == 1 and not env.get("CUDA_VISIBLE_DEVICES"):
        env["CUDA_VISIBLE_DEVICES"] = "0"  # one GPU: HF Trainer would DataParallel over all visible GPUs
    shown = ["python", *cmd[1:]] if layout.world_size == 1 else ["accelerate", "launch", *cmd[3:]]
    echo(f"ftplan: wrote {outp / SCRIPT}; running: {' '.join(shown)}")
    rc, tail = run_streaming(cmd, outp / LOG, env=env, echo=stream, cwd=outp)  # configs name ds_config.json

    report = None
    rpath = outp / REPORT
    if rc == 0 and rpath.is_file():
        try:
            report = json.loads(rpath.read_text())
        except ValueError:
            report = None
    notes = list(machine.notes)
    predicted = _predict(spec, job, layout, machine.gpu_name)
    predicted_seen = None
    seen = (report or {}).get("max_seq_len_seen")
    if seen and seen < job.seq_len:
        predicted_seen = _predict(spec, job.with_(seq_len=int(seen)), layout, machine.gpu_name)
    if rc != 0:
        last = next((ln.strip() for ln in reversed(tail.replace("\r", "\n").splitlines()) if ln.strip()), "")
        oom = "out of memory" in tail.lower() or "outofmemoryerror" in tail.lower()
        if record:
            from .measure.records import append_record

            rec = build_record(model_ref=model_ref, spec=spec, config=config, job=job, layout=layout,
                               report=None, predicted=predicted, outcome="oom" if oom else "error",
                               error=last[:400] or f"exit code {rc}", seed=seed, machine=machine, notes=notes)
            append_record(record, rec)
        print(f"ftplan: error: the training script failed with exit code {rc}"
              f"{' (out of memory)' if oom else ''}: {last[:300]} (full output in {outp / LOG})",
              file=sys.stderr)
        return rc if rc > 0 else 1
    if report is None:
        print(f"ftplan: error: the training script wrote no report ({rpath})", file=sys.stderr)
        return 1
    echo(compare_text(report, predicted, predicted_seen, job))
    if record:
        from .measure.records import append_record

        rec_job = job
        seen = report.get("max_seq_len_seen")
        if seen and seen < job.seq_len:
            rec_job = job.with_(seq_len=int(seen))
            notes.append(f"real data: longest padded batch {seen} tokens (planned seq_len {job.seq_len}); "
                         "recorded seq_len is the longest batch, which sets the peak")
            predicted = predicted_seen
        rec = build_record(model_ref=model_ref, spec=spec, config=config, job=rec_job, layout=layout,
                           report=report, predicted=predicted, outcome="ok", error=None, seed=seed,
                           machine=machine, notes=notes)
        append_record(record, rec)
        echo(f"ftplan: appended a measurement record to {record}")
    return 0
