"""Per-rank memory of real distributed training on CPU: DDP, FSDP1/FSDP2, DeepSpeed ZeRO-1/2/3.

This is the multi-process counterpart of :mod:`ftplan.measure.torchref`: it launches N processes
with the gloo backend (``torch.multiprocessing`` spawn, no torchrun), builds a tiny real Hugging
Face model on every rank (:func:`ftplan.measure.torchref.build_model`), wraps it the way the
reference stack does (accelerate's FSDP plugin settings, HF Trainer's DDP, DeepSpeed through
``deepspeed.initialize``), runs one or two training steps and counts every byte each rank holds.

Counting: :class:`StorageTracker` is a ``TorchDispatchMode`` that registers every tensor storage
an op creates (and ``UntypedStorage.resize_``, which FSDP uses to free and re-allocate unsharded
parameters), keeps an event log (allocation, growth, free) with the phase (wrap, forward, backward,
step) and the owner (the innermost frame of FSDP1, FSDP2, DDP, DeepSpeed, the optimizer, or the
model code), and retags the storages of parameter gradients through gradient hooks. After the
step the log is replayed to split the bytes into categories:

* ``params`` / ``optimizer`` / ``master`` / ``buffers``: storages alive after the step, by identity
  (module parameters, including DTensor local shards, FSDP1 flat parameters and DeepSpeed
  ``ds_tensor`` partitions; torch optimizer state; DeepSpeed's fp32 partitions; module buffers);
* ``engine_persistent``: everything else alive after the step (DDP gradient buckets, DeepSpeed's
  flat buffers, ...);
* ``grads``: storages created during forward/backward that are still alive when backward ends,
  except the loss (sharded gradients, DDP gradients, DeepSpeed's gradient partitions);
* ``engine_transient_peak``: the largest sum, at any moment of forward and backward, of storages
  that do not survive backward and were allocated by the engine or are gradients of (unsharded)
  parameters: gathered parameters, unsharded gradients, reduce-scatter / bucket buffers;
* ``activations``: model-owned storages created in forward and alive at its end;
* ``fwd_bwd_peak`` / ``step_peak``: the peaks of all tracked bytes in forward+backward and in
  the optimizer step (the step's temporaries are CPU-kernel specific);
* ``host``: the categories the engine keeps on the host when it offloads (on CPU the "device" and
  the host are the same memory: the split is by role).

With ``FTPLAN_DIST_SAVED=1`` the last step's forward also runs under autograd saved-tensor hooks:
``detail["saved"]`` lists every tensor it saves (the bytes of the activation storages it is the
first to hold, dtype, shape, whether it is a view, whether it is a parameter, the innermost
transformers / PEFT / bitsandbytes frame), ``detail["unsaved_activation_bytes"]`` what the
activations hold that nothing saved.

CPU stand-ins (the bytes are the engine's own; only these device mechanics differ): FSDP1 is
given ``device_id=cpu`` and CPU "pinning" is a no-op under offload; DeepSpeed's shared-memory
communication kernel (a JIT-compiled C++ extension) is not built (gloo carries the collectives).
DeepSpeed steps a client torch AdamW in every case, offload included
(``zero_force_ds_cpu_optimizer: false``), as HF Trainer does with ftplan's exported ds_config.json
(no "optimizer" section), so no optimizer extension is compiled either; see
``benchmarks/notes/distributed_cpu.md``.

torch, transformers (and deepspeed, peft, bitsandbytes where a case needs them) are imported
lazily: importing this module costs nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import tempfile
import traceback
import time
from typing import Any

__all__ = ["Case", "RankMeasure", "run_cases", "StorageTracker", "ENGINES"]

#: engines a case can be run with
ENGINES = ("ddp", "fsdp2", "fsdp1", "deepspeed")


@dataclasses.dataclass(frozen=True)
class Case:
    """One distributed training job to measure (every rank runs the same case)."""

    family: str = "llama"
    engine: str = "fsdp2"  # one of ENGINES
    method: str = "full"  # full | lora | qlora
    #: FSDP: reshard after forward (FSDP1: FULL_SHARD if True, SHARD_GRAD_OP if False)
    reshard_after_forward: bool = True
    #: FSDP: CPUOffloadPolicy / CPUOffload(offload_params=True) (parameters, gradients, optimizer)
    offload_params: bool = False
    #: DeepSpeed: offload_optimizer (and offload_param with zero_stage 3 when offload_params)
    offload_optimizer: bool = False
    zero_stage: int = 3  # DeepSpeed
    #: HSDP: replicate degree of a 2-D (replicate, shard) mesh; 1 = plain FSDP
    replicate: int = 1
    ddp_bucket_view: bool = False  # DDP gradient_as_bucket_view
    ddp_bucket_cap_mb: float = 25.0
    batch: int = 2
    seq_len: int = 24
    steps: int = 1
    lora_r: int = 8
    #: PEFT ``lora_dropout`` (0: ``nn.Identity``, the adapters read the layer's own input)
    lora_dropout: float = 0.0
    #: PEFT ``target_modules``, comma-separated (or all-linear)
    lora_targets: str = "all-linear"
    #: bitsandbytes 4-bit storage dtype for QLoRA over FSDP (bnb_4bit_quant_storage)
    quant_storage: str = "bf16"
    #: DeepSpeed reduce_bucket_size in elements (``Layout.ds_reduce_bucket_size``); 0 = HF's auto
    reduce_bucket_size: int = 0
    #: DeepSpeed ZeRO-3 stage3_max_live_parameters / stage3_max_reuse_distance / stage3_prefetch_bucket_size
    #: in elements (``Layout.ds_max_live_parameters`` ...); 0 = what ftplan's ds_config.json writes
    #: (1e9, 1e9, HF's auto 0.9 x hidden^2)
    max_live: int = 0
    reuse_distance: int = 0
    prefetch_bucket: int = 0
    #: FSDP: reduce-scatter gradients in fp32 (``reduce_dtype=torch.float32``, torchtitan's default;
    #: ``Layout.fsdp_reduce_dtype``) instead of the mixed-precision dtype
    reduce_fp32: bool = False
    #: LoRA: the frozen base loaded in fp32 (``Job.base_dtype="fp32"``: TRL SFTTrainer's default
    #: for a model id), cast to bf16 by FSDP's mixed precision / DeepSpeed's bf16 mode
    base_fp32: bool = False
    #: FSDP2: whose ``fully_shard`` calls (``Layout.fsdp_wrap``): ``accelerate`` (accelerate's
    #: ``fsdp2_prepare_model``, bf16 mixed precision, autocast, transformers' loss) or ``torchtune``
    #: (torchtune 0.3.1's ``shard_model``: pure bf16, no mixed-precision policy, decoder layers
    #: (full: + the input embedding and the output projection) their own units, the root the rest;
    #: the output projection called per chunk and ``CEWithChunkedOutputLoss``: :func:`_wrap_torchtune`)
    fsdp_wrap: str = "accelerate"
    #: transformers' activation checkpointing on the decoder layers (non-reentrant, as HF Trainer's
    #: ``gradient_checkpointing``; under torchtune's wrapping it stands for torchtune's
    #: ``enable_activation_checkpointing``, which checkpoints the same layers non-reentrantly)
    gradient_checkpointing: bool = False
    #: log every tensor the last forward saves (``detail["saved"]``), as ``FTPLAN_DIST_SAVED=1`` does
    #: for every case
    saved_log: bool = False

    def job(self):
        """The ftplan ``Job`` this case runs (bf16-mixed AdamW, HF Trainer / accelerate style;
        torchtune's wrapping: pure bf16, torchtune's loss)."""
        from ..job import Job, LoraSpec

        if self.fsdp_wrap == "torchtune":
            return Job(method=self.method, precision="bf16", optimizer="adamw", micro_batch=self.batch,
                       seq_len=self.seq_len, attn_impl=self.attn, gradient_checkpointing=self.gradient_checkpointing,
                       loss="torchtune",
                       lora=LoraSpec(r=self.lora_r, alpha=2 * self.lora_r, dropout=self.lora_dropout,
                                     target_modules=tuple(self.lora_targets.split(","))))
        # the harness calls the model with labels (transformers' loss)
        return Job(method=self.method, precision="bf16-mixed", optimizer="adamw", micro_batch=self.batch,
                   seq_len=self.seq_len, attn_impl=self.attn, gradient_checkpointing=self.gradient_checkpointing,
                   loss="hf",
                   lora=LoraSpec(r=self.lora_r, alpha=2 * self.lora_r, dropout=self.lora_dropout,
                                 target_modules=tuple(self.lora_targets.split(","))),
                   base_dtype="fp32" if self.base_fp32 else "compute")

    @property
    def attn(self) -> str:
        """sdpa, or eager for a family transformers has no sdpa path for (gpt_oss: attention sinks;
        gemma2: soft-capping)."""
        from . import torchref as TR
        from .configs import default_attention

        return default_attention(TR.TINY_CONFIGS[self.family])

    def layout(self, world: int):
        """The ftplan ``Layout`` this case runs on ``world`` ranks (HSDP: ``replicate`` nodes)."""
        from ..job import Layout

        strategy = {"ddp": "ddp", "fsdp1": "fsdp", "fsdp2": "fsdp", "deepspeed": f"zero{self.zero_stage}"}[self.engine]
        nodes = self.replicate if self.replicate > 1 else 1
        return Layout(gpus_per_node=world // nodes, nodes=nodes, strategy=strategy,
                      offload_optimizer=self.offload_optimizer or (self.offload_params and self.engine != "deepspeed"),
                      offload_params=self.offload_params,
                      fsdp_version=1 if self.engine == "fsdp1" else 2,
                      reshard_after_forward=self.reshard_after_forward, hsdp=self.replicate > 1,
                      ddp_bucket_view=self.ddp_bucket_view, ds_reduce_bucket_size=self.reduce_bucket_size,
                      ds_max_live_parameters=self.max_live, ds_max_reuse_distance=self.reuse_distance,
                      ds_prefetch_bucket_size=self.prefetch_bucket,
                      fsdp_reduce_dtype="fp32" if self.reduce_fp32 else "compute", fsdp_wrap=self.fsdp_wrap)

    @property
    def label(self) -> str:
        parts = [self.family, self.engine, self.method]
        if self.engine == "deepspeed":
            parts.append(f"zero{self.zero_stage}")
        if self.fsdp_wrap != "accelerate":
            parts.append(f"{self.fsdp_wrap}-wrap")
        if self.gradient_checkpointing:
            parts.append("ckpt")
        if self.engine in ("fsdp1", "fsdp2") and not self.reshard_after_forward:
            parts.append("no-reshard")
        if self.reduce_fp32:
            parts.append("reduce-fp32")
        if self.base_fp32:
            parts.append("base-fp32")
        if self.lora_dropout:
            parts.append(f"dropout{self.lora_dropout:g}")
        if self.lora_targets != "all-linear":
            parts.append(self.lora_targets.replace(",", "+"))
        if self.replicate > 1:
            parts.append(f"hsdp{self.replicate}")
        if self.offload_params:
            parts.append("offload-params")
        if self.offload_optimizer:
            parts.append("offload-opt")
        if self.engine == "ddp" and self.ddp_bucket_view:
            parts.append("bucket-view")
        if self.engine == "deepspeed" and self.reduce_bucket_size:
            parts.append(f"bucket{self.reduce_bucket_size}")
        if self.engine == "deepspeed" and (self.max_live or self.reuse_distance or self.prefetch_bucket):
            parts.append(f"live{self.max_live}-reuse{self.reuse_distance}-prefetch{self.prefetch_bucket}")
        return "/".join(parts)


@dataclasses.dataclass
class RankMeasure:
    """Bytes one rank held (see the module docstring for each category)."""

    rank: int
    case: str
    params: int = 0
    grads: int = 0
    optimizer: int = 0
    master: int = 0
    buffers: int = 0
    engine_persistent: int = 0
    host: int = 0
    engine_transient_peak: int = 0
    activations: int = 0
    fwd_bwd_peak: int = 0
    step_peak: int = 0
    resident_before_step: int = 0
    #: process groups the case's collectives ran on (wrap, forward, backward, step): group name ->
    #: ranks (``measure.collectives.GroupRecorder``); on GPUs each is one NCCL communicator
    groups: dict[str, int] = dataclasses.field(default_factory=dict)
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def device_model_states(self) -> int:
        return self.params + self.grads + self.optimizer + self.master - self.host


# ---------------------------------------------------------------------------------------------
# storage tracking
# ---------------------------------------------------------------------------------------------
#: innermost frame -> owner (checked in order; first match wins)
_OWNER_PATHS = (
    ("/transformers/", "model"),
    ("/peft/", "model"),
    ("/bitsandbytes/", "model"),
    # a module FSDP1 wraps on its own (PEFT's wrap policy: every lora_A / lora_B Linear is a unit):
    # its forward's innermost frame outside torch.nn is FSDP's forward, yet its outputs are the model's
    ("/torch/nn/modules/linear.py", "model"),
    ("/torch/distributed/fsdp/_fully_shard/", "fsdp2"),
    ("/torch/distributed/fsdp/", "fsdp1"),
    ("/torch/nn/parallel/distributed", "ddp"),
    ("/torch/distributed/optim/", "optim"),
    # ZeRO-3 replaces F.linear with its own autograd function: the outputs are the model's
    ("/deepspeed/runtime/zero/linear.py", "model"),
    ("/deepspeed/runtime/zero/", "deepspeed"),
    # DeepSpeed's engine forward/backward wrap the model's own (autograd's backward allocations
    # have no Python frame of their own): the innermost frame decides
    ("/deepspeed/runtime/engine.py", "other"),
    ("/deepspeed/runtime/", "deepspeed"),
    ("/torch/optim/", "optim"),
)
ENGINE_OWNERS = frozenset({"fsdp2", "fsdp1", "ddp", "deepspeed"})


def _make_tracker_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _Tracker(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, list] = {}  # storage _cdata -> [nbytes, registration id]
            self._refs: dict[int, Any] = {}
            self.events: list[tuple[str, int, int]] = []  # (phase, registration id, delta)
            self.meta: dict[int, tuple[str, str]] = {}  # registration id -> (phase allocated, owner)
            self.role: dict[int, str] = {}
            self.phase = "init"
            self.cur = 0
            self.phase_peak: dict[str, int] = {}
            self._orig_resize = torch.UntypedStorage.resize_
            self._seq = 0
            #: registration id -> innermost engine/model frame (debugging: FTPLAN_DIST_DEBUG=1)
            self.where: dict[int, str] | None = {} if os.environ.get("FTPLAN_DIST_DEBUG") else None

        # -- bookkeeping
        def _owner(self) -> str:
            f = sys._getframe(3)
            while f is not None:
                fn = f.f_code.co_filename.replace("\\", "/")
                for part, owner in _OWNER_PATHS:
                    if part in fn:
                        if self.where is not None:
                            self.where[self._seq] = f"{fn.rsplit('/', 1)[-1]}:{f.f_lineno}:{f.f_code.co_name}"
                        return owner
                f = f.f_back
            return "other"

        def _delta(self, sid: int, d: int) -> None:
            if d == 0:
                return
            self.cur += d
            self.events.append((self.phase, sid, d))
            if self.cur > self.phase_peak.get(self.phase, -1):
                self.phase_peak[self.phase] = self.cur

        def register(self, st, owner: str | None = None) -> int:
            """Track storage ``st`` (once); returns its registration id."""
            import weakref

            cdata = st._cdata
            if cdata in self.live:
                return self.live[cdata][1]
            if st.device.type == "meta":  # shapes only (DeepSpeed keeps meta copies as metadata)
                return 0
            n = st.nbytes()
            self._seq += 1
            sid = self._seq
            self.live[cdata] = [n, sid]
            self.meta[sid] = (self.phase, owner or self._owner())

            def _gone(_r, cdata=cdata, sid=sid):
                v = self.live.get(cdata)
                if v is not None and v[1] == sid:
                    del self.live[cdata]
                    self._delta(sid, -v[0])

            self._refs[sid] = weakref.ref(st, _gone)
            self._delta(sid, n)
            return sid

        def register_tensor(self, t, owner: str | None = None) -> list[int]:
            from torch.distributed._tools.common_utils import get_untyped_storages

            return [sid for st in get_untyped_storages(t) if (sid := self.register(st, owner))]

        def key_of(self, t) -> list[int]:
            from torch.distributed._tools.common_utils import get_untyped_storages

            return [self.live[st._cdata][1] for st in get_untyped_storages(t) if st._cdata in self.live]

        def sizes(self) -> dict[int, int]:
            """registration id -> bytes of every live storage"""
            return {sid: n for n, sid in self.live.values()}

        def mark(self, t, role: str) -> None:
            for k in self.register_tensor(t):
                self.role.setdefault(k, role)

        # -- mode
        def __enter__(self):
            tr = self
            orig = self._orig_resize

            def resize_(st, size):
                cdata = st._cdata
                old = st.nbytes()
                orig(st, size)
                if cdata in tr.live:
                    d = st.nbytes() - old
                    tr.live[cdata][0] += d
                    tr._delta(tr.live[cdata][1], d)
                elif st.nbytes() > 0 and st.device.type != "meta":
                    tr.register(st)

            torch.UntypedStorage.resize_ = resize_
            return super().__enter__()

        def __exit__(self, *a):
            torch.UntypedStorage.resize_ = self._orig_resize
            return super().__exit__(*a)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch.distributed.tensor import DTensor

            if any(t is DTensor for t in types):
                return NotImplemented
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.register_tensor(t)
            return out

    return _Tracker


def StorageTracker():  # noqa: N802 - a factory, so that torch is imported only when used
    """A new storage tracker (a ``TorchDispatchMode``; see the module docstring)."""
    return _make_tracker_class()()


def replay_peak(events, keep, phases) -> int:
    """Peak of the running sum of the events in ``phases`` whose key satisfies ``keep``."""
    cur = peak = 0
    for phase, key, d in events:
        if phase not in phases or not keep(key):
            continue
        cur += d
        peak = max(peak, cur)
    return peak


# ---------------------------------------------------------------------------------------------
# building and wrapping
# ---------------------------------------------------------------------------------------------
def _build(case: Case):
    import warnings

    import torch

    from . import torchref as TR

    cfg = TR.TINY_CONFIGS[case.family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case.method == "qlora":
            model = _build_qlora(cfg, case)
        else:
            # (torchtune trains in its ``dtype``: every weight bf16, PEFT's adapters fp32 as ftplan plans them)
            dtype = ("bf16" if (case.method == "lora" and not case.base_fp32) or case.fsdp_wrap == "torchtune"
                     else "fp32")
            model = TR.build_model(cfg, dtype=dtype, attn_implementation=case.attn)
            if case.method == "lora":
                from peft import LoraConfig, get_peft_model

                model = get_peft_model(model, LoraConfig(r=case.lora_r, lora_alpha=2 * case.lora_r,
                                                         lora_dropout=case.lora_dropout,
                                                         target_modules=_peft_targets(case),
                                                         task_type="CAUSAL_LM"))
    if case.gradient_checkpointing:
        from .hf import set_gradient_checkpointing

        set_gradient_checkpointing(model, True)
    model.train()
    del torch
    return model


def _peft_targets(case: Case):
    if case.lora_targets == "all-linear":
        from ..job import LoraSpec, peft_target_modules
        from ..model import model_from_config
        from .configs import TINY_CONFIGS

        # (llama4_text: the modules all-linear stands for; PEFT wraps its router and fails)
        return peft_target_modules(model_from_config(TINY_CONFIGS[case.family]), LoraSpec())
    return case.lora_targets.split(",")


def _build_qlora(cfg: dict, case: Case):
    """QLoRA as PEFT's FSDP-QLoRA recipe builds it: bitsandbytes nf4 with double quantization,
    ``bnb_4bit_quant_storage`` a float dtype (so FSDP can shard the packed weights), all-linear LoRA."""
    import tempfile as _tf

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from . import torchref as TR

    base = TR.build_model(cfg, dtype="bf16", attn_implementation=case.attn)
    storage = {"bf16": torch.bfloat16, "fp32": torch.float32, "uint8": torch.uint8}[case.quant_storage]
    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                            bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=storage)
    with _tf.TemporaryDirectory() as d:
        # every rank writes its own copy (under torch.distributed transformers saves on rank 0 only)
        base.should_save_on_this_rank = lambda *a, **k: True
        base.save_pretrained(d)
        model = AutoModelForCausalLM.from_pretrained(d, quantization_config=qc, dtype=torch.bfloat16,
                                                     attn_implementation=case.attn, device_map="cpu")
    # what ftplan's exported train.py does for sharded QLoRA (TRL's is_sharded_qlora path): no
    # prepare_model_for_kbit_training, the non-quantized weights stay in the storage dtype
    return get_peft_model(model, LoraConfig(r=case.lora_r, lora_alpha=2 * case.lora_r, lora_dropout=case.lora_dropout,
                                            target_modules=_peft_targets(case), task_type="CAUSAL_LM"))


def _decoder_layers(model):
    for m in model.modules():
        layers = getattr(m, "layers", None)
        if layers is not None and type(m).__name__.endswith("Model") and len(layers) > 0:
            return list(layers)
    raise ValueError("no decoder layers found")


def _wrap(case: Case, model, world: int, rank: int):
    """(model to call, torch optimizer or DeepSpeed engine, autocast dtype or None, extra)."""
    import torch

    extra: dict[str, Any] = {}
    trainable = lambda m: [p for p in m.parameters() if p.requires_grad]  # noqa: E731
    if case.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        m = DDP(model, gradient_as_bucket_view=case.ddp_bucket_view, bucket_cap_mb=case.ddp_bucket_cap_mb)
        return m, torch.optim.AdamW(trainable(m), lr=1e-4, fused=True), torch.bfloat16, extra
    if case.engine == "fsdp2" and case.fsdp_wrap == "torchtune":
        return _wrap_torchtune(case, model, world) + (extra,)
    if case.engine == "fsdp2":
        return _wrap_fsdp2(case, model, world) + (extra,)
    if case.engine == "fsdp1":
        return _wrap_fsdp1(case, model) + (extra,)
    if case.engine == "deepspeed":
        return _wrap_deepspeed(case, model) + (extra,)
    raise ValueError(f"unknown engine {case.engine!r}")


def _wrap_fsdp2(case: Case, model, world: int):
    """accelerate's ``fsdp2_prepare_model`` with ``mixed_precision="bf16"``: every decoder layer
    and the input embedding are their own ``fully_shard`` unit, the final norm and lm_head one unit
    with ``reshard_after_forward=False``, the root the rest;
    ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)`` (``reduce_fp32``:
    ``reduce_dtype=fp32``, torchtitan's default); trainable
    parameters upcast to fp32 (they are the fp32 master copy); autocast around the forward."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if case.replicate > 1:
        mesh = init_device_mesh("cpu", (case.replicate, world // case.replicate),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    has4 = any(type(p).__name__ == "Params4bit" for p in model.parameters())
    if not has4:
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.to(torch.float32)
    kw = dict(mesh=mesh, reshard_after_forward=case.reshard_after_forward,
              mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                             reduce_dtype=torch.float32 if case.reduce_fp32 else torch.bfloat16,
                                             output_dtype=torch.bfloat16),
              offload_policy=CPUOffloadPolicy(pin_memory=False) if case.offload_params else OffloadPolicy())
    for layer in _decoder_layers(model):
        fully_shard(layer, **kw)
    # the transformers *ForCausalLM (inside a PEFT wrapper)
    inner = next(mod for mod in model.modules() if type(mod).__name__.endswith("ForCausalLM")
                 and type(mod).__module__.startswith("transformers"))
    emb, out = inner.get_input_embeddings(), inner.get_output_embeddings()
    tied = out is not None and emb.weight is out.weight
    if not tied:
        fully_shard(emb, **kw)
    # the final norm (lfm2 / lfm2_moe call theirs embedding_norm)
    norm = inner.model.norm if hasattr(inner.model, "norm") else inner.model.embedding_norm
    tail = [norm, emb, out] if tied else [norm, out]
    fully_shard(tail, **{**kw, "reshard_after_forward": False})
    fully_shard(model, **{k: v for k, v in kw.items() if k != "reshard_after_forward"})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    return model, opt, torch.bfloat16


def _wrap_torchtune(case: Case, model, world: int):
    """torchtune 0.3.1's wrapping (``training.shard_model`` as ``lora_finetune_distributed`` /
    ``full_finetune_distributed`` call it), on the Hugging Face model: walking
    ``reversed(named_modules())``, ``fully_shard`` every decoder layer (``layers.i``) and, in
    full fine-tuning, the modules of ``custom_sharded_layers: ['tok_embeddings', 'output']``
    (here ``model.embed_tokens`` and ``lm_head``), with ``reshard_after_forward`` and
    ``CPUOffloadPolicy`` when offloading; then ``fully_shard(model)``: the root holds the rest (LoRA:
    embedding, final norm, output; full: the final norm). No ``MixedPrecisionPolicy`` (torchtune
    trains in its ``dtype``), no autocast. The root is given no ``reshard_after_forward`` so that it
    is not resharded after forward, as the torch of torchtune 0.3.1 (2.4/2.5) did for every root
    (torch 2.13 keeps the root gathered only when the argument is left unset). The model's forward
    becomes torchtune's ``TransformerDecoder.forward`` with ``chunked_output``: the final norm's
    output in 8 chunks along the sequence, the output projection called once per chunk."""
    import types

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    from ..sharding import TORCHTUNE_OUTPUT_CHUNKS

    mesh = init_device_mesh("cpu", (world,))
    inner = next(mod for mod in model.modules() if type(mod).__name__.endswith("ForCausalLM")
                 and type(mod).__module__.startswith("transformers"))
    kw = dict(mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=False) if case.offload_params else OffloadPolicy())
    units = {id(layer) for layer in _decoder_layers(model)}
    if case.method == "full":
        units |= {id(inner.get_input_embeddings()), id(inner.get_output_embeddings())}
    for _name, mod in reversed(list(inner.named_modules())):
        if id(mod) in units:
            fully_shard(mod, reshard_after_forward=case.reshard_after_forward, **kw)
    fully_shard(inner, **kw)

    def forward(self, input_ids):
        h = self.model(input_ids=input_ids, use_cache=False).last_hidden_state
        return [self.lm_head(chunk) for chunk in h.chunk(TORCHTUNE_OUTPUT_CHUNKS, dim=1)]

    inner.forward = types.MethodType(forward, inner)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    return inner, opt, None


def _torchtune_loss(m, ids):
    """torchtune's train step up to ``loss.backward()``: labels shifted with ``hstack`` (the loop
    holds them), ``CEWithChunkedOutputLoss`` (eager: ``compile: False``), ``del logits``."""
    import torch

    from ..sharding import TORCHTUNE_OUTPUT_CHUNKS
    from .torchtune_modules import ChunkedCE

    labels = torch.hstack((ids[..., 1:], torch.full((ids.shape[0], 1), -100, dtype=ids.dtype)))
    logits = m(ids)
    loss = ChunkedCE(TORCHTUNE_OUTPUT_CHUNKS)(logits, labels)
    del logits
    return loss, labels


def _wrap_fsdp1(case: Case, model):
    """accelerate's FSDP1 plugin with ``mixed_precision="bf16"`` and a TRANSFORMER_BASED_WRAP policy:
    ``MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)``,
    ``limit_all_gathers=True``, ``use_orig_params=False`` (accelerate's default), backward prefetch
    as asked (accelerate's default NO_PREFETCH), ``CPUOffload(offload_params=...)``.

    LoRA / QLoRA as HF Trainer prepares a PEFT model for FSDP1 (``transformers.distributed.fsdp.
    update_fsdp_plugin_peft``): the plugin's wrap policy becomes PEFT's ``fsdp_auto_wrap_policy``
    (every leaf module with a trainable ``weight`` -- each ``lora_A`` / ``lora_B`` Linear -- is a unit
    of its own, nested in its decoder-layer unit); for bitsandbytes 4-bit with a float
    ``bnb_4bit_quant_storage`` the mixed precision is overridden to that dtype
    (``set_mixed_precision(storage, override=True)``: bf16 here, the same policy). QLoRA: TRL's
    ``SFTTrainer`` first casts the adapters of a quantized model to bf16. After wrapping, accelerate's
    ``prepare_model`` (FSDP1 branch, ``mixed_precision != "no"``) upcasts every flat parameter that
    requires grad to fp32 (``param.data = param.data.to(torch.float32)``, ``_orig_param_dtype``):
    the adapter units are fp32 again, the frozen layer / root units keep their dtype."""
    import functools

    import torch
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if case.offload_params:
        # CPU stand-ins: no pinned memory, and the "device" stream has nothing to wait for
        torch.Tensor.pin_memory = lambda self, *a, **k: self
        if not hasattr(torch.cpu.Stream, "synchronize"):
            torch.cpu.Stream.synchronize = lambda self: None
    mp_dtype = torch.bfloat16  # accelerate's mixed_precision="bf16"
    if case.method in ("lora", "qlora"):
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
        if case.method == "qlora":
            # TRL SFTTrainer: a quantized model's adapters are cast to bf16
            for p in model.parameters():
                if p.requires_grad:
                    p.data = p.data.to(torch.bfloat16)
            # transformers' update_fsdp_plugin_peft: the quant storage dtype, when it is a float
            storage = {"bf16": torch.bfloat16, "fp32": torch.float32, "uint8": torch.uint8}[case.quant_storage]
            if storage.is_floating_point:
                mp_dtype = storage
    else:
        layer_cls = {type(layer) for layer in _decoder_layers(model)}
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_cls)
    m = FSDP(model, auto_wrap_policy=policy,
             sharding_strategy=ShardingStrategy.FULL_SHARD if case.reshard_after_forward
             else ShardingStrategy.SHARD_GRAD_OP,
             mixed_precision=MixedPrecision(param_dtype=mp_dtype,
                                            reduce_dtype=torch.float32 if case.reduce_fp32 else mp_dtype,
                                            buffer_dtype=mp_dtype),
             cpu_offload=CPUOffload(offload_params=case.offload_params), device_id=torch.device("cpu"),
             limit_all_gathers=True, use_orig_params=False)
    # accelerate's prepare_model, FSDP1 branch with mixed precision: trainable flat parameters in fp32
    for mod in FSDP.fsdp_modules(m):
        if not mod._has_params:
            continue
        fp = mod._flat_param
        if fp.dtype != torch.float32 and fp.device != torch.device("meta") and fp.requires_grad:
            fp.data = fp.data.to(torch.float32)
            mod._handle._orig_param_dtype = torch.float32
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4, fused=True)
    return m, opt, torch.bfloat16


