"""``ftplan measure``: train a real model for a few steps and record its memory and speed.

The architecture is built from the model's config.json with random weights (no downloads),
directly on the device and in the job's dtypes, the way the reference stack holds it:

* full: ``bf16-mixed``/``fp16-mixed``/``fp32`` -> fp32 weights (+ autocast for the mixed ones, as
  HF Trainer with ``bf16=True``); ``bf16``/``fp16`` -> weights in that dtype.
* lora: frozen base in the precision's frozen dtype + PEFT LoRA (adapters fp32, PEFT's default).
* qlora: the model skeleton is built on the meta device (buffers real), then every ``nn.Linear``
  except ``quant.skip_modules`` is materialised on the device with random weights *one at a time*
  and quantized to bitsandbytes 4-bit at once (never a whole bf16 copy: a 70B QLoRA job fits one
  80 GB GPU), the other parameters are materialised in the compute dtype, then
  ``peft.prepare_model_for_kbit_training`` + LoRA.

Then ``steps`` optimizer steps on random token batches (HF Trainer's defaults: fused AdamW with
weight decay 0, ``zero_grad(set_to_none=True)``). torch is imported inside functions only.
"""

from __future__ import annotations

import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MeasurementError, Problem
from ..inputs import bad_characters
from .configs import tiny_config
from .predict import predict
from .records import SCHEMA, append_record, job_to_dict, layout_to_dict, record_key

__all__ = [
    "measure",
    "ModelCache",
    "tiny_config",
    "predict",
    "load_matrix",
    "import_torch",
    "build_key",
    "format_record",
    "progress",
    "TINY_AUTO_PARAMS",
    "check_run_options",
    "MAX_STEPS",
]

#: on CPU, models above this many parameters are shrunk to a tiny config automatically
TINY_AUTO_PARAMS = 1_000_000_000
GIB = 1024**3


# ---------------------------------------------------------------------------------------------
# environment
# ---------------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class _Nvml:
    """Optional NVML (pynvml from nvidia-ml-py). Every method returns None when unavailable."""

    def __init__(self) -> None:
        self.ok = False
        self.h = None
        try:
            import pynvml  # type: ignore

            pynvml.nvmlInit()
            idx = 0
            vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            if vis.isdigit():
                idx = int(vis)
            self.h = pynvml.nvmlDeviceGetHandleByIndex(idx)
            self.nv = pynvml
            self.ok = True
        except Exception:
            self.ok = False

    def used(self) -> int | None:
        if not self.ok:
            return None
        try:
            return int(self.nv.nvmlDeviceGetMemoryInfo(self.h).used)
        except Exception:
            return None

    def process_used(self) -> int | None:
        if not self.ok:
            return None
        try:
            pid = os.getpid()
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.h):
                if p.pid == pid and p.usedGpuMemory:
                    return int(p.usedGpuMemory)
        except Exception:
            return None
        return None

    def driver(self) -> str | None:
        if not self.ok:
            return None
        try:
            v = self.nv.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:
            return None


