"""The memory formulas against real PyTorch on CPU (tiny instances of every architecture family).

Exact: parameter, gradient and optimizer-state bytes; autocast weight copies. Within 2 %: the bytes
autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``, parameters excluded,
storages counted once) over a grid of batch, sequence length, checkpointing and full/LoRA.
These tests are the contract that the formulas describe the real implementation.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import ftplan.measure.torchref as TR  # noqa: E402
from ftplan.job import Job, LoraSpec, QuantSpec  # noqa: E402
from ftplan.memory import _autocast_weight_elems, model_states, saved_activation_bytes  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402

pytestmark = pytest.mark.torch

#: attention implementation per family (gemma2 has no sdpa path in transformers 5)
ATTN = {"gemma2": "eager", "gpt_oss": "eager"}
MOE = {"mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "glm4_moe", "qwen3_next", "glm4_moe_lite", "minimax_m2",
       "olmoe", "dots1", "ernie4_5_moe"}
#: PEFT target_modules where ``all-linear`` does not run: PEFT 0.21 wraps Llama 4's router (an
#: ``nn.Linear`` subclass returning a tuple) and the forward fails; ftplan plans all-linear there as
#: every other nn.Linear (and exports this list)
LORA_TARGETS = {"llama4_text": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
#: (session 17, famb: MoE families whose experts PEFT wraps, so no dropout)
MOE |= {"deepseek_v2"}
#: (phimoe: PEFT's all-linear wraps its router, an nn.Linear whose forward returns a tuple, and fails)
LORA_TARGETS["phimoe"] = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _run(family, method, ckpt, batch, seq, optimizer="adamw", attn=None, precision="bf16-mixed", cfg=None):
    cfg = cfg or TR.TINY_CONFIGS[family]
    # PEFT's ParamWrapper (all-linear on fused MoE experts) refuses dropout
    dropout = 0.0 if family in MOE else 0.1
    attn = attn or ATTN.get(family, "sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dtype = "fp32" if method == "full" and precision.endswith("-mixed") else "bf16"
        model = TR.build_model(cfg, dtype=dtype, attn_implementation=attn)
        if method == "lora":
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout,
                                                     target_modules=LORA_TARGETS.get(family, "all-linear"),
                                                     task_type="CAUSAL_LM"))
        # HF Trainer bf16=True: autocast around the forward whatever the model dtype
        orig = TR._model_dtype
        if precision.endswith("-mixed"):
            TR._model_dtype = lambda m: torch.float32
        try:
            r = TR.measure_step(model, batch=batch, seq_len=seq, gradient_checkpointing=ckpt,
                                dtype="bf16", optimizer=optimizer)
        finally:
            TR._model_dtype = orig
    casts = sum(x.nbytes for x in r.records if x.param_copy)  # autocast copies of trainable weights
    job = Job(method=method, precision=precision, micro_batch=batch, seq_len=seq,
              gradient_checkpointing=ckpt, attn_impl=attn, optimizer=optimizer,
              lora=LoraSpec(r=8, alpha=16, dropout=dropout), loss="hf")  # model(labels=...)
    return model_from_config(cfg), job, r, casts



GRID = [(m, ck, b, s) for m in ("full", "lora") for ck in (False, True) for b, s in ((2, 24), (1, 40))]

#: the steps test_model_states_exact measures (b=2, s=24, no checkpointing) are GRID cases of
#: test_saved_activations_exact too: one measured step serves both tests (the first asks for it,
#: the second takes it out), so each family runs it once instead of twice
_SHARED_STEPS: dict = {}


def _run_shared(family, method, ckpt, batch, seq, *, last):
    """:func:`_run` (default options) through :data:`_SHARED_STEPS`: ``last=False`` keeps the
    result for the other test, ``last=True`` takes it out (or measures, if nothing was kept)."""
    key = (family, method, ckpt, batch, seq)
    got = _SHARED_STEPS.pop(key, None) if last else _SHARED_STEPS.get(key)
    if got is None:
        got = _run(*key)
        if not last:
            _SHARED_STEPS[key] = got
    return got


@pytest.mark.parametrize("family", sorted(TR.TINY_CONFIGS))
@pytest.mark.parametrize("method", ["full", "lora"])
def test_model_states_exact(family, method, request):
    spec, job, r, casts = _run_shared(family, method, False, 2, 24, last=False)
    st = model_states(spec, job)
    assert st.params_trainable * (4) == r.trainable_param_bytes
    assert st.trainable_weights == r.trainable_param_bytes
    assert st.gradients == r.grad_bytes
    assert st.optimizer_states == r.optimizer_state_bytes
    assert st.n_trainable_tensors == r.n_trainable_tensors
    if method == "full":
        # (no frozen parameter but ernie4_5_moe's fp32 e_score_correction_bias, requires_grad=False)
        assert st.frozen_weights == r.frozen_param_bytes
        # autocast weight copies kept for backward = the compute-dtype copy of every matmul weight
        assert 2 * _autocast_weight_elems(spec, backend="cpu") == casts
    else:
        assert st.frozen_weights == r.frozen_param_bytes
        # autocast's bf16 copies of the fp32 adapters (all but the first layer's q/k/v lora_A)
        assert st.master_weights == casts


@pytest.mark.parametrize("optimizer", ["sgd", "adafactor", "adamw_8bit", "paged_adamw_8bit"])
@pytest.mark.parametrize("method", ["full", "lora"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "mixtral", "deepseek_v3"])
def test_other_optimizers_exact(family, method, optimizer):
    """SGD (momentum buffer), transformers' Adafactor (factored rows/columns, per-expert for fused
    3-D experts, a 0-dim RMS per tensor) and bitsandbytes 8-bit AdamW on CPU (uint8 states, an fp32
    absmax per 256-block of each tensor, the two shared qmaps, fp32 states below 4096 elements):
    state bytes exact, full and LoRA, dense and MoE."""
    spec, job, r, _ = _run(family, method, False, 1, 16, optimizer=optimizer)
    assert model_states(spec, job).optimizer_states == r.optimizer_state_bytes


@pytest.mark.parametrize("family", sorted(TR.TINY_CONFIGS))
@pytest.mark.parametrize("method,ckpt,batch,seq", GRID)
def test_saved_activations_exact(family, method, ckpt, batch, seq, request):
    """Every byte autograd saves (HF Trainer's autocast, sdpa; gemma2 eager) equals the formula
    on CPU. b = 1 exercises the padded-labels storage, s = 40 > window the sliding-window masks."""
    spec, job, r, casts = _run_shared(family, method, ckpt, batch, seq, last=True)
    measured = r.saved_activation_bytes - casts
    assert saved_activation_bytes(spec, job, backend="cpu") == measured


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "gemma3_text", "phi3"])
@pytest.mark.parametrize("method,ckpt,batch,seq", GRID)
def test_saved_activations_exact_eager(family, method, ckpt, batch, seq):
    """Eager attention: repeated k/v, the fp32 softmax and its cast, masks under checkpointing."""
    spec, job, r, casts = _run(family, method, ckpt, batch, seq, attn="eager")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.parametrize("family", sorted(TR.TINY_CONFIGS))
@pytest.mark.parametrize("ckpt", [False, True])
def test_saved_activations_exact_pure_bf16(family, ckpt):
    """Pure bf16 full fine-tuning (no autocast): norms cast back to bf16, DeepSeek's fp32 router."""
    spec, job, r, casts = _run(family, "full", ckpt, 2, 24, precision="bf16")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def _check_peft_all_linear(family, expected):
    """PEFT's ``all-linear`` on a family's tiny model adapts exactly the linears ftplan plans
    (``lora_targets``), and those are ``expected``."""
    from ftplan.job import lora_targets

    spec = model_from_config(TR.TINY_CONFIGS[family])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        applied = TR.apply_lora(TR.build_model(TR.TINY_CONFIGS[family], dtype="bf16"), r=4, alpha=8, dropout=0.0)
    assert set(applied.targeted_suffixes) == set(lora_targets(spec, LoraSpec(r=4))) == set(expected)


def _check_fp32_base(family, ckpt=False, batch=2, seq=24):
    """A family's fp32-base LoRA run (:func:`_run_fp32_base`): the autocast weight copies are
    ftplan's master weights, the rest of the saved bytes its saved activations."""
    spec, job, r, casts = _run_fp32_base(family, ckpt, batch, seq)
    assert model_states(spec, job).master_weights == casts
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


def _run_fp32_base(family, ckpt, batch, seq, attn=None, cfg=None):
    """LoRA on a base loaded in fp32 (TRL SFTTrainer's default for a model id: ``Job.base_dtype``)
    under HF Trainer's bf16 autocast: PEFT's fp32 adapters on every linear."""
    from peft import LoraConfig, get_peft_model

    cfg = cfg or TR.TINY_CONFIGS[family]
    attn = attn or ATTN.get(family, "sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="fp32", attn_implementation=attn)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
        r = TR.measure_step(model, batch=batch, seq_len=seq, gradient_checkpointing=ckpt, dtype="bf16")
    casts = sum(x.nbytes for x in r.records if x.param_copy)  # autocast's cached adapter copies
    job = Job(method="lora", micro_batch=batch, seq_len=seq, gradient_checkpointing=ckpt, attn_impl=attn,
              lora=LoraSpec(r=8, alpha=16, dropout=0.1), loss="hf", base_dtype="fp32")
    return model_from_config(cfg), job, r, casts


#: dense families (LoRA on fused MoE experts over an fp32 base is refused: not modelled)
FP32_BASE_FAMILIES = ["llama", "qwen3", "phi3", "gemma2", "gemma3_text"]


@pytest.mark.parametrize("family", FP32_BASE_FAMILIES)
@pytest.mark.parametrize("ckpt,batch,seq", [(False, 2, 24), (True, 2, 24), (False, 1, 40), (True, 1, 40)])
def test_saved_activations_exact_fp32_base(family, ckpt, batch, seq):
    """An fp32 LoRA base under autocast: fp32 frozen weights (4 B), an fp32 residual stream, and
    every frozen matmul's compute-dtype weight copy saved for the input's gradient (not cached:
    the weight does not require grad), but for the first layer's q/k/v without checkpointing
    (their input needs no gradient); under checkpointing only the lm_head's copy stays."""
    spec, job, r, casts = _run_fp32_base(family, ckpt, batch, seq)
    st = model_states(spec, job)
    assert st.frozen_weights == r.frozen_param_bytes
    assert st.trainable_weights == r.trainable_param_bytes
    assert st.master_weights == (0 if ckpt else casts)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.parametrize("family", ["mixtral", "deepseek_v3"])
def test_saved_activations_exact_fp32_base_moe_checkpointed(family):
    """MoE, attention-only LoRA over an fp32 base, checkpointed (the frozen fp32 experts run in
    fp32 on CPU)."""
    from peft import LoraConfig, get_peft_model

    cfg = TR.TINY_CONFIGS[family]
    targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(TR.build_model(cfg, dtype="fp32", attn_implementation="sdpa"),
                               LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(targets),
                                          task_type="CAUSAL_LM"))
        r = TR.measure_step(model, batch=2, seq_len=24, gradient_checkpointing=True, dtype="bf16")
    job = Job(method="lora", micro_batch=2, seq_len=24, gradient_checkpointing=True, attn_impl="sdpa", loss="hf",
              lora=LoraSpec(r=8, alpha=16, dropout=0.0, target_modules=targets), base_dtype="fp32")
    assert saved_activation_bytes(model_from_config(cfg), job, backend="cpu") == r.saved_activation_bytes


def _run_qlora(family, ckpt, recipe, dropout=0.1, batch=2, seq=24, attn=None, cfg=None):
    """QLoRA as each recipe builds it: bitsandbytes nf4 (double quant) on CPU through
    ``from_pretrained(quantization_config=...)``, then PEFT's recipe (``prepare_model_for_kbit_training``,
    fp32 adapters) or TRL 1.16 ``SFTTrainer``'s (no kbit preparation; ``get_peft_model``, then every
    trainable parameter cast to bf16, ``enable_input_require_grads`` under checkpointing); one
    step under autocast (HF Trainer ``bf16=True``)."""
    pytest.importorskip("bitsandbytes")
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    cfg = cfg or TR.TINY_CONFIGS[family]
    attn = attn or ATTN.get(family, "sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TR.build_model(cfg, dtype="bf16", quantization="nf4-dq", attn_implementation=attn)
        if recipe == "peft":
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=ckpt)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=dropout,
                                                 target_modules=LORA_TARGETS.get(family, "all-linear"),
                                                 task_type="CAUSAL_LM"))
        if recipe == "trl":  # trl/trainer/sft_trainer.py (1.16): "_is_quantized_model" branch
            if ckpt:
                model.enable_input_require_grads()
            for name, p in model.named_parameters():
                if p.requires_grad and "lora_magnitude_vector" not in name:
                    p.data = p.data.to(torch.bfloat16)
        orig = TR._model_dtype
        TR._model_dtype = lambda m: torch.float32
        try:
            r = TR.measure_step(model, batch=batch, seq_len=seq, gradient_checkpointing=ckpt, dtype="bf16")
        finally:
            TR._model_dtype = orig
    job = Job(method="qlora", micro_batch=batch, seq_len=seq, gradient_checkpointing=ckpt, attn_impl=attn,
              lora=LoraSpec(r=8, alpha=16, dropout=dropout), loss="hf",
              quant=QuantSpec(recipe=recipe))
    return model_from_config(cfg), job, r