def _wrap_deepspeed(case: Case, model):
    """``deepspeed.initialize`` with bf16, the ZeRO stage and offloads of the case and DeepSpeed's
    defaults for everything else (bucket sizes, prefetch, live parameters)."""
    import deepspeed

    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": case.batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": case.zero_stage},
        # no "optimizer" section, as in ftplan's exported ds_config.json: HF Trainer hands DeepSpeed
        # its own torch AdamW (client optimizer; with offload too, zero_allow_untested_optimizer),
        # and nothing is JIT-compiled (DeepSpeed's AdamW on the CPU accelerator builds cpu_adam /
        # fused_adam C++ extensions: ~200 s on 2 cores)
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    zo = cfg["zero_optimization"]
    # the settings of ftplan's exported ds_config.json, with HF Trainer's "auto" values filled in
    # the way transformers.integrations.deepspeed does (hidden_size based)
    h = _hidden_size(model)
    zo.update({"overlap_comm": True, "contiguous_gradients": True,
               "reduce_bucket_size": case.reduce_bucket_size or h * h})
    if case.zero_stage == 3:
        zo.update({"stage3_prefetch_bucket_size": case.prefetch_bucket or int(0.9 * h * h),
                   "stage3_param_persistence_threshold": 10 * h,
                   "stage3_max_live_parameters": case.max_live or 1_000_000_000,
                   "stage3_max_reuse_distance": case.reuse_distance or 1_000_000_000,
                   "sub_group_size": 1_000_000_000})
    else:
        zo.update({"allgather_partitions": True, "allgather_bucket_size": 500_000_000, "reduce_scatter": True})
    if case.offload_optimizer:
        zo["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if case.offload_params:
        zo["offload_param"] = {"device": "cpu", "pin_memory": False}
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    client = torch.optim.AdamW(params, lr=1e-4, foreach=False)
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=client, config=cfg)
    return engine, engine, None


