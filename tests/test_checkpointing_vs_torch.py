"""Activation checkpointing variants, activation offloading, the loss paths and padding-free batches
against real PyTorch on CPU (tiny instances of the real Hugging Face architectures).

Every assertion is an exact byte count: what is alive between forward and backward, measured by
``ftplan.measure.acref`` through the real code paths (transformers' checkpointing with
``use_reentrant`` / ``every_n_layers``, TRL's selective checkpointing, torch's SAC with torchtitan's
op policy, TRL's ``OffloadActivations``, TRL's fused LM head and padding-free collator output),
against ``ftplan.memory``. Weights are excluded on both sides; autocast's weight copies are held
against the weight side of the model separately.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("trl")

import ftplan.measure.acref as A  # noqa: E402
import ftplan.measure.torchref as TR  # noqa: E402
from ftplan.catalog.constants import memory_constants  # noqa: E402
from ftplan.job import Job, Layout, LoraSpec  # noqa: E402
from ftplan.memory import activation_parts, estimate_memory, model_states, saved_activation_bytes  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402

pytestmark = pytest.mark.torch

MOE = {"mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "glm4_moe", "qwen3_next", "glm4_moe_lite", "minimax_m2",
       "ernie4_5_moe"}
ATTN = {"gemma2": "eager", "gpt_oss": "eager"}  # no sdpa path in transformers 5
#: PEFT's all-linear wraps Llama 4's router (an nn.Linear returning a tuple) and fails: the list
#: ftplan plans and exports instead
LORA_TARGETS = {"llama4_text": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def _model(family: str, method: str, loss: str):
    cfg = TR.TINY_CONFIGS[family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = TR.build_model(cfg, dtype="fp32" if method == "full" else "bf16",
                           attn_implementation=ATTN.get(family, "sdpa"))
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            m = get_peft_model(m, LoraConfig(r=8, lora_alpha=16, lora_dropout=_dropout(family),
                                             target_modules=LORA_TARGETS.get(family, "all-linear"),
                                             task_type="CAUSAL_LM"))
        if loss == "trl":
            A.add_trl_fused_head(m)
    return m


def _dropout(family: str) -> float:
    return 0.0 if family in MOE else 0.1  # PEFT's ParamWrapper (MoE experts) refuses dropout


def _job(family: str, method: str, mode: str, batch: int, seq: int, loss: str, **kw) -> Job:
    return Job(method=method, micro_batch=batch, seq_len=seq, attn_impl=ATTN.get(family, "sdpa"),
               gradient_checkpointing=mode != "none", checkpointing=mode if mode != "none" else "full",
               loss=loss, lora=LoraSpec(r=8, alpha=16, dropout=_dropout(family)), **kw)


def _measure(family, method, mode, *, loss="hf", batch=2, seq=24, **kw):
    m = _model(family, method, loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = A.measure_variant(m, batch=batch, seq_len=seq, checkpointing=mode, loss=loss, **kw)
    spec = model_from_config(TR.TINY_CONFIGS[family])
    return spec, r


# (family, method, mode): torchtitan's op SAC everywhere, TRL's attention SAC where attention is one
# op and where it is not (gemma2 eager, MLA on CPU), reentrant, every-k with mixed layer kinds
VARIANTS = (
    # (qwen2_moe's block, qwen3_5_moe and qwen3_next: the shared expert's mm run before the router's)
    [(f, "full", "selective") for f in sorted(TR.TINY_CONFIGS)]
    + [(f, "lora", "selective") for f in ("llama", "qwen2", "phi3", "gemma2", "mixtral", "deepseek_v3", "gpt_oss",
                                          "glm4_moe", "qwen3_next")]
    + [("llama", "full", "selective-attention"), ("llama", "lora", "selective-attention"),
       ("gemma2", "lora", "selective-attention"), ("deepseek_v3", "full", "selective-attention")]
    + [("llama", "lora", "full-reentrant"), ("qwen3_moe", "full", "full-reentrant")]
    + [("llama", "full", "every-k"), ("gemma2", "lora", "every-k"), ("gemma3_text", "full", "every-k"),
       ("mixtral", "lora", "every-k"), ("deepseek_v3", "full", "every-k"), ("gpt_oss", "lora", "every-k"),
       ("glm4_moe", "full", "every-k"), ("qwen3_next", "lora", "every-k"),
       ("llama4_text", "lora", "selective"), ("llama4_text", "lora", "every-k"),
       ("llama4_text", "full", "selective-attention")]
)


@pytest.mark.parametrize("family,method,mode", VARIANTS)
def test_checkpointing_variants_exact(family, method, mode):
    """Checkpoint inputs + recompute closures + the SAC cache (outputs of the attention kernel and
    every other ``mm``, read from torch's caching dispatch mode) + the layers every-k leaves alone."""
    spec, r = _measure(family, method, mode)
    job = _job(family, method, mode, 2, 24, "hf")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes
    assert activation_parts(spec, job, backend="cpu").sac_cache_bytes == r.sac_cache_bytes
    assert activation_parts(spec, job, backend="cpu").checkpointed_layers == r.n_checkpointed
    # autocast's weight copies: only the layers every-k does not checkpoint (and the lm_head's)
    # keep theirs
    if method == "lora":
        assert model_states(spec, job).master_weights == r.weight_copy_bytes
    elif family not in MOE:  # CUDA autocasts grouped_mm experts too; CPU does not
        assert estimate_memory(spec, job).components["master_weights"] == r.weight_copy_bytes


@pytest.mark.parametrize("family,method", [("llama", "full"), ("llama", "lora"), ("qwen2", "lora"),
                                           ("gemma2", "full"), ("qwen3_moe", "lora")])
@pytest.mark.parametrize("mode,batch,seq", [("none", 2, 24), ("full", 1, 40)])
def test_trl_fused_head_exact(family, method, mode, batch, seq):
    """TRL SFTTrainer's loss (``add_fused_lm_head``, ``-log_probs.sum() / num_items``): the hidden
    states it projects (a view with b = 1, a copy otherwise), int64 targets, fp32 log-normaliser and
    entropy, the label mask, the token count; no logits, no lm_head weight copy."""
    spec, r = _measure(family, method, mode, loss="trl", batch=batch, seq=seq)
    job = _job(family, method, mode, batch, seq, "trl")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes
    if method == "full" and family not in MOE:
        # the fused head casts weight tiles inside its autograd function: no lm_head copy is kept
        assert estimate_memory(spec, job).components["master_weights"] == r.weight_copy_bytes


@pytest.mark.parametrize("method,batch,seq", [("lora", 2, 24), ("full", 1, 40)])
def test_trl_fused_head_cuda_path(method, batch, seq):
    """On CUDA TRL projects only the positions with a label (``hidden_states[mask]``, then
    ``masked_scatter``); the same code runs here with its Triton switch forced on."""
    _, plain = _measure("llama", method, "full", loss="trl", batch=batch, seq=seq)
    spec, compact = _measure("llama", method, "full", loss="trl", batch=batch, seq=seq, compact=True)
    job = _job("llama", method, "full", batch, seq, "trl")
    gpu = activation_parts(spec, job, backend="cuda").loss_saved_bytes
    cpu = activation_parts(spec, job, backend="cpu").loss_saved_bytes
    assert gpu - cpu == compact.device_bytes - plain.device_bytes


@pytest.mark.parametrize("family,method,mode,loss", [
    ("llama", "full", "none", "trl"), ("llama", "lora", "none", "trl"), ("llama", "full", "full", "hf"),
    ("llama", "lora", "full", "hf"), ("mistral", "lora", "full", "trl"), ("gemma3_text", "full", "selective", "hf")])
def test_padding_free_exact(family, method, mode, loss):
    """TRL's padding-free batch (one row, position_ids restarting per sequence, cu_seq_lens and
    seq_idx passed to every layer): sdpa gets transformers' block-diagonal mask, the closures hold
    the collator's tensors, RoPE covers the whole row."""
    spec, r = _measure(family, method, mode, loss=loss, padding_free=True)
    job = _job(family, method, mode, 2, 24, loss, padding_free=True)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes


def _offload_consts():
    # TRL's default threshold (1 KiB) only ever skips scalars on real models; the tiny models here
    # have many tensors below it, so the harness and the model both use 1 byte
    return dataclasses.replace(memory_constants(), trl_offload_min_bytes=1)


OFFLOAD = (
    [("llama", "full", "full", "hf"), ("llama", "lora", "full", "trl"), ("llama", "full", "selective", "trl"),
     ("llama", "lora", "selective", "hf"), ("llama", "lora", "selective-attention", "trl"),
     ("llama", "full", "full-reentrant", "trl"), ("gemma3_text", "lora", "full", "trl"),
     ("mixtral", "full", "full", "hf"), ("deepseek_v3", "full", "selective", "hf")]
    # without checkpointing every saved tensor of a layer passes the hook
    + [("llama", "full", "none", "trl"), ("qwen3", "lora", "none", "trl"), ("phi3", "full", "none", "trl")]
    + [("llama", "lora", "every-k", "trl"), ("qwen3", "lora", "every-k", "hf")]
)


@pytest.mark.parametrize("family,method,mode,loss", OFFLOAD)
def test_activation_offloading_exact(family, method, mode, loss):
    """TRL ``activation_offloading=True``: what its pack hook copies to the host, what it keeps on
    the device (repeats of a tracked storage, the last 5 saves' originals, the output head's saves
    under its no-op hook) and what never reaches it (closures, the SAC cache)."""
    spec, r = _measure(family, method, mode, loss=loss, offload=True)
    job = _job(family, method, mode, 2, 24, loss, activation_offloading=True)
    p = activation_parts(spec, job, backend="cpu", consts=_offload_consts())
    device = r.device_bytes - r.weight_copy_bytes
    # every saved byte is accounted for, exactly
    assert p.offloaded_bytes + p.device_saved_bytes + p.loss_saved_bytes == r.host_bytes + device
    # the split, exact: the harness holds every packed tensor (hold_packed), so TRL's address-keyed
    # dedup sees only true repeats, not a fresh tensor at a freed address (allocator-dependent:
    # it kept 192 B for llama/phi3 and an 8 KiB weight copy for llama in earlier full-suite runs)
    assert p.offloaded_bytes == r.host_bytes


def test_offloading_moves_checkpoint_inputs_off_the_gpu():
    """The planning side: with checkpointing, offloading takes the layers' inputs off the device
    and puts them in pinned host memory (power-of-two blocks), on a real model size."""
    from ftplan.catalog.models import resolve_model

    m = resolve_model("llama-3.1-70b")
    job = Job(method="qlora", seq_len=4096)
    on, off = estimate_memory(m, job.with_(activation_offloading=True)), estimate_memory(m, job)
    layers = 80 * 4096 * 8192 * 4  # fp32 residual stream after prepare_model_for_kbit_training
    assert off.components["activations"] - on.components["activations"] >= layers - 5 * 4096 * 8192 * 4
    assert on.host_bytes >= layers and off.host_bytes == 0
    assert Layout().world_size == 1
