"""Defaults that follow the reference stack, the assumptions printed with an answer, the "which
single change makes it fit" advice, the FLOPs terms of checkpointing and the loss path, and a
published single-GPU 70B QLoRA reference point."""

from __future__ import annotations

import pytest

from ftplan.actflops import loss_extra_flops_per_token, recompute_flops_per_token
from ftplan.advice import fit_advice, job_assumptions
from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.models import resolve_model
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout, LoraSpec, validate_job
from ftplan.memory import activation_parts, estimate_memory
from ftplan.planner import fit, recommend
from ftplan.runtime import flops_per_token

GIB = 2**30


@pytest.fixture(scope="module")
def llama70():
    return resolve_model("llama-3.1-70b")


@pytest.fixture(scope="module")
def h100():
    return load_gpus()["h100-sxm"]


def test_defaults_follow_trl_sft_config():
    j = Job()
    assert j.gradient_checkpointing and j.ac_mode == "full"  # SFTConfig gradient_checkpointing=True
    assert j.seq_len == 1024  # SFTConfig max_length
    assert j.loss == "trl" and not j.activation_offloading and not j.packing and not j.padding_free
    assert j.precision == "bf16-mixed" and j.optimizer == "adamw"
    assert Job(gradient_checkpointing=False, checkpointing="selective").ac_mode == "none"


def test_done_when_70b_qlora_fits_one_h100_with_the_defaults(llama70, h100):
    """`ftplan estimate llama-3.1-70b --method qlora --gpu h100-sxm` with TRL/PEFT defaults fits:
    ~47 GB of model states (4-bit base 43.7 GB), 80 checkpointed layer inputs in fp32 (the residual
    stream after prepare_model_for_kbit_training), no logits."""
    job = Job(method="qlora")
    mem = estimate_memory(llama70, job)
    assert mem.fits(h100.memory_bytes)
    c = mem.components
    assert c["activations"] == 80 * 1024 * 8192 * 4 + 2 * 1024 * 128 * 4 + 1024 * 8  # inputs, RoPE, position ids
    assert c["logits_and_loss"] < 0.1e9  # the fused head keeps hidden states, not logits
    assert 45 * GIB < mem.device_total_bytes < 55 * GIB
    # it did not before the defaults changed: no checkpointing, transformers' loss, 2048 tokens
    old = estimate_memory(llama70, job.with_(gradient_checkpointing=False, loss="hf", seq_len=2048))
    assert not old.fits(h100.memory_bytes)
    # TRL's own default micro-batch (per_device_train_batch_size=8) fits too, narrowly
    assert estimate_memory(llama70, job.with_(micro_batch=8)).fits(h100.memory_bytes)


def test_assumptions_name_each_default_and_its_source():
    names = {a.field: a for a in job_assumptions(Job(method="qlora"))}
    for field in ("gradient_checkpointing", "seq_len", "micro_batch", "precision", "optimizer", "loss",
                  "attn_impl", "activation_offloading", "packing", "lora", "quant"):
        assert field in names, field
        assert names[field].text and names[field].source and names[field].change
    assert "TRL" in names["gradient_checkpointing"].source and "PEFT" in names["gradient_checkpointing"].source
    assert "max_length" in names["seq_len"].source
    # options the user set are not assumptions
    given = {a.field for a in job_assumptions(Job(method="qlora", seq_len=4096), explicit={"seq_len", "method"})}
    assert "seq_len" not in given and "gradient_checkpointing" in given
    assert "lora" not in {a.field for a in job_assumptions(Job(method="full"))}
    assert all(isinstance(a.to_dict(), dict) for a in job_assumptions(Job()))


def test_advice_is_empty_when_it_fits(llama70, h100):
    assert fit_advice(llama70, Job(method="qlora"), Layout(), h100) == ()


def test_advice_single_changes_with_numbers(llama70, h100):
    job = Job(method="qlora", seq_len=2048, gradient_checkpointing=False)
    advice = fit_advice(llama70, job, Layout(), h100)
    kinds = [s.kind for s in advice]
    assert kinds[0] == "checkpointing" and "seq_len" in kinds
    for s in advice:
        assert s.device_total_bytes <= h100.memory_bytes
        assert "GiB of" in s.text
        lay = Layout(**s.layout) if s.layout else Layout()
        changed = job.with_(**{k: v for k, v in s.changes.items() if k not in ("gpus", "strategy",
                                                                             "offload_optimizer", "offload_params")})
        if s.kind == "activation_offloading":
            changed = changed.with_(gradient_checkpointing=True)
        assert estimate_memory(llama70, changed, lay).device_total_bytes == s.device_total_bytes
    seq = next(s for s in advice if s.kind == "seq_len").changes["seq_len"]
    assert seq % 128 == 0
    assert not estimate_memory(llama70, job.with_(seq_len=seq + 128)).fits(h100.memory_bytes)