def _check_qlora(family, ckpt, recipe, dropout=0.1, activations=True, **run):
    """One QLoRA step (:func:`_run_qlora`) against the plan: model states byte-exact, and (with
    ``activations``) the saved activations less the adapters' autocast copies (PEFT's fp32 adapters;
    TRL's bf16 ones make none)."""
    spec, job, r = _run_qlora(family, ckpt, recipe, dropout=dropout, **run)
    st = model_states(spec, job)
    assert (st.frozen_weights, st.trainable_weights, st.gradients, st.optimizer_states) == (
        r.frozen_param_bytes, r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes)
    if activations:
        casts = sum(x.nbytes for x in r.records if x.producer == "TBackward0") if recipe == "peft" else 0
        assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text", "gpt_oss"])
@pytest.mark.parametrize("recipe", ["peft", "trl"])
def test_model_states_exact_qlora(family, recipe):
    """QLoRA model states per recipe, byte-exact: packed 4-bit storage + quantization constants,
    the non-quantized weights in fp32 (PEFT) or bf16 (TRL), adapters with their gradients and
    AdamW states in fp32 (PEFT) or bf16 (TRL)."""
    spec, job, r = _run_qlora(family, False, recipe)
    st = model_states(spec, job)
    assert st.frozen_weights == r.frozen_param_bytes
    assert st.trainable_weights == r.trainable_param_bytes
    assert st.gradients == r.grad_bytes
    assert st.optimizer_states == r.optimizer_state_bytes
    if recipe == "trl":  # bf16 adapters: autocast copies nothing
        assert st.master_weights == 0
        assert sum(x.nbytes for x in r.records if x.producer == "TBackward0") == 0


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma2", "gemma3_text", "gpt_oss"])
@pytest.mark.parametrize("ckpt", [False, True])
def test_saved_activations_exact_qlora_trl(family, ckpt):
    """TRL's QLoRA recipe: bf16 residual stream, norms and lm_head (no kbit upcast), bf16 adapters
    (no autocast copies), Linear4bit returning bf16."""
    spec, job, r = _run_qlora(family, ckpt, "trl")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma2", "gemma3_text"])