def _env(torch, device: str, nvml: _Nvml | None) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "bitsandbytes": _version("bitsandbytes"),
        "accelerate": _version("accelerate"),
        "cuda": getattr(torch.version, "cuda", None),
        "driver": nvml.driver() if nvml else None,
        "gpu_name": None,
        "gpu_total_bytes": None,
        "cpu": platform.processor() or platform.machine(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env["gpu_name"] = torch.cuda.get_device_name(0)
        env["gpu_total_bytes"] = int(props.total_memory)
    return env


# ---------------------------------------------------------------------------------------------
# building (ftplan.measure.hf)
# ---------------------------------------------------------------------------------------------
def build_key(model_ref: str, job, device: str, tiny: bool) -> tuple:
    """Jobs with the same key share one built model (batch, seq, gc, optimizer may differ)."""
    return (model_ref, device, tiny, job.method, job.precision, job.frozen_dtype, job.attn_impl,
            json.dumps(job_to_dict(job)["lora"], sort_keys=True),
            json.dumps(job_to_dict(job)["quant"], sort_keys=True) if job.method == "qlora" else "")


class ModelCache:
    """Holds one built model so matrix rows with the same :func:`build_key` reuse it."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.model = None

    def get(self, key: tuple, make: Callable[[], Any]):
        if self.key == key and self.model is not None:
            return self.model, True
        self.clear()
        self.model = make()
        self.key = key
        return self.model, False

    def clear(self) -> None:
        self.model = None
        self.key = None
        gc.collect()
        import torch  # a model was built: torch is there

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# the measurement
# ---------------------------------------------------------------------------------------------
def _is_oom(torch, e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    text = " ".join(text.split())
    return text if len(text) <= 400 else text[:397] + "..."


def _train_steps(torch, model, job, device: str, steps: int, warmup: int, vocab: int, seed: int,
                 measured: dict, run: dict, sync: Callable[[], None]) -> None:
    """Build the optimizer and run ``steps`` optimizer steps; fills ``measured`` as it goes."""
    from ..job import PRECISIONS
    from .accounting import ForwardSavedBytes, optimizer_state_bytes, unique_bytes
    from .hf import torch_dtype, trainer_optimizer

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise MeasurementError("the built model has no trainable parameters")
    if job.loss == "trl":
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model.get_base_model() if hasattr(model, "get_base_model") else model,
                          outputs=("log_probs", "entropy", "is_top1"))
    offload_ctx = None
    if job.activation_offloading:
        if device != "cuda":
            raise MeasurementError("activation offloading moves activations off a GPU: measure it on CUDA")
        from trl.models.activation_offloading import get_act_offloading_ctx_manager

        offload_ctx = get_act_offloading_ctx_manager(model)
    offload = offload_ctx if offload_ctx is not None else _null()
    opt, opt_desc = trainer_optimizer(job.optimizer, params)
    run["optimizer_impl"] = opt_desc
    prec = PRECISIONS[job.precision]
    autocast = job.precision.endswith("-mixed")
    cdtype = torch_dtype(prec["compute"])
    dev_type = "cuda" if device == "cuda" else "cpu"
    g = torch.Generator(device="cpu").manual_seed(seed)
    batches = [torch.randint(0, vocab, (job.micro_batch, job.seq_len), generator=g).to(device)
               for _ in range(job.grad_accum)]
    # a padded micro-batch (Job.padded_batches): the last row shorter, as TRL's collator pads it
    from .torchref import pad_batch

    batches = [pad_batch(ids) if job.has_padding else {"input_ids": ids, "labels": ids} for ids in batches]
    if device == "cuda":
        sync()
        measured["baseline_allocated_bytes"] = int(torch.cuda.memory_allocated())
        measured["baseline_reserved_bytes"] = int(torch.cuda.memory_reserved())
        torch.cuda.reset_peak_memory_stats()
    tensors = {"param_bytes": unique_bytes(model.parameters(), with_quant_state=True), "grad_bytes": None, "optimizer_state_bytes": None,
               "saved_activation_bytes": None, "saved_weight_copy_bytes": None}
    measured["tensors"] = tensors
    times: list[float] = []
    losses: list[float] = []
    for step in range(steps):
        sync()
        t0 = time.perf_counter()
        for i, inputs in enumerate(batches):
            tracker = ForwardSavedBytes(model) if step == 0 and i == 0 and offload_ctx is None else None
            ctx = torch.autocast(dev_type, dtype=cdtype) if autocast else _null()
            hooks = tracker if tracker else _null()
            with offload:  # TRL: one context around the forward and the backward (training_step)
                with ctx, hooks:
                    if job.loss == "trl":  # SFTTrainer.compute_loss with the fused LM head
                        # num_items_in_batch: HF Trainer's count of the labelled targets, a tensor
                        n_items = (inputs["labels"][:, 1:] != -100).sum()
                        out = model(**inputs, fused_lm_head=True)
                        loss = -out.log_probs.sum() / torch.as_tensor(n_items).clamp(min=1) / job.grad_accum
                    else:
                        out = model(**inputs)
                        loss = out.loss / job.grad_accum
                # Trainer.training_step keeps only the loss for the backward: the model output (and
                # any graph only it references, e.g. TRL's entropy metric) is gone by then
                del out
                if tracker:
                    tracker.count()
                    tensors["saved_activation_bytes"] = tracker.total
                    tensors["saved_weight_copy_bytes"] = tracker.weight_copy_bytes
                loss.backward()
            if i == len(batches) - 1:
                losses.append(float(loss.detach().float().item()) * job.grad_accum)
            del loss
        if step == 0:
            tensors["grad_bytes"] = unique_bytes(p.grad for p in params if p.grad is not None)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        if step == 0:
            tensors["optimizer_state_bytes"] = optimizer_state_bytes(opt)[0]
    measured["step_times_s"] = [round(t, 6) for t in times]
    timed = times[warmup:] or times
    med = statistics.median(timed)
    measured["median_step_s"] = med
    measured["tokens_per_s"] = job.micro_batch * job.seq_len * job.grad_accum / med if med > 0 else None
    measured["loss_first"] = losses[0] if losses else None
    measured["loss_last"] = losses[-1] if losses else None
    if not all(math.isfinite(x) for x in losses):
        run["notes"].append("non-finite loss (random weights): memory and time are still valid")
        measured["loss_first"] = measured["loss_last"] = None
    del opt, params, batches


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _resolve_device(torch, device: str | None) -> str:
    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    d = device.lower()
    if d.startswith("cuda"):
        if not torch.cuda.is_available():
            raise MeasurementError("`device=cuda` but torch sees no CUDA GPU", "use `device=cpu` (with `tiny`)")
        return "cuda"
    if d == "cpu":
        return "cpu"
    raise ConfigError(f"unknown device {device!r}", "use cuda or cpu")


#: largest --steps accepted (a validation limit: a measurement is a few steps)
MAX_STEPS = 100_000


def check_run_options(steps: Any, warmup: Any, seed: Any, out: Any) -> None:
    """Bad run options: one ConfigError listing them, before any model is built or record written."""
    from ..inputs import check_text, show_value

    p: list[Problem] = []
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        p.append(Problem("steps", f"`steps` must be an integer in 1..{MAX_STEPS:,} (got {show_value(steps)})"))
    if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup <= MAX_STEPS):
        p.append(Problem("warmup", f"`warmup` must be an integer in 0..{MAX_STEPS:,} (got {show_value(warmup)})"))
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        p.append(Problem("seed", f"`seed` must be an integer in 0..{2**32 - 1} (got {show_value(seed)})"))
    if p:
        raise ConfigError(problems=p)
    if out is not None:
        check_text(str(out), "record file")
        path = Path(os.path.expanduser(str(out)))
        if path.exists() and not path.is_file():
            raise ConfigError(f"`out` {str(out)!r} is not a regular file", "pass a .jsonl file path", field="out")
        if not path.parent.is_dir():
            raise ConfigError(f"`out` {str(out)!r}: the folder {str(path.parent)!r} does not exist",
                              "create it first, or pass another path", field="out")


def check_measurable(job) -> None:
    """Jobs ``ftplan measure`` does not run (it runs HF Trainer's step on the installed
    transformers): refused before torch is imported, never recorded as an outcome."""
    if job.loss == "liger":
        raise ConfigError("the liger loss path is not measured by ftplan measure (it needs liger-kernel and Triton)",
                          "use `loss=trl` or `loss=hf`", field="loss")
    if job.loss == "hf-legacy":
        raise ConfigError("the hf-legacy loss path is transformers < 4.46 and ftplan measure runs the installed "
                          "transformers", "use `loss=hf`, or benchmarks/loss_peak_cpu.py with transformers 4.44",
                          field="loss")
    if job.keep_output:
        raise ConfigError("ftplan measure runs HF Trainer's step, which drops the model output before backward",
                          "leave `keep_output` off", field="keep_output")
    if job.torchao_nf4:
        raise ConfigError("ftplan measure runs transformers + bitsandbytes QLoRA; torchao-nf4 plans torchtune's "
                          "QLoRA (benchmarks/torchao_nf4_grid_cpu.py holds it on CPU)",
                          "use `quant_type=nf4`", field="quant_type")


def _check_setup(job, device: str) -> None:
    """What this machine cannot run, found before the run (it is bad input, not a measurement)."""
    if job.attn_impl == "flash":
        if device != "cuda":
            raise ConfigError("`attn=flash` needs a CUDA GPU", "use `attn=sdpa` on CPU", field="attn")
        from . import hf

        hf.attn_implementation(job)  # the flash_attn package
    needs = []
    if job.uses_lora:
        needs.append(("peft", f"method {job.method}"))
    if job.method == "qlora" or "8bit" in job.optimizer:
        needs.append(("bitsandbytes", "QLoRA" if job.method == "qlora" else f"optimizer {job.optimizer}"))
    for module, why in needs:
        if importlib.util.find_spec(module) is None:
            raise MeasurementError(f"{why} needs the {module} package, which is not installed",
                                   f"pip install {module}")


def import_torch():
    """torch (and transformers is importable), or a one-line MeasurementError saying what to install."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise MeasurementError(f"ftplan measure needs torch and transformers ({e.name} is missing)",
                               "pip install 'ftplan[measure]'") from None
    return torch