def test_advice_more_gpus_for_full_70b(llama70, h100):
    advice = fit_advice(llama70, Job(method="full"), Layout(), h100)
    gpus = [s for s in advice if s.kind == "gpus"]
    assert gpus and gpus[0].changes["strategy"] == "zero3"
    n = gpus[0].changes["gpus"]
    assert not estimate_memory(llama70, Job(method="full"), Layout(8, n // 16, "zero3")).fits(h100.memory_bytes)


def test_advice_zero3_on_the_same_gpus(llama70, h100):
    """LoRA on Llama-3.1-70B under DDP on 8 GPUs replicates the bf16 weights on every rank and does
    not fit an H100; ZeRO-3 on those 8 GPUs does: that single flag is offered (before more GPUs)
    with the memory it needs, and the figure is the estimate of that layout."""
    lay = Layout(8, 1, "ddp")
    job = Job(method="lora")
    assert not estimate_memory(llama70, job, lay).fits(h100.memory_bytes)
    advice = fit_advice(llama70, job, lay, h100)
    kinds = [s.kind for s in advice]
    assert "strategy" in kinds
    s = advice[kinds.index("strategy")]
    assert s.changes == {"strategy": "zero3"} and "same 8 GPUs" in s.text
    assert s.device_total_bytes == estimate_memory(llama70, job, Layout(8, 1, "zero3")).device_total_bytes
    assert "gpus" not in kinds or kinds.index("strategy") < kinds.index("gpus")
    # a layout that already shards its states gets no such advice
    assert "strategy" not in [a.kind for a in fit_advice(llama70, Job(method="full"), Layout(8, 1, "zero3"), h100)]


def test_validation_of_new_options(llama70):
    for bad in (Job(checkpointing="sometimes"), Job(loss="nll"), Job(checkpointing="every-k", checkpoint_every=0),
                Job(checkpoint_every=81)):
        with pytest.raises(ConfigError):
            validate_job(llama70, bad)


def test_checkpointing_variants_order_on_real_sizes(llama70):
    """Saved activations: full <= selective-attention <= selective <= none; every-2 in between;
    offloading moves the checkpoint inputs off the device; padding-free rows keep the same tokens."""
    def act(**kw):
        p = activation_parts(llama70, Job(method="qlora", seq_len=4096, **kw))
        return p.device_saved_bytes
    full, attn, sel = act(), act(checkpointing="selective-attention"), act(checkpointing="selective")
    every, none = act(checkpointing="every-k"), act(gradient_checkpointing=False)
    assert full < attn < sel < none and full < every < none
    assert act(activation_offloading=True) < full / 10
    assert act(padding_free=True, attn_impl="flash") >= full


def test_planner_keeps_the_checkpointing_variant(llama70):
    small = resolve_model("qwen2.5-0.5b")
    ps = recommend(small, Job(method="lora", checkpointing="selective", dataset_tokens=10**6),
                   [_offer("h100-sxm")], max_gpus=1)
    assert ps.plans and {p.job.ac_mode for p in ps.plans} <= {"none", "selective"}
    r = fit(llama70, Job(method="qlora"), load_gpus()["h100-sxm"])
    assert r.fits and r.max_seq_len > 4096


def _offer(gpu):
    from ftplan.catalog.offers import load_offers

    return next(o for o in load_offers() if o.gpu == gpu and o.gpus_per_instance == 1)


def test_flops_terms(llama70):
    base = Job(method="qlora", seq_len=4096, loss="hf")
    attn = flops_per_token(llama70, base).attention
    full = recompute_flops_per_token(llama70, base, attn)
    assert recompute_flops_per_token(llama70, base.with_(gradient_checkpointing=False), attn) == 0
    sel = recompute_flops_per_token(llama70, base.with_(checkpointing="selective"), attn)
    sel_attn = recompute_flops_per_token(llama70, base.with_(checkpointing="selective-attention"), attn)
    every = recompute_flops_per_token(llama70, base.with_(checkpointing="every-k", checkpoint_every=2), attn)
    assert sel < sel_attn < full and every == pytest.approx(full / 2)
    assert sel_attn == pytest.approx(full - attn)
    assert loss_extra_flops_per_token(llama70, base.with_(loss="trl")) == 2 * 128256 * 8192
    assert loss_extra_flops_per_token(llama70, base) == 0


def test_published_unsloth_hf_fa2_70b_qlora_context():
    """Unsloth's Llama 3.3 70B benchmark (unsloth.ai/blog/llama3-3, Dec 2024): 4-bit QLoRA on all
    linear layers, rank 32, batch 1, sequences padded to the length, Hugging Face + FA2: longest
    context 6,916 tokens on an 80 GB A100, out of memory on 48 GB. ftplan (transformers' loss,
    flash attention, checkpointing) must not promise more: within 15 % below."""
    m = resolve_model("llama-3.3-70b")
    job = Job(method="qlora", lora=LoraSpec(r=32, alpha=32, dropout=0.0), attn_impl="flash", loss="hf")
    gpus = load_gpus()
    r = fit(m, job, gpus["a100-80gb-sxm"], safety_margin=0.0)
    assert 0.85 * 6916 <= r.max_seq_len <= 6916
    assert fit(m, job, gpus["l40s"], safety_margin=0.0).max_seq_len is None  # 48 GB: OOM


# ---------------------------------------------------------------------------------------------
# QLoRA recipe: PEFT's (default) or TRL SFTTrainer's own (byte-exact per recipe in
# tests/test_memory_vs_torch.py; here how the planner and the printed defaults use it)
# ---------------------------------------------------------------------------------------------
def test_qlora_recipe_trl_single_gpu_is_smaller_by_the_upcast_and_adapter_bytes(llama70, h100):
    from ftplan.job import QuantSpec
    from ftplan.memory import model_states

    peft = Job(method="qlora")
    trl = peft.with_(quant=QuantSpec(recipe="trl"))
    a, b = model_states(llama70, peft), model_states(llama70, trl)
    n = a.params_trainable
    assert (a.trainable_weights - b.trainable_weights, a.gradients - b.gradients) == (2 * n, 2 * n)
    assert a.optimizer_states - b.optimizer_states == 4 * n  # AdamW's two states in bf16
    # embedding, norms and lm_head: fp32 after prepare_model_for_kbit_training, bf16 under TRL
    unq = llama70.params.embedding + llama70.params.lm_head + llama70.params.norms
    assert a.frozen_weights - b.frozen_weights == pytest.approx(2 * unq, rel=1e-3)
    ma, mb = estimate_memory(llama70, peft), estimate_memory(llama70, trl)
    assert 5.5e9 < ma.peak_allocated_bytes - mb.peak_allocated_bytes < 8e9  # ~6 GB on a 70B
    text = " ".join(x.text for x in job_assumptions(trl))
    assert "TRL SFTTrainer" in text and "bf16" in text
    assert "qlora_recipe" in " ".join(x.change for x in job_assumptions(peft))


@pytest.mark.parametrize("strategy,engine", [("fsdp", "fsdp2"), ("zero3", "deepspeed"), ("zero2", "deepspeed")])
def test_qlora_recipe_under_sharding_engines_is_the_engines_path(llama70, strategy, engine):
    """FSDP/DeepSpeed hold fp32 trainable parameters and no kbit upcast whatever the recipe."""
    from ftplan.job import QuantSpec

    layout = Layout(gpus_per_node=8, strategy=strategy)
    peft = Job(method="qlora")
    a = estimate_memory(llama70, peft, layout)
    b = estimate_memory(llama70, peft.with_(quant=QuantSpec(recipe="trl")), layout)
    assert a.components == b.components
    assert any("recipe trl under " + engine in n for n in b.notes)


def test_qlora_recipe_ddp_follows_the_recipe(llama70):
    from ftplan.job import QuantSpec

    layout = Layout(gpus_per_node=2, strategy="ddp")
    peft = Job(method="qlora", seq_len=2048)
    a = estimate_memory(llama70, peft, layout)
    b = estimate_memory(llama70, peft.with_(quant=QuantSpec(recipe="trl")), layout)
    assert b.peak_allocated_bytes < a.peak_allocated_bytes


def test_fsdp1_lora_on_moe_experts_is_flagged():
    """PEFT's ParamWrapper LoRA on a transformers-5 MoE's fused experts did not train under FSDP1
    in the CPU runs (benchmarks/notes/distributed_cpu.md): the answer says so for FSDP1, not for
    FSDP2 nor when the adapters leave the experts alone."""
    mix = resolve_model("mixtral-8x7b")
    moe = Job(method="lora", lora=LoraSpec(dropout=0.0))
    attn = Job(method="lora", lora=LoraSpec(dropout=0.0, target_modules=("q_proj", "v_proj")))

    def flagged(job, version):
        notes = estimate_memory(mix, job, Layout(gpus_per_node=8, strategy="fsdp", fsdp_version=version)).notes
        return any("ParamWrapper" in n and "FSDP1" in n for n in notes)

    assert flagged(moe, 1)
    assert not flagged(moe, 2) and not flagged(attn, 1)


def test_eager_attention_gets_a_flash_suggestion():
    """gpt-oss runs eager attention by default (no sdpa path for its sinks): at 2 x 8192 tokens its
    score-sized tensors do not fit an H100, a flash kernel does, and the advice says so before it
    cuts the sequence."""
    from ftplan.catalog.gpus import get_gpu

    spec = resolve_model("gpt-oss-20b")
    job = Job(method="lora", micro_batch=2, seq_len=8192)
    advice = fit_advice(spec, job, None, get_gpu("h100-sxm"))
    kinds = [a.kind for a in advice]
    assert "attention" in kinds and kinds.index("attention") < kinds.index("seq_len")
    flash = advice[kinds.index("attention")]
    assert flash.changes == {"attn_impl": "flash"}
    # an sdpa architecture at the same size is not offered a different attention
    assert "attention" not in [a.kind for a in fit_advice(resolve_model("llama-3.1-8b"), job.with_(seq_len=65536),
                                                          None, get_gpu("h100-sxm"))]
