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

import copy
import gc
import importlib
import importlib.metadata
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

from ..errors import ConfigError, MeasurementError
from .records import SCHEMA, append_record, job_to_dict, layout_to_dict, record_key

__all__ = [
    "measure",
    "ModelCache",
    "tiny_config",
    "predict",
    "load_matrix",
    "TINY_AUTO_PARAMS",
]

#: on CPU, models above this many parameters are shrunk to a tiny config automatically
TINY_AUTO_PARAMS = 1_000_000_000
GIB = 1024**3


# ---------------------------------------------------------------------------------------------
# configs
# ---------------------------------------------------------------------------------------------
def _text_config(config: dict) -> tuple[str, dict]:
    """(model_type, kwargs for AutoConfig.for_model); descends into ``text_config`` wrappers."""
    cfg = copy.deepcopy(dict(config))
    model_type = cfg.pop("model_type", None)
    if isinstance(cfg.get("text_config"), dict):
        text = copy.deepcopy(cfg["text_config"])
        ttype = text.pop("model_type", None) or {"gemma3": "gemma3_text"}.get(model_type, f"{model_type}_text")
        for k in ("tie_word_embeddings", "vocab_size"):
            if k in cfg and k not in text:
                text[k] = cfg[k]
        return ttype, text
    if not model_type:
        raise ConfigError("config has no 'model_type'", "pass a Hugging Face config.json")
    return model_type, cfg


_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             head_dim=16, vocab_size=512)


