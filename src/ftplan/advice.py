"""What an estimate assumed, and what single change makes a job fit.

``job_assumptions(job, layout, explicit=...)`` lists the defaults an answer rests on: the choices of
the reference stack (TRL ``SFTConfig``, PEFT, HF Trainer) the job did not set itself, each with
the option that changes it and where the default comes from. ``fit_advice(model, job, layout,
gpu)`` tries one change at a time (checkpointing, the loss path, activation offloading, a shorter
sequence, a smaller micro-batch, an 8-bit optimizer, ZeRO-3 on the same GPUs, more GPUs with ZeRO-3, offload, another
method) and returns the ones that fit, with the memory each needs. Pure functions over the memory
model; the CLI, the JSON documents and the web app print them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import FtplanError, Renderer, render_refs
from .job import Job, Layout, lora_wraps_experts
from .memory import estimate_memory
from .model import ModelSpec

__all__ = ["Assumption", "Suggestion", "job_assumptions", "fit_advice", "DEFAULT_ADVICE_MAX_GPUS"]

#: fit_advice looks for a ZeRO-3 layout up to this many GPUs
DEFAULT_ADVICE_MAX_GPUS = 64


@dataclass(frozen=True)
class Assumption:
    """One default the answer rests on: the job field, its value, a sentence, how to change it
    (backticked option references, written by each front end: ``--seq-len`` on the command line,
    ``seq_len`` on the web) and where the default comes from."""

    field: str
    value: Any
    text: str
    change: str
    source: str

    def to_dict(self, renderer: Renderer | None = None) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("text", "change", "source"):
            d[k] = render_refs(d[k], renderer)
        return d


@dataclass(frozen=True)
class Suggestion:
    """One change that makes the job fit: the fields it changes, a sentence with the numbers, and
    the memory the changed job needs (``device_total_bytes`` of ``gpu_memory_bytes``). ``text``
    names options in backticks (see :func:`ftplan.errors.render_refs`)."""

    kind: str  # checkpointing | loss | attention | activation_offloading | seq_len | micro_batch | optimizer | strategy | gpus | offload | method
    changes: dict[str, Any]
    text: str
    device_total_bytes: int
    gpu_memory_bytes: int
    layout: dict[str, Any] | None = None

    def to_dict(self, renderer: Renderer | None = None) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["text"] = render_refs(self.text, renderer)
        return d


# ---------------------------------------------------------------------------------------------
# assumptions
# ---------------------------------------------------------------------------------------------
_CKPT_TEXT = {
    "full": "every decoder layer, non-reentrant (transformers' default)",
    "full-reentrant": "every decoder layer, reentrant (use_reentrant=True)",
    "selective": "selective, torchtitan's per-op policy (saves attention and every other matmul output)",
    "selective-attention": "selective, TRL's policy (saves the attention kernel's outputs)",
    "every-k": "every k-th decoder layer",
}


def job_assumptions(job: Job, layout: Layout | None = None, *,
                    explicit: frozenset[str] | set[str] | None = None,
                    model: ModelSpec | None = None) -> tuple[Assumption, ...]:
    """The defaults ``job`` rests on. ``explicit``: the option names the user set (those are not
    assumptions); without it, every field still at ``Job()``'s default is listed. ``model``: the
    architecture, where a default depends on it (attention without an sdpa path)."""
    given = set(explicit or ())
    base = Job()
    out: list[Assumption] = []

    def assumed(field: str, *names: str) -> bool:
        if given & {field, *names}:
            return False
        return explicit is not None or getattr(job, field) == getattr(base, field)

    if assumed("gradient_checkpointing", "checkpointing", "checkpoint_every"):
        if job.gradient_checkpointing:
            how = _CKPT_TEXT.get(job.checkpointing, job.checkpointing)
            if job.checkpointing == "every-k":
                how = f"every {job.checkpoint_every}th decoder layer (transformers every_n_layers)"
            out.append(Assumption(
                "gradient_checkpointing", True, f"activation checkpointing on: {how}",
                "`no_gradient_checkpointing`, or `checkpointing=selective` / selective-attention / every-k",
                "TRL SFTConfig gradient_checkpointing=True; PEFT prepare_model_for_kbit_training turns it on "
                "for QLoRA"))
        else:
            out.append(Assumption("gradient_checkpointing", False, "activation checkpointing off",
                                  "`gradient_checkpointing`", "set by the job"))
    if assumed("seq_len"):
        out.append(Assumption(
            "seq_len", job.seq_len,
            f"{job.seq_len} tokens per sequence, every sequence full (the longest a padded batch can be)",
            "`seq_len=N`", "TRL SFTConfig max_length=1024 (sequences are truncated to it)"))
    if assumed("micro_batch", "batch_size"):
        out.append(Assumption(
            "micro_batch", job.micro_batch, f"micro-batch of {job.micro_batch} sequence(s) per GPU",
            "`micro_batch=N`", "ftplan's default; HF TrainingArguments' per_device_train_batch_size is 8"))
    if assumed("precision"):
        out.append(Assumption(
            "precision", job.precision, f"{job.precision}: HF Trainer autocast, fp32 master weights "
            "for trainable parameters" if job.precision.endswith("-mixed") else job.precision,
            "`precision=...`", "TRL SFTConfig bf16=True unless fp16 is set"))
    if assumed("optimizer"):
        out.append(Assumption("optimizer", job.optimizer,
                              "AdamW, fused (adamw_torch_fused)" if job.optimizer == "adamw" else job.optimizer,
                              "`optimizer=...`", "HF TrainingArguments optim default with torch >= 2.8"))
    if assumed("loss"):
        out.append(Assumption(
            "loss", job.loss, {"trl": "loss: TRL SFTTrainer's fused LM head (loss_type='nll'), "
                               "log-probabilities in tiles, the logits are never materialised",
                               "hf": "loss: transformers' ForCausalLMLoss, full logits upcast to fp32",
                               "hf-legacy": "loss: transformers < 4.46, the model returns fp32 logits and "
                                            "copies the shifted ones",
                               "liger": "loss: Liger fused linear cross-entropy"}[job.loss],
            "`loss=hf` (transformers' loss) or `loss=liger`",
            "TRL SFTConfig loss_type='nll' ('chunked_nll' is its deprecated alias)"))
    if assumed("attn_impl", "attn"):
        if model is not None and job.attn_impl == "sdpa" and not model.supports_sdpa:
            out.append(Assumption("attn_impl", "eager", "attention: eager (the (b, heads, s, s) scores "
                                  "materialised)", "`attn=flash`",
                                  "transformers' default attn_implementation: eager where the architecture has "
                                  "no sdpa path (attention soft-capping: Gemma2; attention sinks: gpt-oss)"))
        else:
            out.append(Assumption("attn_impl", job.attn_impl, f"attention: {job.attn_impl}", "`attn=flash`",
                                  "transformers' default attn_implementation (sdpa)"))
    if assumed("activation_offloading") and not job.activation_offloading:
        out.append(Assumption("activation_offloading", False, "activations stay on the GPU",
                              "`activation_offloading`", "TRL SFTConfig activation_offloading=False"))
    if assumed("packing", "padding_free") and assumed("padding_free", "packing") and not job.is_padding_free:
        out.append(Assumption("packing", False, "no packing, no padding-free rows: each sequence is its own row",
                              "`packing` or `padding_free`", "TRL SFTConfig packing=False, padding_free=False"))
    if assumed("padded_batches") and not job.is_padding_free:
        if job.padded_batches:
            text = ("padded micro-batches: an attention_mask with zeros, so sdpa gets a materialised (b, 1, s, s) "
                    "mask (a compute-dtype copy kept per layer) and k/v repeated to every head"
                    + ("; flash attention unpads instead (planned as unpadded, not measured)"
                       if job.attn_impl == "flash" else ""))
        else:
            text = ("no padding in a micro-batch: every row full length (or an all-ones attention_mask, which "
                    "transformers drops): sdpa runs is_causal without a mask, GQA's k/v unrepeated"
                    + ("; TRL's collator pads a micro-batch of uneven rows to its longest: `padded_batches`"
                       if job.micro_batch > 1 else ""))
        out.append(Assumption("padded_batches", job.padded_batches, text, "`padded_batches`",
                              "TRL DataCollatorForLanguageModeling pads each micro-batch to its longest row "
                              "(right, attention_mask 0); transformers' sdpa_mask skips an all-ones mask"))
    if job.torch_compile:
        # how the model is compiled is not an option: an assumption whenever compile is on
        out.append(Assumption(
            "torch_compile", True,
            "torch.compile: each decoder layer compiled (torchtitan, torchtune); AOTAutograd's min-cut partitioner "
            "recomputes the norms, SiLU and casts in backward instead of saving them (llama-shaped dense layers; "
            "others planned as eager); a whole-model compile (HF Trainer torch_compile=True) also materialises "
            "the causal mask and repeats k/v: not modelled",
            "leave out `compile`",
            "torchtitan apply_compile / torchtune compile_model compile each transformer block"))
    if job.uses_lora and assumed("lora", "lora_r", "lora_alpha", "lora_dropout", "lora_targets"):
        lo = job.lora
        out.append(Assumption("lora", {"r": lo.r, "alpha": lo.alpha, "dropout": lo.dropout,
                                       "target_modules": list(lo.target_modules)},
                              f"LoRA r={lo.r}, alpha={lo.alpha}, dropout={lo.dropout}, "
                              f"targets {','.join(lo.target_modules)}; adapters in {job.adapter_dtype}",
                              "`lora_r`, `lora_alpha`, `lora_dropout`, `lora_targets`",
                              "ftplan's defaults; " + (
                                  "torchtune builds the adapters in its dtype" if job.torchao_nf4 else
                                  "TRL SFTTrainer casts a quantized model's adapters to bf16"
                                  if job.adapter_dtype == "bf16" else
                                  "PEFT get_peft_model keeps adapters in fp32 (autocast_adapter_dtype=True)")))
    if job.method == "lora" and assumed("base_dtype"):
        out.append(Assumption(
            "base_dtype", job.base_dtype,
            f"frozen base loaded in {job.frozen_dtype} (ftplan's exported script passes dtype to from_pretrained)",
            "`base_dtype=fp32`",
            "TRL SFTTrainer loads a model id in float32 unless model_init_kwargs sets dtype, and so does "
            "the trl sft command line by default (its ModelConfig dtype is float32)"))
    if layout is not None and layout.strategy == "fsdp" and layout.fsdp_wrap == "torchtune":
        # not a default: stated whenever it is set, since every FSDP2 figure rests on these units
        units = ("decoder layers, the input embedding and the output projection (custom_sharded_layers) its "
                 "units, the root the final norm" if job.method == "full" else
                 "decoder layers its units, the root the input embedding, final norm and output projection")
        out.append(Assumption(
            "fsdp_wrap", "torchtune",
            f"FSDP2 units as torchtune 0.3.x wraps them: {units}; the root kept gathered from the start of forward "
            "to the end of backward (torch 2.4/2.5, the torchtune 0.3 era)"
            + ("; the output projection gathered once per loss chunk, in forward and in backward"
               if job.loss == "torchtune" and job.method == "full" else ""),
            "`fsdp_wrap=accelerate` (accelerate's units)",
            "torchtune 0.3.1 training.shard_model and recipes full_finetune_distributed / "
            "lora_finetune_distributed"))
    if job.torchao_nf4:
        q = job.quant
        out.append(Assumption("quant", {"quant_type": q.quant_type, "double_quant": True,
                                        "compute_dtype": q.compute_dtype, "recipe": "torchtune"},
                              "torchao NF4 (torchtune's QLoRA): every decoder-layer linear an NF4Tensor (block 64, "
                              f"scalers double-quantized per 256), embedding, norms and output projection in "
                              f"{q.compute_dtype}, adapters in {job.adapter_dtype}; linear_nf4 dequantizes its "
                              "weight at each call (int64 code indices: 14 bytes per element in bf16, "
                              "forward and backward)",
                              "`quant_type`",
                              "torchtune 0.3.1 modules/peft/lora.py (LoRALinear quantize_base), "
                              "modules/low_precision/nf4_linear.py; torchao 0.18 nf4_tensor.py"))
    elif job.method == "qlora" and assumed("quant", "quant_type", "no_double_quant", "compute_dtype", "qlora_recipe"):
        q = job.quant
        prep = ("prepare_model_for_kbit_training upcasts the non-quantized weights to fp32 (PEFT's recipe; "
                "`qlora_recipe=trl` for TRL SFTTrainer's, which skips it and casts the adapters to bf16)"
                if q.recipe == "peft" else
                "TRL SFTTrainer's recipe: no prepare_model_for_kbit_training, non-quantized weights in "
                f"{q.compute_dtype}, adapters cast to bf16")
        out.append(Assumption("quant", {"quant_type": q.quant_type, "double_quant": q.double_quant,
                                        "compute_dtype": q.compute_dtype, "recipe": q.recipe},
                              f"bitsandbytes 4-bit {q.quant_type}{', double quantization' if q.double_quant else ''},"
                              f" {q.compute_dtype} compute; {prep}",
                              "`quant_type`, `no_double_quant`, `compute_dtype`, `qlora_recipe`",
                              "the QLoRA paper's BitsAndBytesConfig; PEFT's QLoRA docs"))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# fit advice
# ---------------------------------------------------------------------------------------------
def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def fit_advice(model: ModelSpec, job: Job, layout: Layout | None, gpu: Any, *, margin: float = 0.0,
               max_gpus: int = DEFAULT_ADVICE_MAX_GPUS) -> tuple[Suggestion, ...]:
    """The single changes that make ``job`` fit ``gpu`` under ``layout`` (empty when it fits),
    least disruptive first. ``gpu`` needs ``memory_bytes`` and ``vendor`` (and optionally
    ``max_gpus_per_node``); ``margin`` is the safety margin the fit test uses."""
    layout = layout or Layout()
    cap = gpu.memory_bytes * (1.0 - margin)
    vendor = getattr(gpu, "vendor", "nvidia")
    cache: dict[tuple, int | None] = {}

    def need(j: Job, lay: Layout) -> int | None:
        key = (j, lay)
        if key not in cache:
            try:
                cache[key] = estimate_memory(model, j, lay, gpu_vendor=vendor).device_total_bytes
            except FtplanError:
                cache[key] = None
        return cache[key]

    now = need(job, layout)
    if now is not None and now <= cap:
        return ()
    out: list[Suggestion] = []

    def offer(kind: str, changes: dict[str, Any], text: str, j: Job, lay: Layout) -> bool:
        n = need(j, lay)
        if n is None or n > cap:
            return False
        lay_d = None if lay == layout else dataclasses.asdict(lay)
        out.append(Suggestion(kind, changes, f"{text} ({_gib(n)} of {_gib(gpu.memory_bytes)})", n,
                              gpu.memory_bytes, lay_d))
        return True

    # 1. checkpointing
    if job.ac_mode == "none":
        offer("checkpointing", {"gradient_checkpointing": True, "checkpointing": "full"},
              "fits with activation checkpointing: `gradient_checkpointing`",
              job.with_(gradient_checkpointing=True, checkpointing="full"), layout)
    elif job.ac_mode in ("selective", "selective-attention", "every-k"):
        offer("checkpointing", {"checkpointing": "full"}, "fits with full checkpointing: `checkpointing=full`",
              job.with_(checkpointing="full"), layout)
    # 2. the loss path
    if job.materialises_logits:
        offer("loss", {"loss": "trl"}, "fits with TRL's fused LM head, SFTTrainer's default: `loss=trl`",
              job.with_(loss="trl"), layout)
    # 2b. eager attention (the architecture's default where transformers has no sdpa path):
    # a flash kernel never materialises the (b, heads, s, s) scores
    if (job.attn_impl == "eager" or (job.attn_impl == "sdpa" and not model.supports_sdpa)) and \
            _has_flash(model):
        offer("attention", {"attn_impl": "flash"},
              "fits with a flash-attention kernel instead of eager attention: `attn=flash`",
              job.with_(attn_impl="flash"), layout)
    # 3. activation offloading
    if not job.activation_offloading:
        j = job.with_(activation_offloading=True)
        if job.ac_mode == "none":
            j = j.with_(gradient_checkpointing=True, checkpointing="full")
            text = "fits with checkpointing and activation offloading: `gradient_checkpointing` `activation_offloading`"
        else:
            text = "fits with activation offloading to CPU: `activation_offloading`"
        offer("activation_offloading", {"activation_offloading": True}, text, j, layout)
    # 4. a smaller micro-batch, a shorter sequence
    if job.micro_batch > 1:
        lo, hi = 0, job.micro_batch - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            n = need(job.with_(micro_batch=mid), layout)
            if n is not None and n <= cap:
                lo = mid
            else:
                hi = mid - 1
        if lo >= 1:
            offer("micro_batch", {"micro_batch": lo}, f"fits with `micro_batch={lo}`",
                  job.with_(micro_batch=lo), layout)
    step = 128 if job.seq_len > 256 else 1
    lo, hi = 0, (job.seq_len - 1) // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        n = need(job.with_(seq_len=mid * step), layout)
        if n is not None and n <= cap:
            lo = mid
        else:
            hi = mid - 1
    if lo >= 1:
        s = lo * step
        offer("seq_len", {"seq_len": s}, f"fits with `seq_len={s}`", job.with_(seq_len=s), layout)
    # 5. an 8-bit optimizer
    if job.optimizer in ("adamw", "adafactor"):
        offer("optimizer", {"optimizer": "adamw_8bit"}, "fits with 8-bit AdamW: `optimizer=adamw_8bit`",
              job.with_(optimizer="adamw_8bit"), layout)
    # 5b. shard the model states over the GPUs the layout already has (DDP and ZeRO-1/2 keep a whole
    # copy of the weights on every rank): one flag, before asking for more GPUs
    if layout.world_size > 1 and layout.strategy not in ("zero3", "fsdp") and layout.tp == 1 and layout.pp == 1:
        offer("strategy", {"strategy": "zero3"},
              f"fits with ZeRO-3 on the same {layout.world_size} GPUs: `strategy=zero3` (or fsdp)",
              job, dataclasses.replace(layout, strategy="zero3"))
    # 6. more GPUs with ZeRO-3 (the fewest), then offload on the current GPUs
    per_node = max(1, int(getattr(gpu, "max_gpus_per_node", 8) or 8))
    n_gpu = 2
    while n_gpu <= max_gpus:
        gpn = min(n_gpu, per_node)
        if n_gpu % gpn == 0 and n_gpu > layout.world_size:
            lay = Layout(gpn, n_gpu // gpn, "zero3", tp=1, pp=1)
            if offer("gpus", {"gpus": n_gpu, "strategy": "zero3"},
                     f"fits on {n_gpu} GPUs with ZeRO-3: `gpus={gpn}`"
                     + (f" `nodes={n_gpu // gpn}`" if n_gpu > gpn else "") + " `strategy=zero3` (or fsdp)", job, lay):
                break
        n_gpu *= 2
    if layout.world_size > 1 and not layout.offload_optimizer:
        lay = dataclasses.replace(layout, strategy="zero3" if layout.strategy not in ("zero3", "fsdp")
                                  else layout.strategy, offload_optimizer=True)
        if not offer("offload", {"offload_optimizer": True, "strategy": lay.strategy},
                     "fits with the optimizer offloaded to CPU: `offload_optimizer`", job, lay):
            lay = dataclasses.replace(lay, offload_params=True)
            offer("offload", {"offload_optimizer": True, "offload_params": True, "strategy": lay.strategy},
                  "fits with optimizer and parameters offloaded to CPU: `offload_optimizer` `offload_params`",
                  job, lay)
    # 7. another method
    if job.method == "full":
        lora = job.with_(method="lora")
        if lora_wraps_experts(model, lora.lora) and lora.lora.dropout > 0:
            lora = lora.with_(lora=dataclasses.replace(lora.lora, dropout=0.0))
        offer("method", {"method": "lora"}, "fits with LoRA instead of full fine-tuning: `method=lora`",
              lora, layout)
    elif job.method == "lora" and getattr(gpu, "supports_bitsandbytes", True):
        offer("method", {"method": "qlora"}, "fits with QLoRA: `method=qlora`", job.with_(method="qlora"), layout)
    return tuple(out)


def _has_flash(model) -> bool:
    """transformers has a flash-attention path for the architecture (not Llama 4)."""
    from .model import FAMILIES

    fam = FAMILIES.get(model.family)
    return fam is None or fam.supports_flash