def _hidden_size(model) -> int:
    cfg = model.config
    return int(getattr(cfg, "hidden_size", None) or cfg.get_text_config().hidden_size)


def _init_deepspeed(timeout) -> None:
    import importlib

    # CPU stand-in: the shared-memory all-reduce kernel is a C++ extension built on first use
    # (minutes); gloo carries every collective without it
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# one rank
# ---------------------------------------------------------------------------------------------
def _param_tensors(model, opt, case: Case) -> tuple[list, list, list, list]:
    """(parameter storages, optimizer-state tensors, master (fp32 partition) tensors, buffers)."""
    import torch

    params, states, master = [], [], []
    for p in model.parameters():
        t = p
        if hasattr(p, "ds_tensor"):
            t = p.ds_tensor
        elif hasattr(p, "to_local"):
            t = p.to_local()
        elif hasattr(p, "_local_shard"):
            t = p._local_shard
        params.append(t)
        qs = getattr(getattr(p, "_local_tensor", p), "quant_state", None) or getattr(p, "quant_state", None)
        while qs is not None:
            for name in ("absmax", "code", "offset"):
                v = getattr(qs, name, None)
                if isinstance(v, torch.Tensor):
                    params.append(v)
            qs = getattr(qs, "state2", None)
    inner = opt
    if case.engine == "deepspeed":
        zopt = opt.optimizer
        for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
            master += list(getattr(zopt, name, []) or [])
        inner = zopt.optimizer
    for st in inner.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                states.append(v)
    buffers = list(model.buffers())
    return params, states, master, buffers