def tiny_config(config: dict) -> dict:
    """A tiny config of the same family (hidden 64, 2 layers, 4 heads, vocab 512, ...).

    Structural switches of the original (biases, tied embeddings, qk-norm, sliding windows,
    MoE/MLA, soft-capping) are kept; only sizes shrink, so the same code paths run.
    """
    model_type, cfg = _text_config(config)
    out = dict(cfg)
    out.update(_TINY)
    heads = cfg.get("num_attention_heads") or 1
    kv = cfg.get("num_key_value_heads") or heads
    out["num_key_value_heads"] = 4 if kv >= heads else (1 if kv == 1 else 2)
    if isinstance(out.get("max_position_embeddings"), int):
        out["max_position_embeddings"] = max(4096, min(out["max_position_embeddings"], 131072))
    for k, v in (("num_local_experts", 4), ("num_experts", 4), ("n_routed_experts", 4)):
        if cfg.get(k):
            out[k] = v
    if cfg.get("num_experts_per_tok"):
        out["num_experts_per_tok"] = 2
    if cfg.get("moe_intermediate_size"):
        out["moe_intermediate_size"] = 32
    if cfg.get("n_shared_experts"):
        out["n_shared_experts"] = 1
    if cfg.get("n_group"):
        out["n_group"], out["topk_group"] = 1, 1
    if cfg.get("first_k_dense_replace"):
        out["first_k_dense_replace"] = 1
    if cfg.get("kv_lora_rank"):
        out.update(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)
        out["head_dim"] = 8
        if cfg.get("q_lora_rank"):
            out["q_lora_rank"] = 32
    if isinstance(cfg.get("layer_types"), list):
        out["layer_types"] = cfg["layer_types"][:2] if len(cfg["layer_types"]) >= 2 else cfg["layer_types"]
    if isinstance(cfg.get("mlp_only_layers"), list):
        out["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < 2]
    if cfg.get("max_window_layers") is not None:
        out["max_window_layers"] = min(int(cfg["max_window_layers"]), 2)
    if cfg.get("query_pre_attn_scalar"):
        out["query_pre_attn_scalar"] = 16
    for k in ("torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id"):
        out.pop(k, None)  # token ids of the real vocabulary do not fit the tiny one
    out["model_type"] = model_type
    return out


# ---------------------------------------------------------------------------------------------
# prediction
# ---------------------------------------------------------------------------------------------
def _runtime_prediction(spec, job, layout, gpu_name: str | None) -> tuple[float | None, str | None]:
    """tokens/s from ``ftplan.runtime.estimate_runtime`` if that module exists, else (None, why)."""
    try:
        rt = importlib.import_module("ftplan.runtime")
    except ImportError:
        return None, "ftplan.runtime not available"
    fn = getattr(rt, "estimate_runtime", None)
    if fn is None:
        return None, "ftplan.runtime.estimate_runtime not available"
    gpu = None
    if gpu_name:
        try:
            from ..catalog.gpus import match_gpu  # type: ignore[attr-defined]

            gpu = match_gpu(gpu_name)
        except Exception:
            try:
                from ..catalog.gpus import get_gpu  # type: ignore[attr-defined]

                gpu = get_gpu(gpu_name)
            except Exception:
                gpu = None
    if gpu is None:
        return None, f"GPU {gpu_name!r} not matched in the GPU catalog"
    try:
        est = fn(spec, job, layout, gpu=gpu)
    except TypeError:
        try:
            est = fn(spec, job, layout, gpu)
        except Exception as e:
            return None, f"estimate_runtime failed: {type(e).__name__}: {e}"
    except Exception as e:
        return None, f"estimate_runtime failed: {type(e).__name__}: {e}"
    for attr in ("tokens_per_s", "tokens_per_second", "throughput_tokens_per_s"):
        v = est.get(attr) if isinstance(est, dict) else getattr(est, attr, None)
        if isinstance(v, (int, float)) and v > 0:
            return float(v), None
    return None, "estimate_runtime result has no tokens_per_s"


def predict(spec, job, layout, gpu_name: str | None = None) -> dict[str, Any]:
    """ftplan's prediction for ``job`` on ``spec``, as stored in records (bytes; tokens/s)."""
    from ..version import __version__
    from ..memory import estimate_memory

    mem = estimate_memory(spec, job, layout)
    tps, why = _runtime_prediction(spec, job, layout, gpu_name)
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
# building
# ---------------------------------------------------------------------------------------------
_DT = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _dtype(torch, name: str):
    return getattr(torch, _DT[name])


def build_key(model_ref: str, job, device: str, tiny: bool) -> tuple:
    """Jobs with the same key share one built model (batch, seq, gc, optimizer may differ)."""
    return (model_ref, device, tiny, job.method, job.precision, job.attn_impl,
            json.dumps(job_to_dict(job)["lora"], sort_keys=True),
            json.dumps(job_to_dict(job)["quant"], sort_keys=True) if job.method == "qlora" else "")


def _attn_impl(job) -> str:
    if job.attn_impl == "flash":
        try:
            importlib.import_module("flash_attn")
        except ImportError:
            raise MeasurementError("attention 'flash' needs the flash_attn package, which is not installed",
                                   "use --attn sdpa or install flash-attn") from None
        return "flash_attention_2"
    return job.attn_impl


def _materialize_meta(torch, model, device, dtype) -> None:
    """Give every meta parameter real random storage on ``device`` (ties kept)."""
    memo: dict[int, Any] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_meta:
                continue
            if id(p) in memo:
                mod._parameters[name] = memo[id(p)]
                continue
            t = torch.empty(p.shape, dtype=p.dtype, device=device)
            if name == "bias":
                t.zero_()
            elif t.dim() >= 2:
                t.normal_(0.0, 0.02)
            else:
                t.fill_(1.0)
            newp = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            memo[id(p)] = newp
            mod._parameters[name] = newp
        for name, b in list(mod._buffers.items()):
            if b is not None and b.device != torch.device(device) and not b.is_meta:
                mod._buffers[name] = b.to(device)


def _quantize_linears(torch, model, job, device) -> int:
    """Replace each nn.Linear (bar ``quant.skip_modules``) by a bnb Linear4bit, one at a time."""
    import bitsandbytes as bnb

    q = job.quant
    cdtype = _dtype(torch, q.compute_dtype)
    skip = set(q.skip_modules)
    n = 0
    for parent_name, parent in list(model.named_modules()):
        for cname, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or cname in skip:
                continue
            fin, fout = child.in_features, child.out_features
            new = bnb.nn.Linear4bit(fin, fout, bias=child.bias is not None, compute_dtype=cdtype,
                                    compress_statistics=q.double_quant, quant_type=q.quant_type,
                                    device="meta")
            w = torch.empty(fout, fin, dtype=cdtype, device=device).normal_(0.0, 0.02)
            new.weight = bnb.nn.Params4bit(w, requires_grad=False, blocksize=q.blocksize,
                                           compress_statistics=q.double_quant, quant_type=q.quant_type,
                                           module=new).to(device)
            del w  # the bf16 copy of this one layer is freed before the next is made
            if child.bias is not None:
                new.bias = torch.nn.Parameter(torch.zeros(fout, dtype=cdtype, device=device),
                                              requires_grad=False)
            new.train(child.training)
            setattr(parent, cname, new)
            n += 1
    return n


def _build(torch, config: dict, job, device: str, seed: int) -> Any:
    """The model for ``job`` on ``device``: trainable parameters set, PEFT applied."""
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, cfg = _text_config(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = AutoConfig.for_model(model_type, **cfg)
    hf_config.use_cache = False
    attn = _attn_impl(job)
    torch.manual_seed(seed)
    from ..job import PRECISIONS

    prec = PRECISIONS[job.precision]
    dev = torch.device(device)
    if job.method == "full":
        dtype = _dtype(torch, prec["trainable"])
    elif job.method == "lora":
        dtype = _dtype(torch, prec["frozen"])
    else:
        dtype = _dtype(torch, job.quant.compute_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if job.method == "qlora":
            from accelerate import init_empty_weights

            with init_empty_weights(include_buffers=False):
                model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attn)
            _quantize_linears(torch, model, job, dev)
            _materialize_meta(torch, model, dev, dtype)
            try:
                model.is_loaded_in_4bit = True  # what from_pretrained(quantization_config=...) sets
            except Exception:
                pass
        else:
            with dev:
                model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, attn_implementation=attn)
            model.to(dev)
    model.config.use_cache = False
    model.train()
    if job.uses_lora:
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        if job.method == "qlora":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        targets = list(job.lora.target_modules)
        target = "all-linear" if "all-linear" in targets else targets
        lcfg = LoraConfig(r=job.lora.r, lora_alpha=job.lora.alpha, lora_dropout=job.lora.dropout,
                          target_modules=target, task_type="CAUSAL_LM", bias="none")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(model, lcfg)
        model.train()
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    return model


def _set_gc(model, job) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if job.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            if job.uses_lora and hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()  # PEFT/Trainer do this for frozen embeddings
        else:
            if getattr(model, "is_gradient_checkpointing", False):
                model.gradient_checkpointing_disable()


def _optimizer(torch, job, params, device: str):
    import warnings

    lr = 1e-5
    name = job.optimizer
    if name == "adamw":
        try:
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True), "torch.optim.AdamW(fused=True)"
        except (RuntimeError, TypeError, ValueError):
            return torch.optim.AdamW(params, lr=lr, weight_decay=0.0), "torch.optim.AdamW(foreach)"
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9), "torch.optim.SGD(momentum=0.9)"
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return (Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False),
                "transformers Adafactor")
    if name in ("adamw_8bit", "paged_adamw_8bit"):
        import bitsandbytes as bnb

        cls = bnb.optim.AdamW8bit if name == "adamw_8bit" else bnb.optim.PagedAdamW8bit
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls(params, lr=lr, weight_decay=0.0), f"bitsandbytes.optim.{cls.__name__}"
    raise ConfigError(f"unknown optimizer {name!r}")


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
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


