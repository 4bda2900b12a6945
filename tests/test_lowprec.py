"""Low-precision recipes (FP8 / NVFP4): validation, GPU refusals, catalog consistency and
properties of the memory terms (no torch needed; the byte-exact CPU checks against torchao are in
tests/test_lowprec_memory.py).

The notes below describe both files.

torch 2.13's ``torch._scaled_mm`` and torchao 0.18's float8 training (``Float8Linear``) and FP8 /
NVFP4 weight-only tensors run on CPU, so the low-precision terms are held byte for byte against
one real training step of tiny Hugging Face models (``ftplan.measure.lowprec_ref``): parameter,
gradient and optimizer bytes, and every storage autograd saves (activations plus the weight copies
kept for backward). Transformer Engine and torchao's sm100/Triton prototypes do not run on CPU;
their terms come from their source and are only checked here for consistency (marked below).
"""

from __future__ import annotations


import pytest

from ftplan.catalog.gpus import load_gpus
from ftplan.catalog.models import resolve_model
from ftplan.errors import ConfigError
from ftplan.job import Job, validate_job
from ftplan.lowprec import (
    apply_precision,
    check_gpu,
    converted_linears,
    get_recipe,
    gpu_problem,
    recipes,
    resolve_precision,
)
from ftplan.memory import estimate_memory, model_states

GPUS = load_gpus()


# ---------------------------------------------------------------------------------------------
# validation and GPU refusals (no torch needed)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama70():
    return resolve_model("llama-3.1-70b")


def test_aliases_resolve_by_method():
    assert resolve_precision("fp8", "full").name == "fp8-tensorwise"  # accelerate's AO default
    assert resolve_precision("fp8", "lora").name == "fp8-tensorwise"
    assert resolve_precision("nvfp4", "full").name == "nvfp4-te"
    assert resolve_precision("nvfp4", "lora").name == "nvfp4-weight-only"
    assert resolve_precision("bf16-mixed", "full") is None
    job = apply_precision(Job(method="full"), "fp8")
    assert (job.precision, job.low_precision, job.precision_label) == ("bf16-mixed", "fp8-tensorwise", "fp8-tensorwise")
    assert resolve_precision("fp9") is None
    with pytest.raises(ConfigError, match="fp9"):
        validate_job(resolve_model("llama-3.1-8b"), Job(precision="fp9"))
    # a recipe passed as `precision` is split by Job itself (CLI, web, API, JSON all construct Job)
    assert Job(method="lora", precision="nvfp4").low_precision == "nvfp4-weight-only"
    from ftplan.job import LOW_PRECISIONS, LOW_PRECISION_RECIPES
    from ftplan.lowprec import precision_names

    assert set(LOW_PRECISIONS) == set(precision_names()) and set(LOW_PRECISION_RECIPES) == set(recipes())


@pytest.mark.parametrize("method,precision,match", [
    ("qlora", "fp8-tensorwise", "no framework runs QLoRA with FP8/FP4 GEMMs"),
    ("lora", "nvfp4-te", "PEFT does not wrap te.Linear"),
    ("lora", "fp8-te-delayed", "PEFT does not wrap te.Linear"),
    ("lora", "nvfp4-torchao", "not a LoRA path"),
    ("full", "fp8-weight-only", "cannot be fully fine-tuned"),
    ("full", "nvfp4-weight-only", "cannot be fully fine-tuned"),
])
def test_unsupported_combinations_refused(llama70, method, precision, match):
    job = Job(method=method).with_(low_precision=precision)
    with pytest.raises(ConfigError, match=match):
        validate_job(llama70, job)


def test_former_fp8_method_points_to_precision(llama70):
    with pytest.raises(ConfigError, match="are precisions, not methods") as e:
        validate_job(llama70, Job(method="fp8"))
    assert "precision=" in e.value.hint


@pytest.mark.parametrize("gpu", ["a100-80gb-sxm", "a100-40gb-pcie", "a10g", "rtx-3090"])
@pytest.mark.parametrize("precision", ["fp8-tensorwise", "fp8-rowwise", "fp8-te-delayed", "nvfp4-te"])
def test_gpus_without_fp8_refuse(gpu, precision):
    msg = gpu_problem(get_recipe(precision), GPUS[gpu])
    assert msg and "no FP8 tensor cores" in msg and "bf16-mixed" in msg
    with pytest.raises(ConfigError):
        check_gpu(Job().with_(low_precision=precision), GPUS[gpu])


