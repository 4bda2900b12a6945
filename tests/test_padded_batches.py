"""Padded micro-batches (``Job.padded_batches``) against PyTorch on CPU.

TRL's default collator pads a micro-batch of uneven rows to its longest and passes an
``attention_mask`` with zeros. transformers 5 then cannot run sdpa with ``is_causal``: it builds a
``(b, 1, s, s)`` bool mask per attention kind (sdpa keeps a compute-dtype copy per layer), repeats
GQA's k/v to every head (no ``enable_gqa`` with a mask), and hybrid models zero the padding rows
of their conv / linear-attention inputs with the int64 mask. The batch is ftplan's convention
(``ftplan.measure.torchref.pad_batch``: the last row shorter by ``max(1, s // 8)`` tokens).

CI keeps one case per kind of difference (GQA dense, MoE, a hybrid short-conv model, sliding
windows; full and LoRA; checkpointing on and off), forward only;
``benchmarks/padded_batches_cpu.py`` runs every family, sdpa and eager, by hand.
"""

from __future__ import annotations

import warnings

import pytest

from ftplan.job import Job, LoraSpec
from ftplan.memory import estimate_memory, saved_activation_bytes
from ftplan.model import model_from_config


def test_flag_and_its_scope():
    assert not Job().has_padding and Job(padded_batches=True).has_padding
    # packed and padding-free rows carry no padding, whatever the flag says
    assert not Job(padded_batches=True, packing=True).has_padding
    assert not Job(padded_batches=True, padding_free=True, attn_impl="flash").has_padding
    from ftplan.options import build_job

    assert build_job({"padded_batches": True}).padded_batches


def test_assumption_line_and_job_line():
    from ftplan.advice import job_assumptions
    from ftplan.report import _job_line

    a = {x.field: x for x in job_assumptions(Job(micro_batch=4))}["padded_batches"]
    assert a.value is False and "padded_batches" in a.text
    assert "padded_batches" not in {x.field for x in job_assumptions(Job(packing=True))}
    assert "padded batches" in _job_line(Job(padded_batches=True)) and "padded" not in _job_line(Job())


def test_flash_and_eager_keep_their_bytes():
    """Eager builds its additive mask and repeats k/v either way; flash unpads (not modelled)."""
    from ftplan.catalog.models import resolve_model

    spec = resolve_model("llama-3.1-8b")
    for attn in ("eager", "flash"):
        job = Job(method="lora", micro_batch=4, seq_len=4096, attn_impl=attn)
        assert saved_activation_bytes(spec, job) == saved_activation_bytes(spec, job.with_(padded_batches=True))
    job = Job(method="lora", micro_batch=4, seq_len=4096)
    assert estimate_memory(spec, job.with_(padded_batches=True)).peak_allocated_bytes > \
        estimate_memory(spec, job).peak_allocated_bytes


def test_dataset_plans_padding_where_the_loader_pads():
    from ftplan.dataset import profile_from_lengths, simulate_batches

    prof = profile_from_lengths([100, 300, 700, 900] * 10)
    assert simulate_batches(prof, "longest", 1024, 4).padded
    assert simulate_batches(prof, "bucketed", 1024, 4).padded
    assert not simulate_batches(prof, "longest", 1024, 1).padded  # a row is its own longest
    assert simulate_batches(prof, "padded", 1024, 1).padded  # padded to max_length
    assert not simulate_batches(prof, "packed", 1024, 4).padded
    assert not simulate_batches(profile_from_lengths([2000] * 8), "longest", 1024, 4).padded  # all truncated
    b = simulate_batches(prof, "longest", 1024, 4)
    assert b.memory_job(Job(micro_batch=4)).padded_batches


# ---------------------------------------------------------------------------------------------
# against PyTorch
# ---------------------------------------------------------------------------------------------
#: (family, method, checkpointing): GQA dense (llama, qwen2), an MoE (mixtral), a hybrid
#: short-conv model (lfm2: the int64 mask), sliding windows (gemma3_text: a mask per kind)
CASES = [
    ("llama", "lora", False),
    ("llama", "full", True),
    ("qwen2", "full", False),
    ("mixtral", "full", True),
    ("lfm2", "full", False),
    ("lfm2", "full", True),
    ("gemma3_text", "full", True),
]