# ---------------------------------------------------------------------------------------------
# tensor accounting (all devices)
# ---------------------------------------------------------------------------------------------
def _storage(t) -> tuple[int, int]:
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except Exception:
        return id(t), t.numel() * t.element_size()


def _param_bytes(model) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        ptr, nb = _storage(p)
        if ptr in seen:
            continue
        seen.add(ptr)
        total += nb
        qs = getattr(p, "quant_state", None)
        if qs is not None:  # bitsandbytes 4-bit: absmax (+ nested absmax/code) live beside
            for t in _quant_state_tensors(qs):
                ptr2, nb2 = _storage(t)
                if ptr2 not in seen:
                    seen.add(ptr2)
                    total += nb2
    return total


def _quant_state_tensors(qs):
    import torch

    for name in ("absmax", "code", "offset"):
        t = getattr(qs, name, None)
        if isinstance(t, torch.Tensor):
            yield t
    s2 = getattr(qs, "state2", None)
    if s2 is not None:
        yield from _quant_state_tensors(s2)


def _grad_bytes(params) -> int:
    seen: set[int] = set()
    total = 0
    for p in params:
        if p.grad is None:
            continue
        ptr, nb = _storage(p.grad)
        if ptr not in seen:
            seen.add(ptr)
            total += nb
    return total


def _opt_bytes(torch, opt) -> int:
    seen: set[int] = set()
    total = 0
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                ptr, nb = _storage(v)
                if ptr not in seen:
                    seen.add(ptr)
                    total += nb
    return total