def test_gpu_support_matrix():
    ok = lambda p, g: gpu_problem(get_recipe(p), GPUS[g]) is None  # noqa: E731
    for g in ("h100-sxm", "h200", "l40s", "rtx-4090", "b200", "gb200", "b300"):
        assert ok("fp8-tensorwise", g) and ok("fp8-te-delayed", g), g
    for g in ("b200", "gb200", "b300"):
        assert ok("nvfp4-te", g) and ok("mxfp8-te", g), g
    for g in ("h100-sxm", "h200", "l40s", "rtx-5090", "rtx-pro-6000", "mi355x"):
        assert not ok("nvfp4-te", g), g  # Hopper/Ada lack FP4; sm120 not a TE NVFP4 target; AMD lacks NVFP4
    assert "not verified" in gpu_problem(get_recipe("fp8-rowwise"), GPUS["rtx-5090"])
    assert ok("fp8-tensorwise", "rtx-5090")
    assert ok("fp8-tensorwise", "mi300x") and not ok("fp8-te-current", "mi300x")
    # weight-only bases dequantize to bf16: any GPU that trains in bf16
    assert ok("nvfp4-weight-only", "a100-80gb-sxm") and ok("fp8-weight-only", "a100-80gb-sxm")


def test_gpu_catalog_low_precision_columns_consistent():
    """supports_fp8_training <=> an fp8 peak; supports_fp4_training only where a recipe runs."""
    for g in GPUS.values():
        assert g.supports_fp8_training == (g.fp8_tflops is not None), g.name
        if g.fp8_tflops is not None:
            assert g.fp8_tflops >= g.bf16_tflops * 1.99, g.name  # dense FP8 = 2x dense BF16
        if g.fp4_tflops is not None:
            assert g.fp4_tflops >= g.fp8_tflops, g.name
        fp4_recipe_runs = any(gpu_problem(r, g) is None for r in recipes().values() if r.peak == "nvfp4")
        assert g.supports_fp4_training == fp4_recipe_runs, g.name


def test_every_recipe_has_sources_and_known_methods():
    for r in recipes().values():
        assert r.sources and r.methods and set(r.methods) <= {"full", "lora"}
        assert r.base_precision == "bf16-mixed"
        assert r.peak in ("fp8", "nvfp4", "bf16")


# ---------------------------------------------------------------------------------------------
# properties over the catalog models (no torch)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "mistral-7b", "phi-4"])
def test_low_precision_never_costs_weight_bytes(name):
    model = resolve_model(name)
    base = model_states(model, Job(method="full"))
    for p in ("fp8-tensorwise", "fp8-rowwise", "fp8-rowwise-gw-hp", "nvfp4-te", "mxfp8-te", "fp8-te-delayed"):
        st = model_states(model, apply_precision(Job(method="full"), p))
        if p in ("mxfp8-te", "fp8-te-delayed"):
            # TE keeps the quantized weight row-wise AND column-wise for dgrad: 2 x (1 byte + an
            # E8M0 scale per 32) = 2.06 bytes for MXFP8 (FP8 transpose on Hopper: 2 bytes + scales,
            # plus the amax history): not less than autocast's 2-byte bf16 copy
            assert base.master_weights <= st.master_weights <= base.master_weights * 1.035, p
        else:
            assert st.master_weights <= base.master_weights, p
        assert (st.trainable_weights, st.gradients, st.optimizer_states) == \
            (base.trainable_weights, base.gradients, base.optimizer_states), p
    lora = model_states(model, Job(method="lora"))
    fp8 = model_states(model, apply_precision(Job(method="lora"), "fp8-weight-only"))
    nvfp4 = model_states(model, apply_precision(Job(method="lora"), "nvfp4-weight-only"))
    assert nvfp4.frozen_weights < fp8.frozen_weights < lora.frozen_weights
    # FP8 weights: 1 byte + a per-row fp32 scale; NVFP4 4.5 bits (+ swizzle padding) per weight
    linear = sum(lin.params for lin in model.linears() if lin.is_module and lin.category != "lm_head")
    assert lora.frozen_weights - fp8.frozen_weights == pytest.approx(linear, rel=0.01)
    assert lora.frozen_weights - nvfp4.frozen_weights == pytest.approx(linear * (2 - 0.5625), rel=0.01)


def test_accelerate_skips_first_and_last_linear(llama70):
    job = apply_precision(Job(method="full"), "fp8-tensorwise")
    conv = {lin.module: n for lin, n in converted_linears(llama70, job)}
    assert "lm_head" not in conv and conv["q_proj"] == 79 and conv["k_proj"] == 80
    te_job = job.with_(low_precision="fp8-te-delayed", loss="hf")
    te = {lin.module: n for lin, n in converted_linears(llama70, te_job)}
    assert te["lm_head"] == 1 and te["q_proj"] == 80  # accelerate's TE convert_model takes every linear
    # TRL's fused head (the default loss) reads lm_head.weight directly: nothing to convert there
    assert "lm_head" not in {lin.module for lin, _ in converted_linears(llama70, te_job.with_(loss="trl"))}