@pytest.mark.parametrize("recipe,ckpt", [("peft", False), ("trl", False), ("trl", True)])
def test_saved_activations_exact_qlora_no_dropout(family, recipe, ckpt):
    """lora_dropout 0 (nn.Identity): PEFT's recipe casts each adapter's input to fp32 (one copy per
    adapter); under TRL's the adapters read the layer's own bf16 tensors, shared where the inputs
    are (q/k/v, gate/up, the attention output)."""
    spec, job, r = _run_qlora(family, ckpt, recipe, dropout=0.0)
    casts = sum(x.nbytes for x in r.records if x.producer == "TBackward0")
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "gemma2", "gemma3_text", "gpt_oss"])
@pytest.mark.parametrize("ckpt", [False, True])
def test_saved_activations_exact_qlora(family, ckpt):
    """QLoRA through the real stack: bitsandbytes nf4 (double quant) on CPU, PEFT's
    prepare_model_for_kbit_training (fp32 norms, embedding and lm_head), all-linear LoRA, autocast.
    Linear4bit returns its input's dtype (fp32), and autocast's bf16 copy of the frozen fp32 lm_head
    is saved (and of gpt_oss's fp32 routers, which PEFT's all-linear leaves alone)."""
    spec, job, r = _run_qlora(family, ckpt, "peft")
    casts = sum(x.nbytes for x in r.records if x.producer == "TBackward0")  # LoRA A/B bf16 copies
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_eager_masks_per_layer_kind_even_when_the_window_covers_the_row(family):
    """Eager attention under checkpointing: transformers builds the sliding and the full mask in
    every forward and the recompute closures hold both, even when the window (64 here) is longer
    than the sequence (24), where sdpa would need no sliding mask at all."""
    from peft import LoraConfig, get_peft_model

    cfg = {**TR.TINY_CONFIGS[family], "sliding_window": 64}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(TR.build_model(cfg, dtype="bf16", attn_implementation="eager"),
                               LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                          task_type="CAUSAL_LM"))
        r = TR.measure_step(model, batch=2, seq_len=24, gradient_checkpointing=True, dtype="bf16")
    masks = [x for x in r.records if len(x.shape) == 4 and tuple(x.shape[-2:]) == (24, 24)]
    assert len(masks) == 2
    casts = sum(x.nbytes for x in r.records if x.param_copy)
    job = Job(method="lora", micro_batch=2, seq_len=24, gradient_checkpointing=True, attn_impl="eager",
              lora=LoraSpec(r=8, alpha=16, dropout=0.0), loss="hf")
    assert saved_activation_bytes(model_from_config(cfg), job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.parametrize("method,ckpt,attn", [("full", False, "sdpa"), ("lora", True, "sdpa"),
                                              ("lora", False, "eager")])
def test_phi3_partial_rotary_exact(method, ckpt, attn):
    """Phi-4-mini (phi3) rotates 0.75 of each head: transformers' Phi3 builds its RoPE tables over
    ``int(head_dim * partial_rotary_factor)`` features (read from ``rope_parameters``) and joins the
    rotated and passed-through halves with ``torch.cat``; the saved bytes follow."""
    rp = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}
    cfg = {**TR.TINY_CONFIGS["phi3"], "rope_parameters": rp}
    spec = model_from_config(cfg)
    assert spec.attention.rotary_dim == int(spec.attention.head_dim * 0.75)
    assert model_from_config(TR.TINY_CONFIGS["phi3"]).attention.rotary_dim == spec.attention.head_dim
    spec2, job, r, casts = _run("phi3", method, ckpt, 2, 24, attn=attn, cfg=cfg)
    assert spec2.attention.rotary_dim == spec.attention.rotary_dim
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts


@pytest.mark.parametrize("method,ckpt", [("full", False), ("lora", True)])
def test_mistral_null_sliding_window_is_no_window(method, ckpt):
    """Mistral-7B-v0.3, Mistral NeMo and Mistral Small 3 ship ``"sliding_window": null``:
    transformers keeps None (full causal attention: sdpa runs ``is_causal`` without a mask), not
    MistralConfig's 4096 default, which ftplan used to put back (a window and its mask above the
    window's length). Held at 40 tokens against the tiny model's window of 16."""
    cfg = {**TR.TINY_CONFIGS["mistral"], "sliding_window": None}
    spec = model_from_config(cfg)
    assert all(g.window is None for g in spec.groups)
    assert all(g.window == 16 for g in model_from_config(TR.TINY_CONFIGS["mistral"]).groups)
    _spec, job, r, casts = _run("mistral", method, ckpt, 1, 40, cfg=cfg)
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_activation_bytes - casts
