"""FP8 / NVFP4 memory terms against the real torchao code on CPU.

torch 2.13's ``torch._scaled_mm`` and torchao 0.18's float8 training (``Float8Linear``) and FP8 /
NVFP4 weight-only tensors run on CPU, so the low-precision terms are held byte for byte against
one real training step of tiny Hugging Face models (``ftplan.measure.lowprec_ref``): parameter,
gradient and optimizer bytes, and every storage autograd saves (activations plus the weight copies
kept for backward). Transformer Engine and torchao's sm100/Triton prototypes do not run on CPU;
their terms come from their source (tests/test_lowprec.py checks their consistency only).
"""

from __future__ import annotations

import warnings

import pytest

from ftplan.job import Job, LoraSpec
from ftplan.lowprec import converted_linears, get_recipe
from ftplan.memory import model_states

# ---------------------------------------------------------------------------------------------
# CPU checks against torchao (real Float8Linear / Float8Tensor / NVFP4Tensor code paths)
# ---------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("accelerate")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("torchao")

import ftplan.measure.lowprec_ref as LR  # noqa: E402
import ftplan.measure.torchref as TR  # noqa: E402
from ftplan.lowprec import weight_copy_delta_bytes  # noqa: E402
from ftplan.memory import _autocast_weight_elems, saved_activation_bytes  # noqa: E402
from ftplan.model import model_from_config  # noqa: E402


def _cfg(family: str, mlp16: bool = True) -> dict:
    cfg = dict(TR.TINY_CONFIGS[family])
    if mlp16 and "intermediate_size" in cfg:
        cfg["intermediate_size"] = 128  # divisible by 16: the MLP converts too
    return cfg


def _predict(spec, job: Job) -> tuple[int, int]:
    """(saved activations on CPU, weight copies held for backward) as estimate_memory counts them
    for one GPU (single layout)."""
    st = model_states(spec, job)
    acts = saved_activation_bytes(spec, job, backend="cpu")
    if job.method == "full":
        # on CPU the fused (grouped_mm) MoE experts run in fp32: autocast copies no expert weight
        copies = 2 * _autocast_weight_elems(spec, backend="cpu") + weight_copy_delta_bytes(spec, job)
        if job.gradient_checkpointing:
            outside = spec.params.lm_head + (spec.params.embedding if spec.tie_word_embeddings else 0)
            copies = min(copies, 2 * outside)
    else:
        copies = st.master_weights
    return acts, copies


def _measure(cfg: dict, job: Job, attn: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dtype = "fp32" if job.method == "full" else "bf16"
        model = TR.build_model(cfg, dtype=dtype, attn_implementation=attn)
        r = get_recipe(job.low_precision)
        if r is not None and r.kind == "weight_only":
            LR.quantize_base(model, r.name)
        if job.method == "lora":
            from peft import LoraConfig, get_peft_model

            lo = job.lora
            targets = "all-linear" if "all-linear" in lo.target_modules else list(lo.target_modules)
            model = get_peft_model(model, LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout,
                                                     target_modules=targets, task_type="CAUSAL_LM"))
        if r is not None and r.kind == "gemm":
            LR.convert_like_accelerate(model, r.name)  # accelerate converts after PEFT wrapped
        return LR.measure_lowprec_step(model, batch=job.micro_batch, seq_len=job.seq_len,
                                       gradient_checkpointing=job.gradient_checkpointing)


