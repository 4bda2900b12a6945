"""Exact CPU reference counts for activation checkpointing variants, activation offloading and the
loss paths (the ground truth ``tests/test_checkpointing_vs_torch.py`` holds the formulas against).

Everything here drives the real code paths of the reference stack on tiny random-weight Hugging
Face models (:mod:`ftplan.measure.torchref` builds them) and counts bytes exactly:

* **checkpointing**: transformers 5's ``activation_checkpointing_enable`` (non-reentrant by default,
  ``use_reentrant=True`` for the reentrant variant, ``every_n_layers`` for every-k), TRL's
  ``enable_selective_activation_checkpointing`` (``gradient_checkpointing_kwargs={"selective":
  True}``: save the attention kernel's outputs) and torch's ``create_selective_checkpoint_contexts``
  with torchtitan's per-op policy (:func:`torchtitan_op_policy`).
* What stays alive between forward and backward is the union of (1) the tensors autograd saved
  through ``saved_tensors_hooks`` (checkpoint inputs included; the tensors saved *inside* a
  non-reentrant checkpointed region go to the checkpoint's own hooks and are dropped), (2) the
  tensors the recompute closures capture (``position_embeddings``, masks, ``position_ids``), and
  (3) under selective checkpointing, the op outputs the SAC policy caches in the
  ``_CachingTorchDispatchMode`` storage, which never pass through a saved-tensor hook. (3) is read
  from the storage dicts themselves (:class:`SacRecorder`).
* **activation offloading**: TRL's ``get_act_offloading_ctx_manager`` (streams on, as TRL uses it)
  runs on CPU by telling it the accelerator is the CPU and turning pinned memory off (the only
  changes); after the forward, its own ``tracker`` says which saved tensors were copied to the host
  and which stayed, and its ``fwd_stash`` which originals are still alive.
* **loss paths**: ``hf`` = ``model(labels=...)`` (transformers' ``ForCausalLMLoss``); ``trl`` =
  TRL's ``add_fused_lm_head`` + ``model(..., fused_lm_head=True)`` and the loss exactly as
  ``SFTTrainer.compute_loss`` forms it (``-log_probs.sum() / num_items_in_batch``); ``compact=True``
  takes the path TRL takes on CUDA (only the positions with a label are projected).
* **padding-free**: the batch TRL's ``DataCollatorForLanguageModeling(padding_free=True)`` makes:
  one row, ``position_ids`` restarting per sequence, the first label of each sequence ``-100``,
  ``cu_seq_lens_q/k``, ``max_length_q/k`` and ``seq_idx`` passed to the model.

Imports torch, transformers and (for the TRL paths) trl; only measurement code and tests use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from . import torchref as TR
from .accounting import SacRecorder

__all__ = [
    "VariantMeasure",
    "SacRecorder",
    "torchtitan_op_policy",
    "enable_checkpointing",
    "padding_free_batch",
    "measure_variant",
]

# torchtitan's op-level SAC save list (torchtitan/distributed/activation_checkpoint.py, 2025:
# ``_save_list``): matmuls, the CUDA attention kernels, reduce-scatter, and ``max`` (float8
# amax). On CPU, sdpa runs ``_scaled_dot_product_flash_attention_for_cpu``: it stands in for the
# CUDA kernels here (TRL's selective policy lists it for the same reason).
_TITAN_SAVE = (
    "mm",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)


def _titan_save_ops() -> set:
    ops = {getattr(torch.ops.aten, n).default for n in _TITAN_SAVE if hasattr(torch.ops.aten, n)}
    ops.add(torch.ops.aten.max.default)
    rs = getattr(getattr(torch.ops, "_c10d_functional", None), "reduce_scatter_tensor", None)
    if rs is not None:
        ops.add(rs.default)
    return ops


def torchtitan_op_policy() -> Callable[[], Any]:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint`` with torchtitan's op policy: save
    the outputs of every listed op except every second ``mm`` (counted per checkpointed call, the
    counter starts fresh for each layer), recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = _titan_save_ops()
    mm = torch.ops.aten.mm.default

    def context_fn():
        meta: dict[str, int] = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
            if func == mm:
                meta[key] += 1
            keep = func in save and not (func == mm and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


def _hf(model: nn.Module) -> nn.Module:
    return TR.hf_inner(model)


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in _hf(model).modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_checkpointing(model: nn.Module, mode: str, *, every: int = 2) -> None:
    """Turn on checkpointing variant ``mode`` the way the reference stack does it."""
    hf = _hf(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "none":
            TR.set_gradient_checkpointing(model, False)
            return
        if mode == "full":
            hf.activation_checkpointing_enable()
        elif mode == "full-reentrant":
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        elif mode == "every-k":
            # HF Trainer: activation_checkpointing_kwargs={"every_n_layers": k}
            hf.activation_checkpointing_enable(every_n_layers=every)
        elif mode == "selective-attention":
            # SFTTrainer with gradient_checkpointing_kwargs={"selective": True}
            from trl.models.selective_activation_checkpointing import enable_selective_activation_checkpointing

            enable_selective_activation_checkpointing(model)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif mode == "selective":
            hf.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False, "context_fn": torchtitan_op_policy()})
        else:
            raise ValueError(f"unknown checkpointing mode {mode!r}")
        if any(not p.requires_grad for p in model.parameters()) and hasattr(hf, "enable_input_require_grads"):
            if getattr(hf, "_require_grads_hook", None) is None:
                hf.enable_input_require_grads()


def padding_free_batch(batch: int, seq_len: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``batch`` sequences of ``seq_len`` random tokens as TRL's padding-free collator returns them."""
    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, vocab, (seq_len,), generator=g) for _ in range(batch)]
    input_ids = torch.cat(ids)[None]
    position_ids = torch.cat([torch.arange(seq_len) for _ in range(batch)])[None]
    labels = input_ids.clone()
    labels[position_ids == 0] = -100
    starts = (position_ids[0] == 0).nonzero().flatten()
    cu = torch.cat([starts, torch.tensor([position_ids.size(1)])]).to(torch.int32)
    seq_idx = torch.repeat_interleave(torch.arange(cu.numel() - 1, dtype=torch.int32), cu.diff())[None]
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids, "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu, "max_length_q": int(cu.diff().max()), "max_length_k": int(cu.diff().max()),
            "seq_idx": seq_idx}


