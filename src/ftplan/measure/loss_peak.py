"""Peak bytes of one training step's forward + backward on CPU, loss path included.

The saved-activation trackers (:mod:`~ftplan.measure.accounting`) count what autograd keeps; the
loss path's *transient* (logits, their fp32 copies, the gradients of the log-softmax) is not saved
by anyone and only shows in the live bytes. This module runs one forward + backward of a tiny
Hugging Face decoder under the storage tracker of :mod:`~ftplan.measure.distributed` (every
parameter, buffer and the batch registered first, parameter gradients left out) and returns the
peak of everything else, over the step and over the forward alone (``forward_peak_bytes``: under
autocast with checkpointing the forward's end also holds autocast's cached weight copies of every
checkpointed layer): what ftplan predicts as the larger of ``activations + logits_and_loss +
transient`` and ``ActivationParts.forward_peak_bytes``.

Two loss paths, as the model's own forward runs them:

* transformers' current ``ForCausalLMLoss`` (``loss="hf"``) through ``model(labels=...)``;
* transformers < 4.46 (``loss="hf-legacy"``): the installed model's forward if transformers is
  older than 4.46, else :func:`legacy_causal_lm_forward`, the loss tail of transformers 4.44.2's
  ``LlamaForCausalLM.forward`` on the installed backbone.

``keep_output`` keeps the model output alive through backward, as a hand-written loop does
(``out = model(**batch); out.loss.backward()``); HF Trainer drops it first.

:func:`measure_accumulation_peak` runs several micro-batches of full fine-tuning accumulating
gradients and keeps them in the count: the whole step's peak above the parameters, what
``estimate_memory`` predicts without the optimizer states (at the end of the second forward when
autocast's cached weight copies come on top of the first micro-batch's gradients).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any

__all__ = ["AccumulationPeak", "LossPeak", "legacy_causal_lm_forward", "legacy_transformers_installed",
           "measure_accumulation_peak", "measure_loss_peak"]

#: pure-bf16-lora: bf16 base and adapters, no autocast; mixed-lora: bf16 base, PEFT's fp32 adapters
#: under bf16 autocast; mixed-full: full fine-tuning of fp32 weights under bf16 autocast;
#: mixed-lora-fp32-base: fp32 base and adapters under bf16 autocast (``Job.base_dtype="fp32"``:
#: TRL SFTTrainer's default load of a model id); mixed-qlora: PEFT's QLoRA recipe (NF4 base, double
#: quantization, ``prepare_model_for_kbit_training``'s fp32 norms and embeddings, fp32 adapters)
#: under bf16 autocast, built as ``ftplan measure`` builds it (``hf.build_for_job``)
MODES = ("pure-bf16-lora", "mixed-lora", "mixed-full", "mixed-lora-fp32-base", "mixed-qlora")

#: transformers' first release whose causal-LM forward no longer upcasts the logits itself
LEGACY_BEFORE = (4, 46)


@dataclasses.dataclass(frozen=True)
class LossPeak:
    """One measurement: the step's peak live bytes above the parameters, buffers and batch."""

    transformers_version: str
    loss: str  #: "hf" or "hf-legacy"
    legacy_source: str  #: "installed" (the model's own forward) or "transcribed" (4.44.2's tail)
    mode: str  #: one of MODES
    keep_output: bool
    batch: int
    seq_len: int
    peak_bytes: int
    #: the peak within the forward (model call and loss), before backward starts; None in records
    #: taken before it was recorded
    forward_peak_bytes: int | None = None
    #: the mixed modes' loop: ``autocast`` (a torch.autocast region around the forward) or
    #: ``accelerate`` (``Accelerator(mixed_precision="bf16").prepare(model)``: autocast plus
    #: ``convert_outputs_to_fp32``)
    loop: str = "autocast"
    #: the adapters' ``lora_dropout`` (0 in records taken before it was recorded)
    lora_dropout: float = 0.0
    #: the attention implementation (``sdpa`` in records taken before it was recorded)
    attn_impl: str = "sdpa"

    def job(self):
        """The ftplan ``Job`` this measurement ran."""
        from ..job import Job, LoraSpec

        return Job(method="full" if self.mode == "mixed-full" else "qlora" if self.mode == "mixed-qlora" else "lora",
                   precision="bf16" if self.mode == "pure-bf16-lora" else "bf16-mixed",
                   micro_batch=self.batch, seq_len=self.seq_len, gradient_checkpointing=True,
                   attn_impl=self.attn_impl, lora=LoraSpec(r=8, alpha=16, dropout=self.lora_dropout), loss=self.loss,
                   keep_output=self.keep_output,
                   base_dtype="fp32" if self.mode == "mixed-lora-fp32-base" else "compute")