class _Fsdp1SavedGrad:
    """The most bytes FSDP1 holds in its flat parameters' ``_saved_grad_shard`` at once during a
    backward (read from the engine's own state after each ``_accumulate_sharded_grad``). FSDP1
    keeps every reduced gradient shard there on the device until its post-backward final callback,
    CPU offload or not (``_offload_grad`` copies it into ``_cpu_grad`` but leaves it referenced)."""

    def __init__(self) -> None:
        self.peak = 0
        self._flat: dict[int, Any] = {}

    def __enter__(self) -> "_Fsdp1SavedGrad":
        from torch.distributed.fsdp import _runtime_utils as ru

        self._ru, self._orig = ru, ru._accumulate_sharded_grad
        probe = self

        def accumulate(state, handle, sharded_grad):
            out = probe._orig(state, handle, sharded_grad)
            probe._flat[id(handle.flat_param)] = handle.flat_param
            cur = sum(fp._saved_grad_shard.untyped_storage().nbytes() for fp in probe._flat.values()
                      if getattr(fp, "_saved_grad_shard", None) is not None)
            probe.peak = max(probe.peak, cur)
            return out

        ru._accumulate_sharded_grad = accumulate
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ru._accumulate_sharded_grad = self._orig
        self._flat.clear()


def _ds_trace(tr, engine) -> list:
    """Debugging (FTPLAN_DIST_DEBUG=1): every ZeRO-3 module fetch and release, as (index into the
    tracker's events, "F"/"R" + "f"/"b" for forward/backward, module ds_id, class, elements the
    coordinator counts as gathered after it)."""
    log: list = []
    coord = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    coord = coord.get_param_coordinator() if coord is not None else None
    if coord is None:
        return log
    cls = type(coord)
    fetch, release = coord.fetch_sub_module, coord.release_sub_module
    avail = lambda: getattr(coord, f"_{cls.__name__}__n_available_params")  # noqa: E731

    def f(mod, forward):
        out = fetch(mod, forward)
        log.append((len(tr.events), "F" + "fb"[not forward], mod.ds_id, type(mod).__name__, avail()))
        return out

    def r(mod, forward=False):
        out = release(mod, forward)
        log.append((len(tr.events), "R" + "fb"[not forward], mod.ds_id, type(mod).__name__, avail()))
        return out

    coord.fetch_sub_module, coord.release_sub_module = f, r
    return log