def measure(
    model_ref: str,
    job,
    layout=None,
    *,
    steps: int = 5,
    warmup: int | None = None,
    device: str | None = None,
    tiny: bool | None = None,
    seed: int = 0,
    out: str | os.PathLike | None = None,
    cache: ModelCache | None = None,
    echo: Callable[[str], None] | None = None,
    _step_hook: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """Measure ``job`` on ``model_ref`` for ``steps`` optimizer steps; return (and append) a record.

    Expected failures of the *run* (OOM, a kernel error) become the record's outcome; bad
    *inputs* (unknown model, invalid job, no torch) raise ``FtplanError``.
    """
    from ..catalog.models import resolve_model
    from ..job import Layout, planned_attention, validate_job
    from ..model import model_from_config

    check_run_options(steps, warmup, seed, out)
    layout = layout or Layout()
    if layout.world_size != 1 or layout.tp != 1 or layout.pp != 1:
        raise ConfigError("ftplan measure runs on one GPU", "drop `gpus`, `nodes`, `tp` and `pp`")
    spec = resolve_model(model_ref)
    validate_job(spec, job, layout)
    check_measurable(job)
    torch = import_torch()
    device = _resolve_device(torch, device)
    _check_setup(job, device)  # missing packages, flash on CPU: refused now, never recorded as an outcome
    if tiny is None:
        tiny = device == "cpu" and spec.params.total > TINY_AUTO_PARAMS
    config = tiny_config(dict(spec.config)) if tiny else dict(spec.config)
    built = model_from_config(config, name=spec.name + ("-tiny" if tiny else ""), hf_id=spec.hf_id,
                              source=spec.source) if tiny else spec
    validate_job(built, job, layout)
    # the attention transformers really runs (eager where the architecture has no sdpa path:
    # gemma2's soft-capping, gpt-oss's sinks) is what is measured, recorded and predicted
    job = planned_attention(built, job)[0]
    if warmup is None:
        warmup = 0 if steps == 1 else (1 if steps <= 5 else 2)
    warmup = max(0, min(warmup, steps - 1))
    nvml = _Nvml() if device == "cuda" else None
    nvml_before = nvml.used() if nvml else None
    env = _env(torch, device, nvml)
    prediction = predict(built, job, layout, env["gpu_name"])
    run: dict[str, Any] = {"device": device, "tiny": bool(tiny), "steps": steps, "warmup": warmup,
                           "seed": seed, "attn_implementation": None, "model_reused": False, "notes": []}
    measured: dict[str, Any] = {
        "baseline_allocated_bytes": None, "baseline_reserved_bytes": None,
        "peak_allocated_bytes": None, "peak_reserved_bytes": None, "peak_is_lower_bound": False,
        "nvml_used_before_bytes": nvml_before, "nvml_used_bytes": None, "nvml_process_bytes": None,
        "reserved_at_nvml_bytes": None, "step_times_s": [], "median_step_s": None,
        "tokens_per_s": None, "loss_first": None, "loss_last": None, "tensors": None,
    }
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "key": record_key(model_ref, job, layout, device, bool(tiny)),
        "outcome": "ok",
        "error": None,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "model": {"ref": model_ref, "name": built.name, "hf_id": spec.hf_id, "family": spec.family,
                  "params_total": built.params.total, "tiny": bool(tiny), "config": config},
        "job": job_to_dict(job),
        "layout": layout_to_dict(layout),
        "run": run,
        "env": env,
        "measured": measured,
        "predicted": prediction,
    }
    cache = cache or ModelCache()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    try:
        from . import hf

        run["attn_implementation"] = hf.attn_implementation(job)
        model, reused = cache.get(build_key(model_ref, job, device, bool(tiny)),
                                  lambda: hf.build_for_job(config, job, device, seed))
        run["model_reused"] = reused
        if job.ac_mode not in ("none", "full"):
            from .acref import enable_checkpointing  # transformers / TRL / torch SAC, as the stack does it

            enable_checkpointing(model, job.ac_mode, every=job.checkpoint_every)
        else:
            hf.set_gradient_checkpointing(model, job.gradient_checkpointing)
        if _step_hook:
            _step_hook(model=model, job=job, device=device)
        _train_steps(torch, model, job, device, steps, warmup, built.vocab_size, seed, measured, run, sync)
        model.zero_grad(set_to_none=True)
    except MeasurementError as e:
        record["outcome"], record["error"] = "error", e.one_line()
        cache.clear()
    except Exception as e:  # OOM is an outcome; anything else a one-line error, never a crash
        if _is_oom(torch, e):
            record["outcome"] = "oom"
            measured["peak_is_lower_bound"] = True
        else:
            record["outcome"] = "error"
            if os.environ.get("FTPLAN_DEBUG"):
                import traceback

                traceback.print_exc()
        record["error"] = _one_line(e)
        e = None  # drop the traceback's references to the step's tensors
        if cache.model is not None:
            try:
                cache.model.zero_grad(set_to_none=True)
            except Exception:
                cache.clear()
    finally:
        gc.collect()
    if device == "cuda":
        try:
            sync()
            measured["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
            measured["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
            if nvml:
                measured["reserved_at_nvml_bytes"] = int(torch.cuda.memory_reserved())
                measured["nvml_used_bytes"] = nvml.used()
                measured["nvml_process_bytes"] = nvml.process_used()
            torch.cuda.empty_cache()
        except Exception as e:  # a broken context after a crash: keep the record
            run["notes"].append(f"memory stats unavailable: {_one_line(e)}")
    if out is not None:
        append_record(out, record)
    if echo:
        echo(format_record(record))
    return record


# ---------------------------------------------------------------------------------------------
# printing
# ---------------------------------------------------------------------------------------------
def _gib(n: float | None) -> str:
    from ..units import human_bytes

    return human_bytes(n)


def _err(pred: float | None, meas: float | None) -> str:
    if pred is None or not meas:
        return ""
    return f" ({(pred - meas) / meas * 100:+.1f} %)"


def format_record(rec: dict[str, Any]) -> str:
    """Measured next to predicted, a few lines."""
    j, m, p, r = rec["job"], rec["measured"], rec.get("predicted") or {}, rec["run"]
    head = (f"{rec['model']['name']} {j['method']} {j['precision']} {j['optimizer']} b={j['micro_batch']} "
            f"s={j['seq_len']} ga={j['grad_accum']}{' gc' if j['gradient_checkpointing'] else ''}"
            f"{' padded' if j.get('padded_batches') else ''} "
            f"on {r['device']}{' (tiny)' if r['tiny'] else ''}: {rec['outcome']}")
    lines = [head]
    if rec.get("error"):
        lines.append(f"  {rec['outcome']}: {rec['error']}")
    lines.append(f"  {'':24} {'measured':>12} {'predicted':>12}")
    if r["device"] == "cuda":
        for label, mk, pk in (("peak allocated", "peak_allocated_bytes", "peak_allocated_bytes"),
                              ("peak reserved", "peak_reserved_bytes", "peak_reserved_bytes"),
                              ("device (nvml, process)", "nvml_process_bytes", "device_total_bytes")):
            lines.append(f"  {label:24} {_gib(m.get(mk)):>12} {_gib(p.get(pk)):>12}"
                         f"{_err(p.get(pk), m.get(mk))}")
    if m.get("tensors"):
        # the comparison `ftplan validate` scores (weight copies with the model states, the CPU
        # form of the activation formulas on CPU), against the prediction stored in the record
        from .validate import evaluate_record

        row = evaluate_record(rec, predict_fn=lambda *_: p) if p else {}
        for label, key in (("model states (tensors)", "model_states"), ("saved activations", "activations")):
            pv, mv = row.get(f"{key}_predicted"), row.get(f"{key}_measured")
            lines.append(f"  {label:24} {_gib(mv):>12} {_gib(pv):>12}{_err(pv, mv)}")
    tps = m.get("tokens_per_s")
    ptps = p.get("tokens_per_s")
    lines.append(f"  {'tokens/s':24} {('-' if tps is None else f'{tps:,.0f}'):>12} "
                 f"{('-' if ptps is None else f'{ptps:,.0f}'):>12}{_err(ptps, tps)}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# matrices
# ---------------------------------------------------------------------------------------------
def load_matrix(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a matrix file: YAML (``jobs:`` list, optional ``defaults:``) or CSV (header row).

    Each row is a dict with ``model`` and job options named like the CLI's (``method``,
    ``micro_batch``, ``seq_len``, ``gradient_checkpointing``/``gc``, ``lora_r``...). Every problem
    of the file (bad YAML, anchors/aliases, rows that are not mappings, rows without a model, keys or
    values that are not plain text/numbers) is one ``ConfigError`` before anything runs.
    """
    from ..inputs import check_text, load_yaml_text, read_text_file

    p = Path(path)
    check_text(str(path), "matrix file")
    if not p.is_file():
        raise ConfigError(f"no matrix file {str(p)!r}", "pass a .yaml or .csv file")
    text = read_text_file(p, "matrix file", max_bytes=16 * 2**20)
    suffix = p.suffix.lower()
    if suffix in (".yaml", ".yml"):
        doc = load_yaml_text(text, str(p), hint="see benchmarks/matrices/campaign1.yaml")
        if isinstance(doc, list):
            doc = {"jobs": doc}
        if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
            raise ConfigError(f"{p}: a matrix needs a 'jobs:' list", "see benchmarks/matrices/campaign1.yaml")
        defaults = doc.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise ConfigError(f"{p}: 'defaults' must be a mapping", "see benchmarks/matrices/campaign1.yaml")
        rows = []
        for i, row in enumerate(doc["jobs"], 1):
            if not isinstance(row, dict):
                raise ConfigError(f"{p}: job {i} is not a mapping")
            # a YAML list of names (lora_targets: [q_proj, v_proj]) is the CLI's comma-separated form
            rows.append({k: ",".join(v) if isinstance(v, list) and v and all(
                isinstance(x, str) and x.strip() and "," not in x for x in v) else v
                for k, v in {**defaults, **row}.items()})
    elif suffix == ".csv":
        import csv
        import io

        try:
            rows = [{k.strip(): v.strip() for k, v in r.items() if k and isinstance(v, str) and v.strip() != ""}
                    for r in csv.DictReader(io.StringIO(text), strict=True)]
        except csv.Error as e:
            raise ConfigError(f"{p}: malformed CSV ({e})", "one row per line; close every quote") from None
    else:
        raise ConfigError(f"matrix {str(p)!r} must end in .yaml, .yml or .csv")
    problems: list[Problem] = []
    for i, r in enumerate(rows, 1):
        if not r.get("model"):
            problems.append(Problem(None, f"{p}: row {i} has no 'model'"))
            continue
        for k, v in r.items():
            if not isinstance(k, str) or isinstance(v, (dict, list)) or (isinstance(v, float) and not math.isfinite(v)):
                problems.append(Problem(None, f"{p}: row {i}: {str(k)[:40]!r} must be a plain value, "
                                              f"got {type(v).__name__}"))
            elif isinstance(v, str) and bad_characters(v):
                problems.append(Problem(None, f"{p}: row {i}: {k!r} contains control characters"))
        if len(problems) > 20:
            break
    if problems:
        raise ConfigError(problems=problems)
    return rows


def progress(i: int, n: int, text: str, stream=None) -> None:
    """A one-line stdlib progress bar on stderr."""
    stream = stream or sys.stderr
    width = 24
    done = int(width * i / n) if n else width
    stream.write(f"[{'#' * done}{'.' * (width - done)}] {i}/{n} {text}\n")
    stream.flush()