def measure_padded(family: str, method: str, ckpt: bool, batch: int = 2, seq: int = 16, attn: str = "sdpa"):
    """(spec, job, bytes autograd saves minus autocast's weight copies) for one padded forward under
    HF Trainer's bf16 autocast (the setup of tests/test_memory_vs_torch.py)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    import ftplan.measure.torchref as TR

    cfg = TR.TINY_CONFIGS[family]
    moe = family in ("mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "glm4_moe", "qwen3_next", "glm4_moe_lite",
                     "minimax_m2", "granitemoe", "lfm2_moe", "qwen3_5_moe", "gemma4_moe", "llama4_text", "mistral4")
    dropout = 0.0 if moe else 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="fp32" if method == "full" else "bf16", attn_implementation=attn)
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout,
                                                     target_modules="all-linear", task_type="CAUSAL_LM"))
        orig = TR._model_dtype
        TR._model_dtype = lambda m: torch.float32  # autocast to bf16 around the forward
        try:
            r = TR.measure_step(model, batch=batch, seq_len=seq, gradient_checkpointing=ckpt, dtype="bf16",
                                forward_only=True, padded=True)
        finally:
            TR._model_dtype = orig
    casts = sum(x.nbytes for x in r.records if x.param_copy)
    job = Job(method=method, precision="bf16-mixed", micro_batch=batch, seq_len=seq, gradient_checkpointing=ckpt,
              attn_impl=attn, lora=LoraSpec(r=8, alpha=16, dropout=dropout), loss="hf", padded_batches=True)
    return model_from_config(cfg), job, r.saved_activation_bytes - casts


@pytest.mark.torch
@pytest.mark.parametrize("family,method,ckpt", CASES)
def test_padded_saved_activations_exact(family, method, ckpt):
    spec, job, measured = measure_padded(family, method, ckpt)
    assert saved_activation_bytes(spec, job, backend="cpu") == measured
    # and the padding is what makes the difference (the unpadded forms are held in test_memory_vs_torch)
    assert saved_activation_bytes(spec, job.with_(padded_batches=False), backend="cpu") < measured


@pytest.mark.torch
@pytest.mark.parametrize("family,method,ckpt", [("lfm2", "lora", True), ("mixtral", "lora", False)])
def test_padded_saved_activations_exact_lora(family, method, ckpt):
    spec, job, measured = measure_padded(family, method, ckpt)
    assert saved_activation_bytes(spec, job, backend="cpu") == measured


@pytest.mark.torch
def test_selective_checkpointing_and_trl_loss_padded():
    """TRL's selective checkpointing (the SAC cache keeps the attention kernel's outputs) and TRL's
    fused-head loss on a padded batch (``ftplan.measure.acref.measure_variant``)."""
    pytest.importorskip("trl")
    import ftplan.measure.acref as A
    import ftplan.measure.torchref as TR
    from ftplan.memory import activation_parts

    cfg = TR.TINY_CONFIGS["llama"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="fp32", attn_implementation="sdpa")
        A.add_trl_fused_head(model)
        r = A.measure_variant(model, batch=2, seq_len=16, checkpointing="selective-attention", loss="trl", padded=True)
    job = Job(method="full", micro_batch=2, seq_len=16, checkpointing="selective-attention", loss="trl",
              padded_batches=True)
    spec = model_from_config(cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.device_bytes - r.weight_copy_bytes
    assert activation_parts(spec, job, backend="cpu").sac_cache_bytes == r.sac_cache_bytes


@pytest.mark.torch
def test_recompute_peak_padded():
    """The step's peak is in the last layer's recompute (checkpointing; a small vocabulary, a wide
    MLP): padding raises it by what ftplan adds to the saved set and the recompute (the mask copy
    and the repeated k/v of the recomputed layer, the closures' bool mask)."""
    pytest.importorskip("torch")
    from ftplan.measure.loss_peak import measure_loss_peak
    from ftplan.memory import activation_parts

    cfg = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 448, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False}
    spec = model_from_config(cfg)
    peak, planned = {}, {}
    for padded in (False, True):
        m = measure_loss_peak(cfg, batch=2, seq_len=32, loss="hf", mode="mixed-lora", padded=padded)
        a = activation_parts(spec, m.job().with_(padded_batches=padded), backend="cpu")
        peak[padded], planned[padded] = m.peak_bytes, a.device_saved_bytes + a.recompute_bytes
    assert peak[True] - peak[False] == planned[True] - planned[False] > 0