@pytest.mark.torch
@pytest.mark.parametrize("family,attn,recipe,ckpt", [
    ("llama", "sdpa", "fp8-tensorwise", False), ("llama", "sdpa", "fp8-rowwise", False),
    ("llama", "sdpa", "fp8-rowwise-gw-hp", False), ("llama", "sdpa", "fp8-tensorwise", True),
    ("qwen3", "sdpa", "fp8-rowwise", False), ("mistral", "eager", "fp8-tensorwise", False),
    ("phi3", "sdpa", "fp8-tensorwise", False),  # phi3 registers o_proj before qkv_proj: o_proj stays bf16
    ("gemma2", "eager", "fp8-rowwise", False), ("qwen3_moe", "sdpa", "fp8-tensorwise", False),
])
def test_torchao_float8_full_exact(family, attn, recipe, ckpt):
    """Full fine-tuning, fp32 master + bf16 autocast + Float8Linear: states unchanged, no bf16
    copy of converted weights kept, the same activations."""
    cfg = _cfg(family)
    spec = model_from_config(cfg)
    if True:
        job = Job(loss="hf", method="full", micro_batch=2, seq_len=24, gradient_checkpointing=ckpt, attn_impl=attn,
                  low_precision=recipe)
        r = _measure(cfg, job, attn)
        st = model_states(spec, job)
        assert (r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes) == \
            (st.trainable_weights, st.gradients, st.optimizer_states), recipe
        acts, copies = _predict(spec, job)
        assert r.weight_copy_bytes == copies, (recipe, r.weight_copy_bytes, copies)
        assert r.saved_bytes == acts + copies, (recipe, r.saved_bytes, acts + copies)


@pytest.mark.torch
def test_torchao_float8_filter_leaves_non_multiple_of_16_mlp():
    """The tiny llama's MLP width 120 is not a multiple of 16: accelerate leaves it in bf16."""
    cfg = _cfg("llama", mlp16=False)
    spec = model_from_config(cfg)
    job = Job(loss="hf", method="full", micro_batch=2, seq_len=24, gradient_checkpointing=False,
              low_precision="fp8-tensorwise")
    assert {lin.module for lin, _ in converted_linears(spec, job)} == {"q_proj", "k_proj", "v_proj", "o_proj"}
    r = _measure(cfg, job, "sdpa")
    acts, copies = _predict(spec, job)
    assert (r.weight_copy_bytes, r.saved_bytes) == (copies, acts + copies)


@pytest.mark.torch
@pytest.mark.parametrize("family,attn,rank,ckpt", [
    ("llama", "sdpa", 16, False), ("llama", "sdpa", 8, False), ("llama", "sdpa", 16, True),
    ("qwen3", "sdpa", 16, False), ("mistral", "eager", 16, False), ("phi3", "sdpa", 16, False),
    ("gemma2", "eager", 16, False),
])
def test_torchao_float8_lora_exact(family, attn, rank, ckpt):
    """LoRA on a bf16 base converted after PEFT: frozen base linears save their inputs (bf16
    LoRA saves none), rank-16 adapters are converted too (no autocast copies), rank 8 is not."""
    cfg = _cfg(family)
    spec = model_from_config(cfg)
    job = Job(loss="hf", method="lora", micro_batch=2, seq_len=24, gradient_checkpointing=ckpt, attn_impl=attn,
              lora=LoraSpec(r=rank, alpha=2 * rank, dropout=0.0), low_precision="fp8-tensorwise")
    r = _measure(cfg, job, attn)
    st = model_states(spec, job)
    assert (r.trainable_param_bytes, r.frozen_param_bytes, r.grad_bytes, r.optimizer_state_bytes) == \
        (st.trainable_weights, st.frozen_weights, st.gradients, st.optimizer_states)
    acts, copies = _predict(spec, job)
    assert r.saved_bytes == acts + copies, (r.saved_bytes, acts, copies)
    if not ckpt:
        bf16 = saved_activation_bytes(spec, job.with_(low_precision=None), backend="cpu")
        assert acts > bf16  # the float8 function keeps inputs of frozen linears


