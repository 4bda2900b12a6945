"""What a ``torch.compile``-d model saves for backward, counted exactly on CPU (tests, by-hand checks).

Each decoder layer is compiled (``torch.compile(layer, backend=...)``, as torchtitan and torchtune
compile each transformer block) or, with ``whole_model``, the whole model (HF Trainer's
``torch_compile=True``). AOTAutograd's ``CompiledFunction`` saves through
``ctx.save_for_backward``, so :class:`~ftplan.measure.accounting.SavedTensorTracker`'s
``saved_tensors_hooks`` see every saved tensor. Backends: ``"aot_eager"`` (torch 2.13: AOTAutograd
with ``min_cut_rematerialization_partition``, no code generation: seconds) and ``"inductor"`` (the
same partitioner after inductor's decompositions and joint-graph passes; C++ code generation with
gcc: tens of seconds per model on 2 cores).
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from . import torchref as TR


@dataclasses.dataclass(frozen=True)
class CompiledSaved:
    """Bytes one compiled forward saves (parameters excluded, storages once)."""

    saved_bytes: int
    #: autocast's compute-dtype weight copies among them (counted with the weights by ftplan)
    weight_copy_bytes: int
    checkpoint_calls: int


def _layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    return next(m for n, m in model.named_modules() if n.endswith("model.layers"))


def _weight_shapes(model: torch.nn.Module) -> set[tuple[int, ...]]:
    out = set()
    for p in model.parameters():
        if p.dim() == 2:
            out |= {tuple(p.shape), tuple(p.shape)[::-1]}
    return out


def compiled_saved(config: dict, *, method: str = "full", precision: str = "bf16-mixed", dropout: float = 0.0,
                   gradient_checkpointing: bool = False, backend: str = "aot_eager", batch: int = 2,
                   seq_len: int = 24, whole_model: bool = False, lora_r: int = 8,
                   adapter_dtype: str = "fp32", only_layers: tuple[int, ...] | None = None) -> CompiledSaved:
    """Build the tiny model of ``config`` (full: fp32 under HF Trainer's autocast for ``-mixed``,
    else bf16; LoRA: a bf16 base with PEFT's fp32 adapters on all-linear), compile it and count
    one forward's saved bytes (``model(input_ids, labels=input_ids)``, transformers' loss).
    ``adapter_dtype="bf16"``: PEFT's ``autocast_adapter_dtype=False`` (adapters in the base's
    bf16, as FSDP gathers them in ``param_dtype``). ``only_layers``: compile just these decoder
    layers (the others run eager).

    The weight copies are told apart by shape: a saved 2-D tensor shaped like a weight matrix
    (or its transpose) that is not a parameter; ``batch * seq_len`` must then differ from every
    weight dimension (the tiny configs' 64, 120, 512, 8, ... against the default 48)."""
    mixed = precision.endswith("-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch._dynamo.reset()
        model = TR.build_model(config, dtype="fp32" if method == "full" and mixed else "bf16",
                               attn_implementation="sdpa")
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=dropout,
                                                     target_modules="all-linear", task_type="CAUSAL_LM"),
                                   autocast_adapter_dtype=adapter_dtype == "fp32")
        if whole_model:
            compiled = torch.compile(model, backend=backend)
        else:
            layers = _layers(model)
            for i, layer in enumerate(layers):
                if only_layers is None or i in only_layers:
                    layers[i] = torch.compile(layer, backend=backend)
            compiled = model
        orig = TR._model_dtype
        if mixed:  # HF Trainer bf16=True: autocast around the forward whatever the model dtype
            TR._model_dtype = lambda m: torch.float32
        try:
            TR.set_gradient_checkpointing(model, gradient_checkpointing, None)
            r = TR.measure_step(compiled, batch=batch, seq_len=seq_len, gradient_checkpointing=gradient_checkpointing,
                                dtype="bf16", forward_only=True) if not whole_model else _whole(
                model, compiled, batch, seq_len, gradient_checkpointing)
        finally:
            TR._model_dtype = orig
    shapes = _weight_shapes(model)
    copies = sum(x.nbytes for x in r.records
                 if x.param_copy or (len(x.shape) == 2 and tuple(x.shape) in shapes))
    return CompiledSaved(r.saved_activation_bytes, copies, r.checkpoint_calls)


def _whole(model, compiled, batch, seq_len, ckpt):
    """measure_step's forward on a whole-model compile (the OptimizedModule forwards to the model)."""
    from .accounting import SavedTensorTracker

    model.train()
    vocab = TR._hf_inner(model).config.vocab_size
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len))
    # no module/op attribution: its global hooks mutate state that Dynamo would have to trace
    tracker = SavedTensorTracker(model, track_ops=False, track_modules=False)
    ac = torch.autocast("cpu", dtype=torch.bfloat16) if TR._model_dtype(model) != torch.bfloat16 else (
        torch.autocast("cpu", enabled=False))
    with tracker, ac:
        out = compiled(input_ids=ids, labels=ids, use_cache=False)
        loss = out.loss
    del out
    records = tracker.alive_records()
    del loss
    return TR.StepMeasure(param_bytes=0, trainable_param_bytes=0, frozen_param_bytes=0, grad_bytes=0,
                          optimizer_state_bytes=0, saved_activation_bytes=sum(x.nbytes for x in records),
                          saved_by_kind={}, n_trainable_tensors=0, records=records,
                          checkpoint_calls=tracker.n_checkpoint_calls)