def _version_tuple(v: str) -> tuple[int, int]:
    parts = (v.split(".") + ["0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)  # type: ignore[return-value]


def legacy_transformers_installed() -> bool:
    """The installed transformers still upcasts the logits in its causal-LM forward (< 4.46)."""
    import transformers

    return _version_tuple(transformers.__version__) < LEGACY_BEFORE


def legacy_causal_lm_forward(model: Any, input_ids: Any, labels: Any) -> tuple[Any, Any]:
    """transformers 4.44.2 ``LlamaForCausalLM.forward`` from the decoder's output on (the lines
    after ``outputs = self.model(...)``, ``pretraining_tp`` 1): returns ``(loss, logits)``, the
    fp32 logits being what the model output holds.

    A transcription, not transformers' code: the installed transformers (>= 4.46) no longer has
    this path. ``model`` is a causal-LM (or a PEFT wrapper of one) of the installed version."""
    from torch.nn import CrossEntropyLoss

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    outputs = lm.model(input_ids=input_ids, use_cache=False)
    hidden_states = outputs[0]
    logits = lm.lm_head(hidden_states)
    logits = logits.float()
    # Shift so that tokens < n predict n
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    # Flatten the tokens
    loss_fct = CrossEntropyLoss()
    shift_logits = shift_logits.view(-1, lm.config.vocab_size)
    shift_labels = shift_labels.view(-1)
    shift_labels = shift_labels.to(shift_logits.device)
    loss = loss_fct(shift_logits, shift_labels)
    return loss, logits


def _check_args(loss: str, mode: str) -> None:
    import transformers

    if loss not in ("hf", "hf-legacy"):
        raise ValueError(f"loss must be hf or hf-legacy, not {loss!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    if loss == "hf" and legacy_transformers_installed():
        raise ValueError(f"loss hf needs transformers >= 4.46 (installed: {transformers.__version__})")


def _build(config: dict, mode: str, lora_dropout: float = 0.0, attn_impl: str = "sdpa") -> Any:
    """The tiny model of ``config`` as ``mode`` trains it, checkpointed, in train mode."""
    import torch
    import transformers

    if mode == "mixed-qlora":
        from ..job import Job, LoraSpec
        from .hf import build_for_job

        job = Job(method="qlora", precision="bf16-mixed", micro_batch=1, seq_len=1, gradient_checkpointing=True,
                  attn_impl=attn_impl, lora=LoraSpec(r=8, alpha=16, dropout=lora_dropout), loss="hf")
        model = build_for_job(config, job, "cpu")
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        model.train()
        return model
    cfg = transformers.AutoConfig.for_model(**config)
    cfg.use_cache = False
    cfg._attn_implementation = attn_impl
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if mode != "mixed-full":
        from peft import LoraConfig, get_peft_model

        base = model if mode == "mixed-lora-fp32-base" else model.to(torch.bfloat16)
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=lora_dropout,
                                                     target_modules="all-linear"),
                               autocast_adapter_dtype=mode != "pure-bf16-lora")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode != "mixed-full":
        model.enable_input_require_grads()
    model.train()
    return model


def _forward(model: Any, ids: Any, loss: str, mode: str, loop: str = "autocast",
             inputs: dict | None = None) -> tuple[Any, Any]:
    """(loss, model output) of one micro-batch, under CPU bf16 autocast for the mixed modes (the
    ``accelerate`` loop: the prepared model's own)."""
    import torch

    ac = (torch.autocast("cpu", dtype=torch.bfloat16) if mode.startswith("mixed") and loop == "autocast"
          else contextlib.nullcontext())
    with ac:
        if loss == "hf-legacy" and not legacy_transformers_installed():
            return legacy_causal_lm_forward(model, ids, ids)
        out = model(**inputs) if inputs is not None else model(input_ids=ids, labels=ids)
        return out.loss, out


def measure_loss_peak(config: dict, *, batch: int, seq_len: int, loss: str = "hf", keep_output: bool = False,
                      mode: str = "pure-bf16-lora", seed: int = 0, loop: str = "autocast",
                      lora_dropout: float = 0.0, attn_impl: str = "sdpa", padded: bool = False) -> LossPeak:
    """One forward + backward of a tiny llama-style ``config``, non-reentrant checkpointing of
    every decoder layer; ``mode`` (:data:`MODES`): LoRA r 8 on every linear (PEFT, bf16 base;
    ``pure-bf16-lora``: bf16 adapters, ``autocast_adapter_dtype=False``, no autocast;
    ``mixed-lora``: PEFT's fp32 adapters under CPU bf16 autocast) or ``mixed-full``: every fp32
    weight trains under CPU bf16 autocast (HF Trainer's ``bf16=True`` on an fp32 model). ``loop``
    (mixed modes): ``autocast`` or ``accelerate`` (see :class:`LossPeak`); ``lora_dropout``: the
    adapters' dropout (LoRA modes); ``padded``: a padded micro-batch
    (:func:`ftplan.measure.torchref.pad_batch`, loss ``hf``). Returns the peak live
    bytes over the step and over the forward (see the module doc)."""
    import torch
    import transformers

    from .distributed import StorageTracker, replay_peak

    _check_args(loss, mode)
    if loop not in ("autocast", "accelerate") or (loop == "accelerate" and not mode.startswith("mixed")):
        raise ValueError(f"loop must be autocast, or accelerate with a mixed mode (got {loop!r} with {mode!r})")
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _build(config, mode, lora_dropout, attn_impl)
        if loop == "accelerate":
            from accelerate import Accelerator

            model = Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
        ids = torch.randint(0, int(model.config.vocab_size), (batch, seq_len))
        inputs = None
        if padded:
            from .torchref import pad_batch

            inputs = pad_batch(ids)
        tr = StorageTracker()
        for t in [*model.parameters(), *model.buffers(), ids, *(inputs or {}).values()]:
            tr.register_tensor(t)
        with tr:
            tr.phase = "forward"
            step_loss, out = _forward(model, ids, loss, mode, loop, inputs)
            if not keep_output:
                out = None
            tr.phase = "backward"
            step_loss.backward()
        grads = {k for p in model.parameters() if p.grad is not None for k in tr.key_of(p.grad)}
        peak = replay_peak(tr.events, lambda k: k not in grads, {"forward", "backward"})
        forward_peak = replay_peak(tr.events, lambda k: k not in grads, {"forward"})
        del out, step_loss
    return LossPeak(transformers_version=transformers.__version__, loss=loss,
                    legacy_source="transcribed" if loss == "hf-legacy" and not legacy_transformers_installed()
                    else "installed", mode=mode,
                    keep_output=keep_output, batch=batch, seq_len=seq_len, peak_bytes=peak,
                    forward_peak_bytes=forward_peak, loop=loop, lora_dropout=lora_dropout,
                    attn_impl=attn_impl)


@dataclasses.dataclass(frozen=True)
class AccumulationPeak:
    """Gradient accumulation over ``micro_batches`` micro-batches of full fine-tuning (fp32
    weights, bf16 autocast, checkpointing, HF Trainer's loop: the output dropped before backward):
    the running peak of everything above the parameters, buffers and batches -- gradients
    included -- in each phase (``fwd0``, ``bwd0``, ``fwd1``, ...)."""

    transformers_version: str
    loss: str
    batch: int
    seq_len: int
    micro_batches: int
    phase_peak_bytes: dict

    @property
    def peak_bytes(self) -> int:
        return max(self.phase_peak_bytes.values())

    def job(self):
        """The ftplan ``Job`` this measurement ran."""
        from ..job import Job

        return Job(method="full", precision="bf16-mixed", micro_batch=self.batch, seq_len=self.seq_len,
                   grad_accum=self.micro_batches, gradient_checkpointing=True, attn_impl="sdpa", loss=self.loss)


def measure_accumulation_peak(config: dict, *, batch: int, seq_len: int, loss: str = "hf", micro_batches: int = 2,
                              seed: int = 0) -> AccumulationPeak:
    """``micro_batches`` forward + backward passes of the ``mixed-full`` model (see
    :func:`measure_loss_peak`) accumulating gradients; returns each phase's running peak."""
    import torch
    import transformers

    from .distributed import StorageTracker

    _check_args(loss, "mixed-full")
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _build(config, "mixed-full")
        batches = [torch.randint(0, int(model.config.vocab_size), (batch, seq_len)) for _ in range(micro_batches)]
        tr = StorageTracker()
        for t in [*model.parameters(), *model.buffers(), *batches]:
            tr.register_tensor(t)
        with tr:
            for k, ids in enumerate(batches):
                tr.phase = f"fwd{k}"
                step_loss, out = _forward(model, ids, loss, "mixed-full")
                out = None
                tr.phase = f"bwd{k}"
                step_loss.backward()
                step_loss = None
    cur, peaks = 0, {}
    for phase, _key, d in tr.events:
        if phase == "init":  # the parameters, buffers and batches registered before the step
            continue
        cur += d
        peaks[phase] = max(peaks.get(phase, 0), cur)
    del out
    return AccumulationPeak(transformers_version=transformers.__version__, loss=loss, batch=batch, seq_len=seq_len,
                            micro_batches=micro_batches, phase_peak_bytes=peaks)