def test_fp8_weight_only_lora_keeps_dequantized_copies_without_checkpointing(llama70):
    """torchao Float8Tensor dequantizes above autograd: each base linear saves a bf16 copy of
    its weight. For 70B that is ~128 GiB more than bf16 LoRA; checkpointing removes it."""
    j = apply_precision(Job(method="lora", seq_len=2048, gradient_checkpointing=False), "fp8-weight-only")
    base = estimate_memory(llama70, Job(method="lora", seq_len=2048, gradient_checkpointing=False))
    m = estimate_memory(llama70, j)
    assert m.components["master_weights"] - base.components["master_weights"] > 120 * 2**30
    ck = estimate_memory(llama70, j.with_(gradient_checkpointing=True))
    assert ck.device_total_bytes < 90 * 2**30


# ---------------------------------------------------------------------------------------------
# FLOP split (what the runtime model will run at the FP8/FP4 peak)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b"])
@pytest.mark.parametrize("ckpt", [False, True])
def test_flop_split(name, ckpt):
    from ftplan.lowprec import flop_split as _split
    from ftplan.runtime import flops_per_token

    def flop_split(model, job):
        return _split(model, job, flops_per_token(model, job).hardware)

    model = resolve_model(name)
    full = Job(method="full", seq_len=4096, gradient_checkpointing=ckpt)
    hw = flops_per_token(model, full).hardware
    tw = flop_split(model, apply_precision(full, "fp8-tensorwise"))
    gw = flop_split(model, apply_precision(full, "fp8-rowwise-gw-hp"))
    assert tw.total == pytest.approx(hw) and gw.total == pytest.approx(hw) and tw.wasted == 0
    if model.is_moe:
        # routed experts are 3-D parameters run by grouped_mm, not nn.Linear: Float8Linear does
        # not touch them, so most of an MoE's FLOPs stay bf16
        assert tw.low_share < 0.5
    else:
        assert 0.8 < tw.low_share < 1.0
    assert gw.low_share < tw.low_share  # rowwise_with_gw_hp keeps the wgrad GEMM in bf16
    # accelerate leaves lm_head and one q_proj in bf16; TE converts lm_head too
    assert flop_split(model, apply_precision(full, "fp8-te-delayed")).low > tw.low
    # LoRA: the frozen base's weight-gradient GEMM is computed anyway (+1 forward of the base)
    lora = Job(method="lora", seq_len=4096, gradient_checkpointing=ckpt)
    s = flop_split(model, apply_precision(lora, "fp8-tensorwise"))
    assert s.total == pytest.approx(flops_per_token(model, lora).hardware + s.wasted)
    assert s.wasted > (0.05 if model.is_moe else 0.15) * s.total
    assert flop_split(model, apply_precision(lora, "nvfp4-weight-only")).low == 0


def test_reference_points_file_is_sourced():
    """catalog/data/lowprec_reference.json: published FP8/FP4 speedups with sources and tolerances
    (held against the runtime model once it uses the FP8/FP4 peaks)."""
    import json
    from importlib import resources

    doc = json.loads((resources.files("ftplan.catalog") / "data" / "lowprec_reference.json").read_text())
    gpus = load_gpus()
    for p in doc["points"]:
        assert p["source"] and 0 < p["tolerance"] < 0.5, p["id"]
        assert ("speedup" in p) != ("speedup_range" in p), p["id"]
        assert p["gpu"] in gpus and get_recipe(p["precision"]) if "precision" in p else True


def test_quant_traffic():
    """Quantize-kernel traffic: torchao's eager casts read each tensor twice (amax, cast) and cast
    input and grad_output once per GEMM orientation; TE fuses cast + transpose; gw_hp skips the
    wgrad casts; weight-only recipes have none."""
    from ftplan.lowprec import quant_traffic_bytes

    model = resolve_model("llama-3.1-8b")
    full = Job(method="full", seq_len=4096)
    tw = quant_traffic_bytes(model, apply_precision(full, "fp8-tensorwise"))
    gw = quant_traffic_bytes(model, apply_precision(full, "fp8-rowwise-gw-hp"))
    te = quant_traffic_bytes(model, apply_precision(full, "fp8-te-delayed"))
    assert te[0] < gw[0] < tw[0] and te[1] < tw[1]
    # torchao tensorwise on 8B: ~10 bytes per (in + out) feature of every converted linear per token
    conv = sum((lin.in_features + lin.out_features) * n
               for lin, n in converted_linears(model, apply_precision(full, "fp8")))
    assert tw[0] == pytest.approx(10 * conv, rel=0.01)
    assert quant_traffic_bytes(model, apply_precision(Job(method="lora"), "nvfp4-weight-only")) == (0, 0)