@dataclasses.dataclass
class VariantMeasure:
    """Bytes alive between forward and backward (weights excluded), exact."""

    #: every storage the backward needs that lives on the device (for offloading: stays there)
    device_bytes: int
    #: offloading: bytes of the host copies; 0 otherwise
    host_bytes: int
    #: of device_bytes: the SAC cache
    sac_cache_bytes: int
    #: of device_bytes: autocast's compute-dtype copies of trainable weights (counted with the
    #: weights by the model, so tests subtract them)
    weight_copy_bytes: int
    #: offloading: the tensors still alive in TRL's forward stash
    stash_bytes: int = 0
    n_checkpointed: int = 0
    loss: float = float("nan")
    records: list = dataclasses.field(default_factory=list, repr=False)


class _NoStream:
    """A stand-in for a CUDA stream/event on CPU: ordering is already sequential there."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> "_NoStream":
        return self

    def synchronize(self) -> None:
        pass


class _CpuDeviceModule:
    """What TRL's OffloadActivations asks of ``torch.cuda``, for a CPU run (no streams, no
    caching allocator); every tensor operation stays TRL's own."""

    Stream = _NoStream

    @staticmethod
    def current_stream() -> _NoStream:
        return _NoStream()

    @staticmethod
    def stream(s: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @staticmethod
    def empty_cache() -> None:
        pass


@contextlib.contextmanager
def _cpu_accelerator() -> Iterator[None]:
    """Make TRL's offloading treat the CPU as the accelerator (torch has none here)."""
    orig = torch.accelerator.current_accelerator
    torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.accelerator.current_accelerator = orig  # type: ignore[assignment]


class _Held:
    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def _forward_loss(model: nn.Module, inputs: dict[str, Any], loss: str) -> tuple[torch.Tensor, Any]:
    if loss == "hf":
        out = model(**inputs, use_cache=False)
        return out.loss, out
    if loss == "trl":
        labels = inputs["labels"]
        n_items = (labels[:, 1:] != -100).sum()  # what HF Trainer passes as num_items_in_batch
        out = model(**inputs, use_cache=False, fused_lm_head=True)
        per_token = -out.log_probs
        return per_token.sum() / torch.as_tensor(n_items).clamp(min=1), out
    raise ValueError(f"unknown loss {loss!r}")


def measure_variant(
    model: nn.Module,
    *,
    batch: int,
    seq_len: int,
    checkpointing: str = "full",
    every: int = 2,
    offload: bool = False,
    loss: str = "hf",
    compact: bool = False,
    padding_free: bool = False,
    padded: bool = False,
    dtype: str | None = "bf16",
    autocast: bool = True,
    min_offload_size: int = 1,
    hold_packed: bool = True,
    seed: int = 0,
) -> VariantMeasure:
    """One real forward (and loss) of ``model`` under the variant; counts what backward will use.

    ``autocast``: run under ``torch.autocast("cpu", dtype)`` as HF Trainer does with ``bf16=True``.
    ``loss="trl"`` needs :func:`add_trl_fused_head` applied to the model first.
    ``min_offload_size``: TRL's threshold (default there 1024 bytes); the tiny test models have
    tensors below it that real models never have, so tests pass 1.
    ``padded``: a padded micro-batch (:func:`ftplan.measure.torchref.pad_batch`: the last row
    shorter, an attention_mask with zeros), as ``Job.padded_batches`` plans it.
    ``hold_packed`` (offloading): keep every tensor TRL's pack hook receives alive until the count
    is taken. TRL recognises a repeat by (storage address + offset, dtype); without this a fresh
    tensor that the allocator places at the address of a freed, offloaded one is kept on the
    device as a "repeat" (allocator-dependent: glibc on CPU, the caching allocator on CUDA). Holding
    the originals leaves only true repeats, which is the split ftplan predicts; the bytes are
    counted from TRL's tracker either way, never from the allocator.
    """
    model.train()
    enable_checkpointing(model, checkpointing, every=every)
    sac = SacRecorder()
    sac.install(model)
    hf = _hf(model)
    cfg = hf.config.get_text_config()
    vocab = int(cfg.vocab_size)
    if padding_free:
        inputs = padding_free_batch(batch, seq_len, vocab, seed)
    else:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
        inputs = TR.pad_batch(ids) if padded else {"input_ids": ids, "labels": ids}
    params = {TR.storage_key(p) for p in model.parameters()} | {TR.storage_key(b) for b in model.buffers()}
    ac = torch.autocast("cpu", dtype=TR.torch_dtype(dtype)) if autocast and dtype else contextlib.nullcontext()
    closures = TR.SavedTensorTracker(model, track_ops=False, track_modules=False)
    patch = contextlib.nullcontext()
    if compact:
        import trl.trainer.utils as tu

        patch = _patched(tu, "_use_triton", lambda device: True)
    n_ckpt = sum(1 for m in _decoder_layers(model) if getattr(m, "gradient_checkpointing", False))

    if not offload:
        tracker = TR.SavedTensorTracker(model, track_ops=True)
        with patch, tracker, ac:
            loss_t, out = _forward_loss(model, inputs, loss)
        del out
        records = tracker.alive_records()
        device = {r.key: r.nbytes for r in records}
        for k, nb in TR.graph_leaf_bytes(loss_t, set(device) | params).items():  # (no op saved them)
            device.setdefault(k, nb)
        copies = sum(r.nbytes for r in records if r.param_copy)
        host = stash = 0
    else:
        from trl.models.activation_offloading import get_act_offloading_ctx_manager

        with _cpu_accelerator():
            ctx = get_act_offloading_ctx_manager(model, use_pin_memory=False, use_streams=True,
                                                 min_offload_size=min_offload_size, warn_if_no_head=False)
        ctx.device_module = _CpuDeviceModule()
        ctx.s1 = _NoStream()
        noop_held: list[weakref.ref] = []
        # the NoOpManager TRL enters around the output head is the first hook on lm_head
        noop = _find_noop(model)
        if noop is not None:
            noop.pack_hook = _recording_pack(noop_held)
            noop.unpack_hook = lambda h: h.t
        orig_pack = ctx.pack_hook
        trace: list[tuple] = []
        packed: list[torch.Tensor] = []

        def pack(t):
            gf = t.grad_fn
            if hold_packed:
                packed.append(t)
            tid = orig_pack(t)
            entry = ctx.tracker.get(tid)
            trace.append((tid, tuple(t.shape), str(t.dtype), t.numel() * t.element_size(),
                          bool(entry and entry[1]), type(gf).__name__ if gf is not None else ""))
            return tid

        ctx.pack_hook = pack
        with _cpu_accelerator(), patch, closures._patched_checkpointing(), ctx, ac:
            loss_t, out = _forward_loss(model, inputs, loss)
            del out
            device: dict[int, int] = {}
            copy_keys: set[int] = set()
            host = 0

            def hold(t: torch.Tensor) -> None:
                k = TR.storage_key(t)
                device[k] = TR.storage_nbytes(t)
                if t.grad_fn is not None and closures._param_copy_of(t.grad_fn):
                    copy_keys.add(k)

            for t, modified, *_ in ctx.tracker.values():
                if modified:
                    host += TR.storage_nbytes(t)
                else:
                    hold(t)
            stash = sum({TR.storage_key(t): TR.storage_nbytes(t) for t, _ in ctx.fwd_stash.values()}.values())
            for t, _ in ctx.fwd_stash.values():
                hold(t)
            for ref in noop_held:
                h = ref()
                if h is not None:
                    hold(h.t)
            for k, nb in sac.storage_bytes().items():
                device.setdefault(k, nb)
            for r in closures._closure_records():
                device[r.key] = r.nbytes
            # leaves the graph holds that no hook saw (Granite's unscaled embedding output) stay
            for k, nb in TR.graph_leaf_bytes(loss_t, set(device) | params).items():
                device.setdefault(k, nb)
            records = trace
            copies = sum(device[k] for k in copy_keys if k not in params)
            # the graph (and the offloaded copies) are freed before the hooks go away
            loss_value = float(loss_t.detach().float())
            del loss_t
            ctx.tracker.clear()
            ctx.fwd_stash.clear()
            packed.clear()
        for k in list(device):
            if k in params or k == 0:
                del device[k]
        return VariantMeasure(device_bytes=sum(device.values()), host_bytes=host,
                              sac_cache_bytes=sum(sac.storage_bytes(params).values()), weight_copy_bytes=copies,
                              stash_bytes=stash, n_checkpointed=n_ckpt, loss=loss_value, records=records)
    for k, nb in sac.storage_bytes(params).items():
        device.setdefault(k, nb)
    loss_value = float(loss_t.detach().float())
    return VariantMeasure(device_bytes=sum(device.values()), host_bytes=host,
                          sac_cache_bytes=sum(sac.storage_bytes(params).values()), weight_copy_bytes=copies,
                          stash_bytes=stash, n_checkpointed=n_ckpt, loss=loss_value, records=records)


def _recording_pack(held: list) -> Callable:
    def pack(t):
        h = _Held(t)
        held.append(weakref.ref(h))
        return h

    return pack


def _find_noop(model: nn.Module):
    from trl.models.activation_offloading import NoOpManager

    for m in model.modules():
        for hook in list(m._forward_pre_hooks.values()):
            cell = getattr(hook, "__closure__", None) or ()
            for c in cell:
                obj = c.cell_contents
                if isinstance(obj, NoOpManager):
                    return obj
    return None


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    orig = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, orig)


def add_trl_fused_head(model: nn.Module) -> None:
    """What SFTTrainer does: ``add_fused_lm_head`` on the base model, with the outputs it asks for."""
    from trl.trainer.utils import add_fused_lm_head

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))