class _SavedBytes:
    """Bytes of the distinct storages autograd saves during a forward (parameters excluded)."""

    def __init__(self, torch, model) -> None:
        self.torch = torch
        self.param_ptrs = {_storage(p)[0] for p in model.parameters()}
        self.weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
        self.seen: dict[int, int] = {}
        self.weight_copies: dict[int, int] = {}

    def pack(self, t):
        ptr, nb = _storage(t)
        if ptr not in self.param_ptrs and ptr not in self.seen:
            self.seen[ptr] = nb
            if self._is_weight_copy(t):
                self.weight_copies[ptr] = nb  # autocast's low-precision copy of a weight
        return t

    def _is_weight_copy(self, t) -> bool:
        """A cast of a trainable parameter: ``ToCopyBackward0`` straight off an ``AccumulateGrad``."""
        if t.dim() != 2 or not ({tuple(t.shape), tuple(t.shape)[::-1]} & self.weight_shapes):
            return False
        fn = t.grad_fn
        while fn is not None and type(fn).__name__ in ("TBackward0", "TransposeBackward0", "ViewBackward0",
                                                      "PermuteBackward0"):
            fn = fn.next_functions[0][0] if fn.next_functions else None  # linear saves weight.t()
        if fn is None or type(fn).__name__ != "ToCopyBackward0":
            return False
        nxt = [f for f, _ in fn.next_functions if f is not None]
        return len(nxt) == 1 and type(nxt[0]).__name__ == "AccumulateGrad"

    @staticmethod
    def unpack(t):
        return t

    def hooks(self):
        return self.torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    @property
    def total(self) -> int:
        return sum(self.seen.values())

    @property
    def weight_copy_bytes(self) -> int:
        return sum(self.weight_copies.values())


# ---------------------------------------------------------------------------------------------
# the measurement
# ---------------------------------------------------------------------------------------------
def _oom_types(torch) -> tuple[type, ...]:
    out = []
    for obj in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)):
        if isinstance(obj, type) and obj not in out:
            out.append(obj)
    return tuple(out)


def _is_oom(torch, e: BaseException) -> bool:
    if isinstance(e, _oom_types(torch)):
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

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise MeasurementError("the built model has no trainable parameters")
    opt, opt_desc = _optimizer(torch, job, params, device)
    run["optimizer_impl"] = opt_desc
    prec = PRECISIONS[job.precision]
    autocast = job.precision.endswith("-mixed")
    cdtype = _dtype(torch, prec["compute"])
    dev_type = "cuda" if device == "cuda" else "cpu"
    g = torch.Generator(device="cpu").manual_seed(seed)
    batches = [torch.randint(0, vocab, (job.micro_batch, job.seq_len), generator=g).to(device)
               for _ in range(job.grad_accum)]
    if device == "cuda":
        sync()
        measured["baseline_allocated_bytes"] = int(torch.cuda.memory_allocated())
        measured["baseline_reserved_bytes"] = int(torch.cuda.memory_reserved())
        torch.cuda.reset_peak_memory_stats()
    tensors = {"param_bytes": _param_bytes(model), "grad_bytes": None, "optimizer_state_bytes": None,
               "saved_activation_bytes": None, "saved_weight_copy_bytes": None}
    measured["tensors"] = tensors
    times: list[float] = []
    losses: list[float] = []
    for step in range(steps):
        sync()
        t0 = time.perf_counter()
        for i, ids in enumerate(batches):
            tracker = _SavedBytes(torch, model) if step == 0 and i == 0 else None
            ctx = torch.autocast(dev_type, dtype=cdtype) if autocast else _null()
            hooks = tracker.hooks() if tracker else _null()
            with ctx, hooks:
                out = model(input_ids=ids, labels=ids)
                loss = out.loss / job.grad_accum
            if tracker:
                tensors["saved_activation_bytes"] = tracker.total
                tensors["saved_weight_copy_bytes"] = tracker.weight_copy_bytes
            loss.backward()
            if i == len(batches) - 1:
                losses.append(float(loss.detach().float().item()) * job.grad_accum)
            del out, loss
        if step == 0:
            tensors["grad_bytes"] = _grad_bytes(params)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        if step == 0:
            tensors["optimizer_state_bytes"] = _opt_bytes(torch, opt)
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
            raise MeasurementError("--device cuda but torch sees no CUDA GPU", "use --device cpu (with --tiny)")
        return "cuda"
    if d == "cpu":
        return "cpu"
    raise ConfigError(f"unknown device {device!r}", "use cuda or cpu")


