"""Reference measurements of fine-tuning memory with real PyTorch on CPU.

This module is the *ground truth* that ftplan's formulas are held against. It builds tiny,
random-weight instances of the real Hugging Face architectures (``AutoModelForCausalLM.from_config``),
optionally wraps them with real PEFT LoRA, runs one real training step (forward through the model's
own loss, backward, optimizer step) and counts bytes exactly:

* parameters, gradients and optimizer state are summed over tensor *storages* (each storage once);
* saved activations are the tensors autograd keeps for the backward pass, captured with
  :func:`torch.autograd.graph.saved_tensors_hooks` (see :class:`SavedTensorTracker` for exactly what
  is counted, including under non-reentrant activation checkpointing);
* :func:`live_bytes_after_forward` is an independent, allocator-level cross-check using the profiler.

Everything runs on CPU (``device="cpu"``); ``device="meta"`` is accepted by :func:`build_model` and
the parameter-counting functions. This module imports torch at import time; it is only imported by
measurement code and tests, never by the planner itself.

The pieces are shared with ``ftplan measure`` and live in their own modules, re-exported here:
tiny configs in :mod:`~ftplan.measure.configs`, building, quantizing and LoRA in
:mod:`~ftplan.measure.hf`, byte accounting in :mod:`~ftplan.measure.accounting`. This module adds
the one-step reference measurement (:func:`measure_step`) and the allocator-level cross-check
(:func:`live_bytes_after_forward`).

Findings about the installed stack (torch 2.13 / transformers 5.23 / peft 0.21 / bitsandbytes 0.50),
established by running this module:

* ``model.gradient_checkpointing_enable()`` is a deprecated alias of
  ``activation_checkpointing_enable()``; with no kwargs it uses
  ``functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)`` (NON-reentrant), wraps
  each ``GradientCheckpointingLayer`` (decoder layer) ``forward`` (module hooks stay outside), passes
  ``hidden_states`` positionally and every other argument (``position_embeddings`` cos/sin,
  ``attention_mask``, ``position_ids`` ...) through a ``functools.partial`` closure, and always calls
  ``enable_input_require_grads()`` (because ``main_input_name == "input_ids"``).
* MoE experts are fused 3-D ``nn.Parameter`` s (``experts.gate_up_proj`` ``[E, 2*I, H]`` and
  ``experts.down_proj`` ``[E, H, I]``); the default ``experts_implementation`` is ``"grouped_mm"``
  (also on CPU). Router weights are a plain ``nn.Parameter`` in a ``*TopKRouter`` module (not an
  ``nn.Linear``); DeepSeek-V3's ``e_score_correction_bias`` is a *buffer*, not a parameter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from .accounting import (
    CATEGORIES,
    SavedRecord,
    SavedTensorTracker,
    graph_leaf_bytes,
    optimizer_state_bytes,
    params_by_category,
    storage_key,
    storage_nbytes,
    total_params,
    trainable_params,
    unique_bytes,
    unique_named_parameters,
)
from .configs import TINY_CONFIGS
from .hf import (
    DTYPES,
    LoraApplied,
    apply_lora,
    build_model,
    hf_inner,
    make_optimizer,
    model_dtype,
    set_gradient_checkpointing,
    strip_peft_prefix,
    torch_dtype,
)

__all__ = [
    "TINY_CONFIGS",
    "CATEGORIES",
    "DTYPES",
    "build_model",
    "params_by_category",
    "total_params",
    "trainable_params",
    "LoraApplied",
    "apply_lora",
    "SavedRecord",
    "SavedTensorTracker",
    "StepMeasure",
    "measure_step",
    "set_gradient_checkpointing",
    "make_optimizer",
    "optimizer_state_bytes",
    "LiveBytes",
    "live_bytes_after_forward",
    "storage_key",
    "storage_nbytes",
    "graph_leaf_bytes",
    "padding_tokens",
    "pad_batch",
]

#: the names these helpers had when they lived here: measurement modules and tests use them, and
#: :func:`measure_step` looks them up here (tests replace ``_model_dtype`` to force autocast)
_torch_dtype, _model_dtype, _hf_inner, _strip_peft_prefix = torch_dtype, model_dtype, hf_inner, strip_peft_prefix


# --------------------------------------------------------------------------------------------------
# One training step
# --------------------------------------------------------------------------------------------------
def padding_tokens(seq_len: int) -> int:
    """ftplan's padded-batch convention (``Job.padded_batches``): the LAST row of the micro-batch
    is shorter by ``max(1, seq_len // 8)`` tokens (at most ``seq_len - 1``: one real token stays),
    padded on the right as TRL's collator pads; every other row is full length."""
    return max(0, min(seq_len - 1, max(1, seq_len // 8)))


def pad_batch(input_ids: torch.Tensor, pad: int | None = None) -> dict[str, torch.Tensor]:
    """``input_ids`` (b, s) as TRL's ``DataCollatorForLanguageModeling`` returns a padded
    micro-batch (:func:`padding_tokens` convention): the last ``pad`` positions of the last row
    get pad id 0, ``attention_mask`` 0 (int64, as the collator's) and label -100."""
    b, s = input_ids.shape
    pad = padding_tokens(s) if pad is None else pad
    ids = input_ids.clone()
    mask = torch.ones_like(ids)
    labels = ids.clone()
    if pad:
        ids[-1, s - pad:] = 0
        mask[-1, s - pad:] = 0
        labels[-1, s - pad:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}




@dataclasses.dataclass
class StepMeasure:
    """Exact byte counts from one real training step (see :func:`measure_step`)."""

    param_bytes: int
    trainable_param_bytes: int
    frozen_param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    saved_activation_bytes: int
    saved_by_kind: dict[str, int]
    n_trainable_tensors: int
    # --- extras useful for debugging / exact formulas ---
    #: bitsandbytes quantization state (4-bit absmax/code/nested absmax, 8-bit SCB) included in
    #: ``param_bytes``/``frozen_param_bytes`` (Params4bit storages themselves are the packed uint8)
    quant_state_bytes: int = 0
    buffer_bytes: int = 0
    saved_by_module: dict[str, int] = dataclasses.field(default_factory=dict)
    optimizer_state_by_key: dict[str, int] = dataclasses.field(default_factory=dict)
    optimizer_state_bytes_per_param_sum: int = 0
    excluded_param_saved_bytes: int = 0
    checkpoint_calls: int = 0
    checkpoint_rng_state_bytes: int = 0
    loss: float = float("nan")
    records: list[SavedRecord] = dataclasses.field(default_factory=list, repr=False)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def measure_step(
    model: nn.Module,
    *,
    batch: int,
    seq_len: int,
    gradient_checkpointing: bool,
    optimizer: str = "adamw",
    lr: float = 1e-4,
    dtype: str | None = None,
    seed: int = 0,
    checkpoint_kwargs: dict | None = None,
    keep_records: bool = True,
    track_ops: bool = True,
    forward_only: bool = False,
    padded: bool = False,
) -> StepMeasure:
    """Run ONE real training step and count bytes exactly.

    Procedure: ``model.train()``; set HF activation checkpointing on/off (:func:`set_gradient_
    checkpointing`); ``torch.manual_seed(seed)``; ``input_ids = randint(vocab, (batch, seq_len))``;
    forward ``model(input_ids=input_ids, labels=input_ids)`` under :class:`SavedTensorTracker`, so the
    model's own loss (``ForCausalLMLoss``: ``logits.float()``, shift, ``cross_entropy``) is inside;
    drop the outputs except ``loss`` (HF Trainer also discards the logits before backward) and count
    the alive saved storages; ``loss.backward()``; sum ``p.grad`` storages; build the optimizer over
    trainable parameters (:func:`make_optimizer`) and ``step()``; sum optimizer state.

    Args:
        dtype: compute dtype. ``None`` (or the model's own dtype) = plain training in the model
            dtype. A different value (e.g. ``"bf16"`` on an fp32 model) runs the forward under
            ``torch.autocast("cpu", dtype)``, i.e. mixed precision as HF Trainer's ``bf16=True``; the
            low-precision weight copies autocast makes and saves are counted as activations
            (op/producer ``ToCopyBackward0`` or ``_to_copy``).
        checkpoint_kwargs: passed to ``activation_checkpointing_enable`` (``None`` = HF default,
            non-reentrant). Use ``{"use_reentrant": True}`` to measure reentrant checkpointing.
        padded: a padded micro-batch (:func:`pad_batch`: the last row shorter, an attention_mask
            with zeros, labels -100 there), as ``Job.padded_batches`` plans it.
        keep_records: keep per-storage :class:`SavedRecord` s in the result.
        forward_only: stop after counting the saved activations (no backward, no optimizer step,
            so the weights are not changed); gradient/optimizer fields are then 0.

    Note: a full step really updates the weights (``optimizer.step()``), so repeated calls on the
    same model see different weights (MoE routing may change; byte counts with the default
    ``grouped_mm`` experts do not depend on the routing).

    Field meanings (bytes, exact): ``param_bytes`` = all parameter storages once (tied counted once;
    for bitsandbytes 4-bit weights the packed uint8 storage plus its ``quant_state`` tensors);
    ``trainable_param_bytes``/``frozen_param_bytes`` split it by ``requires_grad``; ``grad_bytes`` =
    ``p.grad`` storages after backward; ``optimizer_state_bytes`` = every tensor in
    ``optimizer.state`` once (AdamW: ``exp_avg`` + ``exp_avg_sq`` + a 4-byte fp32 ``step`` tensor per
    parameter tensor; on CUDA that ``step`` lives on the host unless ``fused``/``capturable``);
    ``saved_activation_bytes`` = :class:`SavedTensorTracker` total at the end of the forward;
    ``saved_by_kind`` = the same split by the torch function that saved it (``linear``, ``softmax``,
    ``embedding``, ``cross_entropy``, ``checkpoint_input``, ``checkpoint_closure``, ...).
    """
    model.train()
    set_gradient_checkpointing(model, gradient_checkpointing, checkpoint_kwargs)
    for p in model.parameters():
        p.grad = None

    hf = _hf_inner(model)
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    vocab = int(cfg.vocab_size)
    device = next(model.parameters()).device
    mdtype = _model_dtype(model)
    autocast_dtype = None
    if dtype is not None and _torch_dtype(dtype) != mdtype:
        autocast_dtype = _torch_dtype(dtype)

    params = [p for _, p in unique_named_parameters(model)]
    trainable = [p for p in params if p.requires_grad]
    frozen = [p for p in params if not p.requires_grad]
    # parameter bytes are taken before the step (bitsandbytes int8 may move its SCB scales in forward)
    param_bytes = unique_bytes(params, with_quant_state=True)
    trainable_param_bytes = unique_bytes(trainable, with_quant_state=True)
    frozen_param_bytes = unique_bytes(frozen, with_quant_state=True)
    quant_state_bytes = param_bytes - unique_bytes(params)

    torch.manual_seed(seed)
    input_ids = torch.randint(0, vocab, (batch, seq_len), device=device)
    inputs = pad_batch(input_ids) if padded else {"input_ids": input_ids, "labels": input_ids}
    tracker = SavedTensorTracker(model, track_ops=track_ops)
    ac = (
        torch.autocast(device_type=device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with tracker, ac:
        out = model(**inputs, use_cache=False)
        loss = out.loss
    del out
    records = tracker.alive_records()
    saved = sum(r.nbytes for r in records)
    by_kind: dict[str, int] = defaultdict(int)
    by_module: dict[str, int] = defaultdict(int)
    for r in records:
        by_kind[r.op] += r.nbytes
        by_module[r.module or "<top>"] += r.nbytes
    # leaves the graph holds that no op saved (Granite's unscaled embedding output, see
    # graph_leaf_bytes): autograd keeps them until backward as it keeps a saved tensor
    known = {r.key for r in records} | {storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    leaves = sum(graph_leaf_bytes(loss, known).values())
    saved += leaves
    if leaves:
        by_kind["graph_leaf"] += leaves

    loss_value = float(loss.detach().float())
    if forward_only:
        grad_bytes = opt_total = opt_per_param = 0
        opt_by_key: dict[str, int] = {}
    else:
        loss.backward()
        grad_bytes = unique_bytes(p.grad for p in params if p.grad is not None)
        opt = make_optimizer(optimizer, trainable, lr=lr)
        opt.step()
        opt_total, opt_by_key, opt_per_param = optimizer_state_bytes(opt)
        del opt
        for p in params:
            p.grad = None
    del loss

    return StepMeasure(
        param_bytes=param_bytes,
        trainable_param_bytes=trainable_param_bytes,
        frozen_param_bytes=frozen_param_bytes,
        quant_state_bytes=quant_state_bytes,
        grad_bytes=grad_bytes,
        optimizer_state_bytes=opt_total,
        saved_activation_bytes=saved,
        saved_by_kind=dict(by_kind),
        n_trainable_tensors=len(trainable),
        buffer_bytes=unique_bytes(model.buffers()),
        saved_by_module=dict(by_module),
        optimizer_state_by_key=opt_by_key,
        optimizer_state_bytes_per_param_sum=opt_per_param,
        excluded_param_saved_bytes=tracker.excluded_bytes(),
        checkpoint_calls=tracker.n_checkpoint_calls,
        checkpoint_rng_state_bytes=tracker.rng_state_bytes,
        loss=loss_value,
        records=records if keep_records else [],
        meta={
            "batch": batch,
            "seq_len": seq_len,
            "gradient_checkpointing": gradient_checkpointing,
            "padded": padded,
            "checkpoint_kwargs": checkpoint_kwargs,
            "optimizer": optimizer,
            "model_dtype": str(mdtype).replace("torch.", ""),
            "autocast_dtype": None if autocast_dtype is None else str(autocast_dtype).replace("torch.", ""),
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "experts_implementation": getattr(hf.config, "_experts_implementation", None),
            "model_type": getattr(cfg, "model_type", None),
            "vocab_size": vocab,
            "hidden_size": getattr(cfg, "hidden_size", None),
        },
    )


# --------------------------------------------------------------------------------------------------
# Allocator-level cross-check
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LiveBytes:
    """Result of :func:`live_bytes_after_forward`."""

    live_bytes: int  #: net CPU bytes allocated during the region and still alive at its end
    allocated_bytes: int  #: sum of all allocations in the region (peak-ish upper bound)
    n_alloc: int
    n_free: int
    loss_bytes: int  #: storage of the loss tensor (alive because we keep it)
    input_bytes: int  #: storage of input_ids (allocated inside the region and kept)
    #: address -> bytes of every allocation made in the region and not freed by its end
    live_allocations: dict[int, int] = dataclasses.field(default_factory=dict, repr=False)
    loss_key: int = 0  #: address of the loss storage
    input_key: int = 0  #: address of the input_ids storage
    #: with ``with_hooks``: the hook measurement taken in the SAME forward (same addresses)
    hook_saved_bytes: int = 0
    #: live allocations that are not saved-tensor storages (loss, RNG states, wrapped scalars ...)
    not_saved_live: dict[int, int] = dataclasses.field(default_factory=dict, repr=False)
    #: saved storages not allocated inside the region (should be empty)
    saved_not_live: dict[int, int] = dataclasses.field(default_factory=dict, repr=False)
    checkpoint_calls: int = 0
    #: storages of the graph's non-parameter leaves (``graph_leaf_bytes``): the embedding output
    #: ``enable_input_require_grads`` marks, held by ``AccumulateGrad`` and seen by no hook
    graph_leaf_keys: frozenset[int] = frozenset()

    def explain(self) -> dict[str, int]:
        """Classify ``not_saved_live`` blocks: loss, input_ids (when not saved, e.g. frozen embedding),
        graph leaves (the marked embedding output where it is no layer's input), checkpoint RNG states
        (5056 B), 8-byte wrapped-number scalars; anything else is ``other``."""
        out: dict[str, int] = defaultdict(int)
        for key, nb in self.not_saved_live.items():
            if key == self.loss_key:
                out["loss"] += nb
            elif key == self.input_key:
                out["input_ids"] += nb  # allocated in the region and held by the caller, not saved
            elif key in self.graph_leaf_keys:
                out["graph_leaf"] += nb
            elif nb == 5056:
                out["checkpoint_rng_state"] += nb
            elif nb == 8:
                out["wrapped_number_scalars_8B"] += nb
            else:
                out["other"] += nb
        return dict(out)


def _live_allocations(prof: Any) -> dict[int, int]:
    """Replay the profiler's allocation/free events (in time order) into address -> live bytes."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu":
                events.append((node.start_time_ns, int(f.ptr), int(f.alloc_size)))
    events.sort(key=lambda e: e[0])
    live: dict[int, int] = {}
    for _, ptr, size in events:
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    return live


def live_bytes_after_forward(
    model: nn.Module,
    *,
    batch: int,
    seq_len: int,
    gradient_checkpointing: bool,
    dtype: str | None = None,
    seed: int = 0,
    checkpoint_kwargs: dict | None = None,
    with_hooks: bool = True,
) -> LiveBytes:
    """Allocator-level count of what a training forward leaves alive (independent of the hooks).

    Runs the same forward as :func:`measure_step` (random ``input_ids`` created INSIDE the region,
    ``labels=input_ids``, the model's own loss, outputs dropped except ``loss``) under
    ``torch.profiler.profile(activities=[CPU], profile_memory=True)`` and sums the ``[memory]``
    events of the raw kineto trace: every CPU allocation is a positive event and every free a
    negative one, so the sum is exactly the bytes allocated in the region and still alive at its end
    (the CPU allocator does not cache). ``live_allocations`` replays the same events by address
    (``experimental_event_tree``), so each live block can be matched with a saved-tensor record
    (``SavedRecord.key`` is the same address). The result should equal the hook measurement plus the loss
    scalar (and any other live non-saved tensors, e.g. checkpoint RNG states, see the report).
    The backward is not run; the graph is freed on return.
    """
    from torch.profiler import ProfilerActivity, profile

    model.train()
    set_gradient_checkpointing(model, gradient_checkpointing, checkpoint_kwargs)
    hf = _hf_inner(model)
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    vocab = int(cfg.vocab_size)
    device = next(model.parameters()).device
    mdtype = _model_dtype(model)
    autocast_dtype = None
    if dtype is not None and _torch_dtype(dtype) != mdtype:
        autocast_dtype = _torch_dtype(dtype)
    ac = (
        torch.autocast(device_type=device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    # warm-up forward outside the region so lazy one-time allocations (caches) are not counted
    torch.manual_seed(seed)
    with ac:
        warm = model(input_ids=torch.randint(0, vocab, (batch, seq_len), device=device), labels=None, use_cache=False)
    del warm
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            input_ids = torch.randint(0, vocab, (batch, seq_len), device=device)
            tracker = SavedTensorTracker(model, track_ops=False) if with_hooks else contextlib.nullcontext()
            with tracker, ac:
                out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
                loss = out.loss
            del out
    live_map = _live_allocations(prof)
    alloc = n_alloc = n_free = 0
    for ev in prof.profiler.kineto_results.events():
        if ev.name() != "[memory]":
            continue
        nb = int(ev.nbytes())
        if nb > 0:
            alloc += nb
            n_alloc += 1
        elif nb < 0:
            n_free += 1
    result = LiveBytes(
        live_bytes=sum(live_map.values()),
        allocated_bytes=alloc,
        n_alloc=n_alloc,
        n_free=n_free,
        loss_bytes=storage_nbytes(loss),
        input_bytes=storage_nbytes(input_ids),
        live_allocations=live_map,
        loss_key=storage_key(loss),
        input_key=storage_key(input_ids),
    )
    if with_hooks:
        records = tracker.alive_records()
        keys = {r.key for r in records}
        result.hook_saved_bytes = sum(r.nbytes for r in records)
        result.not_saved_live = {k: v for k, v in live_map.items() if k not in keys}
        result.saved_not_live = {r.key: r.nbytes for r in records if r.key not in live_map}
        result.checkpoint_calls = tracker.n_checkpoint_calls
        params = {storage_key(p) for p in model.parameters()}
        result.graph_leaf_keys = frozenset(graph_leaf_bytes(loss, keys | params))
    del loss
    return result