def _run_case(case: Case, rank: int, world: int) -> RankMeasure:
    import contextlib
    import warnings

    import torch

    from . import torchref as TR

    torch.manual_seed(0)
    model = _build(case)
    tr = StorageTracker()
    _register_model(tr, model)  # (a helper: a loop variable here would keep a parameter alive)
    cfg = TR.TINY_CONFIGS[case.family]
    vocab = cfg["vocab_size"]
    g = torch.Generator().manual_seed(1000 + rank)
    ids = torch.randint(0, vocab, (case.batch, case.seq_len), generator=g)
    if case.fsdp_wrap == "torchtune":
        # the loop's token ids, made before the step (the labels' shift would show the tracker
        # their storage first, in the forward)
        tr.register_tensor(ids, "model")
    label_keys: set[int] = set()
    hooks = []
    out = RankMeasure(rank=rank, case=case.label)
    from .collectives import GroupRecorder

    groups = GroupRecorder()
    saved_grad = _Fsdp1SavedGrad() if case.engine == "fsdp1" else contextlib.nullcontext()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tr, groups, saved_grad:
            tr.phase = "wrap"
            m, opt, ac_dtype, _extra = _wrap(case, model, world, rank)
            ds_trace = _ds_trace(tr, m) if case.engine == "deepspeed" and os.environ.get("FTPLAN_DIST_DEBUG") else None

            def _grad_hook(grad):
                tr.mark(grad, "grad")
                return grad

            for step in range(case.steps):
                last = step == case.steps - 1
                tr.phase = f"fwd{step}"
                if last:
                    fwd_start_live = tr.sizes()
                ac = torch.autocast("cpu", dtype=ac_dtype) if ac_dtype is not None else contextlib.nullcontext()
                saved_log: list | None = ([] if last and (case.saved_log or os.environ.get("FTPLAN_DIST_SAVED"))
                                             else None)
                hooks_ctx = _saved_tensor_log(tr, saved_log) if saved_log is not None else contextlib.nullcontext()
                with ac, hooks_ctx:
                    if case.fsdp_wrap == "torchtune":
                        loss, labels = _torchtune_loss(m, ids)
                    else:
                        loss = m(input_ids=ids, labels=ids, use_cache=False).loss
                if last:
                    fwd_end_live = tr.sizes()
                tr.phase = f"bwd{step}"
                loss_keys = set(tr.key_of(loss))
                if case.fsdp_wrap == "torchtune":
                    # the loop's shifted labels, held through backward: activations, not gradients
                    label_keys = set(tr.key_of(labels))
                if last:  # FSDP2 creates its unsharded parameters on the first forward
                    hooks = [p.register_hook(_grad_hook) for p in _hookable_params(m, case)]
                if case.engine == "deepspeed":
                    m.backward(loss)
                else:
                    loss.backward()
                del loss
                if last:
                    bwd_end_live = tr.sizes()
                    out.resident_before_step = tr.cur
                tr.phase = f"step{step}"
                if case.engine == "deepspeed":
                    m.step()
                else:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            for h in hooks:
                h.remove()
            tr.phase = "end"
    out.groups = dict(groups.groups)
    extra_detail = {"fsdp1_saved_grad_peak": saved_grad.peak} if case.engine == "fsdp1" else {}

    # ---- categories
    params, states, master, buffers = _param_tensors(m, opt, case)
    end_sizes = tr.sizes()
    end_keys = set(end_sizes)

    def keys(ts):
        s: set[int] = set()
        for t in ts:
            s.update(tr.key_of(t))
        return s & end_keys

    kp, ko, km, kb = keys(params), keys(states), keys(master), keys(buffers)
    ko -= kp
    km -= kp | ko
    kb -= kp | ko | km
    size = lambda ks: sum(end_sizes[k] for k in ks)  # noqa: E731
    out.params, out.optimizer, out.master, out.buffers = size(kp), size(ko), size(km), size(kb)
    rest = end_keys - kp - ko - km - kb
    out.engine_persistent = size(rest)
    s = case.steps - 1
    fb = {f"fwd{s}", f"bwd{s}"}
    alloc_in_fb = {k for k, (ph, _o) in tr.meta.items() if ph in fb}
    grad_keys = {k for k in alloc_in_fb if bwd_end_live.get(k)} - loss_keys - label_keys
    out.grads = sum(bwd_end_live[k] for k in grad_keys)
    # transient: what does not survive backward (storages FSDP resized to 0 included)
    eng = {k for k in tr.meta if not fwd_start_live.get(k) and not bwd_end_live.get(k)
           and (tr.meta[k][1] in ENGINE_OWNERS or tr.role.get(k) == "grad")}
    if case.fsdp_wrap == "torchtune" and case.method == "full":
        # autograd's out-of-place partial sums of the output unit's per-chunk weight gradients
        # (its input buffer: no Python frame, no hook sees them): the storages of the output
        # weight's size made in backward by no engine and freed before it ends (the case's
        # tokens x vocabulary must differ from vocabulary x hidden, so that no logits-sized
        # tensor is taken for one)
        w = cfg["vocab_size"] * cfg["hidden_size"] * 2
        if case.batch * case.seq_len * cfg["vocab_size"] * 2 == w:
            raise ValueError("torchtune full case: choose batch x seq_len != hidden_size")
        first: dict[int, int] = {}
        for ph, sid, d in tr.events:
            if ph == f"bwd{s}" and d > 0:
                first.setdefault(sid, d)
        eng |= {k for k, d in first.items() if d == w and tr.meta[k][1] == "other" and not bwd_end_live.get(k)
                and not fwd_start_live.get(k)}
    out.engine_transient_peak = replay_peak(tr.events, eng.__contains__, fb)
    out.activations = sum(v for k, v in fwd_end_live.items()
                          if tr.meta.get(k, ("", ""))[0] == f"fwd{s}" and tr.meta[k][1] not in ENGINE_OWNERS
                          and k not in loss_keys)
    out.fwd_bwd_peak = max(tr.phase_peak.get(ph, 0) for ph in fb)
    out.step_peak = tr.phase_peak.get(f"step{s}", 0)
    out.detail = {
        **extra_detail,
        "persistent_by_owner": _by(tr, rest),
        "grads_by_owner": _by(tr, grad_keys, bwd_end_live),
        "transient_by_owner": _by(tr, eng, None, peak_only=True),
        "end_total": tr.cur,
    }
    import torch.distributed as dist

    out.detail["world_group"] = str(dist.distributed_c10d._get_default_group().group_name)
    if saved_log is not None:
        # the saved tensors whose storages are counted as activations (each storage once)
        act_keys = {k for k, v in fwd_end_live.items() if tr.meta.get(k, ("", ""))[0] == f"fwd{s}"
                    and tr.meta[k][1] not in ENGINE_OWNERS and k not in loss_keys}
        seen_keys: set[int] = set()
        rows = []
        for keys_, desc in saved_log:
            mine = [k for k in keys_ if k in act_keys and k not in seen_keys]
            seen_keys.update(mine)
            rows.append((sum(fwd_end_live[k] for k in mine), *desc))
        out.detail["saved"] = rows
        out.detail["unsaved_activation_bytes"] = sum(fwd_end_live[k] for k in act_keys - seen_keys)
    if os.environ.get("FTPLAN_DIST_DEBUG"):
        if ds_trace is not None:
            out.detail["ds_trace"] = ds_trace
        out.detail["persistent_where"] = sorted((end_sizes[k], tr.meta[k][0] + " " + tr.where.get(k, tr.meta[k][1]))
                                                for k in rest if end_sizes[k])
        out.detail["grads_where"] = sorted((bwd_end_live[k], tr.meta[k][0] + " " + tr.where.get(k, tr.meta[k][1]))
                                           for k in grad_keys)
        out.detail["events"] = [(ph, sid, d, tr.meta[sid][1] + " " + tr.where.get(sid, ""), tr.role.get(sid, ""),
                                 sid in eng, i)
                                for i, (ph, sid, d) in enumerate(tr.events)
                                if ph in fb and (sid in eng or sid in grad_keys
                                                 or os.environ.get("FTPLAN_DIST_DEBUG") == "all")]
    if case.offload_params and case.engine in ("fsdp1", "fsdp2"):
        out.host = out.params + out.grads + out.optimizer
    elif case.engine == "deepspeed":
        if case.offload_optimizer:
            out.host += out.optimizer + out.master + out.grads
        if case.offload_params:
            out.host += out.params
    return out