def _import_torch():
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
    from ..job import Layout, validate_job
    from ..model import model_from_config

    if steps < 1:
        raise ConfigError(f"--steps must be >= 1 (got {steps})")
    layout = layout or Layout()
    if layout.world_size != 1 or layout.tp != 1 or layout.pp != 1:
        raise ConfigError("ftplan measure runs on one GPU", "drop --gpus/--nodes/--tp/--pp")
    spec = resolve_model(model_ref)
    validate_job(spec, job, layout)
    torch = _import_torch()
    device = _resolve_device(torch, device)
    if tiny is None:
        tiny = device == "cpu" and spec.params.total > TINY_AUTO_PARAMS
    config = tiny_config(dict(spec.config)) if tiny else dict(spec.config)
    built = model_from_config(config, name=spec.name + ("-tiny" if tiny else ""), hf_id=spec.hf_id,
                              source=spec.source) if tiny else spec
    validate_job(built, job, layout)
    if warmup is None:
        warmup = 0 if steps == 1 else (1 if steps <= 5 else 2)
    warmup = max(0, min(warmup, steps - 1))
    nvml = _Nvml() if device == "cuda" else None
    nvml_before = nvml.used() if nvml else None
    env = _env(torch, device, nvml)
    gpu_total = env["gpu_total_bytes"]
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
        run["attn_implementation"] = _attn_impl(job)
        model, reused = cache.get(build_key(model_ref, job, device, bool(tiny)),
                                  lambda: _build(torch, config, job, device, seed))
        run["model_reused"] = reused
        _set_gc(model, job)
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
            f"s={j['seq_len']} ga={j['grad_accum']}{' gc' if j['gradient_checkpointing'] else ''} "
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
    t = m.get("tensors") or {}
    if t:
        comp = p.get("components") or {}
        ms = None
        if t.get("grad_bytes") is not None and t.get("optimizer_state_bytes") is not None:
            ms = t["param_bytes"] + t["grad_bytes"] + t["optimizer_state_bytes"]
        lines.append(f"  {'model states (tensors)':24} {_gib(ms):>12} {_gib(p.get('model_states_bytes')):>12}"
                     f"{_err(p.get('model_states_bytes'), ms)}")
        act_pred = None
        if comp:
            act_pred = comp.get("activations", 0) + comp.get("logits_and_loss", 0)
        lines.append(f"  {'saved activations':24} {_gib(t.get('saved_activation_bytes')):>12} "
                     f"{_gib(act_pred):>12}{_err(act_pred, t.get('saved_activation_bytes'))}")
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
    ``micro_batch``, ``seq_len``, ``gradient_checkpointing``/``gc``, ``lora_r``...).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"no matrix file {str(p)!r}", "pass a .yaml or .csv file")
    text = p.read_text()
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise MeasurementError("reading a YAML matrix needs PyYAML", "pip install pyyaml, or use CSV") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: invalid YAML ({str(e).splitlines()[0]})") from None
        if isinstance(doc, list):
            doc = {"jobs": doc}
        if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
            raise ConfigError(f"{p}: a matrix needs a 'jobs:' list", "see benchmarks/matrices/campaign1.yaml")
        defaults = doc.get("defaults") or {}
        rows = []
        for i, row in enumerate(doc["jobs"], 1):
            if not isinstance(row, dict):
                raise ConfigError(f"{p}: job {i} is not a mapping")
            rows.append({**defaults, **row})
    elif p.suffix.lower() == ".csv":
        import csv
        import io

        rows = [{k.strip(): v.strip() for k, v in r.items() if k and v is not None and v.strip() != ""}
                for r in csv.DictReader(io.StringIO(text))]
    else:
        raise ConfigError(f"matrix {str(p)!r} must end in .yaml, .yml or .csv")
    for i, r in enumerate(rows, 1):
        if not r.get("model"):
            raise ConfigError(f"{p}: row {i} has no 'model'")
    return rows


def progress(i: int, n: int, text: str, stream=None) -> None:
    """A one-line stdlib progress bar on stderr."""
    stream = stream or sys.stderr
    width = 24
    done = int(width * i / n) if n else width
    stream.write(f"[{'#' * done}{'.' * (width - done)}] {i}/{n} {text}\n")
    stream.flush()