@pytest.mark.torch
@pytest.mark.parametrize("recipe", ["fp8-weight-only", "nvfp4-weight-only"])
@pytest.mark.parametrize("ckpt", [False, True])
def test_weight_only_base_lora_exact(recipe, ckpt):
    """LoRA on a torchao weight-only base: quantized frozen bytes exact (values, scales, swizzle
    padding, per-tensor scale); FP8 saves a dequantized bf16 copy per base linear, NVFP4 none."""
    cfg = _cfg("llama")
    spec = model_from_config(cfg)
    job = Job(loss="hf", method="lora", micro_batch=2, seq_len=24, gradient_checkpointing=ckpt,
              lora=LoraSpec(r=8, alpha=16, dropout=0.0), low_precision=recipe)
    r = _measure(cfg, job, "sdpa")
    st = model_states(spec, job)
    assert r.frozen_param_bytes == st.frozen_weights
    assert (r.trainable_param_bytes, r.grad_bytes, r.optimizer_state_bytes) == \
        (st.trainable_weights, st.gradients, st.optimizer_states)
    acts, copies = _predict(spec, job)
    assert r.saved_bytes == acts + copies, (r.saved_bytes, acts, copies)


@pytest.mark.torch
@pytest.mark.parametrize("rows,cols", [(128, 256), (64, 48), (200, 320), (16, 16)])
def test_format_layouts_match_torchao_tensors(rows, cols):
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor

    fmts = {f: get_recipe(r).weight for f, r in (("nvfp4", "nvfp4-te"), ("mxfp8", "mxfp8-te"),
                                                  ("fp8_rowwise", "fp8-weight-only"))}
    w = torch.randn(rows, cols, dtype=torch.bfloat16)
    for swz in (False, True):
        t = NVFP4Tensor.to_nvfp4(w, is_swizzled_scales=swz, per_tensor_scale=torch.tensor(1.0))
        assert LR.param_storage_bytes([t]) == fmts["nvfp4"].tensor_bytes(rows, cols, swizzled=swz)
    if cols % 32 == 0:  # MXTensor needs whole blocks
        mx = MXTensor.to_mx(w, torch.float8_e4m3fn, 32)
        assert LR.param_storage_bytes([mx]) == fmts["mxfp8"].tensor_bytes(rows, cols)
    from torchao.quantization import Float8WeightOnlyConfig, quantize_

    lin = torch.nn.Linear(cols, rows, bias=False).bfloat16()
    quantize_(lin, Float8WeightOnlyConfig())
    assert LR.param_storage_bytes([lin.weight]) == fmts["fp8_rowwise"].tensor_bytes(rows, cols)


@pytest.mark.torch
def test_scaled_mm_runs_on_cpu():
    """torch 2.13 runs torch._scaled_mm (the FP8 GEMM torchao calls) on CPU: tensorwise and
    rowwise scales, bf16 output."""
    a = torch.randn(32, 64).to(torch.float8_e4m3fn)
    b = torch.randn(48, 64).to(torch.float8_e4m3fn).t()
    y = torch._scaled_mm(a, b, scale_a=torch.tensor(1.0), scale_b=torch.tensor(1.0), out_dtype=torch.bfloat16)
    assert y.shape == (32, 48) and y.dtype == torch.bfloat16
    y = torch._scaled_mm(a, b, scale_a=torch.ones(32, 1), scale_b=torch.ones(1, 48), out_dtype=torch.bfloat16)
    assert y.shape == (32, 48)


@pytest.mark.torch
def test_torchao_float8_lora_on_moe_delta_exact():
    """MoE (qwen3_moe, attention-only LoRA): what float8 adds over bf16 LoRA is exact (the routed
    experts are 3-D parameters, never converted; the dense layer's MLP is)."""
    cfg = _cfg("qwen3_moe")
    spec = model_from_config(cfg)
    job = Job(loss="hf", method="lora", micro_batch=2, seq_len=24, gradient_checkpointing=False,
              lora=LoraSpec(r=16, alpha=32, dropout=0.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")),
              low_precision="fp8-tensorwise")
    base = job.with_(low_precision=None)
    measured = _measure(cfg, job, "sdpa").saved_bytes - _measure(cfg, base, "sdpa").saved_bytes
    predicted = sum(_predict(spec, job)) - sum(_predict(spec, base))
    assert measured == predicted != 0