def _saved_tensor_log(tr, log: list):
    """Autograd saved-tensor hooks (``FTPLAN_DIST_SAVED=1``): every tensor the forward saves, as
    (storage keys, (dtype, shape, is a view, is a parameter, innermost model frame))."""
    import torch

    def pack(t):
        f, where = sys._getframe(1), ""
        while f is not None:
            fn = f.f_code.co_filename.replace("\\", "/")
            if "/peft/" in fn or "/transformers/" in fn or "/bitsandbytes/" in fn:
                where = f"{fn.rsplit('/', 1)[-1]}:{f.f_lineno}:{f.f_code.co_name}"
                break
            f = f.f_back
        log.append((tr.key_of(t), (str(t.dtype).replace("torch.", ""), tuple(t.shape), t._base is not None,
                                   isinstance(t, torch.nn.Parameter), where)))
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)


def _register_model(tr, model) -> None:
    for p in model.parameters():
        tr.register_tensor(p.data, "model")
        for t in _param_tensors_plain(p):
            tr.register_tensor(t, "model")
    for b in model.buffers():
        tr.register_tensor(b, "model")


def _param_tensors_plain(p) -> list:
    import torch

    out = []
    qs = getattr(p, "quant_state", None)
    while qs is not None:
        for name in ("absmax", "code", "offset"):
            v = getattr(qs, name, None)
            if isinstance(v, torch.Tensor):
                out.append(v)
        qs = getattr(qs, "state2", None)
    return out


def _hookable_params(m, case: Case) -> list:
    """Leaf tensors whose gradients autograd produces: the unsharded parameters under FSDP2, the
    (unsharded) flat parameters under FSDP1, the module parameters otherwise."""
    if case.engine == "fsdp2":
        out = []
        for mod in m.modules():
            state = getattr(mod, "_get_fsdp_state", None)
            if state is None:
                continue
            pg = state()._fsdp_param_group
            if pg is None:
                continue
            for fp in pg.fsdp_params:
                up = fp._unsharded_param if hasattr(fp, "_unsharded_param") else None
                if up is not None and up.requires_grad:
                    out.append(up)
        return out
    return [p for p in m.parameters() if p.requires_grad]


def _by(tr, ks, sizes=None, peak_only=False) -> dict[str, int]:
    out: dict[str, int] = {}
    if peak_only:
        return {o: 1 for o in sorted({tr.meta[k][1] for k in ks})}
    for k in ks:
        o = ":".join(tr.meta[k])
        out[o] = out.get(o, 0) + (sizes or tr.sizes())[k]
    return out


def _worker(rank: int, world: int, port: int, cases: list[Case], outdir: str, need_ds: bool,
            timeout_s: float) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results: list[dict] = []
    try:
        import logging
        import warnings

        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        import datetime

        timeout = datetime.timedelta(seconds=timeout_s)
        if need_ds:
            _init_deepspeed(timeout)
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
        for case in cases:
            t0 = time.perf_counter()
            try:
                results.append({"ok": True, **dataclasses.asdict(_run_case(case, rank, world))})
            except Exception as e:  # one case failing must not hide the others
                results.append({"ok": False, "case": case.label, "error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc(limit=8)})
                print(f"rank {rank}: {case.label}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            dist.barrier()
            if os.environ.get("FTPLAN_DIST_TIMING") and rank == 0:
                print(f"{case.label}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cases(cases: list[Case], world_size: int = 2, *, timeout_s: float = 300.0) -> list[list[RankMeasure] | str]:
    """Run every case in one process group of ``world_size`` gloo processes (one spawn for all
    cases). Returns, per case, the per-rank measures, or the error text of the case. A collective
    that hangs fails after ``timeout_s`` (gloo's timeout); the whole run is stopped after
    ``timeout_s`` x (cases + 1)."""
    import time

    import torch.multiprocessing as mp

    need_ds = any(c.engine == "deepspeed" for c in cases)
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(_worker, args=(world_size, _free_port(), list(cases), d, need_ds, timeout_s),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s * (len(cases) + 1)
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.terminate()
                raise TimeoutError(f"distributed measurement did not finish in {timeout_s * (len(cases) + 1):.0f} s")
        per_rank = []
        for r in range(world_size):
            path = os.path.join(d, f"rank{r}.json")
            with open(path) as f:
                per_rank.append(json.load(f))
    out: list[list[RankMeasure] | str] = []
    fields = {f.name for f in dataclasses.fields(RankMeasure)}
    for i in range(len(cases)):
        rows = [per_rank[r][i] if i < len(per_rank[r]) else {"ok": False, "error": "missing"}
                for r in range(world_size)]
        bad = next((row for row in rows if not row.get("ok")), None)
        if bad is not None:
            out.append(bad.get("error", "failed") + "\n" + bad.get("traceback", ""))
        else:
            out.append([RankMeasure(**{k: v for k, v in row.items() if k in fields}) for row in rows])
    return out
